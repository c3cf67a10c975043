// The math of one DeformConv2d output element, shared by the CUDA kernel and a host build
// (check_kernel_math.cpp), so that a CPU test checks the kernel's indexing against reference.py.
//
// Before including this header, declare `float toFloat(T)` (GSKIT_HD) for every element type T used.
#pragma once

#include "deformConv2dParams.h"

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define GSKIT_HD __host__ __device__ __forceinline__
#else
#define GSKIT_HD inline
#endif

namespace gskit
{

//! Bilinear sample of one (H, W) image at (py, px); corners outside the image read zero.
template <typename T>
GSKIT_HD float bilinearSample(T const* image, int32_t h, int32_t w, float py, float px)
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

//! Output element `index` of y (N, C_out, oH, oW) in float; bias and mask may be nullptr.
template <typename T>
GSKIT_HD float deformConv2dElement(DeformConv2dParams const& p, int64_t index, T const* x, T const* weight,
    T const* offset, T const* bias, T const* mask)
{
    int32_t const taps = p.kH * p.kW;
    int32_t const cPerGroup = p.c / p.group;
    int32_t const coPerGroup = p.cOut / p.group;
    int32_t const cPerOffsetGroup = p.c / p.offsetGroup;
    int64_t const pixels = static_cast<int64_t>(p.oH) * p.oW;
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
            float sample = bilinearSample(image, p.h, p.w, py, px);
            if (mask)
            {
                sample *= toFloat(mask[tap * pixels + pixel]);
            }
            acc += toFloat(w[k]) * sample;
        }
    }
    return acc;
}

} // namespace gskit
