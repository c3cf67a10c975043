"""onnx ``OpSchema``s for plugin nodes, so onnx's own shape inference runs each plugin's output rule.

Each plugin becomes an onnx ``OpSchema`` whose type-and-shape inference function calls the spec's
``infer``, so onnx's ``infer_shapes`` propagates dtypes and shapes (symbolic dims included) through plugin
nodes and the standard ops after them in one pass.

One schema is registered per ``(namespace, name)`` with ``since_version=1``: the node's opset version for
a plugin domain says nothing about the plugin, and the inference function picks the spec by the node's
``plugin_version`` attribute. The schema lists the spec attributes (all optional: defaults live in the spec)
and the TensorRT routing attributes, so onnx's checker also validates plugin nodes while it is registered.

Only :func:`gskit.passes.tensor_types.infer_types` (and the path-based inference of
:mod:`gskit.passes.shapes`) run inference with these schemas; other modules ask them.
"""

from __future__ import annotations

import contextvars
import importlib
import logging
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import onnx
from onnx.defs import OpSchema

from gskit.errors import PLUGIN_CODE_FAILURES, GskitError
from gskit.passes.tensor_types import elem_type
from gskit.plugin.ops import onnx_op_types
from gskit.plugin.registry import PluginRegistry
from gskit.plugin.spec import REQUIRED, ROUTING_ATTRIBUTES, AttrType, PluginSpec, TensorInfo, attribute_value

log = logging.getLogger(__name__)

_ATTR_TYPES = {
    AttrType.INT: OpSchema.AttrType.INT,
    AttrType.FLOAT: OpSchema.AttrType.FLOAT,
    AttrType.STRING: OpSchema.AttrType.STRING,
    AttrType.INTS: OpSchema.AttrType.INTS,
    AttrType.FLOATS: OpSchema.AttrType.FLOATS,
    AttrType.STRINGS: OpSchema.AttrType.STRINGS,
    AttrType.TENSOR: OpSchema.AttrType.TENSOR,
}
_ALL_TENSOR_TYPES = sorted(
    f"tensor({name})"
    for name in (
        "float",
        "float16",
        "bfloat16",
        "double",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "bool",
        "string",
        "complex64",
        "complex128",
    )
)


class _Registered:
    """A schema gskit registered: its shape (to know when a reload needs a new schema) and its specs."""

    def __init__(self, signature: tuple[Any, ...]) -> None:
        self.signature = signature
        self.versions: dict[str, PluginSpec] = {}


#: Whether the inference running now is strict (plugin rule errors raise) or lenient (they are logged).
_STRICT: contextvars.ContextVar[bool] = contextvars.ContextVar("gskit_strict_inference", default=True)
#: (domain, op_type) -> what gskit registered in this process. The inference functions read from it, so
#: re-registering a reloaded spec with the same schema shape only swaps the spec.
_REGISTERED: dict[tuple[str, str], _Registered] = {}


def register_schemas(registry: PluginRegistry) -> None:
    """Register one onnx OpSchema per plugin ``(domain, name)`` (idempotent; reloads replace specs).

    Raises:
        GskitError: onnx already has a schema of that name and domain that gskit did not register.
    """
    # onnx.reference indexes all registered schemas by op name on its first import and refuses two of one
    # name in different domains: a plugin named like an ONNX op (acme::Swish), or two plugins of one name.
    # Where such a pair would be, it indexes the schemas before any plugin is added; its import (7-9 ms) is
    # spared where every plugin has a name of its own.
    names = [op for _, op in {*_REGISTERED, *((spec.domain, spec.name) for spec in registry)}]
    clash = len(names) != len(set(names)) or not onnx_op_types().isdisjoint(names)
    if clash and "onnx.reference.op_run" not in sys.modules:
        importlib.import_module("onnx.reference.op_run")  # (an import statement would make onnx local)

    by_op: dict[tuple[str, str], list[PluginSpec]] = {}
    for spec in registry:
        by_op.setdefault((spec.domain, spec.name), []).append(spec)
    for (domain, op), specs in by_op.items():
        signature = _signature(specs)
        entry = _REGISTERED.get((domain, op))
        if entry is not None and entry.signature != signature:
            onnx.defs.deregister_schema(op, 1, domain)
            del _REGISTERED[(domain, op)]
            entry = None
        if entry is None:
            if onnx.defs.has(op, domain):
                raise GskitError(
                    f"plugin {domain}::{op}: onnx already defines a schema with this name and domain; "
                    f"rename the plugin or its namespace"
                )
            entry = _Registered(signature)
            schema = plugin_schema(domain, op, specs)
            schema.set_type_and_shape_inference_function(_inference_function(domain, op, entry))
            onnx.defs.register_schema(schema)
            _REGISTERED[(domain, op)] = entry
            log.debug("registered onnx schema %s::%s", domain, op)
        entry.versions = {spec.version: spec for spec in specs}


def deregister_schemas() -> None:
    """Remove every schema gskit registered (for tests and long-running processes that reload plugins)."""
    for domain, op in list(_REGISTERED):
        onnx.defs.deregister_schema(op, 1, domain)
        del _REGISTERED[(domain, op)]


@contextmanager
def strict_inference(strict: bool) -> Iterator[None]:
    """Plugin rule failures raise (``strict``) or are logged, for the inference run inside the block."""
    token = _STRICT.set(strict)
    try:
        yield
    finally:
        _STRICT.reset(token)


