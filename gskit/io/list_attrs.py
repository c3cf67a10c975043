"""Empty list attributes (``axes=[]``, ``pads=[]``) through a ``gs.Graph`` round trip, kind and all.

graphsurgeon imports an ``INTS``, ``FLOATS`` or ``STRINGS`` attribute as a Python list and exports it with
``onnx.helper.make_attribute``, which infers the kind from the items and so fails on an empty list (valid
ONNX). :func:`mark_empty_lists` runs after import and replaces each empty list by an :class:`EmptyList`
that remembers its kind; :func:`exporting_empty_lists` hides empty lists from graphsurgeon's export as
marker strings and :func:`restore_empty_lists` turns the markers back into empty attributes of their kind.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

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
