"""LayerNorm as a TensorRT Python plugin (``tensorrt.plugin``), JIT and ahead-of-time (Triton PTX).

Load with ``gskit build --plugins plugins/layer_norm`` (full TensorRT >= 10.9, Triton, torch).
Name, namespace and attributes come from ``spec.py``; the output is x's shape and dtype. The AOT kernel
needs x's last dim fixed at build time (it sets the launch configuration).
"""

from typing import Any

from gskit.backends.trt_plugin import launch, load_plugin_folder, register_from_spec, triton_type
from gskit.backends.trt_row_plugin import fixed_rows, row_grid, row_impl

SPEC, kernel = load_plugin_folder(__file__)


def shape(inputs: list[Any], attrs: dict[str, Any]) -> list[Any]:
    """Mirrors ``SPEC.infer`` (per_channel_of(0, 1)): x's shape and dtype. The weight's last dim, which that
    rule takes where onnx cannot infer x's, is never needed here: TensorRT always knows x's shape."""
    return [inputs[0].like()]


def aot_impl(inputs: list[Any], outputs: list[Any], attrs: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    rows, cols = fixed_rows(SPEC, inputs[0])
    ptx = kernel.aot_kernel(triton_type(inputs[0].dtype), cols.constant_value(), attrs["epsilon"])
    return launch(ptx, grid=row_grid(ptx, rows), scalars=[rows, cols])


PLUGIN_ID = register_from_spec(SPEC, shape=shape, impl=row_impl(kernel.layer_norm), aot_impl=aot_impl)
