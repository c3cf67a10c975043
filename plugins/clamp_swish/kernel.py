"""ClampSwish GPU kernel (Triton): ``y = x' * sigmoid(x')`` with ``x' = max(x, 0)``, computed in float32.

The kernel's parameters are ordered (input pointers, int32 scalars, output pointers, constexprs), the
calling convention of TensorRT's ahead-of-time Python plugins, so ``trt_plugin.py`` can hand the same
kernel to TensorRT as PTX: :func:`aot_kernel` compiles it the way the plugin's ``aot_impl`` does,
without TensorRT (tests/test_trt_aot_ptx.py checks the PTX on a CPU).
"""

from __future__ import annotations

from typing import Any

from gskit.backends.aot_ptx import TritonPtx, triton_ptx

try:
    import triton
    import triton.language as tl
except ImportError as err:  # optional: the GPU kernels need Triton
    raise ImportError("plugins/clamp_swish/kernel.py needs Triton: pip install triton") from err

#: Elements per program.
BLOCK = 1024


@triton.jit
def clamp_swish_kernel(x_ptr, n, y_ptr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n
    x = tl.load(x_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
    x = tl.where(x < 0.0, 0.0, x)  # keeps NaN, like numpy's maximum
    y = x / (1.0 + tl.exp(-x))
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=inside)


def grid(n: int) -> tuple[int]:
    """Programs for ``n`` elements."""
    return (triton.cdiv(n, BLOCK),)


#: Build-time values ``aot_impl`` takes from the network, for a test compile of :func:`aot_kernel` with the
#: spec's default attributes (tests/test_trt_aot_ptx.py).
AOT_EXAMPLE: dict[str, Any] = {}


def aot_kernel(dtype: str, target: Any | None = None) -> TritonPtx:
    """The kernel as PTX for the plugin's ``aot_impl``: parameters ``(x_ptr, n, y_ptr)``.

    Args:
        dtype: Triton type of x and y (``fp32``, ``fp16``).
        target: a ``triton.backends.compiler.GPUTarget``; None: the current GPU.

    Raises:
        PluginError: see :func:`gskit.backends.aot_ptx.triton_ptx`.
    """
    return triton_ptx(clamp_swish_kernel, {"x_ptr": dtype, "y_ptr": dtype}, {"BLOCK": BLOCK}, target=target)


def clamp_swish(x: Any, out: Any | None = None) -> Any:
    """ClampSwish of a contiguous float32/float16 torch tensor into ``out`` (allocated when None).

    Launches on the current stream (wrap in ``gskit.backends.trt_plugin.cuda_stream(handle)`` for another
    one).

    Raises:
        ValueError: non-contiguous tensors, mismatched shapes or dtypes, or more than 2**31 - 1 elements.
    """
    out = x.new_empty(x.shape) if out is None else out
    _check(x, out)
    if x.numel():
        clamp_swish_kernel[grid(x.numel())](x, x.numel(), out, BLOCK=BLOCK)
    return out


def _check(x: Any, out: Any) -> None:
    if not (x.is_contiguous() and out.is_contiguous()):
        raise ValueError("clamp_swish needs contiguous tensors")
    if out.shape != x.shape or out.dtype != x.dtype:
        raise ValueError(f"out is {tuple(out.shape)} {out.dtype}, expected {tuple(x.shape)} {x.dtype}")
    if x.numel() >= 2**31:
        raise ValueError("clamp_swish takes at most 2**31 - 1 elements (int32 sizes)")
