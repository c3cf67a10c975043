"""DeformConv2d GPU kernel (Triton): deformable convolution as an implicit matrix product (float32 sums).

One program computes a tile of ``BLOCK_CO`` output channels (within one group) by ``BLOCK_P`` output
pixels of one image. The reduction runs over (offset group, kernel tap, input channel): for each tap the
sampling positions of the tile's pixels are computed once (offset and mask read once per offset group),
then ``BLOCK_C`` input channels at a time are sampled by bilinear interpolation (zero outside the image)
into a ``(BLOCK_C, BLOCK_P)`` tile held in registers, and ``tl.dot`` multiplies the ``(BLOCK_CO,
BLOCK_C)`` weight tile by it on the tensor cores: the im2col matrix of the fast implementations, never
written to memory. float32 inputs use ``PRECISION`` (``ieee``, or ``tf32x3``: three TF32 products, float32
accuracy); half types multiply in their own type.

Parameters are ordered (input pointers, int32 sizes, output pointer, constexprs), the calling convention
of TensorRT's ahead-of-time Python plugins (:func:`aot_kernel` compiles it as the plugin's ``aot_impl``
does, without TensorRT). Absent ``bias``/``mask`` are switched off by constexpr flags (any pointer may
be passed in their place). The tile sizes come from :func:`fused_launch`, tuned on an H100
(``bench/tune_kernels.py``).

The JIT wrapper also runs the two-step form of the fast implementations (``DcnLaunch(method="im2col")``):
:func:`deform_im2col_kernel` writes the sample matrix, ``torch.matmul`` (cuBLAS) multiplies it by the weights.
:func:`dcn_launch`, the JIT rule, picks it for wide groups, where it was 2.3-5.3x faster than the fused kernel
on the H100; the AOT kernel (TensorRT) stays the fused one. Both kernels share the sampling code
(:func:`_tap_corners`, :func:`_sample`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from gskit.backends.aot_ptx import TritonPtx, triton_ptx

try:
    import triton
    import triton.language as tl
except ImportError as err:  # optional: the GPU kernels need Triton
    raise ImportError("plugins/deform_conv2d/kernel.py needs Triton: pip install triton") from err


@dataclass(frozen=True)
class DcnLaunch:
    """Tile sizes and warps of one DeformConv2d launch.

    Attributes:
        block_co: output channels per program (>= 16: ``tl.dot`` needs 16).
        block_p: output pixels per program.
        block_c: input channels sampled per step (the ``tl.dot`` reduction length).
        num_warps: warps per program.
        num_stages: software-pipelining depth of the channel loop (shared memory grows with it).
        precision: ``tl.dot`` input precision for float32 inputs (``ieee`` or ``tf32x3``).
        method: ``fused`` (:func:`deform_conv2d_kernel`, the AOT kernel too) or ``im2col`` (JIT only:
            :func:`deform_im2col_kernel` writes the sample matrix in ``BLOCK_C`` by ``BLOCK_P`` tiles, then
            ``torch.matmul`` (cuBLAS) multiplies it by the weights; ``block_co`` and ``precision`` unused).
    """

    block_co: int
    block_p: int
    block_c: int
    num_warps: int
    num_stages: int = 2
    precision: str = "tf32x3"
    method: str = "fused"


@triton.jit
def _tap_corners(
    off_ptr, m_ptr, tap, npix, p, p_ok, oh, ow, u, v, H, W, SH, SW, PT, PL, DH, DW, HAS_MASK: tl.constexpr
):  # fmt: skip
    """Bilinear corners of one tap for a row of pixels: the top-left corner's index in the image, and per
    corner the weight (mask and bounds folded in) and whether it lies inside the image."""
    dy = tl.load(off_ptr + (tap * 2) * npix + p, mask=p_ok, other=0.0).to(tl.float32)
    dx = tl.load(off_ptr + (tap * 2 + 1) * npix + p, mask=p_ok, other=0.0).to(tl.float32)
    py = (oh * SH - PT + u * DH).to(tl.float32) + dy
    px = (ow * SW - PL + v * DW).to(tl.float32) + dx
    y0f = tl.floor(py)
    x0f = tl.floor(px)
    fy = py - y0f
    fx = px - x0f
    # Positions a pixel or more outside the image (and NaN) sample zero: clamp before the int conversion so
    # that huge offsets cannot overflow it.
    y0 = tl.minimum(tl.maximum(y0f, -2.0), H + 1.0).to(tl.int32)
    x0 = tl.minimum(tl.maximum(x0f, -2.0), W + 1.0).to(tl.int32)
    in_y0 = (y0 >= 0) & (y0 < H)
    in_y1 = (y0 >= -1) & (y0 < H - 1)
    in_x0 = (x0 >= 0) & (x0 < W)
    in_x1 = (x0 >= -1) & (x0 < W - 1)
    scale = tl.where(p_ok & (py == py) & (px == px), 1.0, 0.0)
    if HAS_MASK:
        scale *= tl.load(m_ptr + tap * npix + p, mask=p_ok, other=0.0).to(tl.float32)
    w00 = tl.where(in_y0 & in_x0, (1.0 - fy) * (1.0 - fx) * scale, 0.0)
    w01 = tl.where(in_y0 & in_x1, (1.0 - fy) * fx * scale, 0.0)
    w10 = tl.where(in_y1 & in_x0, fy * (1.0 - fx) * scale, 0.0)
    w11 = tl.where(in_y1 & in_x1, fy * fx * scale, 0.0)
    ok00 = p_ok & in_y0 & in_x0
    ok01 = p_ok & in_y0 & in_x1
    ok10 = p_ok & in_y1 & in_x0
    ok11 = p_ok & in_y1 & in_x1
    return y0 * W + x0, w00, w01, w10, w11, ok00, ok01, ok10, ok11


@triton.jit
def _sample(x_ptr, n, C, H, W, ci, c_ok, corner, w00, w01, w10, w11, ok00, ok01, ok10, ok11):
    """The (channels, pixels) tile of bilinear samples of image n at one tap's corners, in float32."""
    image = x_ptr + ((n * C + ci) * H * W)[:, None] + corner[None, :]
    c2 = c_ok[:, None]
    sample = w00[None, :] * tl.load(image, mask=c2 & ok00[None, :], other=0.0).to(tl.float32)
    sample += w01[None, :] * tl.load(image + 1, mask=c2 & ok01[None, :], other=0.0).to(tl.float32)
    sample += w10[None, :] * tl.load(image + W, mask=c2 & ok10[None, :], other=0.0).to(tl.float32)
    sample += w11[None, :] * tl.load(image + W + 1, mask=c2 & ok11[None, :], other=0.0).to(tl.float32)
    return sample


