"""DeformConv2d GPU kernel (Triton): direct deformable convolution, float32 accumulation.

One program computes a tile of ``BLOCK_CO`` output channels (within one group) by ``BLOCK_P`` output
pixels of one image: for each input channel of the group and each kernel tap it samples the input at the
tap's offset position by bilinear interpolation (zero outside the image), scales by the mask, and adds
the weight column times the sample row to the tile. Samples are shared by the tile's output channels.

Parameters are ordered (input pointers, int32 sizes, output pointer, constexprs), the calling convention
of TensorRT's ahead-of-time Python plugins (:func:`aot_kernel` compiles it as the plugin's ``aot_impl``
does, without TensorRT). Absent ``bias``/``mask`` are switched off by constexpr flags (any pointer may
be passed in their place).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gskit.backends.trt_plugin import TritonPtx, triton_ptx

try:
    import triton
    import triton.language as tl
except ImportError as err:  # optional: the GPU kernels need Triton
    raise ImportError("plugins/deform_conv2d/kernel.py needs Triton: pip install triton") from err

#: Output pixels per program.
BLOCK_P = 64
#: Most output channels per program.
MAX_BLOCK_CO = 32


@triton.jit
def deform_conv2d_kernel(
    x_ptr, w_ptr, off_ptr, b_ptr, m_ptr,
    N, C, H, W, C_OUT, OH, OW,
    y_ptr,
    KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
    PT: tl.constexpr, PL: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr,
    GROUP: tl.constexpr, OFFSET_GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr,
    BLOCK_CO: tl.constexpr, BLOCK_P: tl.constexpr,
):  # fmt: skip
    co_per_group = C_OUT // GROUP
    c_per_group = C // GROUP
    c_per_offset_group = C // OFFSET_GROUP
    co_blocks = tl.cdiv(co_per_group, BLOCK_CO)
    q = tl.program_id(1)
    n = (q // (GROUP * co_blocks)).to(tl.int64)
    g = (q // co_blocks) % GROUP
    co_local = (q % co_blocks) * BLOCK_CO + tl.arange(0, BLOCK_CO)
    co_ok = co_local < co_per_group
    co = g * co_per_group + co_local
    npix = OH * OW
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    p_ok = p < npix
    oh = p // OW
    ow = p % OW
    acc = tl.zeros([BLOCK_CO, BLOCK_P], dtype=tl.float32)
    for ci_local in range(0, c_per_group):
        ci = g * c_per_group + ci_local
        og = ci // c_per_offset_group
        image = x_ptr + (n * C + ci) * H * W
        for u in tl.static_range(KH):
            for v in tl.static_range(KW):
                k = u * KW + v
                tap = (n * OFFSET_GROUP + og) * (KH * KW) + k
                dy = tl.load(off_ptr + (tap * 2) * npix + p, mask=p_ok, other=0.0).to(tl.float32)
                dx = tl.load(off_ptr + (tap * 2 + 1) * npix + p, mask=p_ok, other=0.0).to(tl.float32)
                py = (oh * SH - PT + u * DH).to(tl.float32) + dy
                px = (ow * SW - PL + v * DW).to(tl.float32) + dx
                y0f = tl.floor(py)
                x0f = tl.floor(px)
                fy = py - y0f
                fx = px - x0f
                y0 = y0f.to(tl.int32)
                x0 = x0f.to(tl.int32)
                y1 = y0 + 1
                x1 = x0 + 1
                in_y0 = (y0 >= 0) & (y0 < H)
                in_y1 = (y1 >= 0) & (y1 < H)
                in_x0 = (x0 >= 0) & (x0 < W)
                in_x1 = (x1 >= 0) & (x1 < W)
                v00 = tl.load(image + y0 * W + x0, mask=p_ok & in_y0 & in_x0, other=0.0).to(tl.float32)
                v01 = tl.load(image + y0 * W + x1, mask=p_ok & in_y0 & in_x1, other=0.0).to(tl.float32)
                v10 = tl.load(image + y1 * W + x0, mask=p_ok & in_y1 & in_x0, other=0.0).to(tl.float32)
                v11 = tl.load(image + y1 * W + x1, mask=p_ok & in_y1 & in_x1, other=0.0).to(tl.float32)
                sample = (1.0 - fy) * ((1.0 - fx) * v00 + fx * v01) + fy * ((1.0 - fx) * v10 + fx * v11)
                if HAS_MASK:
                    sample *= tl.load(m_ptr + tap * npix + p, mask=p_ok, other=0.0).to(tl.float32)
                w = tl.load(w_ptr + (co * c_per_group + ci_local) * (KH * KW) + k, mask=co_ok, other=0.0)
                acc += w.to(tl.float32)[:, None] * sample[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + co, mask=co_ok, other=0.0).to(tl.float32)[:, None]
    y_index = (n * C_OUT + co[:, None]) * npix + p[None, :]
    tl.store(y_ptr + y_index, acc.to(y_ptr.dtype.element_ty), mask=co_ok[:, None] & p_ok[None, :])


@dataclass(frozen=True)
class Geometry:
    """Sizes of one DeformConv2d call (everything but the tensors)."""

    n: int
    c: int
    h: int
    w: int
    c_out: int
    kh: int
    kw: int
    oh: int
    ow: int

    def block_co(self, group: int) -> int:
        """Output channels per program for this geometry."""
        return min(MAX_BLOCK_CO, max(2, triton.next_power_of_2(self.c_out // group)))

    def grid(self, group: int) -> tuple[int, int]:
        """(pixel tiles, images x groups x channel tiles)."""
        co_blocks = triton.cdiv(self.c_out // group, self.block_co(group))
        return (triton.cdiv(self.oh * self.ow, BLOCK_P), self.n * group * co_blocks)


def output_size(size: int, kernel: int, stride: int, pad_begin: int, pad_end: int, dilation: int) -> int:
    """Spatial output size of a convolution (the same formula as the spec's)."""
    return (size + pad_begin + pad_end - dilation * (kernel - 1) - 1) // stride + 1


def constexprs(
    kh: int, kw: int, strides: Sequence[int], pads: Sequence[int], dilations: Sequence[int],
    group: int, offset_group: int, has_bias: bool, has_mask: bool, block_co: int,
) -> dict[str, Any]:  # fmt: skip
    """The kernel's compile-time parameters."""
    return {
        "KH": int(kh), "KW": int(kw), "SH": int(strides[0]), "SW": int(strides[1]),
        "PT": int(pads[0]), "PL": int(pads[1]), "DH": int(dilations[0]), "DW": int(dilations[1]),
        "GROUP": int(group), "OFFSET_GROUP": int(offset_group),
        "HAS_BIAS": bool(has_bias), "HAS_MASK": bool(has_mask),
        "BLOCK_CO": int(block_co), "BLOCK_P": BLOCK_P,
    }  # fmt: skip


#: Build-time values ``aot_impl`` takes from the network, for a test compile of :func:`aot_kernel` with the
#: spec's default attributes (tests/test_trt_aot_ptx.py).
AOT_EXAMPLE: dict[str, Any] = {"weight_shape": (8, 4, 3, 3)}


def aot_kernel(
    dtype: str,
    weight_shape: Sequence[int],
    *,
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
    group: int,
    offset_group: int,
    target: Any | None = None,
) -> TritonPtx:
    """The kernel as PTX for the plugin's ``aot_impl`` (bias and mask present: the plugin takes all five).

    Parameters ``(x_ptr, w_ptr, off_ptr, b_ptr, m_ptr, N, C, H, W, C_OUT, OH, OW, y_ptr)``; the output
    channels per program are ``constexprs["BLOCK_CO"]`` of the result.

    Args:
        dtype: Triton type of every tensor (``fp32``, ``fp16``).
        weight_shape: ``(C_out, C/group, kH, kW)``, fixed at build time.
        strides, pads, dilations, group, offset_group: the node's attributes.
        target: a ``triton.backends.compiler.GPUTarget``; None: the current GPU.

    Raises:
        PluginError: see :func:`gskit.backends.trt_plugin.triton_ptx`.
    """
    c_out, _, kh, kw = (int(d) for d in weight_shape)
    block_co = Geometry(1, 1, 1, 1, c_out, kh, kw, 1, 1).block_co(group)
    meta = constexprs(kh, kw, strides, pads, dilations, group, offset_group, True, True, block_co)
    names = ("x_ptr", "w_ptr", "off_ptr", "b_ptr", "m_ptr", "y_ptr")
    return triton_ptx(deform_conv2d_kernel, dict.fromkeys(names, dtype), meta, target=target)


def deform_conv2d(
    x: Any,
    weight: Any,
    offset: Any,
    bias: Any | None = None,
    mask: Any | None = None,
    out: Any | None = None,
    *,
    strides: Sequence[int] = (1, 1),
    pads: Sequence[int] = (0, 0, 0, 0),
    dilations: Sequence[int] = (1, 1),
    group: int = 1,
    offset_group: int = 1,
) -> Any:
    """Deformable 2-D convolution of contiguous float32/float16 torch tensors (layouts as the spec's).

    Launches on the current stream (wrap in ``gskit.backends.trt_plugin.cuda_stream(handle)`` for another
    one).

    Raises:
        ValueError: shapes that do not fit together, non-contiguous tensors, or a mismatched ``out``.
    """
    geo = geometry(tuple(x.shape), tuple(weight.shape), strides, pads, dilations)
    _check(geo, x, weight, offset, bias, mask, group, offset_group)
    out = x.new_empty((geo.n, geo.c_out, geo.oh, geo.ow)) if out is None else out
    if tuple(out.shape) != (geo.n, geo.c_out, geo.oh, geo.ow) or out.dtype != x.dtype:
        raise ValueError(
            f"out is {tuple(out.shape)} {out.dtype}, expected {(geo.n, geo.c_out, geo.oh, geo.ow)}"
        )
    if out.numel():
        meta = constexprs(
            geo.kh, geo.kw, strides, pads, dilations, group, offset_group,
            bias is not None, mask is not None, geo.block_co(group),
        )  # fmt: skip
        deform_conv2d_kernel[geo.grid(group)](
            x, weight, offset, x if bias is None else bias, x if mask is None else mask,
            geo.n, geo.c, geo.h, geo.w, geo.c_out, geo.oh, geo.ow, out, **meta,
        )  # fmt: skip
    return out


def geometry(
    x_shape: Sequence[int],
    w_shape: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
) -> Geometry:
    """Sizes of a call from the input and weight shapes and the attributes."""
    n, c, h, w = (int(d) for d in x_shape)
    c_out, _, kh, kw = (int(d) for d in w_shape)
    oh = output_size(h, kh, int(strides[0]), int(pads[0]), int(pads[2]), int(dilations[0]))
    ow = output_size(w, kw, int(strides[1]), int(pads[1]), int(pads[3]), int(dilations[1]))
    return Geometry(n, c, h, w, c_out, kh, kw, oh, ow)


def _check(
    geo: Geometry, x: Any, weight: Any, offset: Any, bias: Any, mask: Any, group: int, og: int
) -> None:
    tensors = [t for t in (x, weight, offset, bias, mask) if t is not None]
    if not all(t.is_contiguous() for t in tensors):
        raise ValueError("deform_conv2d needs contiguous tensors")
    k = geo.kh * geo.kw
    if geo.c % group or geo.c_out % group or weight.shape[1] != geo.c // group or geo.c % og:
        raise ValueError(
            f"weight {tuple(weight.shape)} does not fit x {tuple(x.shape)} with group={group}, "
            f"offset_group={og}"
        )
    if tuple(offset.shape) != (geo.n, og * k * 2, geo.oh, geo.ow):
        raise ValueError(f"offset is {tuple(offset.shape)}, expected {(geo.n, og * k * 2, geo.oh, geo.ow)}")
    if mask is not None and tuple(mask.shape) != (geo.n, og * k, geo.oh, geo.ow):
        raise ValueError(f"mask is {tuple(mask.shape)}, expected {(geo.n, og * k, geo.oh, geo.ow)}")
    if bias is not None and bias.numel() != geo.c_out:
        raise ValueError(f"bias has {bias.numel()} elements, expected {geo.c_out}")
    if max(t.numel() for t in (*tensors,)) >= 2**31:
        raise ValueError("deform_conv2d takes tensors of at most 2**31 - 1 elements (int32 sizes)")
