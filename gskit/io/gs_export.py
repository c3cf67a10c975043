"""What graphsurgeon cannot export, kept through a ``gs.Graph`` round trip (``to_graph`` / ``to_model``).

Empty list attributes (``axes=[]``, ``pads=[]``): graphsurgeon imports an ``INTS``, ``FLOATS`` or ``STRINGS``
attribute as a Python list and exports it with ``onnx.helper.make_attribute``, which infers the kind from
the items and so fails on an empty list (valid ONNX). :func:`mark_empty_lists` runs after import and
replaces each empty list by an :class:`EmptyList` that remembers its kind; :func:`exporting_empty_lists`
hides empty lists from graphsurgeon's export as marker strings and :func:`restore_empty_lists` turns the
markers back into empty attributes of their kind.

Value types other than tensors and sequences of tensors: graphsurgeon imports an ``optional``, ``map`` or
``opaque`` value_info with its ``dtype`` set to a part of the type and then fails to export it
(``UnboundLocalError``); a sequence of sequences comes in with element type 0, which it would write as a
sequence of UNDEFINED tensors. :func:`exporting_value_types` hides those dtypes from the export and
:func:`restore_value_types` writes back the types that can be rebuilt from what graphsurgeon kept
(optional, opaque); the others are written without a type (``tensor_types.GsLosses`` keeps them exactly
where a pass has the original model).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import numpy as np
import onnx
import onnx_graphsurgeon as gs

log = logging.getLogger(__name__)

#: Attribute kinds graphsurgeon imports as a plain list.
_LIST_KINDS = (onnx.AttributeProto.INTS, onnx.AttributeProto.FLOATS, onnx.AttributeProto.STRINGS)


class EmptyList(list):
    """An empty list attribute value that knows its onnx kind (``onnx.AttributeProto.INTS``, ...)."""

    def __init__(self, kind: int) -> None:
        super().__init__()
        self.kind = kind


def mark_empty_lists(model: onnx.ModelProto, graph: gs.Graph) -> None:
    """Give each empty list attribute of ``graph`` (imported from ``model``) the kind it has in ``model``."""
    _mark_nodes(model.graph.node, graph.nodes)
    functions = {(f.domain, f.name): f for f in getattr(graph, "functions", ())}
    for proto_function in model.functions:
        function = functions.get((proto_function.domain, proto_function.name))
        if function is not None:
            _mark_nodes(proto_function.node, function.nodes)


def _mark_nodes(protos: Iterable[onnx.NodeProto], nodes: list[gs.Node]) -> None:
    """graphsurgeon imports nodes in proto order, so the two lists pair up (skipped if they do not)."""
    protos = list(protos)
    if len(protos) != len(nodes):
        return
    for proto, node in zip(protos, nodes, strict=True):
        for attr in proto.attribute:
            value = node.attrs.get(attr.name)
            if attr.type in _LIST_KINDS and isinstance(value, list) and not value and not attr.ref_attr_name:
                node.attrs[attr.name] = EmptyList(attr.type)
            elif attr.type == onnx.AttributeProto.GRAPH and isinstance(value, gs.Graph):
                _mark_nodes(attr.g.node, value.nodes)


@contextmanager
def exporting_empty_lists(graph: gs.Graph) -> Iterator[str]:
    """While exporting ``graph``: each empty list attribute is a marker string (yields the marker's prefix).

    The graph's attributes are put back afterwards: the caller's graph is left as it was.
    """
    prefix = f"gskit-empty-list-{uuid.uuid4().hex}:"
    hidden: list[tuple[gs.Node, str, list]] = []
    for node in _all_nodes(graph):
        for key, value in node.attrs.items():
            if isinstance(value, list) and not value:
                hidden.append((node, key, value))
    for node, key, value in hidden:
        node.attrs[key] = f"{prefix}{_kind(node, key, value)}"
    try:
        yield prefix
    finally:
        for node, key, value in hidden:
            node.attrs[key] = value


def restore_empty_lists(model: onnx.ModelProto, prefix: str) -> None:
    """Turn the marker strings of :func:`exporting_empty_lists` into empty attributes of their kind."""
    marker = prefix.encode()
    for node in _proto_nodes(model):
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.STRING and attr.s.startswith(marker):
                kind = int(attr.s[len(marker) :])
                attr.ClearField("s")
                attr.type = kind


def _kind(node: gs.Node, key: str, value: list) -> int:
    """The kind an empty list was imported with, else the one the op's schema declares, else ``INTS``."""
    if isinstance(value, EmptyList):
        return value.kind
    try:
        schema = onnx.defs.get_schema(node.op, domain=node.domain or "")
    except onnx.defs.SchemaError:
        schema = None
    declared = schema.attributes.get(key) if schema is not None else None
    if declared is not None and int(declared.type) in _LIST_KINDS:
        return int(declared.type)
    log.debug("empty attribute %s of node %s has no known kind; writing it as INTS", key, node.name)
    return onnx.AttributeProto.INTS


def _all_nodes(graph: gs.Graph) -> Iterator[gs.Node]:
    subs = (graph, *graph.subgraphs(recursive=True))
    for function in getattr(graph, "functions", ()):
        subs += (function, *function.subgraphs(recursive=True))
    for sub in subs:
        yield from sub.nodes


def _proto_nodes(model: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    pending: list[onnx.NodeProto] = [*model.graph.node, *(n for f in model.functions for n in f.node)]
    while pending:
        node = pending.pop()
        yield node
        for attr in node.attribute:
            subgraphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            pending.extend(n for sub in subgraphs for n in sub.node)


#: Value kinds graphsurgeon exports from a tensor's ``type`` and ``dtype``.
_EXPORTED_KINDS = ("tensor_type", "sequence_type", "sparse_tensor_type")


@contextmanager
def exporting_value_types(graph: gs.Graph) -> Iterator[dict[str, onnx.TypeProto]]:
    """While exporting ``graph``: variables of a kind graphsurgeon cannot export have no dtype.

    Yields the types that can be rebuilt, by tensor name, for :func:`restore_value_types`. The dtypes are
    put back afterwards: the caller's graph is left as it was.
    """
    hidden: list[tuple[gs.Variable, object]] = []
    rebuilt: dict[str, onnx.TypeProto] = {}
    for sub in (graph, *graph.subgraphs(recursive=True)):
        for tensor in sub.tensors().values():
            kind = getattr(tensor, "type", "tensor_type")
            if not isinstance(tensor, gs.Variable) or tensor.dtype is None or _exportable(kind, tensor.dtype):
                continue
            hidden.append((tensor, tensor.dtype))
            type_proto = _rebuilt_type(kind, tensor.dtype)
            if type_proto is not None:
                rebuilt[tensor.name] = type_proto
    for tensor, _ in hidden:
        tensor.dtype = None
    try:
        yield rebuilt
    finally:
        for tensor, dtype in hidden:
            tensor.dtype = dtype


def restore_value_types(model: onnx.ModelProto, types: dict[str, onnx.TypeProto]) -> None:
    """Give the tensors named in ``types`` their type: an untyped input or output, or a value_info entry
    beside the node that makes it (graphsurgeon leaves out a value_info with no dtype and no shape)."""
    placed: set[str] = set()
    pending = [model.graph] if types else []
    while pending:
        graph = pending.pop()
        for info in (*graph.input, *graph.output, *graph.value_info):
            if info.name in types and info.type.WhichOneof("value") is None:
                info.type.CopyFrom(types[info.name])
            placed.add(info.name)
        for node in graph.node:
            for name in node.output:
                if name in types and name not in placed:
                    graph.value_info.add(name=name).type.CopyFrom(types[name])
                    placed.add(name)
            pending.extend(a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH)
            pending.extend(g for a in node.attribute for g in a.graphs)


def _exportable(kind: str | None, dtype: object) -> bool:
    """graphsurgeon writes this kind, and a sequence's element type is one it can write (not 0)."""
    if kind not in _EXPORTED_KINDS:
        return False
    return kind != "sequence_type" or dtype != onnx.TensorProto.UNDEFINED


def _rebuilt_type(kind: str | None, dtype: object) -> onnx.TypeProto | None:
    """The full type, where graphsurgeon's ``dtype`` holds all of it (optional: the element type; opaque:
    the opaque type); None otherwise (a map's key type, a sequence's inner type are lost)."""
    type_proto = onnx.TypeProto()
    if kind == "optional_type" and isinstance(dtype, onnx.TypeProto):
        type_proto.optional_type.elem_type.CopyFrom(dtype)
    elif kind == "opaque_type" and isinstance(dtype, onnx.TypeProto.Opaque):
        type_proto.opaque_type.CopyFrom(dtype)
    else:
        return None
    return type_proto


#: A Constant node's scalar and list forms, with the dtype ONNX gives them.
_CONSTANT_FORMS = {
    "value_float": "float32",
    "value_floats": "float32",
    "value_int": "int64",
    "value_ints": "int64",
}


def type_constant_nodes(graph: gs.Graph) -> None:
    """Give ``Constant`` nodes written with ``value_float(s)``/``value_int(s)`` a ``value`` tensor of their
    ONNX dtype (float32, int64), in place.

    graphsurgeon's constant folding lowers those forms with ``np.array(value)``: a ``value_float`` became a
    float64 tensor, so ``Div(value_float, x)`` was written as a float64/float32 ``Div`` that onnx's shape
    inference and onnxruntime refuse.
    """
    for node in graph.nodes:
        if node.op != "Constant" or len(node.attrs) != 1:
            continue
        ((key, value),) = node.attrs.items()
        if key in _CONSTANT_FORMS and not isinstance(value, gs.Node.AttributeRef):
            array = np.array(value, dtype=_CONSTANT_FORMS[key])
            node.attrs = {"value": gs.Constant(f"{node.outputs[0].name}_value", array)}


def node_subgraphs(node: gs.Node) -> Iterator[gs.Graph]:
    """The graphs held in one node's attributes (``If`` branches, ``Loop``/``Scan`` bodies)."""
    for value in node.attrs.values():
        if isinstance(value, gs.Graph):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (v for v in value if isinstance(v, gs.Graph))
