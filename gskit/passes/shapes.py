"""Shape inference that knows plugin nodes.

Each plugin becomes an onnx ``OpSchema`` whose type-and-shape inference function calls the spec's
``infer``, so onnx's own ``infer_shapes`` propagates dtypes and shapes (symbolic dims included) through
plugin nodes and the standard ops after them in one pass.

One schema is registered per ``(namespace, name)`` with ``since_version=1``: the node's opset version for
a plugin domain says nothing about the plugin, and the inference function picks the spec by the node's
``plugin_version`` attribute. The schema lists the spec attributes (all optional: defaults live in the spec)
and the TensorRT routing attributes, so onnx's checker also validates plugin nodes while it is registered.

Weights never reach onnx's C++ side: large initializers are replaced by stubs (dims and type, no data)
before serialization, so a model of any size is inferred in memory. ``infer_shapes_path`` runs onnx's
path-based inference for files.
"""

from __future__ import annotations

import contextvars
import logging
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import TensorProto
from onnx.defs import OpSchema
from onnx.external_data_helper import uses_external_data
from onnx_graphsurgeon.exporters.onnx_exporter import dtype_to_onnx
from onnx_graphsurgeon.importers.onnx_importer import get_onnx_tensor_dtype, get_onnx_tensor_shape

from gskit.errors import PLUGIN_CODE_FAILURES, GskitError
from gskit.io import model as gsmodel
from gskit.io.outputs import place_file
from gskit.passes.tensor_types import data_propagation_bounded
from gskit.passes.transform import GraphPass, PassContext, PassResult, ensure, option, run_pass
from gskit.plugin.spec import (
    REQUIRED,
    ROUTING_ATTRIBUTES,
    AttrType,
    PluginRegistry,
    PluginSpec,
    TensorInfo,
    attribute_value,
)

log = logging.getLogger(__name__)

#: Initializers of more bytes than this are passed to onnx as stubs (dims and type only).
STUB_MIN_BYTES = 64 * 1024
_STUB_LOCATION = "__gskit_stripped__"

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
    # onnx.reference indexes all registered schemas by op name on its first import and refuses a plugin
    # named like an ONNX op (e.g. acme::Swish); have it index the standard set before any plugin is added.
    import onnx.reference.op_run  # noqa: F401

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


@dataclass(frozen=True)
class InferShapesOptions:
    """Custom-domain aware shape inference (``infer_shapes``'s options, the single source of the default)."""

    strict: bool = option(
        True, help="fail on the first node whose inference fails (--no-strict: skip such nodes)"
    )


_DEFAULTS = InferShapesOptions()


class _InferShapes(GraphPass[InferShapesOptions]):
    """A gs.Graph gets shapes set on its own tensors; a ModelProto is left alone (a new one is returned).

    On a gs.Graph the report is the plugin outputs still without a rank (``unshaped_plugin_outputs``);
    preparing for a TensorRT target (``context.target``), strict inference also stops at a plugin rule that
    gives no rank for inputs with one.
    """

    name, options, effect = "infer_shapes", InferShapesOptions, "in_place"

    def call(self, model: Any, options: InferShapesOptions, context: PassContext) -> PassResult:
        registry = context.plugins or PluginRegistry()
        if isinstance(model, onnx.ModelProto):
            return PassResult(_infer_model(model, registry, options.strict), modified=True)
        graph = _infer_graph(model, registry, options.strict)
        unshaped = unshaped_plugin_outputs(graph, registry)
        if options.strict and context.target is not None:
            # Preparing for TensorRT, which asks the plugin for its output shapes: a plugin rule that gives
            # no rank for inputs with one stops the run. Where an upstream op lost the shape, TensorRT still
            # knows it (the network).
            blocking = [u.describe() for u in unshaped if u.origin is None]
            ensure(not blocking, self.name, "; ".join(blocking[:3]))
        summary = (
            f"{len(unshaped)} plugin output(s) without a rank: {unshaped[0].describe()}"
            if unshaped
            else "every plugin output has a rank"
        )
        return PassResult(graph, modified=True, report=unshaped, summary=summary)


#: The shape inference pass: ``run_pass(INFER_SHAPES, graph_or_model, InferShapesOptions(...), plugins=...)``.
INFER_SHAPES = _InferShapes()


