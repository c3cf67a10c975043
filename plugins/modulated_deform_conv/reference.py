"""Numpy reference of TensorRT's ``ModulatedDeformConv2d`` (DCNv2), as its CUDA source computes it.

Source: NVIDIA/TensorRT ``plugin/modulatedDeformConvPlugin/modulatedDeformConvPluginKernel.cu`` at
82d1dca801c8318a5605399d5240780d0679e4e1 (11.1): ``modulatedDeformableIm2colGpuKernel`` and
``dmcnIm2colBilinear``, then a grouped GEMM with the weights and the bias.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def modulated_deform_conv2d(
    x: np.ndarray,
    offset: np.ndarray,
    mask: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None = None,
    *,
    stride: Sequence[int] = (1, 1),
    padding: Sequence[int] = (0, 0),
    dilation: Sequence[int] = (1, 1),
    group: int = 1,
    deformable_group: int = 1,
) -> np.ndarray:
    """Modulated deformable convolution: each kernel tap samples the input at an offset, scaled by a mask.

    For output pixel ``(p, q)``, tap ``(i, j)`` (``t = i * kW + j``) and input channel ``c`` of deformable
    group ``g = c // (C / deformable_group)``, the sample is taken at::

        h = p * stride_h - pad_h + i * dilation_h + offset[n, (g * kH * kW + t) * 2,     p, q]
        w = q * stride_w - pad_w + j * dilation_w + offset[n, (g * kH * kW + t) * 2 + 1, p, q]

    by bilinear interpolation: zero when ``h <= -1``, ``h >= H``, ``w <= -1`` or ``w >= W``, otherwise the
    four neighbours with a neighbour outside the image reading zero. It is multiplied by
    ``mask[n, g * kH * kW + t, p, q]``, and the samples go through a convolution of ``group`` groups with
    ``weight``, plus ``bias``. Padding is symmetric (``padding = [pad_h, pad_w]``). Computed in float64,
    returned in ``x``'s dtype.

    Args:
        x: ``[N, C, H, W]``.
        offset: ``[N, 2 * deformable_group * kH * kW, oH, oW]``.
        mask: ``[N, deformable_group * kH * kW, oH, oW]``.
        weight: ``[C_out, C / group, kH, kW]``.
        bias: ``[C_out]`` or None.
        stride: ``[stride_h, stride_w]``.
        padding: ``[pad_h, pad_w]``.
        dilation: ``[dilation_h, dilation_w]``.
        group: convolution groups.
        deformable_group: channel groups sharing one set of offsets and masks.

    Returns:
        ``[N, C_out, oH, oW]``, ``oH = (H + 2 * pad_h - (dilation_h * (kH - 1) + 1)) // stride_h + 1``.

    Raises:
        ValueError: shapes that do not fit together.
    """
    n, channels, height, width = x.shape
    c_out, per_group, kh, kw = weight.shape
    out_h = (height + 2 * padding[0] - (dilation[0] * (kh - 1) + 1)) // stride[0] + 1
    out_w = (width + 2 * padding[1] - (dilation[1] * (kw - 1) + 1)) // stride[1] + 1
    taps = kh * kw
    if channels != per_group * group or c_out % group or channels % deformable_group:
        raise ValueError(
            f"weight {weight.shape} and groups {group}/{deformable_group} do not fit x {x.shape}"
        )
    if offset.shape != (n, 2 * deformable_group * taps, out_h, out_w):
        raise ValueError(f"offset {offset.shape} does not fit the output {out_h}x{out_w}")
    if mask.shape != (n, deformable_group * taps, out_h, out_w):
        raise ValueError(f"mask {mask.shape} does not fit the output {out_h}x{out_w}")
    image = x.astype(np.float64).reshape(n, deformable_group, channels // deformable_group, height * width)
    moves = offset.astype(np.float64).reshape(n, deformable_group, taps, 2, out_h, out_w)
    scale = mask.astype(np.float64).reshape(n, deformable_group, taps, out_h, out_w)
    rows = np.arange(out_h)[:, None] * stride[0] - padding[0]
    cols = np.arange(out_w)[None, :] * stride[1] - padding[1]
    columns = np.empty((n, channels, taps, out_h, out_w))
    for tap in range(taps):
        h = rows + (tap // kw) * dilation[0] + moves[:, :, tap, 0]
        w = cols + (tap % kw) * dilation[1] + moves[:, :, tap, 1]
        sample = _bilinear(image, h, w, height, width) * scale[:, :, None, tap]
        columns[:, :, tap] = sample.reshape(n, channels, out_h, out_w)
    columns = columns.reshape(n, group, per_group * taps, out_h * out_w)
    kernels = weight.astype(np.float64).reshape(group, c_out // group, per_group * taps)
    y = np.matmul(kernels[None], columns).reshape(n, c_out, out_h, out_w)
    if bias is not None:
        y = y + bias.astype(np.float64)[None, :, None, None]
    return y.astype(x.dtype)


def _bilinear(image: np.ndarray, h: np.ndarray, w: np.ndarray, height: int, width: int) -> np.ndarray:
    """``dmcnIm2colBilinear`` for every channel of each deformable group: ``image [N, G, Cg, H*W]`` sampled at
    ``h``, ``w`` ``[N, G, oH, oW]``; returns ``[N, G, Cg, oH, oW]``."""
    inside = (h > -1) & (h < height) & (w > -1) & (w < width)
    top, left = np.floor(h), np.floor(w)
    dh, dw = h - top, w - left
    total = 0.0
    for row, col, share in (
        (top, left, (1 - dh) * (1 - dw)),
        (top, left + 1, (1 - dh) * dw),
        (top + 1, left, dh * (1 - dw)),
        (top + 1, left + 1, dh * dw),
    ):
        valid = inside & (row >= 0) & (row <= height - 1) & (col >= 0) & (col <= width - 1)
        index = np.where(valid, row * width + col, 0).astype(np.intp)
        n, groups = index.shape[:2]
        picked = np.take_along_axis(image, index.reshape(n, groups, 1, -1), axis=-1)
        total = total + picked.reshape(*image.shape[:3], *h.shape[2:]) * np.where(valid, share, 0)[:, :, None]
    return total
