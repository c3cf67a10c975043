"""LayerNorm as a TensorRT Python plugin (``tensorrt.plugin``), JIT and ahead-of-time (Triton PTX).

Load with ``gskit build --plugins plugins/layer_norm`` (full TensorRT >= 10.9, Triton, torch).
Name, namespace and attributes come from ``spec.py``; the output is x's shape and dtype. The AOT kernel
needs x's last dim fixed at build time (it sets the launch configuration).
"""

from typing import Any

import tensorrt.plugin as trtp

from gskit.backends.trt_plugin import (
    as_torch,
    cuda_stream,
    launch,
    load_plugin_folder,
    register_from_spec,
    triton_type,
)
from gskit.errors import PluginError

SPEC, kernel = load_plugin_folder(__file__)


def shape(inputs: list[Any], attrs: dict[str, Any]) -> list[Any]:
    """Mirrors ``SPEC.infer`` (same_as_input(0))."""
    return [inputs[0].like()]


def impl(inputs: list[Any], outputs: list[Any], attrs: dict[str, Any], stream: int) -> None:
    (x, w, b), (y,) = as_torch(inputs), as_torch(outputs)
    with cuda_stream(stream):
        kernel.layer_norm(x, w, b, y, epsilon=attrs["epsilon"])


def aot_impl(inputs: list[Any], outputs: list[Any], attrs: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    x = inputs[0]
    cols = x.shape_expr[x.ndim - 1]
    if cols.is_fake or not cols.is_constant:
        raise PluginError(f"{SPEC.qualified_name}: the AOT kernel needs a fixed last dim of x")
    ptx = kernel.aot_kernel(triton_type(x.dtype), cols.constant_value(), attrs["epsilon"])
    rows = x.shape_expr.numel() // cols
    return launch(ptx, grid=[trtp.cdiv(rows, ptx.constexprs["ROWS"])], scalars=[rows, cols])


PLUGIN_ID = register_from_spec(SPEC, shape=shape, impl=impl, aot_impl=aot_impl)
