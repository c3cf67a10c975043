"""RMSNorm as a TensorRT Python plugin (``tensorrt.plugin``), JIT and ahead-of-time (Triton PTX).

Load with ``gskit build --plugins plugins/rms_norm`` (full TensorRT >= 10.9, Triton, torch).
Name, namespace and attributes come from ``spec.py``; the output is x's shape in the weight's dtype (x's,
or float16 for a float32 x with a float16 weight). The AOT kernel needs x's last dim fixed at build time (it
sets the launch configuration).
"""

from typing import Any

import tensorrt.plugin as trtp

from gskit.backends.trt_plugin import launch, load_plugin_folder, register_from_spec, triton_type
from gskit.backends.trt_row_plugin import fixed_rows, row_grid, row_impl

SPEC, kernel = load_plugin_folder(__file__)
#: (x, weight, y): all float32, all float16, or a float32 x with a float16 weight and output.
TYPES = "FP32|FP16|FP32, FP32|FP16|FP16, FP32|FP16|FP16"


def shape(inputs: list[Any], attrs: dict[str, Any]) -> list[Any]:
    """Mirrors ``SPEC.infer`` (per_channel_of(0, 1, dtype_of=1)): x's shape, the weight's dtype."""
    return [trtp.from_shape_expr(inputs[0].shape_expr, dtype=inputs[1].dtype)]


def aot_impl(inputs: list[Any], outputs: list[Any], attrs: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    rows, cols = fixed_rows(SPEC, inputs[0])
    ptx = kernel.aot_kernel(
        triton_type(inputs[0].dtype),
        cols.constant_value(),
        attrs["epsilon"],
        weight_dtype=triton_type(inputs[1].dtype),
    )
    return launch(ptx, grid=row_grid(ptx, rows), scalars=[rows, cols])


PLUGIN_ID = register_from_spec(
    SPEC, shape=shape, impl=row_impl(kernel.rms_norm), aot_impl=aot_impl, types=TYPES
)
