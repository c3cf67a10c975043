"""Translations for the dynamo exporter: ``torch.onnx.export(..., dynamo=True, custom_translation_table=T)``.

An entry of ``custom_translation_table`` maps a torch op overload (``torch.ops.aten.asinh.default``,
``torch.ops.mylib.op.default``) to a function the exporter calls with onnxscript values. Plugin nodes
are emitted through an onnxscript ``Op`` of the plugin's domain that carries an onnx ``OpSchema`` built
from the spec (onnxscript refuses ops without a schema); the schema is not registered with onnx.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs

from gskit.errors import GskitError
from gskit.plugin.spec import PluginSpec
from gskit.torch_export._torch import require
from gskit.torch_export.torchscript import BindFn, Call


def torch_op(op: Any) -> Any:
    """The ``OpOverload`` a translation table is keyed by.

    Args:
        op: an ``OpOverload``, an ``OpOverloadPacket`` (its ``default``), a ``torch.library.custom_op``
            object, or a name ``"namespace::name"`` / ``"namespace::name.overload"``.

    Raises:
        GskitError: the name is not a registered torch op.
    """
    torch = require()
    if isinstance(op, torch._ops.OpOverload):
        return op
    if isinstance(op, torch._ops.OpOverloadPacket):
        return op.default
    if hasattr(op, "_opoverload"):  # torch.library.custom_op result
        return op._opoverload
    if isinstance(op, str) and "::" in op:
        namespace, rest = op.split("::", 1)
        name, _, overload = rest.partition(".")
        try:
            return getattr(getattr(getattr(torch.ops, namespace), name), overload or "default")
        except (AttributeError, RuntimeError) as err:
            raise GskitError(
                f"'{op}' is not a registered torch op; import the library that defines it "
                f"(or define it with torch.library.custom_op) before exporting"
            ) from err
    raise GskitError(f"{op!r} is not a torch op; give torch.ops.<ns>.<name>.default or 'ns::name'")


def plugin_op(spec: PluginSpec) -> Any:
    """An onnxscript ``Op`` that writes ``spec``'s node (domain = namespace, op = name, opset version 1)."""
    require("onnxscript")
    from onnxscript.values import Op, Opset

    from gskit.passes.plugin_schemas import plugin_schema  # the schema gskit registers for shape inference

    return Op(Opset(spec.domain, 1), spec.name, plugin_schema(spec.domain, spec.name, [spec]))


def translation(
    *,
    onnx_op: str | None = None,
    plugin: PluginSpec | None = None,
    bind: BindFn | None = None,
    attrs: Mapping[str, Any] | None = None,
    opset: int = 18,
) -> Callable[..., Any]:
    """A ``custom_translation_table`` value that emits a standard ONNX op or a plugin node.

    Example::

        table = {torch_op("mylib::clamp_swish"): translation(plugin=CLAMP_SWISH)}
        torch.onnx.export(model, args, dynamo=True, custom_translation_table=table)

    Args:
        onnx_op: a standard ONNX op type (looked up in ``opset``); exclusive with ``plugin``.
        plugin: the plugin spec; attributes are completed and checked by ``spec.node_attrs``.
        bind: ``bind(*args, **kwargs) -> Call(inputs, attrs)`` with the torch op's arguments (tensors as
            onnxscript values, others as Python values). Default: every argument is an input.
        attrs: fixed attributes (used when ``bind`` is not given).
        opset: ONNX opset of ``onnx_op``.

    Raises:
        GskitError: not exactly one of ``onnx_op`` and ``plugin``, or ``onnx_op`` is not in ``opset``.
    """
    if (onnx_op is None) == (plugin is None):
        raise GskitError("translation(): give exactly one of onnx_op= and plugin=")
    require("onnxscript")
    from onnxscript import ir
    from onnxscript.values import Opset

    fixed = dict(attrs or {})
    if plugin is not None:
        op = plugin_op(plugin)
    else:
        op = Opset("", opset)[onnx_op]
        if op is None:
            raise GskitError(f"'{onnx_op}' is not an ONNX op at opset {opset}")

    def translate(*args: Any, **kwargs: Any) -> Any:
        call = bind(*args, **kwargs) if bind is not None else Call(args, fixed)
        inputs = list(call.inputs)
        while inputs and inputs[-1] is None:
            inputs.pop()
        if plugin is None:
            return op(*inputs, **dict(call.attrs))
        node_attrs = {
            name: ir.tensor(np.array(value.values)) if isinstance(value, gs.Constant) else value
            for name, value in plugin.node_attrs(call.attrs).items()
        }
        return op(*inputs, **node_attrs)

    translate.__name__ = f"gskit_{plugin.name if plugin else onnx_op}"
    return translate
