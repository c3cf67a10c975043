// DeformConv2d CUDA kernel: one thread per output element (deformConv2dMath.h, the math of
// plugins/deform_conv2d/reference.py), float accumulation, float32 or float16 tensors.
#include "deformConv2dKernel.h"

#include <cuda_fp16.h>

namespace gskit
{
// The element types deformConv2dMath.h reads (it must see these before its templates).
__host__ __device__ __forceinline__ float toFloat(float v)
{
    return v;
}
__host__ __device__ __forceinline__ float toFloat(__half v)
{
    return __half2float(v);
}
} // namespace gskit

#include "deformConv2dMath.h"

namespace gskit
{
namespace
{

template <typename T>
__device__ __forceinline__ T fromFloat(float v);
template <>
__device__ __forceinline__ float fromFloat<float>(float v)
{
    return v;
}
template <>
__device__ __forceinline__ __half fromFloat<__half>(float v)
{
    return __float2half_rn(v);
}

template <typename T>
__global__ void deformConv2dKernel(DeformConv2dParams p, T const* __restrict__ x, T const* __restrict__ weight,
    T const* __restrict__ offset, T const* __restrict__ bias, T const* __restrict__ mask, T* __restrict__ y)
{
    int64_t const total = static_cast<int64_t>(p.n) * p.cOut * p.oH * p.oW;
    for (int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; index < total;
         index += static_cast<int64_t>(gridDim.x) * blockDim.x)
    {
        y[index] = fromFloat<T>(deformConv2dElement(p, index, x, weight, offset, bias, mask));
    }
}

template <typename T>
cudaError_t launch(DeformConv2dParams const& p, void const* x, void const* weight, void const* offset,
    void const* bias, void const* mask, void* y, cudaStream_t stream)
{
    int64_t const total = static_cast<int64_t>(p.n) * p.cOut * p.oH * p.oW;
    if (total == 0)
    {
        return cudaSuccess;
    }
    constexpr int32_t kThreads = 256;
    int64_t const blocks = (total + kThreads - 1) / kThreads;
    int32_t const grid = static_cast<int32_t>(blocks < 65535 * 32 ? blocks : 65535 * 32);
    deformConv2dKernel<T><<<grid, kThreads, 0, stream>>>(p, static_cast<T const*>(x), static_cast<T const*>(weight),
        static_cast<T const*>(offset), static_cast<T const*>(bias), static_cast<T const*>(mask), static_cast<T*>(y));
    return cudaGetLastError();
}

} // namespace

cudaError_t launchDeformConv2d(DeformConv2dParams const& p, DcnDataType type, void const* x, void const* weight,
    void const* offset, void const* bias, void const* mask, void* y, cudaStream_t stream)
{
    switch (type)
    {
    case DcnDataType::kFLOAT: return launch<float>(p, x, weight, offset, bias, mask, y, stream);
    case DcnDataType::kHALF: return launch<__half>(p, x, weight, offset, bias, mask, y, stream);
    }
    return cudaErrorInvalidValue;
}

} // namespace gskit
