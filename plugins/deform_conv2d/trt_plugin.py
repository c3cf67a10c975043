"""DeformConv2d as a TensorRT Python plugin (``tensorrt.plugin``), JIT and ahead-of-time (Triton PTX).

Load with ``gskit build --plugins plugins/deform_conv2d`` (full TensorRT >= 10.9, Triton, torch).
Name, namespace and attributes come from ``spec.py``. ``tensorrt.plugin`` plugins have a fixed input
count, so this one takes all five inputs ``(x, weight, offset, bias, mask)``: a node without bias or mask
needs zeros / ones there, or the C++ plugin in ``cpp/`` (which takes 3 to 5 inputs). The AOT kernel
needs the weight shape fixed at build time.
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
    """Mirrors ``SPEC.infer``: ``(N, C_out, oH, oW)`` in x's dtype, spatial dims by symbolic arithmetic."""
    x, weight = inputs[0], inputs[1]
    strides, pads, dilations = (list(map(int, attrs[k])) for k in ("strides", "pads", "dilations"))
    spatial = []
    for axis in (0, 1):
        size, k = x.shape_expr[2 + axis], weight.shape_expr[2 + axis]
        padded = size + (pads[axis] + pads[axis + 2])
        spatial.append((padded - (k - 1) * dilations[axis] - 1) // strides[axis] + 1)
    return [trtp.from_shape_expr((x.shape_expr[0], weight.shape_expr[0], *spatial), dtype=x.dtype)]


def impl(inputs: list[Any], outputs: list[Any], attrs: dict[str, Any], stream: int) -> None:
    (x, weight, offset, bias, mask), (y,) = as_torch(inputs), as_torch(outputs)
    with cuda_stream(stream):
        kernel.deform_conv2d(x, weight, offset, bias, mask, y, **_attrs(attrs))


def aot_impl(inputs: list[Any], outputs: list[Any], attrs: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    x, weight = inputs[0], inputs[1]
    w_dims = [weight.shape_expr[i] for i in range(4)]
    if any(d.is_fake or not d.is_constant for d in w_dims):
        raise PluginError(f"{SPEC.qualified_name}: the AOT kernel needs a fixed weight shape")
    w_shape = [d.constant_value() for d in w_dims]
    a = _attrs(attrs)
    ptx = kernel.aot_kernel(triton_type(x.dtype), w_shape, **a)
    n, c, h, w = (x.shape_expr[i] for i in range(4))
    c_out = w_shape[0]
    oh, ow = outputs[0].shape_expr[2], outputs[0].shape_expr[3]
    co_blocks = -(-(c_out // a["group"]) // ptx.constexprs["BLOCK_CO"])
    grid = [trtp.cdiv(oh * ow, ptx.constexprs["BLOCK_P"]), n * (a["group"] * co_blocks)]
    return launch(ptx, grid=grid, scalars=[n, c, h, w, c_out, oh, ow])


def _attrs(attrs: dict[str, Any]) -> dict[str, Any]:
    return {
        "strides": [int(v) for v in attrs["strides"]],
        "pads": [int(v) for v in attrs["pads"]],
        "dilations": [int(v) for v in attrs["dilations"]],
        "group": int(attrs["group"]),
        "offset_group": int(attrs["offset_group"]),
    }


PLUGIN_ID = register_from_spec(SPEC, shape=shape, impl=impl, aot_impl=aot_impl)
