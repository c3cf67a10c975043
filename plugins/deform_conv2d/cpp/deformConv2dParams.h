// Sizes and attributes of one DeformConv2d call (no CUDA or TensorRT types: host tools include it too).
#pragma once

#include <cstdint>

namespace gskit
{

//! Layouts as the gskit spec (plugins/deform_conv2d/reference.py).
struct DeformConv2dParams
{
    int32_t n, c, h, w;         // x: (N, C, H, W)
    int32_t cOut, kH, kW;       // weight: (C_out, C / group, kH, kW)
    int32_t oH, oW;             // y: (N, C_out, oH, oW)
    int32_t strideH, strideW;
    int32_t padTop, padLeft;    // bottom/right pads only change oH/oW
    int32_t dilationH, dilationW;
    int32_t group, offsetGroup;
};

} // namespace gskit