@triton.jit
def deform_conv2d_kernel(
    x_ptr, w_ptr, off_ptr, b_ptr, m_ptr,
    N, C, H, W, C_OUT, OH, OW,
    y_ptr,
    KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
    PT: tl.constexpr, PL: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr,
    GROUP: tl.constexpr, OFFSET_GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr,
    BLOCK_CO: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    TAPS = KH * KW
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
    c_lo = g * c_per_group
    c_hi = c_lo + c_per_group
    acc = tl.zeros([BLOCK_CO, BLOCK_P], dtype=tl.float32)
    # The offset groups that share channels with this group: each gives its own sampling positions.
    for og in range(c_lo // c_per_offset_group, (c_hi - 1) // c_per_offset_group + 1):
        seg_lo = tl.maximum(c_lo, og * c_per_offset_group)
        seg_hi = tl.minimum(c_hi, (og + 1) * c_per_offset_group)
        # A run-time loop over the taps: one tl.dot in the loop body keeps the code (and compile) small.
        for k in range(TAPS):
            tap = (n * OFFSET_GROUP + og) * TAPS + k
            corner, w00, w01, w10, w11, ok00, ok01, ok10, ok11 = _tap_corners(
                off_ptr, m_ptr, tap, npix, p, p_ok, oh, ow, k // KW, k % KW, H, W, SH, SW, PT, PL, DH, DW,
                HAS_MASK,
            )  # fmt: skip
            for c0 in range(seg_lo, seg_hi, BLOCK_C):
                ci = c0 + tl.arange(0, BLOCK_C)
                c_ok = ci < seg_hi
                sample = _sample(
                    x_ptr, n, C, H, W, ci, c_ok, corner, w00, w01, w10, w11, ok00, ok01, ok10, ok11
                )
                w_index = (co[:, None] * c_per_group + (ci - c_lo)[None, :]) * TAPS + k
                w = tl.load(w_ptr + w_index, mask=co_ok[:, None] & c_ok[None, :], other=0.0)
                acc = tl.dot(w, sample.to(w.dtype), acc, input_precision=PRECISION)
    if HAS_BIAS:
        acc += tl.load(b_ptr + co, mask=co_ok, other=0.0).to(tl.float32)[:, None]
    y_index = (n * C_OUT + co[:, None]) * npix + p[None, :]
    tl.store(y_ptr + y_index, acc.to(y_ptr.dtype.element_ty), mask=co_ok[:, None] & p_ok[None, :])


@triton.jit
def deform_im2col_kernel(
    x_ptr, off_ptr, m_ptr,
    C, H, W, OH, OW,
    col_ptr,
    KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
    PT: tl.constexpr, PL: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr,
    OFFSET_GROUP: tl.constexpr, HAS_MASK: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr,
):  # fmt: skip
    """The im2col matrix ``col[n, ci * KH * KW + k, pixel]`` of the samples (mask applied), in x's dtype."""
    TAPS = KH * KW
    c_per_offset_group = C // OFFSET_GROUP
    c_blocks = tl.cdiv(c_per_offset_group, BLOCK_C)
    q = tl.program_id(0)  # images x offset groups x taps x channel blocks: can pass grid_y's 65535
    c_local = (q % c_blocks) * BLOCK_C + tl.arange(0, BLOCK_C)
    k = (q // c_blocks) % TAPS
    og = (q // (c_blocks * TAPS)) % OFFSET_GROUP
    n = (q // (c_blocks * TAPS * OFFSET_GROUP)).to(tl.int64)
    npix = OH * OW
    p = tl.program_id(1) * BLOCK_P + tl.arange(0, BLOCK_P)
    p_ok = p < npix
    tap = (n * OFFSET_GROUP + og) * TAPS + k
    corner, w00, w01, w10, w11, ok00, ok01, ok10, ok11 = _tap_corners(
        off_ptr, m_ptr, tap, npix, p, p_ok, p // OW, p % OW, k // KW, k % KW, H, W, SH, SW, PT, PL, DH, DW,
        HAS_MASK,
    )  # fmt: skip
    c_ok = c_local < c_per_offset_group
    ci = og * c_per_offset_group + c_local
    sample = _sample(x_ptr, n, C, H, W, ci, c_ok, corner, w00, w01, w10, w11, ok00, ok01, ok10, ok11)
    col_index = ((n * C + ci) * TAPS + k)[:, None] * npix + p[None, :]
    tl.store(col_ptr + col_index, sample.to(col_ptr.dtype.element_ty), mask=c_ok[:, None] & p_ok[None, :])


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

    def grid(self, group: int, launch: DcnLaunch) -> tuple[int, int]:
        """(pixel tiles, images x groups x channel tiles)."""
        co_blocks = triton.cdiv(self.c_out // group, launch.block_co)
        return (triton.cdiv(self.oh * self.ow, launch.block_p), self.n * group * co_blocks)


def fused_launch(c_out_per_group: int, c_per_group: int, itemsize: int = 4) -> DcnLaunch:
    """The fused kernel's tile rule (the AOT kernel's, and the JIT one's for narrow groups): from the channels
    per group and the element size, known at build time.

    Read off a sweep of :func:`dcn_candidates` on an H100 (``bench/tune_kernels.py``, results in
    ``bench/gpu_runs/``): 64 pixels by as many output channels as the group has (at most 128 for float32, 64
    for half types; each channel tile samples the input again), 32 input channels per step for float32 (16
    for half types and narrow groups), 4 warps; float32 unpipelined (``num_stages=1`` was up to 2.4x faster
    than 2: less shared memory, more programs per multiprocessor), half types two stages.
    """
    half = itemsize < 4
    block_co = min(64 if half else 128, max(16, triton.next_power_of_2(c_out_per_group)))
    block_c = 16 if half or c_per_group <= 16 else 32
    return DcnLaunch(block_co, 64, block_c, 4, 2 if half else 1, "tf32x3")


#: The JIT rule's im2col launch: 16 channels by 128 pixels per sampling program, 4 warps (of the three im2col
#: tilings swept, the fastest on 7 of the 8 ResNet-50-stage shape/dtype pairs and 1.5% behind on the other).
IM2COL_LAUNCH = DcnLaunch(0, 128, 16, 4, 2, "tf32x3", "im2col")
#: Groups at least this wide (input and output channels) take :data:`IM2COL_LAUNCH` in the JIT wrapper.
IM2COL_MIN_CHANNELS = 128


def dcn_launch(c_out_per_group: int, c_per_group: int, itemsize: int = 4) -> DcnLaunch:
    """The JIT wrapper's rule: :data:`IM2COL_LAUNCH` for groups of :data:`IM2COL_MIN_CHANNELS` channels or
    more (in and out), else :func:`fused_launch`.

    From the second H100 sweep (``bench/gpu_runs/h100-2026-11-27-dcn``): on the ResNet-50 stage shapes
    (128-512 channels) the im2col method took 0.19-0.44x the fused kernel's best time; on the corpus's
    shapes (3-6 channels) 2.0-8.9x its time (three launches for 0.7k-13k multiply-adds: launches dominate).
    Widths between 6 and 128 were not timed; 128 is the narrowest where im2col won. ``itemsize`` does not
    change the choice (both float32 and float16 agree on every timed shape).
    """
    if min(c_out_per_group, c_per_group) >= IM2COL_MIN_CHANNELS:
        return IM2COL_LAUNCH
    return fused_launch(c_out_per_group, c_per_group, itemsize)


def dcn_candidates(c_out_per_group: int, c_per_group: int, itemsize: int = 4) -> list[DcnLaunch]:
    """Tile sizes the tuning sweep times (:func:`fused_launch`'s and :func:`dcn_launch`'s picks among them).

    Output-channel tiles from 32 (64 for groups of 128 or more channels) up to the group's channels (at most
    256) by 64 or 128 pixels by 16 or 32 channels; the rule's tile at other pipelining depths; for float32
    also the rule's channel tile in ``ieee`` precision (plain float32 products, no tensor cores).
    """
    rule = fused_launch(c_out_per_group, c_per_group, itemsize)
    found = {rule}
    widest = max(16, triton.next_power_of_2(c_out_per_group))
    for block_co in (32, 64, 128, 256):
        if block_co > max(32, widest) or (block_co == 32 and widest >= 128):
            continue
        for block_p in (64, 128):
            for block_c in (16, 32) if c_per_group > 16 else (16,):
                found.add(DcnLaunch(block_co, block_p, block_c, _warps(block_co, block_p), 2, "tf32x3"))
    found |= {replace(rule, num_stages=stages) for stages in (1, 2, 3)}
    if itemsize == 4:
        found |= {
            replace(c, precision="ieee") for c in found if c.block_co == rule.block_co and c.num_stages == 2
        }
    found |= set(IM2COL_CANDIDATES)
    return sorted(
        found,
        key=lambda c: (c.method, c.precision, c.block_co, c.block_p, c.block_c, c.num_warps, c.num_stages),
    )


#: The im2col + cuBLAS tilings the sweep times (JIT only; see :class:`DcnLaunch`).
IM2COL_CANDIDATES = (
    DcnLaunch(0, 64, 32, 4, 2, "tf32x3", "im2col"),
    IM2COL_LAUNCH,
    DcnLaunch(0, 128, 32, 8, 2, "tf32x3", "im2col"),
)


def _warps(block_co: int, block_p: int) -> int:
    """4 warps for tiles of up to 64x128 outputs, else 8 (the accumulator lives in registers)."""
    return 4 if block_co * block_p <= 8192 else 8


def output_size(size: int, kernel: int, stride: int, pad_begin: int, pad_end: int, dilation: int) -> int:
    """Spatial output size of a convolution (the same formula as the spec's)."""
    return (size + pad_begin + pad_end - dilation * (kernel - 1) - 1) // stride + 1


def constexprs(
    kh: int, kw: int, strides: Sequence[int], pads: Sequence[int], dilations: Sequence[int],
    group: int, offset_group: int, has_bias: bool, has_mask: bool, launch: DcnLaunch, itemsize: int,
) -> dict[str, Any]:  # fmt: skip
    """The kernel's compile-time parameters (``itemsize``: bytes per element; half types ignore
    ``launch.precision``)."""
    return {
        "KH": int(kh), "KW": int(kw), "SH": int(strides[0]), "SW": int(strides[1]),
        "PT": int(pads[0]), "PL": int(pads[1]), "DH": int(dilations[0]), "DW": int(dilations[1]),
        "GROUP": int(group), "OFFSET_GROUP": int(offset_group),
        "HAS_BIAS": bool(has_bias), "HAS_MASK": bool(has_mask),
        "BLOCK_CO": launch.block_co, "BLOCK_P": launch.block_p, "BLOCK_C": launch.block_c,
        "PRECISION": launch.precision if itemsize == 4 else "tf32",
    }  # fmt: skip


#: Build-time values ``aot_impl`` takes from the network, for a test compile of :func:`aot_kernel` with the
#: spec's default attributes (tests/test_trt_aot_ptx.py): groups wide enough that :func:`dcn_launch` picks
#: the JIT-only im2col method, which the AOT kernel must not take.
AOT_EXAMPLE: dict[str, Any] = {"weight_shape": (IM2COL_MIN_CHANNELS, IM2COL_MIN_CHANNELS, 3, 3)}


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

    Parameters ``(x_ptr, w_ptr, off_ptr, b_ptr, m_ptr, N, C, H, W, C_OUT, OH, OW, y_ptr)``; launch
    ``(cdiv(OH * OW, BLOCK_P), N * group * cdiv(C_out / group, BLOCK_CO))`` programs with the result's
    ``constexprs``.

    Args:
        dtype: Triton type of every tensor (``fp32``, ``fp16``, ``bf16``).
        weight_shape: ``(C_out, C/group, kH, kW)``, fixed at build time.
        strides, pads, dilations, group, offset_group: the node's attributes.
        target: a ``triton.backends.compiler.GPUTarget``; None: the current GPU.

    Raises:
        PluginError: see :func:`gskit.backends.aot_ptx.triton_ptx`.
    """
    c_out, c_per_group, kh, kw = (int(d) for d in weight_shape)
    itemsize = 4 if dtype == "fp32" else 2
    launch = fused_launch(c_out // group, c_per_group, itemsize)  # the im2col method is JIT only
    meta = constexprs(kh, kw, strides, pads, dilations, group, offset_group, True, True, launch, itemsize)
    names = ("x_ptr", "w_ptr", "off_ptr", "b_ptr", "m_ptr", "y_ptr")
    return triton_ptx(
        deform_conv2d_kernel,
        dict.fromkeys(names, dtype),
        meta,
        target=target,
        num_warps=launch.num_warps,
        num_stages=launch.num_stages,
    )


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
    launch: DcnLaunch | None = None,
) -> Any:
    """Deformable 2-D convolution of contiguous float torch tensors (layouts as the spec's).

    Launches on the current stream (wrap in ``gskit.backends.trt_plugin.cuda_stream(handle)`` for another
    one). ``launch`` overrides the shipped rule, :func:`dcn_launch` (the tuning sweep uses it).

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
    launch = launch or dcn_launch(geo.c_out // group, geo.c // group, x.element_size())
    if out.numel() and launch.method == "im2col":
        _im2col_matmul(
            geo, x, weight, offset, bias, mask, out, strides, pads, dilations, group, offset_group, launch
        )
    elif out.numel():
        meta = constexprs(
            geo.kh, geo.kw, strides, pads, dilations, group, offset_group,
            bias is not None, mask is not None, launch, x.element_size(),
        )  # fmt: skip
        deform_conv2d_kernel[geo.grid(group, launch)](
            x, weight, offset, x if bias is None else bias, x if mask is None else mask,
            geo.n, geo.c, geo.h, geo.w, geo.c_out, geo.oh, geo.ow, out,
            num_warps=launch.num_warps, num_stages=launch.num_stages, **meta,
        )  # fmt: skip
    return out


#: Most elements of the im2col matrix held at once: images are processed in chunks past it.
IM2COL_MAX_ELEMENTS = 1 << 26


def _im2col_matmul(
    geo: Geometry, x: Any, weight: Any, offset: Any, bias: Any, mask: Any, out: Any,
    strides: Sequence[int], pads: Sequence[int], dilations: Sequence[int], group: int, offset_group: int,
    launch: DcnLaunch,
) -> None:  # fmt: skip
    """``out = weight @ im2col(x) + bias`` per group, a chunk of images at a time (see :class:`DcnLaunch`)."""
    import torch

    taps = geo.kh * geo.kw
    npix = geo.oh * geo.ow
    rows = geo.c * taps
    chunk = max(1, min(geo.n, IM2COL_MAX_ELEMENTS // max(rows * npix, 1)))
    cols = x.new_empty((chunk, rows, npix))
    meta = constexprs(
        geo.kh, geo.kw, strides, pads, dilations, group, offset_group, False, mask is not None, launch, 4
    )
    for name in ("GROUP", "HAS_BIAS", "BLOCK_CO", "PRECISION"):
        del meta[name]
    weights = weight.reshape(group, geo.c_out // group, (geo.c // group) * taps)
    c_blocks = triton.cdiv(geo.c // offset_group, launch.block_c)
    for first in range(0, geo.n, chunk):
        count = min(chunk, geo.n - first)
        grid = (count * offset_group * taps * c_blocks, triton.cdiv(npix, launch.block_p))
        deform_im2col_kernel[grid](
            x[first : first + count], offset[first : first + count],
            x if mask is None else mask[first : first + count],
            geo.c, geo.h, geo.w, geo.oh, geo.ow, cols,
            num_warps=launch.num_warps, num_stages=launch.num_stages, **meta,
        )  # fmt: skip
        products = out[first : first + count].view(count, group, geo.c_out // group, npix)
        torch.matmul(weights, cols[:count].view(count, group, -1, npix), out=products)
    if bias is not None:
        out += bias.view(1, -1, 1, 1)


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