def _signature(specs: list[PluginSpec]) -> tuple[Any, ...]:
    longest_in = max(specs, key=lambda s: len(s.inputs))
    longest_out = max(specs, key=lambda s: len(s.outputs))
    attrs = sorted({(a.name, a.type) for s in specs for a in s.attributes})
    return (longest_in.inputs, longest_out.outputs, tuple(attrs))


def plugin_schema(domain: str, op: str, specs: list[PluginSpec]) -> OpSchema:
    """The onnx OpSchema of a plugin op (all versions of ``domain::op`` in ``specs``), gskit's inference."""
    inputs_of, outputs_of, attrs = _signature(specs)
    min_in = min(sum(1 for n in s.inputs if not n.endswith("?")) for s in specs)
    inputs = [
        OpSchema.FormalParameter(
            name.rstrip("?"),
            f"I{i}",
            param_option=OpSchema.FormalParameterOption.Optional
            if name.endswith("?") or i >= min_in
            else OpSchema.FormalParameterOption.Single,
        )
        for i, name in enumerate(inputs_of)
    ]
    min_out = min(len(s.outputs) for s in specs)
    outputs = [
        OpSchema.FormalParameter(
            name,
            f"O{i}",
            param_option=OpSchema.FormalParameterOption.Optional
            if i >= min_out
            else OpSchema.FormalParameterOption.Single,
        )
        for i, name in enumerate(outputs_of)
    ]
    constraints = [(f"I{i}", _ALL_TENSOR_TYPES, "") for i in range(len(inputs))]
    constraints += [(f"O{i}", _ALL_TENSOR_TYPES, "") for i in range(len(outputs))]
    attributes = [OpSchema.Attribute(name, _ATTR_TYPES[kind], "", required=False) for name, kind in attrs]
    attributes += [
        OpSchema.Attribute(name, _ATTR_TYPES[kind], "TensorRT routing", required=False)
        for name, kind in ROUTING_ATTRIBUTES.items()
    ]
    doc = " | ".join(s.doc or s.qualified_name for s in specs)
    return OpSchema(
        op,
        domain,
        1,
        doc,
        inputs=inputs,
        outputs=outputs,
        type_constraints=constraints,
        attributes=attributes,
    )


def _inference_function(domain: str, op: str, entry: _Registered) -> Callable[[Any], None]:
    def infer(ctx: Any) -> None:
        version_attr = ctx.get_attribute("plugin_version")
        version = str(attribute_value(version_attr)) if version_attr is not None else "1"
        spec = entry.versions.get(version)
        if spec is None:
            message = (
                f"{ctx.get_display_name()}: no loaded spec of {domain}::{op} with plugin_version {version!r} "
                f"(loaded: {sorted(entry.versions)}); pass the plugin folder with --plugins"
            )
            if _STRICT.get():
                raise GskitError(message)
            log.warning("%s", message)
            return
        inputs: list[TensorInfo | None] = []
        for i in range(len(spec.inputs)):
            present = i < ctx.get_num_inputs() and ctx.has_input(i)
            inputs.append(_tensor_info(ctx.get_input_type(i)) if present else None)
        attrs = _node_attrs(spec, ctx)
        try:
            outputs = spec.infer(inputs, attrs)
        except PLUGIN_CODE_FAILURES as err:  # the spec's rule is user code; name the node and the plugin
            message = f"{ctx.get_display_name()}: output rule of {spec.qualified_name} failed: {err}"
            if _STRICT.get():
                raise GskitError(message) from err
            log.warning("%s; its outputs keep no shape", message)
            return
        for i, info in enumerate(outputs):
            # an output rule that passes on an input of unknown type (a tensor nothing defines, or one onnx
            # could not type) gives element type 0, which onnx refuses to set: that output stays untyped
            typed = _type_proto(info)
            if i < ctx.get_num_outputs() and ctx.has_output(i) and typed is not None:
                ctx.set_output_type(i, typed)

    return infer


def _node_attrs(spec: PluginSpec, ctx: Any) -> Mapping[str, Any]:
    attrs: dict[str, Any] = {}
    for attr in spec.attributes:
        proto = ctx.get_attribute(attr.name)
        if proto is not None:
            attrs[attr.name] = attribute_value(proto)
        elif attr.default is not REQUIRED:
            attrs[attr.name] = attribute_value(attr.default)
    return attrs


def _tensor_info(type_proto: onnx.TypeProto | None) -> TensorInfo | None:
    if type_proto is None or not type_proto.HasField("tensor_type"):
        return TensorInfo(0, None)
    tensor_type = type_proto.tensor_type
    if not tensor_type.HasField("shape"):
        return TensorInfo(tensor_type.elem_type, None)
    dims: list[int | str | None] = []
    for dim in tensor_type.shape.dim:
        if dim.HasField("dim_value"):
            dims.append(int(dim.dim_value))
        elif dim.HasField("dim_param"):
            dims.append(dim.dim_param)
        else:
            dims.append(None)
    return TensorInfo(tensor_type.elem_type, tuple(dims))


def _type_proto(info: TensorInfo) -> onnx.TypeProto | None:
    """The onnx type of an output rule's result, or None when its element type says "unknown" (None, onnx's 0
    UNDEFINED: a rule that passes on an input of unknown type), which onnx refuses to set."""
    code = elem_type(info.dtype)
    if not code:
        return None
    shape = None if info.shape is None else list(info.shape)
    return onnx.helper.make_tensor_type_proto(code, shape)
