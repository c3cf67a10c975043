"""PyTorch eager versions of the plugin computations that PyTorch has no single op for (bench baselines).

``deform_conv2d`` is DeformConv2d in plain tensor ops, as a PyTorch user without torchvision would write
it: bilinear samples gathered for every kernel tap (im2col), then one grouped matrix multiply. It follows
``plugins/deform_conv2d/reference.py`` (tests/test_bench_eager.py checks it against that reference), so the
benchmark's eager column computes the same thing as the kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def deform_conv2d(
    x: Any,
    weight: Any,
    offset: Any,
    bias: Any | None = None,
    mask: Any | None = None,
    *,
    strides: Sequence[int] = (1, 1),
    pads: Sequence[int] = (0, 0, 0, 0),
    dilations: Sequence[int] = (1, 1),
    group: int = 1,
    offset_group: int = 1,
) -> Any:
    """DeformConv2d of torch tensors in ``x``'s dtype; same layouts and attributes as the reference."""
    import torch

    n, c, h, w = x.shape
    c_out, c_per_group, kh, kw = weight.shape
    (sh, sw), (pt, pl, pb, pr), (dh, dw) = strides, pads, dilations
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
    k = kh * kw
    device = x.device
    off = offset.reshape(n, offset_group, k, 2, oh, ow)
    tap_y = (torch.arange(kh, device=device) * dh).repeat_interleave(kw).view(k, 1, 1)
    tap_x = (torch.arange(kw, device=device) * dw).repeat(kh).view(k, 1, 1)
    base_y = (torch.arange(oh, device=device) * sh - pt).view(1, oh, 1)
    base_x = (torch.arange(ow, device=device) * sw - pl).view(1, 1, ow)
    py = (base_y + tap_y).to(off.dtype) + off[:, :, :, 0]  # (N, G_off, K, oH, oW)
    px = (base_x + tap_x).to(off.dtype) + off[:, :, :, 1]
    y0, x0 = py.floor(), px.floor()
    fy, fx = py - y0, px - x0
    image = x.reshape(n, offset_group, 1, c // offset_group, h * w)
    samples = x.new_zeros(n, offset_group, c // offset_group, k * oh * ow)
    for cy, cx, corner in (
        (y0, x0, (1 - fy) * (1 - fx)),
        (y0, x0 + 1, (1 - fy) * fx),
        (y0 + 1, x0, fy * (1 - fx)),
        (y0 + 1, x0 + 1, fy * fx),
    ):
        inside = (cy >= 0) & (cy < h) & (cx >= 0) & (cx < w)
        # Index arithmetic in int64: float16 rounds integers above 2048 (4095 -> 4096, past the image).
        flat = (cy.clamp(0, h - 1).long() * w + cx.clamp(0, w - 1).long()).reshape(n, offset_group, 1, -1)
        values = torch.gather(image.squeeze(2), -1, flat.expand(-1, -1, c // offset_group, -1))
        samples += values * torch.where(inside, corner, 0).reshape(n, offset_group, 1, -1)
    samples = samples.reshape(n, offset_group, c // offset_group, k, oh * ow)
    if mask is not None:
        samples = samples * mask.reshape(n, offset_group, 1, k, oh * ow)
    columns = samples.reshape(n, group, c_per_group * k, oh * ow)
    kernels = weight.reshape(group, c_out // group, c_per_group * k)
    y = torch.matmul(kernels.unsqueeze(0), columns).reshape(n, c_out, oh, ow)
    return y if bias is None else y + bias.view(1, c_out, 1, 1)
