"""ClampSwish as a TensorRT Python plugin (``tensorrt.plugin``), JIT and ahead-of-time (Triton PTX).

Load with ``gskit build --plugins plugins/clamp_swish`` (full TensorRT >= 10.9, Triton, torch).
Name, namespace and attributes come from ``spec.py``; the output is the input's shape and dtype.
"""

from typing import Any

from gskit.backends.trt_plugin import (
    as_torch,
    cuda_stream,
    launch,
    load_plugin_folder,
    register_from_spec,
    triton_type,
)

SPEC, kernel = load_plugin_folder(__file__)


def shape(inputs: list[Any], attrs: dict[str, Any]) -> list[Any]:
    """Mirrors ``SPEC.infer`` (same_as_input(0))."""
    return [inputs[0].like()]


def impl(inputs: list[Any], outputs: list[Any], attrs: dict[str, Any], stream: int) -> None:
    (x,), (y,) = as_torch(inputs), as_torch(outputs)
    with cuda_stream(stream):
        kernel.clamp_swish(x, y)


def aot_impl(inputs: list[Any], outputs: list[Any], attrs: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    ptx = kernel.aot_kernel(triton_type(inputs[0].dtype))
    import tensorrt.plugin as trtp

    n = inputs[0].shape_expr.numel()
    return launch(ptx, grid=[trtp.cdiv(n, kernel.BLOCK)], scalars=[n])


PLUGIN_ID = register_from_spec(SPEC, shape=shape, impl=impl, aot_impl=aot_impl)