def infer_shapes(
    model: onnx.ModelProto, registry: PluginRegistry, *, strict: bool = _DEFAULTS.strict
) -> onnx.ModelProto:
    """Infer dtypes and shapes of every tensor, through plugin nodes too.

    Args:
        model: the model; left unchanged. Its large initializers are sent to onnx as stubs, so any
            size works (weights still on disk stay there).
        registry: plugins whose specs give the output rules of plugin nodes.
        strict: raise on the first inference error; with False, onnx skips what it cannot infer and the
            tensors left without shapes are logged.

    Returns:
        A new model with ``value_info`` (and graph output types) filled in
        (``run_pass(INFER_SHAPES, model, InferShapesOptions(strict), plugins=registry).model``).

    Raises:
        GskitError: (strict) a node's inference failed; the message names the node.
    """
    return run_pass(INFER_SHAPES, model, InferShapesOptions(strict=strict), plugins=registry).model


def _infer_model(model: onnx.ModelProto, registry: PluginRegistry, strict: bool) -> onnx.ModelProto:
    register_schemas(registry)
    with _stubbed_initializers(model) as light:
        payload = light.SerializeToString()
        data_prop = data_propagation_bounded(light)
    token = _STRICT.set(strict)
    try:
        inferred = onnx.shape_inference.infer_shapes(
            payload, check_type=True, strict_mode=strict, data_prop=data_prop
        )
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as err:
        raise GskitError(f"shape inference failed: {_first_line(err)}") from err
    finally:
        _STRICT.reset(token)
    result = onnx.ModelProto()
    result.CopyFrom(model)
    result.graph.ClearField("value_info")
    result.graph.value_info.extend(inferred.graph.value_info)
    result.graph.ClearField("output")
    result.graph.output.extend(inferred.graph.output)
    _copy_subgraph_value_info(inferred.graph, result.graph)
    if not strict:
        missing = missing_shapes(result)
        if missing:
            log.warning("no shape inferred for %d tensor(s): %s", len(missing), ", ".join(missing[:10]))
    return result


def infer_shapes_path(
    path: str | os.PathLike,
    output_path: str | os.PathLike,
    registry: PluginRegistry,
    *,
    strict: bool = _DEFAULTS.strict,
) -> Path:
    """Path-based inference (onnx's ``infer_shapes_path``) for model files of any size, >2 GB included.

    onnx reads the proto without external data; the result is written beside the input (so its
    external data references stay valid) and then moved, or saved with gskit's streaming save when
    ``output_path`` is in another folder.

    Raises:
        GskitError: the input is missing, ``output_path`` is the input, or (strict) inference failed.
    """
    path = Path(path)
    output = gsmodel.resolve_output(path, output_path, in_place=False)
    if not path.is_file():
        raise GskitError(gsmodel.not_a_file(path, "model"))
    register_schemas(registry)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".onnx", dir=path.resolve().parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        token = _STRICT.set(strict)
        try:
            data_prop = data_propagation_bounded(onnx.load(str(path), load_external_data=False))
            onnx.shape_inference.infer_shapes_path(
                str(path), str(tmp), check_type=True, strict_mode=strict, data_prop=data_prop
            )
        except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as err:
            raise GskitError(f"{path}: shape inference failed: {_first_line(err)}") from err
        finally:
            _STRICT.reset(token)
        if output.resolve().parent == tmp.parent:
            gsmodel.check_file(tmp)
            place_file(tmp, output)
        else:
            gsmodel.save(gsmodel.load(tmp, load_weights=False), output)
    finally:
        tmp.unlink(missing_ok=True)
    return output


def infer_graph_shapes(
    graph: gs.Graph, registry: PluginRegistry, *, strict: bool = _DEFAULTS.strict
) -> gs.Graph:
    """Infer shapes of a graph and set them on its own tensors (the graph is returned, not copied;
    ``run_pass(INFER_SHAPES, graph, InferShapesOptions(strict), plugins=registry).model``).

    Constants are exported as stubs (dims and dtype, no data), so weights are not copied.

    Raises:
        GskitError: (strict) a node's inference failed.
    """
    return run_pass(INFER_SHAPES, graph, InferShapesOptions(strict=strict), plugins=registry).model


def _infer_graph(graph: gs.Graph, registry: PluginRegistry, strict: bool) -> gs.Graph:
    with stubbed_constants(graph):
        proto = gsmodel.to_model(graph)
    inferred = _infer_model(proto, registry, strict)
    infos: dict[str, onnx.ValueInfoProto] = {}
    for sub in gsmodel.graph_protos(inferred.graph):
        for vi in (*sub.value_info, *sub.output):
            infos[vi.name] = vi
    tensors = {name: t for g in (graph, *graph.subgraphs(recursive=True)) for name, t in g.tensors().items()}
    for name, vi in infos.items():
        tensor = tensors.get(name)
        if not isinstance(tensor, gs.Variable) or not vi.type.HasField("tensor_type"):
            continue
        if vi.type.tensor_type.elem_type:
            tensor.dtype = get_onnx_tensor_dtype(vi)
        shape = get_onnx_tensor_shape(vi)
        if shape is not None:
            tensor.shape = shape
    return graph


