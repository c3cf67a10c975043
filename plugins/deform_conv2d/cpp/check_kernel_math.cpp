// Host build of the CUDA kernel's per-element math (deformConv2dMath.h), for a CPU test against reference.py.
//
//   check_kernel_math DIR N C H W C_OUT KH KW OH OW STRIDE_H STRIDE_W PAD_TOP PAD_LEFT DIL_H DIL_W GROUP
//       OFFSET_GROUP HAS_BIAS HAS_MASK
//
// reads DIR/{x,weight,offset[,bias][,mask]}.f32 (raw little-endian float32, C order) and writes DIR/y.f32.
#include "deformConv2dParams.h"

namespace gskit
{
inline float toFloat(float v)
{
    return v;
}
} // namespace gskit

#include "checkFiles.h"
#include "deformConv2dMath.h"

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

int main(int argc, char** argv)
{
    constexpr int kArgs = 2 + gskit::kCaseArgs;
    if (argc != kArgs)
    {
        std::cerr << "usage: check_kernel_math DIR N C H W C_OUT KH KW OH OW STRIDE_H STRIDE_W PAD_TOP PAD_LEFT "
                     "DIL_H DIL_W GROUP OFFSET_GROUP HAS_BIAS HAS_MASK\n";
        return 2;
    }
    gskit::CaseInputs const c = gskit::readCase(argv[1], argv + 2);
    gskit::DeformConv2dParams const& p = c.p;
    int64_t const total = static_cast<int64_t>(p.n) * p.cOut * p.oH * p.oW;
    std::vector<float> y(static_cast<size_t>(total));
    for (int64_t index = 0; index < total; ++index)
    {
        y[static_cast<size_t>(index)] = gskit::deformConv2dElement(p, index, c.x.data(), c.weight.data(),
            c.offset.data(), c.hasBias ? c.bias.data() : nullptr, c.hasMask ? c.mask.data() : nullptr);
    }
    std::ofstream out(std::string(argv[1]) + "/y.f32", std::ios::binary);
    out.write(reinterpret_cast<char const*>(y.data()), static_cast<std::streamsize>(y.size() * sizeof(float)));
    return out ? 0 : 1;
}
