// DeformConv2d CUDA kernel launcher (no TensorRT types, so it compiles and can be reused on its own).
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace gskit
{

enum class DcnDataType : int32_t
{
    kFLOAT = 0,
    kHALF = 1,
};

//! Sizes and attributes of one call; layouts as the gskit spec (plugins/deform_conv2d/reference.py).
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

//! y = deform_conv2d(x, weight, offset, bias?, mask?); bias and mask may be nullptr. All tensors have `type`.
cudaError_t launchDeformConv2d(DeformConv2dParams const& p, DcnDataType type, void const* x, void const* weight,
    void const* offset, void const* bias, void const* mask, void* y, cudaStream_t stream);

} // namespace gskit