def missing_shapes(model: onnx.ModelProto) -> list[str]:
    """Names of node outputs in the main graph without a known dtype and rank (postcondition helper)."""
    graph = model.graph
    known = {init.name for init in graph.initializer}
    for vi in (*graph.input, *graph.value_info, *graph.output):
        tensor_type = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tensor_type.elem_type and tensor_type.HasField("shape"):
            known.add(vi.name)
        elif (
            vi.type.HasField("sequence_type")
            or vi.type.HasField("optional_type")
            or vi.type.HasField("map_type")
        ):
            known.add(vi.name)
    return [out for node in graph.node for out in node.output if out and out not in known]


@dataclass(frozen=True)
class UnshapedPluginOutput:
    """A plugin node's output whose rank shape inference could not give.

    Attributes:
        node: the plugin node (name, or ``op`` when unnamed).
        output: the output tensor's name.
        origin: the upstream tensor where the shape was lost (its producer's inputs all have a rank, or it
            is a graph input), or None when the plugin's own inputs all have a rank (the rule lost it).
        origin_op: the op that produced ``origin`` ("graph input" for one).
    """

    node: str
    output: str
    origin: str | None
    origin_op: str | None

    def describe(self) -> str:
        if self.origin is None:
            return (
                f"{self.node}:{self.output} has no rank although every input of {self.node} has one; "
                f"the plugin's output rule (spec.infer) must give a rank, TensorRT asks the plugin for it"
            )
        return f"{self.node}:{self.output} has no rank: shape lost at '{self.origin}' ({self.origin_op})"


def unshaped_plugin_outputs(graph: gs.Graph, registry: PluginRegistry) -> list[UnshapedPluginOutput]:
    """Plugin outputs without a rank after inference, each with the upstream tensor that lost its shape.

    The walk back from a plugin's inputs visits each tensor once per call, so it is linear in graph size.
    """
    found: list[UnshapedPluginOutput] = []
    origins: dict[int, gs.Tensor] = {}
    for sub in (graph, *graph.subgraphs(recursive=True)):
        for node in sub.nodes:
            if registry.for_node(node) is None:
                continue
            for out in node.outputs:
                if out.shape is not None:
                    continue
                unshaped = [t for t in node.inputs if t.name and t.shape is None]
                lost = _lost_at(unshaped[0], origins) if unshaped else None
                op = None if lost is None else (lost.inputs[0].op if lost.inputs else "graph input")
                found.append(
                    UnshapedPluginOutput(node.name or node.op, out.name, lost.name if lost else None, op)
                )
    return found


def _lost_at(tensor: gs.Tensor, memo: dict[int, gs.Tensor]) -> gs.Tensor:
    """The first tensor without a rank on the way back from ``tensor`` (whose shape is unknown)."""
    path, current = [], tensor
    while id(current) not in memo:
        path.append(current)
        producer = current.inputs[0] if current.inputs else None
        unshaped = [t for t in producer.inputs if t.name and t.shape is None] if producer else []
        if not unshaped:  # every input of the producer has a rank, or a graph input: lost here
            memo[id(current)] = current
            break
        current = unshaped[0]
    origin = memo[id(current)]
    for visited in path:
        memo[id(visited)] = origin
    return origin


# -- schema construction -----------------------------------------------------------------------------------


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
            if i < ctx.get_num_outputs() and ctx.has_output(i) and not _undefined(info.dtype):
                ctx.set_output_type(i, _type_proto(info))

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


def _undefined(dtype: Any) -> bool:
    """An element type that says "unknown" (``None`` or onnx's 0, UNDEFINED)."""
    return dtype is None or (isinstance(dtype, int) and dtype == onnx.TensorProto.UNDEFINED)


def _type_proto(info: TensorInfo) -> onnx.TypeProto:
    dtype = info.dtype
    if isinstance(dtype, np.dtype) or isinstance(dtype, type):
        dtype = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    shape = None if info.shape is None else [d for d in info.shape]
    return onnx.helper.make_tensor_type_proto(int(dtype), shape)


# -- weights kept out of onnx's way ------------------------------------------------------------------------


