// Launches the plugin's CUDA kernel (launchDeformConv2d, deformConv2dKernel.cu) without TensorRT, for a GPU test
// against reference.py (test_cpp_kernel_cuda.py).
//
//   check_kernel_cuda DIR TYPE N C H W C_OUT KH KW OH OW STRIDE_H STRIDE_W PAD_TOP PAD_LEFT DIL_H DIL_W GROUP
//       OFFSET_GROUP HAS_BIAS HAS_MASK [REPS]
//
// TYPE is f32 or f16. Reads DIR/{x,weight,offset[,bias][,mask]}.f32 (raw little-endian float32, C order), converts
// them to TYPE on the host (round to nearest), runs the kernel into an output poisoned with NaN, and writes the
// result as float32 to DIR/y.f32. With REPS > 0 it then launches REPS more times and prints
// "median_ms <ms>" (CUDA events around each launch). Every CUDA call is checked: exit 1 with the call and its
// error; exit 2 for bad arguments or input files.
#include "checkFiles.h"
#include "deformConv2dKernel.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace
{

#define CHECK_CUDA(call)                                                                                               \
    do                                                                                                                 \
    {                                                                                                                  \
        cudaError_t const status_ = (call);                                                                            \
        if (status_ != cudaSuccess)                                                                                    \
        {                                                                                                              \
            std::cerr << #call << " failed: " << cudaGetErrorName(status_) << ": " << cudaGetErrorString(status_)      \
                      << "\n";                                                                                         \
            std::exit(1);                                                                                              \
        }                                                                                                              \
    } while (0)

//! A device copy of `values` in float32 or float16 (nullptr for an empty vector); freed by the destructor.
class DeviceTensor
{
public:
    DeviceTensor(std::vector<float> const& values, bool half)
        : mBytes(values.size() * (half ? sizeof(__half) : sizeof(float)))
    {
        if (values.empty())
        {
            return;
        }
        CHECK_CUDA(cudaMalloc(&mData, mBytes));
        if (half)
        {
            std::vector<__half> converted(values.size());
            std::transform(values.begin(), values.end(), converted.begin(), [](float v) { return __float2half_rn(v); });
            CHECK_CUDA(cudaMemcpy(mData, converted.data(), mBytes, cudaMemcpyHostToDevice));
        }
        else
        {
            CHECK_CUDA(cudaMemcpy(mData, values.data(), mBytes, cudaMemcpyHostToDevice));
        }
    }
    DeviceTensor(DeviceTensor const&) = delete;
    DeviceTensor& operator=(DeviceTensor const&) = delete;
    ~DeviceTensor()
    {
        if (mData)
        {
            cudaFree(mData);
        }
    }
    void* data() const
    {
        return mData;
    }
    size_t bytes() const
    {
        return mBytes;
    }

private:
    void* mData{nullptr};
    size_t mBytes{0};
};

} // namespace

int main(int argc, char** argv)
{
    constexpr int kArgs = 3 + gskit::kCaseArgs;
    if (argc != kArgs && argc != kArgs + 1)
    {
        std::cerr << "usage: check_kernel_cuda DIR f32|f16 N C H W C_OUT KH KW OH OW STRIDE_H STRIDE_W PAD_TOP "
                     "PAD_LEFT DIL_H DIL_W GROUP OFFSET_GROUP HAS_BIAS HAS_MASK [REPS]\n";
        return 2;
    }
    std::string const dir = argv[1];
    std::string const type = argv[2];
    if (type != "f32" && type != "f16")
    {
        std::cerr << "TYPE must be f32 or f16, not '" << type << "'\n";
        return 2;
    }
    bool const half = type == "f16";
    int const reps = argc > kArgs ? std::atoi(argv[kArgs]) : 0;
    gskit::CaseInputs const c = gskit::readCase(dir, argv + 3);
    gskit::DeformConv2dParams const& p = c.p;
    DeviceTensor const x(c.x, half);
    DeviceTensor const weight(c.weight, half);
    DeviceTensor const offset(c.offset, half);
    DeviceTensor const bias(c.bias, half);
    DeviceTensor const mask(c.mask, half);
    size_t const pixels = static_cast<size_t>(p.oH) * p.oW;
    size_t const total = static_cast<size_t>(p.n) * p.cOut * pixels;
    DeviceTensor const y(std::vector<float>(total), half);
    CHECK_CUDA(cudaMemset(y.data(), 0xFF, y.bytes())); // NaN in float32 and float16: unwritten elements show

    gskit::DcnDataType const dtype = half ? gskit::DcnDataType::kHALF : gskit::DcnDataType::kFLOAT;
    cudaStream_t stream{};
    CHECK_CUDA(cudaStreamCreate(&stream));
    auto const run = [&]() {
        CHECK_CUDA(gskit::launchDeformConv2d(
            p, dtype, x.data(), weight.data(), offset.data(), bias.data(), mask.data(), y.data(), stream));
    };
    run();
    CHECK_CUDA(cudaStreamSynchronize(stream));
    CHECK_CUDA(cudaGetLastError());

    std::vector<float> result(total);
    if (half)
    {
        std::vector<__half> raw(total);
        CHECK_CUDA(cudaMemcpy(raw.data(), y.data(), y.bytes(), cudaMemcpyDeviceToHost));
        std::transform(raw.begin(), raw.end(), result.begin(), [](__half h) { return __half2float(h); });
    }
    else
    {
        CHECK_CUDA(cudaMemcpy(result.data(), y.data(), y.bytes(), cudaMemcpyDeviceToHost));
    }
    std::ofstream out(dir + "/y.f32", std::ios::binary);
    out.write(reinterpret_cast<char const*>(result.data()), static_cast<std::streamsize>(total * sizeof(float)));
    if (!out)
    {
        std::cerr << dir << "/y.f32: cannot write\n";
        return 1;
    }

    if (reps > 0)
    {
        cudaEvent_t start{};
        cudaEvent_t stop{};
        CHECK_CUDA(cudaEventCreate(&start));
        CHECK_CUDA(cudaEventCreate(&stop));
        std::vector<float> times;
        for (int i = 0; i < reps + 3; ++i)
        {
            CHECK_CUDA(cudaEventRecord(start, stream));
            run();
            CHECK_CUDA(cudaEventRecord(stop, stream));
            CHECK_CUDA(cudaEventSynchronize(stop));
            float ms = 0.F;
            CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
            if (i >= 3) // the first launches warm up
            {
                times.push_back(ms);
            }
        }
        std::sort(times.begin(), times.end());
        std::printf("median_ms %.6f\n", static_cast<double>(times[times.size() / 2]));
        CHECK_CUDA(cudaEventDestroy(start));
        CHECK_CUDA(cudaEventDestroy(stop));
    }
    CHECK_CUDA(cudaStreamDestroy(stream));
    return 0;
}
