"""RMSNorm GPU kernel (Triton): float32 accumulation, the row held in registers when it fits.

``y = x / sqrt(mean(x^2) + epsilon) * weight``. How it is launched comes from
:func:`gskit.backends.row_launch.row_launch` (tuned on an H100): a row of up to ``MAX_FIT`` elements is
loaded once into registers (``FITS``; several short rows per program), longer rows are read in chunks twice
(sum of squares, then scaling). Parameters are ordered (input pointers, int32 scalars, output pointers,
constexprs) for TensorRT's ahead-of-time Python plugins; ``epsilon`` is a constexpr (TensorRT passes only
integer scalars to AOT kernels). :func:`aot_kernel` compiles the kernel as the plugin's ``aot_impl`` does,
without TensorRT.
"""

from __future__ import annotations

from typing import Any

from gskit.backends.aot_ptx import TritonPtx, triton_ptx
from gskit.backends.row_launch import TRITON_ITEMSIZE, RowLaunch, row_constexprs, row_launch

try:
    import triton
    import triton.language as tl
except ImportError as err:  # optional: the GPU kernels need Triton
    raise ImportError("plugins/rms_norm/kernel.py needs Triton: pip install triton") from err


@triton.jit(do_not_specialize=["rows"])
def rms_norm_kernel(
    x_ptr, w_ptr, rows, cols, y_ptr,
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
        inv_rms = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / cols + EPS)
        w = tl.load(w_ptr + c, mask=c_ok, other=0.0).to(tl.float32)
        y = x * inv_rms[:, None] * w[None, :]
        tl.store(y_ptr + index, y.to(y_ptr.dtype.element_ty), mask=inside)
    else:
        # One row per program (ROWS == 1), read in chunks: sum of squares, then scaling.
        x_row = x_ptr + first * cols
        y_row = y_ptr + first * cols
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, cols, BLOCK):
            offsets = start + tl.arange(0, BLOCK)
            x = tl.load(x_row + offsets, mask=offsets < cols, other=0.0).to(tl.float32)
            acc += x * x
        inv_rms = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / cols + EPS)
        for start in range(0, cols, BLOCK):
            offsets = start + tl.arange(0, BLOCK)
            inside = offsets < cols
            x = tl.load(x_row + offsets, mask=inside, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
            tl.store(y_row + offsets, (x * inv_rms * w).to(y_ptr.dtype.element_ty), mask=inside)


#: Build-time values ``aot_impl`` takes from the network, for a test compile of :func:`aot_kernel` with the
#: spec's default attributes (tests/test_trt_aot_ptx.py).
AOT_EXAMPLE: dict[str, Any] = {"cols": 4096}


def aot_kernel(
    dtype: str, cols: int, epsilon: float, target: Any | None = None, *, weight_dtype: str | None = None
) -> TritonPtx:
    """The kernel as PTX for the plugin's ``aot_impl``: parameters ``(x_ptr, w_ptr, rows, cols, y_ptr)``.

    Launch ``cdiv(rows, constexprs["ROWS"])`` programs of the PTX's ``block_x`` threads.

    Args:
        dtype: Triton type of x (``fp32``, ``fp16``, ``bf16``), and of the weight and y unless
            ``weight_dtype``.
        cols: x's last dim, fixed at build time (it sets the launch configuration).
        epsilon: the node's attribute.
        target: a ``triton.backends.compiler.GPUTarget``; None: the current GPU.
        weight_dtype: Triton type of the weight and y when it differs from x's (float32 x, float16 weight).

    Raises:
        PluginError: see :func:`gskit.backends.aot_ptx.triton_ptx`.
    """
    launch = row_launch(cols, TRITON_ITEMSIZE.get(dtype, 4))
    out = weight_dtype or dtype
    pointers = {"x_ptr": dtype, "w_ptr": out, "y_ptr": out}
    return triton_ptx(
        rms_norm_kernel, pointers, row_constexprs(launch, epsilon), target=target, num_warps=launch.num_warps
    )


def rms_norm(
    x: Any, weight: Any, out: Any | None = None, *, epsilon: float = 1e-5, launch: RowLaunch | None = None
) -> Any:
    """RMSNorm over the last axis of a contiguous float torch tensor; ``weight`` is ``(C,)``.

    Launches on the current stream (wrap in ``gskit.backends.trt_plugin.cuda_stream(handle)`` for another
    one). ``launch`` overrides the shipped launch rule (the tuning sweep uses it). The output has the
    weight's dtype (x's, or float16 for a float32 x with a float16 weight).

    Raises:
        ValueError: non-contiguous tensors, a weight that is not ``(C,)``, a mismatched ``out``, or more than
            2**31 - 1 rows.
    """
    out = x.new_empty(x.shape, dtype=weight.dtype) if out is None else out
    cols = x.shape[-1] if x.dim() else 1
    _check(x, weight, out, cols)
    rows = x.numel() // cols if cols else 0
    if rows:
        launch = launch or row_launch(cols, x.element_size())
        rms_norm_kernel[(launch.programs(rows),)](
            x, weight, rows, cols, out, num_warps=launch.num_warps, **row_constexprs(launch, epsilon)
        )
    return out


def _check(x: Any, weight: Any, out: Any, cols: int) -> None:
    if not (x.is_contiguous() and weight.is_contiguous() and out.is_contiguous()):
        raise ValueError("rms_norm needs contiguous tensors")
    if weight.numel() != cols:
        raise ValueError(f"weight has {weight.numel()} elements, x's last axis {cols}")
    if out.shape != x.shape or out.dtype != weight.dtype:
        raise ValueError(f"out is {tuple(out.shape)} {out.dtype}, expected {tuple(x.shape)} {weight.dtype}")
    if cols and x.numel() // cols >= 2**31:
        raise ValueError("rms_norm takes at most 2**31 - 1 rows (int32 sizes)")
