"""What an op is: which domains are standard, how ops are named, and what makes a node a plugin node.

Every module that asks "is this a standard op?" or "is this a plugin node?" asks this one, so the answer is
the same in inspect, edit, fold, sanitize, convert, the onnxruntime backend and the TensorRT check.

Three domain sets, each a superset of the one before, because three different questions are asked:

* :data:`DEFAULT_DOMAINS` (``""`` and its alias ``ai.onnx``): the ONNX operator set itself. Ops such as
  ``Constant``, ``Shape`` or ``Cast`` are recognised only there.
* :data:`ONNX_DOMAINS`: every domain the ONNX standard defines (``ai.onnx.ml``, the preview domains). A node
  outside them is a *custom* node (``gskit inspect``), and the TensorRT parser has no importer for it.
* :data:`ORT_DOMAINS`: the ONNX domains plus onnxruntime's own contrib domains. onnxruntime runs these
  itself; a node of any other domain is a **plugin node**, run through its plugin (a numpy reference on
  onnxruntime, a TensorRT plugin in an engine) and never evaluated by ``fold``.

A plugin's identity is ``(domain, name, version)`` everywhere (:data:`PluginKey`): the node's domain (the
TensorRT namespace for gskit's own plugins; ``TRT`` for TensorRT's own, whose namespace ``""`` travels in
the ``plugin_namespace`` attribute), its op type the name, and its ``plugin_version`` attribute the version
(``"1"`` when absent, as TensorRT reads it). Never key a plugin on its op type or ``(domain, op)`` alone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass
from functools import cache
from typing import Any

import onnx
import onnx_graphsurgeon as gs

#: The ONNX default operator set: the empty domain and its alias.
DEFAULT_DOMAINS = frozenset({"", "ai.onnx"})
#: Every domain the ONNX standard defines.
ONNX_DOMAINS = DEFAULT_DOMAINS | {"ai.onnx.ml", "ai.onnx.preview.training", "ai.onnx.preview"}
#: Domains onnxruntime's CPU provider implements itself (ONNX's and its contrib ops).
ORT_DOMAINS = ONNX_DOMAINS | {"com.microsoft", "com.microsoft.nchwc", "com.ms.internal.nhwc"}
#: Attribute that names the TensorRT plugin namespace; a node carrying it is a plugin node.
NAMESPACE_ATTR = "plugin_namespace"
#: Attribute that holds the plugin version (TensorRT's default when absent: "1").
VERSION_ATTR = "plugin_version"
DEFAULT_VERSION = "1"

#: ``(domain, name, version)``: a plugin's identity (``PluginSpec.key``, :func:`node_key`).
PluginKey = tuple[str, str, str]
Node = gs.Node | onnx.NodeProto


def onnx_op_types() -> frozenset[str]:
    """Op types of the ONNX standard (any version, any ONNX domain); also ``ONNX_OP_TYPES``.

    Made on first use, from the newest schema of each op: ONNX keeps a schema for every op it ever defined
    (deprecated ones too), so the names are those of every version, and listing each op's history made five
    times as many schema objects (8 ms instead of 1.5 ms). Only schemas of ONNX's domains count, so plugin
    schemas added to onnx's registry never do.
    """
    global _onnx_op_types
    if _onnx_op_types is None:
        _onnx_op_types = frozenset(
            schema.name for schema in onnx.defs.get_all_schemas() if schema.domain in ONNX_DOMAINS
        )
    return _onnx_op_types


_onnx_op_types: frozenset[str] | None = None


def __getattr__(name: str) -> Any:
    """``ONNX_OP_TYPES``: :func:`onnx_op_types`, for the code that imports it by that name."""
    if name == "ONNX_OP_TYPES":
        return onnx_op_types()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_default_domain(domain: str | None) -> bool:
    """True for the ONNX default operator set (``""``, ``ai.onnx``, or no domain at all)."""
    return (domain or "") in DEFAULT_DOMAINS


def canonical_domain(domain: str | None) -> str:
    """The domain with ``ai.onnx`` and ``None`` written as ``""`` (the form onnx's schemas use)."""
    return "" if is_default_domain(domain) else str(domain)


def op_label(domain: str | None, op_type: str) -> str:
    """How reports name an op: ``Relu`` for the default set, ``domain::Op`` otherwise."""
    return op_type if is_default_domain(domain) else f"{domain}::{op_type}"


@dataclass(frozen=True)
class NodeSummary:
    """A node as reports list it and pictures draw it: name, op label, input and output tensor names (an
    absent optional input stays ``""``)."""

    name: str
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    @classmethod
    def of(cls, node: onnx.NodeProto, op: str) -> NodeSummary:
        """``node`` under the label ``op`` (the caller's form: :func:`op_label`, ``domain::op_type``)."""
        return cls(node.name, op, tuple(node.input), tuple(node.output))


def is_onnx_op(domain: str | None, op_type: str) -> bool:
    """Whether ONNX (any opset) defines ``op_type`` in ``domain``; op names are case-sensitive.

    ONNX's own domains are answered once per op (``onnx.defs.has`` takes 50 us a call, loading the shipped
    plugins asks 500 times about some 40 ops, and listing every schema takes 20 ms); another domain's schemas
    may be added later, so onnx is asked each time.
    """
    domain = canonical_domain(domain)
    if domain in ONNX_DOMAINS:
        return _onnx_has(domain, op_type)
    return onnx.defs.has(op_type, domain)


@cache
def _onnx_has(domain: str, op_type: str) -> bool:
    return onnx.defs.has(op_type, domain)


def onnx_op_since(domain: str | None, op_type: str, opset: int) -> int | None:
    """None when ``op_type`` exists at ``opset`` of ``domain``, else the first opset having it (0: none)."""
    domain = canonical_domain(domain)
    try:
        onnx.defs.get_schema(op_type, opset, domain)
        return None
    except onnx.defs.SchemaError:
        pass
    versions = [
        s.since_version
        for s in onnx.defs.get_all_schemas_with_history()
        if s.name == op_type and s.domain == domain
    ]
    return min(versions, default=0)


def similar_onnx_ops(op_type: str, limit: int = 3) -> list[str]:
    """ONNX op types spelled like ``op_type`` (``tanh`` -> ``Tanh``), for "did you mean" hints."""
    import difflib

    lower = {name.lower(): name for name in onnx_op_types()}
    exact = lower.get(op_type.lower())
    if exact is not None:
        return [exact]
    return [lower[m] for m in difflib.get_close_matches(op_type.lower(), list(lower), n=limit, cutoff=0.75)]


def op_counts(graph: gs.Graph) -> Counter[str]:
    """Nodes per :func:`op_label` in ``graph`` and all its subgraphs."""
    counts: Counter[str] = Counter()
    for sub in (graph, *graph.subgraphs(recursive=True)):
        for node in sub.nodes:
            counts[op_label(node.domain, node.op)] += 1
    return counts


def node_key(node: Node) -> PluginKey:
    """``(domain, op type, plugin_version or "1")``: the plugin a node instantiates, for either node kind."""
    if isinstance(node, onnx.NodeProto):
        version = next((_text(a) for a in node.attribute if a.name == VERSION_ATTR), DEFAULT_VERSION)
        return (node.domain or "", node.op_type, version)
    return (node.domain or "", node.op, _text(node.attrs.get(VERSION_ATTR, DEFAULT_VERSION)))


def has_namespace_attr(node: Node) -> bool:
    """The node carries ``plugin_namespace``: TensorRT's parser looks for a registered plugin first."""
    if isinstance(node, onnx.NodeProto):
        return any(a.name == NAMESPACE_ATTR for a in node.attribute)
    return NAMESPACE_ATTR in node.attrs


def is_plugin_node(node: Node, known: Collection[PluginKey] = ()) -> bool:
    """True for a plugin node: a domain outside :data:`ORT_DOMAINS`, a ``plugin_namespace`` attribute, or
    the key (:func:`node_key`) of a known plugin. onnxruntime cannot run such a node by itself."""
    domain = node.domain or ""
    return domain not in ORT_DOMAINS or has_namespace_attr(node) or (bool(known) and node_key(node) in known)


def plugin_keys(specs: Any) -> frozenset[PluginKey]:
    """The keys of plugin specs (a ``PluginRegistry``, a list of ``PluginSpec``, or ``None``)."""
    return frozenset(spec.key for spec in specs or ())


def _text(value: Any) -> str:
    """An attribute value as the string TensorRT compares (STRING attributes arrive as bytes)."""
    if isinstance(value, onnx.AttributeProto):
        value = onnx.helper.get_attribute_value(value)
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
