"""LayerNorm GPU kernel (Triton): float32 accumulation, the row held in registers when it fits.

``y = (x - mean) / sqrt(var + epsilon) * weight + bias`` with the biased variance, computed from the
centred values (accurate for rows with a large mean). How it is launched comes from
:func:`gskit.backends.row_launch.row_launch` (tuned on an H100): a row of up to ``MAX_FIT`` elements is
loaded once into registers (``FITS``; several short rows per program), longer rows are read in chunks three
times (mean, centred variance, output). Parameters are ordered (input pointers, int32 scalars, output
pointers, constexprs) for TensorRT's ahead-of-time Python plugins; ``epsilon`` is a constexpr.
:func:`aot_kernel` compiles the kernel as the plugin's ``aot_impl`` does, without TensorRT.
"""

from __future__ import annotations

from typing import Any

from gskit.backends.aot_ptx import TritonPtx, triton_ptx
from gskit.backends.row_launch import TRITON_ITEMSIZE, RowLaunch, row_constexprs, row_launch

try:
    import triton
    import triton.language as tl
except ImportError as err:  # optional: the GPU kernels need Triton
    raise ImportError("plugins/layer_norm/kernel.py needs Triton: pip install triton") from err


@triton.jit(do_not_specialize=["rows"])
def layer_norm_kernel(
    x_ptr, w_ptr, b_ptr, rows, cols, y_ptr,
    EPS: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr, FITS: tl.constexpr,
):  # fmt: skip
    first = tl.program_id(0).to(tl.int64) * ROWS
    if FITS:
        # ROWS whole rows in registers: x is read once.
        r = first + tl.arange(0, ROWS)
        c = tl.arange(0, BLOCK)
        c_ok = c < cols
        inside = (r < rows)[:, None] & c_ok[None, :]
        index = r[:, None] * cols + c[None, :]
        x = tl.load(x_ptr + index, mask=inside, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=1) / cols
        centered = tl.where(inside, x - mean[:, None], 0.0)
        inv_std = 1.0 / tl.sqrt(tl.sum(centered * centered, axis=1) / cols + EPS)
        w = tl.load(w_ptr + c, mask=c_ok, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + c, mask=c_ok, other=0.0).to(tl.float32)
        y = centered * inv_std[:, None] * w[None, :] + b[None, :]
        tl.store(y_ptr + index, y.to(y_ptr.dtype.element_ty), mask=inside)
    else:
        # One row per program (ROWS == 1), read in chunks: mean, centred variance, output.
        x_row = x_ptr + first * cols
        y_row = y_ptr + first * cols
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, cols, BLOCK):
            offsets = start + tl.arange(0, BLOCK)
            acc += tl.load(x_row + offsets, mask=offsets < cols, other=0.0).to(tl.float32)
        mean = tl.sum(acc, axis=0) / cols
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, cols, BLOCK):
            offsets = start + tl.arange(0, BLOCK)
            inside = offsets < cols
            x = tl.load(x_row + offsets, mask=inside, other=0.0).to(tl.float32)
            centered = tl.where(inside, x - mean, 0.0)
            acc += centered * centered
        inv_std = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / cols + EPS)
        for start in range(0, cols, BLOCK):
            offsets = start + tl.arange(0, BLOCK)
            inside = offsets < cols
            x = tl.load(x_row + offsets, mask=inside, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
            b = tl.load(b_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
            y = (x - mean) * inv_std * w + b
            tl.store(y_row + offsets, y.to(y_ptr.dtype.element_ty), mask=inside)


#: Build-time values ``aot_impl`` takes from the network, for a test compile of :func:`aot_kernel` with the
#: spec's default attributes (tests/test_trt_aot_ptx.py).
AOT_EXAMPLE: dict[str, Any] = {"cols": 768}


def aot_kernel(dtype: str, cols: int, epsilon: float, target: Any | None = None) -> TritonPtx:
    """The kernel as PTX for the plugin's ``aot_impl``: ``(x_ptr, w_ptr, b_ptr, rows, cols, y_ptr)``.

    Launch ``cdiv(rows, constexprs["ROWS"])`` programs of the PTX's ``block_x`` threads.

    Args:
        dtype: Triton type of every tensor (``fp32``, ``fp16``, ``bf16``).
        cols: x's last dim, fixed at build time (it sets the launch configuration).
        epsilon: the node's attribute.
        target: a ``triton.backends.compiler.GPUTarget``; None: the current GPU.

    Raises:
        PluginError: see :func:`gskit.backends.aot_ptx.triton_ptx`.
    """
    launch = row_launch(cols, TRITON_ITEMSIZE.get(dtype, 4))
    pointers = dict.fromkeys(("x_ptr", "w_ptr", "b_ptr", "y_ptr"), dtype)
    return triton_ptx(
        layer_norm_kernel,
        pointers,
        row_constexprs(launch, epsilon),
        target=target,
        num_warps=launch.num_warps,
    )


def layer_norm(
    x: Any,
    weight: Any,
    bias: Any,
    out: Any | None = None,
    *,
    epsilon: float = 1e-5,
    launch: RowLaunch | None = None,
) -> Any:
    """LayerNorm over the last axis of a contiguous float torch tensor; weight, bias ``(C,)``.

    Launches on the current stream (wrap in ``gskit.backends.trt_plugin.cuda_stream(handle)`` for another
    one). ``launch`` overrides the shipped launch rule (the tuning sweep uses it).

    Raises:
        ValueError: non-contiguous tensors, weight or bias not ``(C,)``, a mismatched ``out``, or more than
            2**31 - 1 rows.
    """
    out = x.new_empty(x.shape) if out is None else out
    cols = x.shape[-1] if x.dim() else 1
    _check(x, weight, bias, out, cols)
    rows = x.numel() // cols if cols else 0
    if rows:
        launch = launch or row_launch(cols, x.element_size())
        layer_norm_kernel[(launch.programs(rows),)](
            x, weight, bias, rows, cols, out, num_warps=launch.num_warps, **row_constexprs(launch, epsilon)
        )
    return out


def _check(x: Any, weight: Any, bias: Any, out: Any, cols: int) -> None:
    if not all(t.is_contiguous() for t in (x, weight, bias, out)):
        raise ValueError("layer_norm needs contiguous tensors")
    if weight.numel() != cols or bias.numel() != cols:
        raise ValueError(f"weight/bias have {weight.numel()}/{bias.numel()} elements, x's last axis {cols}")
    if out.shape != x.shape or out.dtype != x.dtype:
        raise ValueError(f"out is {tuple(out.shape)} {out.dtype}, expected {tuple(x.shape)} {x.dtype}")
    if cols and x.numel() // cols >= 2**31:
        raise ValueError("layer_norm takes at most 2**31 - 1 rows (int32 sizes)")
