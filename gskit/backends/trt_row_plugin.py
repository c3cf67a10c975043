"""What the row-wise norm plugins (LayerNorm, RMSNorm) share on TensorRT's side.

Their kernels see x as rows of its last axis: the JIT ``impl`` calls the kernel module's wrapper on
TensorRT's stream (:func:`row_impl`), and the ``aot_impl`` needs the row length fixed at build time, since it
sets the launch configuration (:func:`fixed_rows`), and launches one program per ``ROWS`` rows
(:func:`row_grid`). Each plugin's ``trt_plugin.py`` keeps its own output rule, its ``aot_kernel`` call and its
``launch(..., scalars=[rows, cols])``, which tests/test_trt_aot_ptx.py reads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gskit.backends.aot_ptx import TritonPtx
from gskit.backends.trt_plugin import ImplFn, as_torch, cuda_stream, import_trtp
from gskit.errors import PluginError
from gskit.plugin.spec import PluginSpec


def row_impl(norm: Callable[..., None]) -> ImplFn:
    """The JIT ``impl`` of a norm plugin: ``norm(*inputs, y, epsilon=attrs["epsilon"])`` on torch tensors
    sharing TensorRT's memory, launched on TensorRT's stream."""

    def impl(inputs: list[Any], outputs: list[Any], attrs: Any, stream: int) -> None:
        tensors, (y,) = as_torch(inputs), as_torch(outputs)
        with cuda_stream(stream):
            norm(*tensors, y, epsilon=attrs["epsilon"])

    return impl


def fixed_rows(spec: PluginSpec, x: Any) -> tuple[Any, Any]:
    """``(rows, cols)`` of the ``TensorDesc`` x seen as rows of its last axis, as shape expressions.

    Raises:
        PluginError: x's last dim is not fixed at build time (the AOT kernel's launch configuration needs it).
    """
    cols = x.shape_expr[x.ndim - 1]
    if cols.is_fake or not cols.is_constant:
        raise PluginError(f"{spec.qualified_name}: the AOT kernel needs a fixed last dim of x")
    return x.shape_expr.numel() // cols, cols


def row_grid(ptx: TritonPtx, rows: Any) -> list[Any]:
    """The launch grid of a row kernel: one program per ``ptx.constexprs["ROWS"]`` rows."""
    return [import_trtp(aot=True).cdiv(rows, ptx.constexprs["ROWS"])]
