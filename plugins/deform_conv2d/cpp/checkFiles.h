// Command line and raw float32 input files of the kernel harnesses (check_kernel_math.cpp, check_kernel_cuda.cu).
#pragma once

#include "deformConv2dParams.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace gskit
{

//! Exactly `count` little-endian float32 values from `path`; a missing, short or long file exits with status 2.
inline std::vector<float> readFloats(std::string const& path, size_t count)
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

//! One case: sizes and attributes, and the inputs (bias and mask empty when absent).
struct CaseInputs
{
    DeformConv2dParams p;
    bool hasBias;
    bool hasMask;
    std::vector<float> x, weight, offset, bias, mask;
};

//! Number of command-line values readCase takes.
constexpr int kCaseArgs = 19;

//! The case whose kCaseArgs values (N C H W C_OUT KH KW OH OW STRIDE_H STRIDE_W PAD_TOP PAD_LEFT DIL_H DIL_W
//! GROUP OFFSET_GROUP HAS_BIAS HAS_MASK) start at `args`, with its inputs read from DIR/{x,weight,offset[,bias]
//! [,mask]}.f32.
inline CaseInputs readCase(std::string const& dir, char const* const* args)
{
    int32_t v[kCaseArgs];
    for (int i = 0; i < kCaseArgs; ++i)
    {
        v[i] = static_cast<int32_t>(std::atoi(args[i]));
    }
    CaseInputs c{{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11], v[12], v[13], v[14],
                     v[15], v[16]},
        v[17] != 0, v[18] != 0, {}, {}, {}, {}, {}};
    DeformConv2dParams const& p = c.p;
    size_t const taps = static_cast<size_t>(p.kH) * p.kW;
    size_t const pixels = static_cast<size_t>(p.oH) * p.oW;
    c.x = readFloats(dir + "/x.f32", static_cast<size_t>(p.n) * p.c * p.h * p.w);
    c.weight = readFloats(dir + "/weight.f32", static_cast<size_t>(p.cOut) * (p.c / p.group) * taps);
    c.offset = readFloats(dir + "/offset.f32", static_cast<size_t>(p.n) * p.offsetGroup * taps * 2 * pixels);
    if (c.hasBias)
    {
        c.bias = readFloats(dir + "/bias.f32", static_cast<size_t>(p.cOut));
    }
    if (c.hasMask)
    {
        c.mask = readFloats(dir + "/mask.f32", static_cast<size_t>(p.n) * p.offsetGroup * taps * pixels);
    }
    return c;
}

} // namespace gskit
