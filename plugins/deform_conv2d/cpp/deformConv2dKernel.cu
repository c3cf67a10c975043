// DeformConv2d CUDA kernel: one thread per output element, float accumulation, bilinear sampling with
// zeros outside the image (the math of plugins/deform_conv2d/reference.py).
#include "deformConv2dKernel.h"

#include <cuda_fp16.h>

namespace gskit
{
namespace
{

__device__ __forceinline__ float toFloat(float v)
{
    return v;
}
__device__ __forceinline__ float toFloat(__half v)
{
    return __half2float(v);
}
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
__device__ float bilinear(T const* image, int32_t h, int32_t w, float py, float px)
{
    // A sample at or beyond one pixel outside the image has all four corners outside: zero, as in the
    // reference. Returning early also keeps huge offsets from overflowing the int32 corner indices below and
    // makes a NaN position read zero (the reference's "inside" tests are false for NaN).
    if (!(py > -1.F && py < static_cast<float>(h) && px > -1.F && px < static_cast<float>(w)))
    {
        return 0.F;
    }
    float const y0f = floorf(py);
    float const x0f = floorf(px);
    float const fy = py - y0f;
    float const fx = px - x0f;
    int32_t const y0 = static_cast<int32_t>(y0f);
    int32_t const x0 = static_cast<int32_t>(x0f);
    float value = 0.F;
    for (int32_t dy = 0; dy < 2; ++dy)
    {
        int32_t const yy = y0 + dy;
        if (yy < 0 || yy >= h)
        {
            continue;
        }
        float const wy = dy ? fy : 1.F - fy;
        for (int32_t dx = 0; dx < 2; ++dx)
        {
            int32_t const xx = x0 + dx;
            if (xx < 0 || xx >= w)
            {
                continue;
            }
            float const wx = dx ? fx : 1.F - fx;
            value += wy * wx * toFloat(image[static_cast<int64_t>(yy) * w + xx]);
        }
    }
    return value;
}

template <typename T>
__global__ void deformConv2dKernel(DeformConv2dParams p, T const* __restrict__ x, T const* __restrict__ weight,
    T const* __restrict__ offset, T const* __restrict__ bias, T const* __restrict__ mask, T* __restrict__ y)
{
    int64_t const total = static_cast<int64_t>(p.n) * p.cOut * p.oH * p.oW;
    int32_t const taps = p.kH * p.kW;
    int32_t const cPerGroup = p.c / p.group;
    int32_t const coPerGroup = p.cOut / p.group;
    int32_t const cPerOffsetGroup = p.c / p.offsetGroup;
    int64_t const pixels = static_cast<int64_t>(p.oH) * p.oW;
    for (int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; index < total;
         index += static_cast<int64_t>(gridDim.x) * blockDim.x)
    {
        int32_t const ow = static_cast<int32_t>(index % p.oW);
        int32_t const oh = static_cast<int32_t>((index / p.oW) % p.oH);
        int32_t const co = static_cast<int32_t>((index / pixels) % p.cOut);
        int64_t const n = index / (pixels * p.cOut);
        int32_t const g = co / coPerGroup;
        int64_t const pixel = static_cast<int64_t>(oh) * p.oW + ow;
        float acc = bias ? toFloat(bias[co]) : 0.F;
        for (int32_t ciLocal = 0; ciLocal < cPerGroup; ++ciLocal)
        {
            int32_t const ci = g * cPerGroup + ciLocal;
            int32_t const og = ci / cPerOffsetGroup;
            T const* image = x + (n * p.c + ci) * p.h * p.w;
            T const* w = weight + (static_cast<int64_t>(co) * cPerGroup + ciLocal) * taps;
            for (int32_t k = 0; k < taps; ++k)
            {
                int32_t const u = k / p.kW;
                int32_t const v = k % p.kW;
                int64_t const tap = (n * p.offsetGroup + og) * taps + k;
                float const py = static_cast<float>(oh * p.strideH - p.padTop + u * p.dilationH)
                    + toFloat(offset[(tap * 2) * pixels + pixel]);
                float const px = static_cast<float>(ow * p.strideW - p.padLeft + v * p.dilationW)
                    + toFloat(offset[(tap * 2 + 1) * pixels + pixel]);
                float sample = bilinear(image, p.h, p.w, py, px);
                if (mask)
                {
                    sample *= toFloat(mask[tap * pixels + pixel]);
                }
                acc += toFloat(w[k]) * sample;
            }
        }
        y[index] = fromFloat<T>(acc);
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