def _stub(tensor: TensorProto) -> TensorProto:
    stub = TensorProto(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims)
    stub.data_location = TensorProto.EXTERNAL
    for key, value in (("location", _STUB_LOCATION), ("offset", "0"), ("length", "0")):
        entry = stub.external_data.add()
        entry.key, entry.value = key, value
    return stub


@contextmanager
def _stubbed_initializers(model: onnx.ModelProto) -> Iterator[onnx.ModelProto]:
    """The model itself with large main-graph initializers' bytes moved out (dims kept), restored on exit."""
    moved: list[tuple[TensorProto, bytes]] = []
    try:
        for tensor in model.graph.initializer:
            if tensor.HasField("raw_data") and len(tensor.raw_data) > STUB_MIN_BYTES:
                moved.append((tensor, tensor.raw_data))
                tensor.ClearField("raw_data")
                tensor.data_location = TensorProto.EXTERNAL
                for key, value in (("location", _STUB_LOCATION), ("offset", "0"), ("length", "0")):
                    entry = tensor.external_data.add()
                    entry.key, entry.value = key, value
        yield model
    finally:
        for tensor, raw in moved:
            del tensor.external_data[:]
            tensor.data_location = TensorProto.DEFAULT
            tensor.raw_data = raw


@contextmanager
def stubbed_constants(
    graph: gs.Graph, min_bytes: int = STUB_MIN_BYTES, *, on_disk: bool = False
) -> Iterator[gs.Graph]:
    """Large constants of ``graph`` (and its subgraphs) export as stubs until the block exits.

    A stub keeps the constant's name, data type and dims but no data, so exporting the graph
    (``gskit.io.model.to_model``) for shape inference neither reads weights from disk nor copies them. The
    constants' own values are swapped back on exit, even on error; sparse constants are left as they are.

    Args:
        graph: the graph whose constants are swapped; it is yielded back.
        min_bytes: constants holding more bytes than this become stubs; smaller ones (shape operands of
            ``Reshape``, ``Slice``...) keep their data, which inference may need.
        on_disk: also turn every constant whose data is still in an external file into a stub, whatever
            its size.
    """
    swapped: list[tuple[gs.Constant, Any]] = []
    try:
        for sub in (graph, *graph.subgraphs(recursive=True)):
            for tensor in sub.tensors().values():
                if not isinstance(tensor, gs.Constant):
                    continue
                proto = _stub_for(tensor, min_bytes, on_disk)
                if proto is not None:
                    swapped.append((tensor, tensor._values))
                    tensor._values = gs.ir.tensor.LazyValues(_stub(proto))
        yield graph
    finally:
        for tensor, values in swapped:
            tensor._values = values


def _stub_for(tensor: gs.Constant, min_bytes: int, on_disk: bool) -> TensorProto | None:
    """A data-free TensorProto with the constant's name, type and dims, or None to keep its data."""
    values = tensor._values
    if isinstance(values, gs.ir.tensor.LazyValues):
        lazy = values.tensor
        if not isinstance(lazy, TensorProto):
            return None  # sparse
        if not (on_disk and uses_external_data(lazy)) and gsmodel.tensor_nbytes(lazy) <= min_bytes:
            return None
        return TensorProto(name=tensor.name, data_type=lazy.data_type, dims=lazy.dims)
    if np.asarray(values).nbytes <= min_bytes:
        return None
    return TensorProto(
        name=tensor.name, data_type=dtype_to_onnx(tensor.export_dtype), dims=list(np.shape(values))
    )


def _copy_subgraph_value_info(source: onnx.GraphProto, target: onnx.GraphProto) -> None:
    for src_node, dst_node in zip(source.node, target.node, strict=True):
        for src_attr, dst_attr in zip(src_node.attribute, dst_node.attribute, strict=True):
            if src_attr.type == onnx.AttributeProto.GRAPH:
                dst_attr.g.ClearField("value_info")
                dst_attr.g.value_info.extend(src_attr.g.value_info)
                _copy_subgraph_value_info(src_attr.g, dst_attr.g)
            elif src_attr.type == onnx.AttributeProto.GRAPHS:
                for src_g, dst_g in zip(src_attr.graphs, dst_attr.graphs, strict=True):
                    dst_g.ClearField("value_info")
                    dst_g.value_info.extend(src_g.value_info)
                    _copy_subgraph_value_info(src_g, dst_g)


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("[ShapeInferenceError] Inference error(s):"):
            return line
    return text.splitlines()[0] if text else repr(err)


__all__ = [
    "deregister_schemas",
    "infer_graph_shapes",
    "infer_shapes",
    "infer_shapes_path",
    "missing_shapes",
    "register_schemas",
]
