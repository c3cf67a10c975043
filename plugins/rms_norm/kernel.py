"""RMSNorm GPU kernel (Triton): one program per row of the last axis, float32 accumulation.

``y = x / sqrt(mean(x^2) + epsilon) * weight``. Rows of any length: the row is read in chunks of
``BLOCK`` twice (sum of squares, then scaling). Parameters are ordered (input pointers, int32 scalars,
output pointers, constexprs) for TensorRT's ahead-of-time Python plugins; ``epsilon`` is a constexpr
(TensorRT passes only integer scalars to AOT kernels). :func:`aot_kernel` compiles the kernel as the
plugin's ``aot_impl`` does, without TensorRT.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gskit.backends.trt_plugin import TritonPtx, triton_ptx

try:
    import triton
    import triton.language as tl
except ImportError as err:  # optional: the GPU kernels need Triton
    raise ImportError("plugins/rms_norm/kernel.py needs Triton: pip install triton") from err

#: Largest chunk of a row read at once.
MAX_BLOCK = 1024


@triton.jit
def rms_norm_kernel(x_ptr, w_ptr, cols, y_ptr, EPS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * cols
    y_row = y_ptr + row * cols
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


def block_size(cols: int) -> int:
    """Chunk length for rows of ``cols`` elements: the next power of two, at most MAX_BLOCK."""
    return min(MAX_BLOCK, triton.next_power_of_2(max(int(cols), 1)))


def epsilon_constant(epsilon: float) -> float:
    """``epsilon`` rounded to float32, as the ONNX attribute holds it."""
    return float(np.float32(epsilon))


#: Build-time values ``aot_impl`` takes from the network, for a test compile of :func:`aot_kernel` with the
#: spec's default attributes (tests/test_trt_aot_ptx.py).
AOT_EXAMPLE: dict[str, Any] = {"cols": 4096}


def aot_kernel(
    dtype: str, cols: int, epsilon: float, target: Any | None = None, *, weight_dtype: str | None = None
) -> TritonPtx:
    """The kernel as PTX for the plugin's ``aot_impl``: parameters ``(x_ptr, w_ptr, cols, y_ptr)``.

    Args:
        dtype: Triton type of x (``fp32``, ``fp16``), and of the weight and y unless ``weight_dtype``.
        cols: x's last dim, fixed at build time (it sets the chunk length).
        epsilon: the node's attribute.
        target: a ``triton.backends.compiler.GPUTarget``; None: the current GPU.
        weight_dtype: Triton type of the weight and y when it differs from x's (float32 x, float16 weight).

    Raises:
        PluginError: see :func:`gskit.backends.trt_plugin.triton_ptx`.
    """
    out = weight_dtype or dtype
    pointers = {"x_ptr": dtype, "w_ptr": out, "y_ptr": out}
    constexprs = {"EPS": epsilon_constant(epsilon), "BLOCK": block_size(cols)}
    return triton_ptx(rms_norm_kernel, pointers, constexprs, target=target)


def rms_norm(x: Any, weight: Any, out: Any | None = None, *, epsilon: float = 1e-5) -> Any:
    """RMSNorm over the last axis of a contiguous float32/float16 torch tensor; ``weight`` is ``(C,)``.

    The output has the weight's dtype (x's, or float16 for a float32 x with a float16 weight).

    Launches on the current stream (wrap in ``gskit.backends.trt_plugin.cuda_stream(handle)`` for another
    one).

    Raises:
        ValueError: non-contiguous tensors, a weight that is not ``(C,)``, or a mismatched ``out``.
    """
    out = x.new_empty(x.shape, dtype=weight.dtype) if out is None else out
    cols = x.shape[-1] if x.dim() else 1
    _check(x, weight, out, cols)
    rows = x.numel() // cols if cols else 0
    if rows:
        rms_norm_kernel[(rows,)](x, weight, cols, out, EPS=epsilon_constant(epsilon), BLOCK=block_size(cols))
    return out


def _check(x: Any, weight: Any, out: Any, cols: int) -> None:
    if not (x.is_contiguous() and weight.is_contiguous() and out.is_contiguous()):
        raise ValueError("rms_norm needs contiguous tensors")
    if weight.numel() != cols:
        raise ValueError(f"weight has {weight.numel()} elements, x's last axis {cols}")
    if out.shape != x.shape or out.dtype != weight.dtype:
        raise ValueError(f"out is {tuple(out.shape)} {out.dtype}, expected {tuple(x.shape)} {weight.dtype}")
