"""Symbolics for the TorchScript exporter (``torch.onnx.export(..., dynamo=False)``).

A symbolic turns one TorchScript op (``aten::asinh``, ``torchvision::deform_conv2d``, a
``torch.library`` op) into ONNX nodes through ``g.op``. :func:`register_symbolic` writes it for the two
cases gskit cares about: a standard ONNX op the exporter does not map, and a plugin node built from a
:class:`~gskit.plugin.spec.PluginSpec` (domain = namespace, op = name, ``plugin_namespace`` and
``plugin_version`` attributes, attributes typed as the spec says), so the exported node is what the
TensorRT parser needs without editing the file afterwards.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import onnx_graphsurgeon as gs

from gskit.errors import GskitError, PluginError
from gskit.plugin.spec import ROUTING_ATTRIBUTES, AttrType, PluginSpec, TensorInfo
from gskit.torch_export._torch import require

log = logging.getLogger(__name__)

#: ``g.op`` keyword suffix per attribute kind (``eps_f=1e-5``, ``plugin_version_s="1"``).
_SUFFIX = {
    AttrType.INT: "i",
    AttrType.INTS: "i",
    AttrType.FLOAT: "f",
    AttrType.FLOATS: "f",
    AttrType.STRING: "s",
    AttrType.STRINGS: "s",
    AttrType.TENSOR: "t",
}


class Call(NamedTuple):
    """What one op call becomes: node inputs (None for an omitted optional input) and attributes."""

    inputs: Sequence[Any]
    attrs: Mapping[str, Any] = {}


#: Maps the (parsed) arguments of the torch op to the node's inputs and attributes.
BindFn = Callable[..., Call]


class SymbolicRegistration:
    """A registered symbolic; ``unregister()`` (or leaving the ``with`` block) removes it."""

    def __init__(self, op: str, opset: int) -> None:
        self.op = op
        self.opset = opset
        self.active = True

    def unregister(self) -> None:
        """Remove the symbolic (idempotent)."""
        if self.active:
            unregister_symbolic(self.op, self.opset)
            self.active = False

    def __enter__(self) -> SymbolicRegistration:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unregister()

    def __repr__(self) -> str:
        state = "active" if self.active else "removed"
        return f"SymbolicRegistration({self.op!r}, opset={self.opset}, {state})"


def register_symbolic(
    op: str,
    *,
    onnx_op: str | None = None,
    plugin: PluginSpec | None = None,
    arg_types: Sequence[str] | None = None,
    bind: BindFn | None = None,
    attrs: Mapping[str, Any] | None = None,
    opset: int = 9,
) -> SymbolicRegistration:
    """Register a TorchScript-exporter symbolic for ``op`` that emits ``onnx_op`` or a plugin node.

    Examples::

        register_symbolic("aten::asinh", onnx_op="Asinh")
        with register_symbolic("mylib::clamp_swish", plugin=CLAMP_SWISH):
            torch.onnx.export(model, args, path, dynamo=False)

    Args:
        op: the TorchScript op, ``namespace::name`` (``aten::asinh``, ``torchvision::deform_conv2d``).
        onnx_op: a standard ONNX op type; exclusive with ``plugin``.
        plugin: the spec of the plugin node to emit; exclusive with ``onnx_op``.
        arg_types: one ``parse_args`` descriptor per argument of the op: ``"v"`` (a tensor, None when
            the argument is None), ``"i"``, ``"f"``, ``"b"``, ``"s"``, ``"is"``, ``"fs"``, ``"none"``
            (ignored: None). Default: every argument is passed as is.
        bind: ``bind(*args) -> Call(inputs, attrs)`` with the parsed arguments. Default: all arguments
            are inputs, in order, and ``attrs`` are the attributes.
        attrs: fixed attributes (used when ``bind`` is not given).
        opset: lowest ONNX opset the symbolic serves (it serves every opset from there up).

    Returns:
        The registration; unregister it (or use it as a context manager) to restore the exporter.

    Raises:
        GskitError: not exactly one of ``onnx_op`` and ``plugin``, or torch is missing or refuses the name.
    """
    if (onnx_op is None) == (plugin is None):
        raise GskitError(f"register_symbolic('{op}'): give exactly one of onnx_op= and plugin=")
    torch = require()
    fixed = dict(attrs or {})

    def symbolic(g: Any, *args: Any) -> Any:
        values = _parse(args, arg_types, op)
        call = bind(*values) if bind is not None else Call(values, fixed)
        if plugin is not None:
            return emit_plugin(g, plugin, call.inputs, call.attrs)
        return emit_onnx_op(g, onnx_op or "", call.inputs, call.attrs)

    symbolic.__name__ = f"gskit_symbolic_{op.replace('::', '_')}"
    try:
        torch.onnx.register_custom_op_symbolic(op, symbolic, opset)
    except (ValueError, RuntimeError) as err:
        raise GskitError(f"cannot register a symbolic for '{op}': {err}") from err
    log.debug(
        "registered symbolic %s -> %s (opset >= %d)", op, plugin.qualified_name if plugin else onnx_op, opset
    )
    return SymbolicRegistration(op, opset)


def unregister_symbolic(op: str, opset: int = 9) -> None:
    """Remove a symbolic registered with :func:`register_symbolic` (the exporter's own one comes back)."""
    require().onnx.unregister_custom_op_symbolic(op, opset)
    # torch keeps an empty entry for an op it has no symbolic of, which then breaks its lookup
    # ("min() arg is an empty sequence" instead of "not supported"): drop it.
    try:
        from torch.onnx._internal.torchscript_exporter import registration
    except ImportError:  # another torch layout: nothing to tidy
        return
    group = registration.registry._registry.get(op)
    if group is not None and not group._functions:
        del registration.registry._registry[op]


def emit_plugin(
    g: Any, spec: PluginSpec, inputs: Sequence[Any], attrs: Mapping[str, Any] | None = None
) -> Any:
    """Add a plugin node to a TorchScript export graph (call it from a symbolic).

    Attributes are checked and completed by :meth:`PluginSpec.node_attrs` (defaults, int32 range,
    ``plugin_namespace``/``plugin_version``) and typed by the spec, not by the Python value. Outputs get
    dtypes and shapes from ``spec.infer`` when the input types are known.

    Args:
        g: the graph context the exporter passes to a symbolic.
        spec: the plugin.
        inputs: one value per spec input; None for an omitted optional input.
        attrs: the spec's attributes by name.

    Returns:
        The output value, or a tuple of them for a multi-output plugin.

    Raises:
        PluginError: wrong number of inputs, a required input missing, or an attribute the spec rejects.
    """
    torch = require()
    values = _plugin_inputs(spec, inputs, g)
    kwargs: dict[str, Any] = {}
    for name, value in spec.node_attrs(attrs or {}).items():
        kind = ROUTING_ATTRIBUTES[name] if name in ROUTING_ATTRIBUTES else spec.attribute(name).type
        if isinstance(value, gs.Constant):
            value = torch.from_numpy(np.array(value.values))
        kwargs[f"{name}_{_SUFFIX[kind]}"] = value
    out = g.op(f"{spec.domain}::{spec.name}", *values, outputs=len(spec.outputs), **kwargs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    _set_output_types(spec, values, outs, attrs or {})
    return out


def emit_onnx_op(g: Any, op_type: str, inputs: Sequence[Any], attrs: Mapping[str, Any] | None = None) -> Any:
    """Add a standard ONNX node; attribute kinds follow the Python values (int, float, str, lists, tensors).

    Raises:
        GskitError: an attribute value of a kind ONNX attributes cannot hold.
    """
    torch = require()
    kwargs: dict[str, Any] = {}
    for name, value in (attrs or {}).items():
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(value)
        kwargs[f"{name}_{_python_suffix(op_type, name, value, torch)}"] = value
    values = list(inputs)
    while values and values[-1] is None:
        values.pop()
    return g.op(op_type, *[v if v is not None else _absent(g) for v in values], **kwargs)


def _parse(args: Sequence[Any], arg_types: Sequence[str] | None, op: str) -> list[Any]:
    helper = require("torch.onnx.symbolic_helper")
    if arg_types is None:
        return [None if _is_none(helper, a) else a for a in args]
    if len(arg_types) != len(args):
        raise GskitError(
            f"symbolic for '{op}': arg_types has {len(arg_types)} entries "
            f"but the op has {len(args)} arguments"
        )
    parsed = []
    for i, (value, desc) in enumerate(zip(args, arg_types, strict=True)):
        if desc == "none" or _is_none(helper, value):
            parsed.append(None)
        elif desc == "v":
            parsed.append(value)
        else:
            parsed.append(helper._get_const(value, desc, f"argument {i} of {op}"))
    return parsed


def _is_none(helper: Any, value: Any) -> bool:
    return value is None or (hasattr(value, "node") and helper._is_none(value))


def _absent(g: Any) -> Any:
    """An empty-named optional input (what the exporter writes for omitted optional inputs)."""
    torch = require()
    none = g.op("prim::Constant")
    none.setType(torch._C.OptionalType.ofTensor())
    return none


def _plugin_inputs(spec: PluginSpec, inputs: Sequence[Any], g: Any) -> list[Any]:
    if len(inputs) > len(spec.inputs):
        raise PluginError(
            f"{spec.qualified_name}: {len(inputs)} inputs given, the spec has {len(spec.inputs)}"
        )
    values = list(inputs)
    for port, value in zip(spec.inputs, values, strict=False):
        if value is None and not port.endswith("?"):
            raise PluginError(f"{spec.qualified_name}: input '{port}' is required")
    for port in spec.inputs[len(values) :]:
        if not port.endswith("?"):
            raise PluginError(f"{spec.qualified_name}: input '{port}' is required")
    while values and values[-1] is None:
        values.pop()
    return [v if v is not None else _absent(g) for v in values]


def _set_output_types(
    spec: PluginSpec, inputs: Sequence[Any], outputs: Sequence[Any], attrs: Mapping[str, Any]
) -> None:
    """Give plugin outputs the dtype/shape the spec infers, so the exporter's own inference continues."""
    torch = require()
    scalar = torch.onnx.JitScalarType
    infos: list[TensorInfo | None] = []
    for value in inputs:
        vtype = value.type()
        if not isinstance(vtype, torch._C.TensorType) or vtype.scalarType() is None:
            infos.append(None)
            continue
        sizes = vtype.varyingSizes()
        dtype = int(scalar.from_value(value).onnx_type())
        infos.append(TensorInfo(dtype, None if sizes is None else tuple(sizes)))
    try:
        values = {a.name: attrs.get(a.name, a.default) for a in spec.attributes}
        results = spec.infer(infos, values)
    except Exception as err:  # user rule; the exported model is still right without these types
        log.debug("%s: no output types for the exporter: %s", spec.qualified_name, err)
        return
    for out, info in zip(outputs, results, strict=False):
        if not info.dtype or info.shape is None:
            continue
        torch_dtype = scalar.from_onnx_type(info.dtype).dtype()
        sizes = [d if isinstance(d, int) else None for d in info.shape]
        out.setType(
            torch._C.TensorType.create_from_tensor(torch.empty(0, dtype=torch_dtype)).with_sizes(sizes)
        )


def _python_suffix(op_type: str, name: str, value: Any, torch: Any) -> str:
    item = value[0] if isinstance(value, (list, tuple)) and value else value
    if isinstance(item, (bool, int)):
        return "i"
    if isinstance(item, float):
        return "f"
    if isinstance(item, str):
        return "s"
    if isinstance(value, torch.Tensor):
        return "t"
    raise GskitError(f"{op_type} attribute '{name}': {type(value).__name__} is not an ONNX attribute value")
