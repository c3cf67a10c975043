"""A summary of an ONNX model: what it needs (opsets), what it contains (ops, custom nodes, functions),
what it takes and gives (inputs, outputs) and where shape information is missing.

``summarize`` never reads weights: it works on a model loaded with ``load(path, load_weights=False)``,
and shape inference runs on a weightless view (``gskit.passes.tensor_types.infer_types``: large
initializers as stubs, weights on disk never read), so it stays cheap and works for models over 2 GB.

Scopes: the *main* graph is the model's top-level graph; *subgraphs* are the bodies of If/Loop/Scan
(any graph attribute), recursively, reached from the main graph; *functions* are the model-local
functions (with the subgraphs inside them).
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import onnx
from onnx import AttributeProto, TensorProto
from onnx.external_data_helper import uses_external_data

from gskit.io.model import load, missing_data_files, tensor_nbytes
from gskit.io.strict_json import to_jsonable
from gskit.passes.tensor_types import InferenceFailed, infer_types
from gskit.plugin.ops import ONNX_DOMAINS, NodeSummary

log = logging.getLogger(__name__)

#: How the default domain ("") is written in keys and tables.
DEFAULT_DOMAIN = "ai.onnx"

#: A dim: a fixed size (int), a symbolic name (str) or unknown (None, shown as "?").
Dim = int | str | None

SCOPE_MAIN = "main"
SCOPE_SUBGRAPH = "subgraph"
SCOPE_FUNCTION = "function"
SCOPES = (SCOPE_MAIN, SCOPE_SUBGRAPH, SCOPE_FUNCTION)


@dataclass(frozen=True)
class TensorSummary:
    """A graph input or output.

    Attributes:
        name: the tensor's name.
        dtype: ONNX element type in lower case (``float``, ``float16``, ``int64``...); ``?`` when the
            type is missing; ``sequence``/``map``/``optional``/``sparse_tensor`` for non-tensor types.
        shape: one entry per dim (see ``Dim``), or None when even the rank is unknown.
    """

    name: str
    dtype: str
    shape: tuple[Dim, ...] | None

    @property
    def is_dynamic(self) -> bool:
        """True when the rank or some dim is not a fixed int."""
        return self.shape is None or any(not isinstance(d, int) for d in self.shape)

    def shape_text(self) -> str:
        """The shape for people: ``[1, batch, ?]``; ``?`` alone for an unknown rank."""
        return shape_text(self.shape)


def shape_text(shape: tuple[Dim, ...] | None) -> str:
    """Dims for people: ``[1, batch, ?]`` (an unknown dim is ``?``); ``?`` alone for an unknown rank."""
    if shape is None:
        return "?"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


@dataclass(frozen=True)
class InitializerSummary:
    """The main graph's initializers.

    Attributes:
        count: number of initializers (dense and sparse).
        nbytes: bytes of their data, counted from the external-data records for weights on disk.
        external_count: how many of them keep their data in an external file.
        listed_as_inputs: initializers that are also graph inputs (IR < 4 style, or overridable weights;
            TensorRT and onnxruntime treat such a tensor as an input unless it is fed nothing).
    """

    count: int
    nbytes: int
    external_count: int
    listed_as_inputs: tuple[str, ...]


@dataclass(frozen=True)
class CustomNode:
    """A node whose domain is not an ONNX standard domain (a plugin node or a local-function call).

    Attributes:
        name: node name (may be empty).
        domain: the node's domain.
        op_type: the node's op type.
        scope: ``main``, ``subgraph`` or ``function <domain>::<name>`` (the function that holds it).
        plugin_namespace: value of the ``plugin_namespace`` string attribute, None when absent.
        plugin_version: value of the ``plugin_version`` string attribute, None when absent.
        calls_function: a model-local function with this (domain, op_type) exists.
    """

    name: str
    domain: str
    op_type: str
    scope: str
    plugin_namespace: str | None = None
    plugin_version: str | None = None
    calls_function: bool = False


@dataclass(frozen=True)
class FunctionSummary:
    """A model-local function.

    Attributes:
        domain: the function's domain.
        name: the function's name (the op_type of nodes that call it).
        overload: the overload name (IR >= 10), empty when none.
        node_count: nodes in its body, subgraphs in the body included.
        call_count: nodes that call it, in every scope.
    """

    domain: str
    name: str
    overload: str
    node_count: int
    call_count: int

    @property
    def key(self) -> str:
        """``domain::name``, the key used in tables."""
        return _key(self.domain, self.name)


@dataclass(frozen=True)
class ModelSummary:
    """What ``summarize`` found. ``to_json`` gives the same as plain JSON values.

    Attributes:
        path: the model file, when known.
        ir_version: the model's IR version.
        producer: producer name and version, e.g. ``pytorch 2.5.0`` (empty when not recorded).
        opsets: opset version per domain; the default domain is written ``ai.onnx``.
        node_count: nodes in the main graph.
        subgraph_node_count: nodes in subgraphs (If/Loop/Scan bodies) reached from the main graph.
        function_node_count: nodes in the bodies of local functions.
        ops: op histogram keyed ``domain::op_type`` over the main graph and its subgraphs (not the
            bodies of local functions; see ``ops_by_scope``), most frequent first.
        ops_by_scope: the same histogram per scope: ``main``, ``subgraph``, ``function``.
        inputs: graph inputs that are not initializers.
        outputs: graph outputs.
        initializers: the main graph's initializers.
        custom_nodes: nodes outside the standard domains, in every scope, in graph order.
        functions: the model-local functions.
        missing_shapes: main-graph node outputs whose rank is unknown after shape inference.
        shape_inference_error: onnx's message when shape inference failed (then ``missing_shapes`` is
            computed from the value_info already in the model); None when it ran.
        missing_data_files: external data files the model names that are not beside it (no weight is
            read to summarize, so that is no error here; other commands need them).
        tensorrt: the TensorRT parser check, filled by the TensorRT backend when asked for; None here.
    """

    path: str | None
    ir_version: int
    producer: str
    opsets: dict[str, int]
    node_count: int
    subgraph_node_count: int
    function_node_count: int
    ops: dict[str, int]
    ops_by_scope: dict[str, dict[str, int]]
    inputs: tuple[TensorSummary, ...]
    outputs: tuple[TensorSummary, ...]
    initializers: InitializerSummary
    custom_nodes: tuple[CustomNode, ...]
    functions: tuple[FunctionSummary, ...]
    missing_shapes: tuple[str, ...]
    shape_inference_error: str | None = None
    missing_data_files: tuple[str, ...] = ()
    tensorrt: Any | None = field(default=None)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values. Unknown dims are ``null``, symbolic dims strings, fixed dims ints."""
        data = to_jsonable(self)
        for entry, function in zip(data["functions"], self.functions, strict=True):
            entry["key"] = function.key
        return data


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of the main graph (``gskit inspect --tensors``).

    Attributes:
        name: the tensor's name (what ``gskit isolate``, ``edit --expose`` and ``compare`` take).
        dtype: element type as in :class:`TensorSummary` (``?`` when unknown).
        shape: dims (see ``Dim``), or None when even the rank is unknown.
        kind: ``input`` (a graph input), ``initializer`` or ``activation`` (a node's output).
        producer: the name of the node that computes it; None for inputs and initializers.
        consumers: how many main-graph node inputs read it.
        is_output: it is a graph output.
    """

    name: str
    dtype: str
    shape: tuple[Dim, ...] | None
    kind: str
    producer: str | None
    consumers: int
    is_output: bool


def list_nodes(model: onnx.ModelProto) -> tuple[NodeSummary, ...]:
    """Every node of the main graph in graph order (``inspect --nodes``; ``op`` is ``domain::op_type``)."""
    return tuple(NodeSummary.of(n, _key(n.domain, n.op_type)) for n in model.graph.node)


def list_tensors(model: onnx.ModelProto, *, infer_shapes: bool = True) -> tuple[TensorEntry, ...]:
    """Every tensor of the main graph: inputs, initializers, then node outputs in graph order.

    Types and shapes come from shape inference on a weight-free copy (see ``summarize``), or only from the
    model's own value_info with ``infer_shapes=False``; no weight is read.
    """
    graph = model.graph
    typed, _ = _inferred_graph(model, infer_shapes)
    known = {v.name: _tensor(v) for v in (*typed.input, *typed.value_info, *typed.output)}
    consumers = Counter(name for node in graph.node for name in node.input if name)
    outputs = {v.name for v in graph.output}
    tensors: dict[str, TensorEntry] = {}

    def add(name: str, kind: str, producer: str | None, fallback: TensorSummary | None = None) -> None:
        if not name or name in tensors:
            return
        summary = known.get(name) or fallback or TensorSummary(name, "?", None)
        tensors[name] = TensorEntry(
            name, summary.dtype, summary.shape, kind, producer, consumers[name], name in outputs
        )

    initializers = {t.name: t for t in graph.initializer}
    for value in graph.input:
        if value.name not in initializers:
            add(value.name, "input", None)
    for init in graph.initializer:
        add(
            init.name,
            "initializer",
            None,
            TensorSummary(init.name, _dtype_name(init.data_type), tuple(init.dims)),
        )
    for node in graph.node:
        for name in node.output:
            add(name, "activation", node.name)
    return tuple(tensors.values())


def tensor_name_hint(name: str, names: Iterable[str]) -> str:
    """The end of an unknown-tensor error: the close names (a typo) or none, and how to list them all."""
    close = difflib.get_close_matches(name, list(names), n=5, cutoff=0.6)
    hint = f"close names: {', '.join(repr(c) for c in close)}" if close else "no similar name"
    return f"{hint}; `gskit inspect --tensors` lists the model's tensors"


def summarize_file(path: str | os.PathLike, *, infer_shapes: bool = True) -> ModelSummary:
    """Load ``path`` without its weights and summarize it (see ``summarize``).

    Raises:
        GskitError: the file is missing or not a readable ONNX model (missing external data is noted in
            ``missing_data_files``, not raised).
    """
    model = load(path, load_weights=False, allow_missing_data=True)
    summary = summarize(model, path=str(path), infer_shapes=infer_shapes)
    return dataclasses.replace(summary, missing_data_files=tuple(missing_data_files(model, path)))


def summarize(model: onnx.ModelProto, path: str | None = None, *, infer_shapes: bool = True) -> ModelSummary:
    """Summarize ``model`` without reading any weight from disk; one pass over each scope.

    The op histogram ``ops`` counts the nodes of the main graph and of its subgraphs (If/Loop/Scan
    bodies, recursively); nodes inside local functions are counted apart, in ``ops_by_scope["function"]``.

    Args:
        model: the model; it is not modified.
        path: the file it came from, recorded in the summary.
        infer_shapes: run onnx shape inference (on a weight-free copy) to find tensors without shape
            information; with False only the model's own value_info is used.

    Returns:
        The summary.
    """
    graph = model.graph
    local = {(f.domain, f.name) for f in model.functions}
    ops_by_scope: dict[str, Counter[str]] = {scope: Counter() for scope in SCOPES}
    calls: Counter[tuple[str, str, str]] = Counter()
    custom: list[CustomNode] = []

    def record(scope: str, label: str, node: onnx.NodeProto) -> None:
        ops_by_scope[scope][_key(node.domain, node.op_type)] += 1
        calls[(node.domain, node.op_type, getattr(node, "overload", ""))] += 1
        if node.domain not in ONNX_DOMAINS:
            custom.append(_custom_node(node, label, (node.domain, node.op_type) in local))

    for scope, node in _walk(graph.node, SCOPE_MAIN):
        record(scope, scope, node)
    function_sizes: list[int] = []
    for function in model.functions:
        label = f"{SCOPE_FUNCTION} {_key(function.domain, function.name)}"
        size = 0
        for _, node in _walk(function.node, SCOPE_FUNCTION):
            record(SCOPE_FUNCTION, label, node)
            size += 1
        function_sizes.append(size)

    ops = ops_by_scope[SCOPE_MAIN] + ops_by_scope[SCOPE_SUBGRAPH]
    initializer_names = {t.name for t in graph.initializer}
    initializer_names |= {s.values.name for s in graph.sparse_initializer}
    missing, error = _missing_shapes(model, infer_shapes)
    return ModelSummary(
        path=path,
        ir_version=model.ir_version,
        producer=" ".join(p for p in (model.producer_name, model.producer_version) if p),
        opsets={(o.domain or DEFAULT_DOMAIN): o.version for o in model.opset_import},
        node_count=sum(ops_by_scope[SCOPE_MAIN].values()),
        subgraph_node_count=sum(ops_by_scope[SCOPE_SUBGRAPH].values()),
        function_node_count=sum(ops_by_scope[SCOPE_FUNCTION].values()),
        ops=_sorted(ops),
        ops_by_scope={scope: _sorted(counts) for scope, counts in ops_by_scope.items()},
        inputs=tuple(_tensor(v) for v in graph.input if v.name not in initializer_names),
        outputs=tuple(_tensor(v) for v in graph.output),
        initializers=_initializers(graph),
        custom_nodes=tuple(custom),
        functions=tuple(
            FunctionSummary(
                domain=f.domain,
                name=f.name,
                overload=getattr(f, "overload", ""),
                node_count=size,
                call_count=calls[(f.domain, f.name, getattr(f, "overload", ""))],
            )
            for f, size in zip(model.functions, function_sizes, strict=True)
        ),
        missing_shapes=missing,
        shape_inference_error=error,
    )


def _key(domain: str, op_type: str) -> str:
    return f"{domain or DEFAULT_DOMAIN}::{op_type}"


def _sorted(counts: Counter[str]) -> dict[str, int]:
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def _walk(nodes: Iterable[onnx.NodeProto], scope: str) -> Iterator[tuple[str, onnx.NodeProto]]:
    """Yield (scope, node) for ``nodes`` and, depth first, for the nodes of their subgraphs.

    Nodes inside subgraphs get the scope ``subgraph`` unless ``scope`` is ``function``.
    """
    inner = SCOPE_FUNCTION if scope == SCOPE_FUNCTION else SCOPE_SUBGRAPH
    stack: list[tuple[str, Iterator[onnx.NodeProto]]] = [(scope, iter(nodes))]
    while stack:
        current, it = stack[-1]
        node = next(it, None)
        if node is None:
            stack.pop()
            continue
        yield current, node
        for attr in node.attribute:
            if attr.type == AttributeProto.GRAPH:
                stack.append((inner, iter(attr.g.node)))
            elif attr.type == AttributeProto.GRAPHS:
                for sub in reversed(attr.graphs):
                    stack.append((inner, iter(sub.node)))


def _string_attr(node: onnx.NodeProto, name: str) -> str | None:
    for attr in node.attribute:
        if attr.name == name:
            if attr.type == AttributeProto.STRING:
                return attr.s.decode("utf-8", errors="replace")
            return str(onnx.helper.get_attribute_value(attr))
    return None


def _custom_node(node: onnx.NodeProto, scope: str, calls_function: bool) -> CustomNode:
    return CustomNode(
        name=node.name,
        domain=node.domain,
        op_type=node.op_type,
        scope=scope,
        plugin_namespace=_string_attr(node, "plugin_namespace"),
        plugin_version=_string_attr(node, "plugin_version"),
        calls_function=calls_function,
    )


def _dtype_name(elem_type: int) -> str:
    if elem_type == TensorProto.UNDEFINED:
        return "?"
    try:
        return TensorProto.DataType.Name(elem_type).lower()
    except ValueError:
        return f"type{elem_type}"


def _tensor(value: onnx.ValueInfoProto) -> TensorSummary:
    kind = value.type.WhichOneof("value")
    if kind != "tensor_type":
        return TensorSummary(value.name, kind or "?", None)
    tensor_type = value.type.tensor_type
    if not tensor_type.HasField("shape"):
        return TensorSummary(value.name, _dtype_name(tensor_type.elem_type), None)
    dims = tuple(_dim(d) for d in tensor_type.shape.dim)
    return TensorSummary(value.name, _dtype_name(tensor_type.elem_type), dims)


def _dim(dim: onnx.TensorShapeProto.Dimension) -> Dim:
    which = dim.WhichOneof("value")
    if which == "dim_value":
        return dim.dim_value
    if which == "dim_param":
        return dim.dim_param
    return None


def _initializers(graph: onnx.GraphProto) -> InitializerSummary:
    tensors = [*graph.initializer, *(s.values for s in graph.sparse_initializer)]
    names = {t.name for t in tensors}
    return InitializerSummary(
        count=len(tensors),
        nbytes=sum(tensor_nbytes(t) for t in tensors),
        external_count=sum(1 for t in tensors if uses_external_data(t)),
        listed_as_inputs=tuple(v.name for v in graph.input if v.name in names),
    )


def _missing_shapes(model: onnx.ModelProto, infer: bool) -> tuple[tuple[str, ...], str | None]:
    """Main-graph node outputs without a rank, after shape inference (or from value_info as present)."""
    graph, error = _inferred_graph(model, infer)
    known = {t.name for t in graph.initializer}
    for value in (*graph.input, *graph.output, *graph.value_info):
        if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape"):
            known.add(value.name)
        elif value.type.WhichOneof("value") not in (None, "tensor_type"):
            known.add(value.name)  # sequences, maps, optionals: no rank to report
    missing = [name for node in model.graph.node for name in node.output if name and name not in known]
    return tuple(missing), error


def _inferred_graph(model: onnx.ModelProto, infer: bool) -> tuple[onnx.GraphProto, str | None]:
    """The main graph with inferred value_info (on a weightless view), and onnx's message when that failed
    (then the model's own graph, with the value_info it has)."""
    if not infer:
        return model.graph, None
    try:
        return infer_types(model).graph, None
    except InferenceFailed as err:
        log.warning("shape inference failed, using the model's value_info: %s", err.reason)
        return model.graph, err.reason
