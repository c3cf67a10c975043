// DeformConv2d CUDA kernel launcher (no TensorRT types, so it compiles and can be reused on its own).
#pragma once

#include "deformConv2dParams.h"

#include <cstdint>
#include <cuda_runtime.h>

namespace gskit
{

enum class DcnDataType : int32_t
{
    kFLOAT = 0,
    kHALF = 1,
};

//! y = deform_conv2d(x, weight, offset, bias?, mask?); bias and mask may be nullptr. All tensors have `type`.
cudaError_t launchDeformConv2d(DeformConv2dParams const& p, DcnDataType type, void const* x, void const* weight,
    void const* offset, void const* bias, void const* mask, void* y, cudaStream_t stream);

} // namespace gskit
