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

#include "deformConv2dMath.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace
{

std::vector<float> readFloats(std::string const& path, size_t count)
{
    std::vector<float> values(count);
    std::ifstream in(path, std::ios::binary);
    in.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(count * sizeof(float)));
    if (!in || in.peek() != EOF)
    {
        std::cerr << path << ": expected exactly " << count << " float32 values\n";
        std::exit(2);
    }
    return values;
}

} // namespace

int main(int argc, char** argv)
{
    constexpr int kArgs = 21;
    if (argc != kArgs)
    {
        std::cerr << "usage: check_kernel_math DIR N C H W C_OUT KH KW OH OW STRIDE_H STRIDE_W PAD_TOP PAD_LEFT "
                     "DIL_H DIL_W GROUP OFFSET_GROUP HAS_BIAS HAS_MASK\n";
        return 2;
    }
    std::string const dir = argv[1];
    int32_t v[kArgs - 2];
    for (int i = 2; i < kArgs; ++i)
    {
        v[i - 2] = static_cast<int32_t>(std::atoi(argv[i]));
    }
    gskit::DeformConv2dParams const p{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11],
        v[12], v[13], v[14], v[15], v[16]};
    bool const hasBias = v[17] != 0;
    bool const hasMask = v[18] != 0;
    size_t const taps = static_cast<size_t>(p.kH) * p.kW;
    size_t const pixels = static_cast<size_t>(p.oH) * p.oW;
    auto const x = readFloats(dir + "/x.f32", static_cast<size_t>(p.n) * p.c * p.h * p.w);
    auto const weight = readFloats(dir + "/weight.f32", static_cast<size_t>(p.cOut) * (p.c / p.group) * taps);
    auto const offset = readFloats(dir + "/offset.f32", static_cast<size_t>(p.n) * p.offsetGroup * taps * 2 * pixels);
    std::vector<float> bias;
    std::vector<float> mask;
    if (hasBias)
    {
        bias = readFloats(dir + "/bias.f32", static_cast<size_t>(p.cOut));
    }
    if (hasMask)
    {
        mask = readFloats(dir + "/mask.f32", static_cast<size_t>(p.n) * p.offsetGroup * taps * pixels);
    }
    int64_t const total = static_cast<int64_t>(p.n) * p.cOut * p.oH * p.oW;
    std::vector<float> y(static_cast<size_t>(total));
    for (int64_t index = 0; index < total; ++index)
    {
        y[static_cast<size_t>(index)] = gskit::deformConv2dElement(p, index, x.data(), weight.data(),
            offset.data(), hasBias ? bias.data() : nullptr, hasMask ? mask.data() : nullptr);
    }
    std::ofstream out(dir + "/y.f32", std::ios::binary);
    out.write(reinterpret_cast<char const*>(y.data()), static_cast<std::streamsize>(y.size() * sizeof(float)));
    return out ? 0 : 1;
}
