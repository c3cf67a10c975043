"""Numpy reference of DeformConv2d (torchvision's ``deform_conv2d``, ONNX's ``DeformConv``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def output_size(size: int, kernel: int, stride: int, pad_begin: int, pad_end: int, dilation: int) -> int:
    """Spatial output size of a convolution: ``(size + pads - dilation * (kernel - 1) - 1) // stride + 1``."""
    return (size + pad_begin + pad_end - dilation * (kernel - 1) - 1) // stride + 1


def deform_conv2d(
    x: np.ndarray,
    weight: np.ndarray,
    offset: np.ndarray,
    bias: np.ndarray | None = None,
    mask: np.ndarray | None = None,
    *,
    strides: Sequence[int] = (1, 1),
    pads: Sequence[int] = (0, 0, 0, 0),
    dilations: Sequence[int] = (1, 1),
    group: int = 1,
    offset_group: int = 1,
) -> np.ndarray:
    """Deformable 2-D convolution (v1 without ``mask``, v2 with it).

    For output pixel ``(i, j)`` and kernel tap ``(u, v)`` (``k = u * kW + v``) the input is sampled at::

        py = i * stride_h - pad_top  + u * dilation_h + offset[n, g, k, 0, i, j]    # dy
        px = j * stride_w - pad_left + v * dilation_w + offset[n, g, k, 1, i, j]    # dx

    by bilinear interpolation, where ``g`` is the offset group of the input channel and a corner outside
    the image reads zero. The sample is multiplied by ``mask[n, g, k, i, j]`` (when given), and the
    samples feed an ordinary grouped convolution with ``weight``, plus ``bias``.

    Layouts: ``offset`` is ``(N, offset_group * kH * kW * 2, oH, oW)`` with ``(dy, dx)`` pairs per kernel
    tap per offset group, ``mask`` is ``(N, offset_group * kH * kW, oH, oW)``; ``pads`` is
    ``[top, left, bottom, right]`` as in ONNX. Computed in float64 (the sums are exact for float32
    data up to rounding of the result) and cast back to ``x``'s dtype.

    Args:
        x: ``(N, C, H, W)``.
        weight: ``(C_out, C / group, kH, kW)``.
        offset: see above.
        bias: ``(C_out,)`` or None.
        mask: see above, or None (all ones).
        strides: ``[stride_h, stride_w]``.
        pads: ``[top, left, bottom, right]``.
        dilations: ``[dilation_h, dilation_w]``.
        group: number of convolution groups.
        offset_group: number of channel groups that share one set of offsets.

    Returns:
        ``(N, C_out, oH, oW)`` in ``x``'s dtype.

    Raises:
        ValueError: shapes that do not fit together.
    """
    n, c, h, w = x.shape
    c_out, c_per_group, kh, kw = weight.shape
    sh, sw = strides
    pt, pl, pb, pr = pads
    dh, dw = dilations
    oh, ow = output_size(h, kh, sh, pt, pb, dh), output_size(w, kw, sw, pl, pr, dw)
    k = kh * kw
    if c % group or c_out % group or c // group != c_per_group:
        raise ValueError(f"weight {weight.shape} does not fit input {x.shape} with group={group}")
    if c % offset_group:
        raise ValueError(f"{c} input channels are not divisible by offset_group={offset_group}")
    if offset.shape != (n, offset_group * k * 2, oh, ow):
        raise ValueError(f"offset is {offset.shape}, expected {(n, offset_group * k * 2, oh, ow)}")
    if mask is not None and mask.shape != (n, offset_group * k, oh, ow):
        raise ValueError(f"mask is {mask.shape}, expected {(n, offset_group * k, oh, ow)}")

    def wide(a: np.ndarray) -> np.ndarray:
        return np.asarray(a).astype(np.float32, copy=False).astype(np.float64)

    off = wide(offset).reshape(n, offset_group, k, 2, oh, ow)
    # Sampling positions, (N, offset_group, K, oH, oW).
    tap_y = np.repeat(np.arange(kh) * dh, kw)[:, None, None]
    tap_x = np.tile(np.arange(kw) * dw, kh)[:, None, None]
    py = (np.arange(oh) * sh - pt)[None, :, None] + tap_y + off[:, :, :, 0]
    px = (np.arange(ow) * sw - pl)[None, None, :] + tap_x + off[:, :, :, 1]

    # Bilinear interpolation with zeros outside: gather the four corners from the flattened image.
    image = wide(x).reshape(n, offset_group, c // offset_group, h * w)
    y0, x0 = np.floor(py), np.floor(px)
    fy, fx = py - y0, px - x0
    samples = np.zeros((n, offset_group, c // offset_group, k * oh * ow))
    for cy, cx, weight_corner in (
        (y0, x0, (1 - fy) * (1 - fx)),
        (y0, x0 + 1, (1 - fy) * fx),
        (y0 + 1, x0, fy * (1 - fx)),
        (y0 + 1, x0 + 1, fy * fx),
    ):
        inside = (cy >= 0) & (cy < h) & (cx >= 0) & (cx < w)
        flat = (np.clip(cy, 0, h - 1) * w + np.clip(cx, 0, w - 1)).astype(np.intp)
        values = np.take_along_axis(image, flat.reshape(n, offset_group, 1, -1), axis=-1)
        samples += values * np.where(inside, weight_corner, 0.0).reshape(n, offset_group, 1, -1)
    samples = samples.reshape(n, offset_group, c // offset_group, k, oh, ow)
    if mask is not None:
        samples *= wide(mask).reshape(n, offset_group, 1, k, oh, ow)

    # Grouped convolution of the sampled columns with the weights.
    columns = samples.reshape(n, group, c_per_group, k, oh, ow)
    kernels = wide(weight).reshape(group, c_out // group, c_per_group, k)
    y = np.einsum("ngckhw,gock->ngohw", columns, kernels, optimize=True).reshape(n, c_out, oh, ow)
    if bias is not None:
        y += wide(bias).reshape(1, c_out, 1, 1)
    return y.astype(x.dtype)
