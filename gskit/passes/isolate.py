"""Subgraph isolation: cut out the part of a model between named tensors, without reading its weights.

``isolate(graph, inputs, outputs)`` walks backwards from the output tensors and stops at the input
tensors, so it touches each node and tensor of the kept part once. Weights come along as they are:
weights still on disk (``load(..., load_weights=False)``) stay there until ``gskit.io.model.save`` streams
them into the new model's data file, which is what lets it work on models past protobuf's 2 GB limit
(``onnx.utils.extract_model`` loads every weight and cannot).

The new graph's inputs and outputs need a dtype (and should have a shape). Where the model carries no
value_info for them, plugin-aware shape inference runs on a weightless view of the model
(``gskit.passes.tensor_types.infer_types``): large or on-disk constants keep their dims and data type but
lose their data, so inference never reads or serializes weights.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.importers.onnx_importer import get_onnx_tensor_shape

from gskit.errors import GskitError
from gskit.io.model import node_subgraphs
from gskit.passes.inspect import tensor_name_hint
from gskit.passes.tensor_types import gs_dtype, infer_types
from gskit.passes.transform import Before, GraphPass, PassContext, PassResult, ensure, option, run_pass
from gskit.plugin.registry import PluginRegistry

log = logging.getLogger(__name__)


def _names(text: str) -> tuple[str, ...]:
    """The CLI's comma-separated tensor names."""
    return tuple(name.strip() for name in text.split(",") if name.strip())


@dataclass(frozen=True)
class IsolateOptions:
    """Keep only the subgraph between these tensors (``isolate``'s options)."""

    inputs: tuple[str, ...] = option(
        (), help="comma-separated tensor names that become the inputs", parse=_names, metavar="NAMES"
    )
    outputs: tuple[str, ...] = option(
        (),
        help="comma-separated tensor names that become the outputs",
        parse=_names,
        metavar="NAMES",
        required=True,
    )


class _Isolate(GraphPass[IsolateOptions]):
    name, options, effect, keeps_outputs, takes_model = "isolate", IsolateOptions, "copying", False, False

    def requires(self, model: Any, options: IsolateOptions) -> None:
        if not options.outputs:
            raise GskitError("isolate needs at least one output tensor name")
        if not options.inputs:  # the outputs would be computed from the graph's inputs: nothing isolated
            raise GskitError("isolate: needs both 'inputs' and 'outputs' tensor names")

    def call(self, model: Any, options: IsolateOptions, context: PassContext) -> PassResult:
        sub = _isolate(model, options.inputs, options.outputs, context.plugins)
        summary = f"kept the subgraph {list(options.inputs)} -> {list(options.outputs)}"
        return PassResult(sub, modified=True, summary=summary)

    def ensures(self, model: Any, options: IsolateOptions, result: PassResult, before: Before) -> None:
        outputs = [t.name for t in result.model.outputs]
        ensure(outputs == list(options.outputs), self.name, f"outputs are {outputs}")


#: The isolate pass: ``run_pass(ISOLATE, graph, IsolateOptions(inputs, outputs), plugins=registry)``.
ISOLATE = _Isolate()


def isolate(
    graph: gs.Graph,
    inputs: Sequence[str],
    outputs: Sequence[str],
    *,
    registry: PluginRegistry | None = None,
) -> gs.Graph:
    """Extract the subgraph that computes ``outputs`` from ``inputs``.

    The original graph is left unchanged; the result is a new graph holding copies of the kept nodes
    and tensors (weights are shared, not copied). Initializers used by the kept nodes come along;
    nodes of If/Loop/Scan bodies that read tensors of the enclosing graph pull in those tensors'
    producers too. A given input that is never reached stays a (dangling) graph input.

    Args:
        graph: the model's graph (from ``gskit.io.model.to_graph``).
        inputs: names of main-graph tensors that become the new graph's inputs.
        outputs: names of main-graph tensors that become the new graph's outputs (at least one).
        registry: plugins whose specs type the outputs of plugin nodes during shape inference;
            ``None`` infers through standard ops only.

    Returns:
        The subgraph, with dtype and shape filled in on its inputs and outputs
        (``run_pass(ISOLATE, graph, IsolateOptions(inputs, outputs), plugins=registry).model``).

    Raises:
        GskitError: a name is unknown (the message lists close names) or listed twice, an input is an
            initializer, an output cannot be computed from the inputs (the message names the tensor
            that is missing), or an input/output's dtype stays unknown after shape inference.
    """
    options = IsolateOptions(inputs=tuple(inputs), outputs=tuple(outputs))
    return run_pass(ISOLATE, graph, options, plugins=registry).model


def _isolate(
    graph: gs.Graph, inputs: Sequence[str], outputs: Sequence[str], registry: PluginRegistry | None
) -> gs.Graph:
    names = graph.tensors()
    in_tensors = _lookup(names, inputs, "input")
    out_tensors = _lookup(names, outputs, "output")
    for tensor in in_tensors:
        if isinstance(tensor, gs.Constant):
            raise GskitError(
                f"input '{tensor.name}' is an initializer (a constant), not a computed tensor; "
                f"drop it from the inputs (initializers are kept automatically)"
            )
    nodes = _nodes_between(graph, in_tensors, out_tensors)
    sub = _copy_part(graph, nodes, in_tensors, out_tensors)
    _fill_types(graph, sub, PluginRegistry() if registry is None else registry)
    log.info(
        "isolated %d of %d nodes: inputs %s, outputs %s",
        len(sub.nodes),
        len(graph.nodes),
        list(inputs),
        list(outputs),
    )
    return sub


def _lookup(tensors: dict[str, gs.Tensor], names: Sequence[str], role: str) -> list[gs.Tensor]:
    found: list[gs.Tensor] = []
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise GskitError(f"{role} tensor '{name}' is listed twice; list it once")
        seen.add(name)
        tensor = tensors.get(name) if name else None
        if tensor is None:
            raise GskitError(
                f"unknown {role} tensor '{name}' (not in the main graph); {tensor_name_hint(name, tensors)}"
            )
        found.append(tensor)
    return found


def _nodes_between(graph: gs.Graph, inputs: list[gs.Tensor], outputs: list[gs.Tensor]) -> list[gs.Node]:
    """Nodes needed to compute ``outputs`` from ``inputs``, in the graph's order; one pass backwards."""
    stop = {id(t) for t in inputs}
    model_inputs = {id(t) for t in graph.inputs}
    seen: set[int] = set()
    kept: set[int] = set()
    missing: dict[str, tuple[str, bool]] = {}  # tensor name -> (output that needs it, is a model input)
    for out in outputs:
        stack: list[gs.Tensor] = [out]
        while stack:
            tensor = stack.pop()
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            if id(tensor) in stop or isinstance(tensor, gs.Constant) or not tensor.name:
                continue
            if not tensor.inputs:
                missing.setdefault(tensor.name, (out.name, id(tensor) in model_inputs))
                continue
            node = tensor.inputs[0]
            if id(node) in kept:
                continue
            kept.add(id(node))
            stack.extend(node.inputs)
            stack.extend(_outer_reads(node))
    if missing:
        raise GskitError(_missing_message(missing))
    return [node for node in graph.nodes if id(node) in kept]


def _missing_message(missing: dict[str, tuple[str, bool]]) -> str:
    (name, (output, is_input)), *others = missing.items()
    why = "a model input" if is_input else "no node produces it"
    message = (
        f"output '{output}' needs tensor '{name}' ({why}), which is not among the inputs; "
        f"add it to the inputs"
    )
    if others:
        message += f" (also needed: {', '.join(repr(n) for n, _ in others)})"
    return message


def _outer_reads(node: gs.Node) -> list[gs.Tensor]:
    """Tensors of enclosing graphs that the node's bodies (If/Loop/Scan, nested too) read."""
    graphs = [g for body in node_subgraphs(node) for g in (body, *body.subgraphs(recursive=True))]
    if not graphs:
        return []
    local: set[int] = set()
    reads: list[gs.Tensor] = []
    for g in graphs:
        local.update(id(t) for t in g.inputs)
        for inner in g.nodes:
            local.update(id(t) for t in inner.outputs)
            reads.extend(inner.inputs)
    return [t for t in reads if id(t) not in local]


#: What a subgraph keeps of the whole graph besides its nodes and boundary tensors.
_GRAPH_FIELDS = ("name", "doc_string", "opset", "import_domains", "functions", "ir_version")


def _copy_part(
    graph: gs.Graph, nodes: list[gs.Node], inputs: list[gs.Tensor], outputs: list[gs.Tensor]
) -> gs.Graph:
    """Copy just the kept nodes and their tensors into a new graph (the original stays untouched)."""
    kept = {field: getattr(graph, field) for field in _GRAPH_FIELDS}
    part = gs.Graph(nodes=nodes, inputs=inputs, outputs=outputs, **kept)
    sub = part.copy()
    # A kept node may also produce a tensor given as input (one output of a Split, say): that output
    # now comes from outside, so the node's slot gets a fresh, unused tensor.
    input_ids = {id(t) for t in sub.inputs}
    taken = set(sub.tensors())
    for node in sub.nodes:
        for index, tensor in enumerate(node.outputs):
            if id(tensor) in input_ids:
                fresh = f"{tensor.name}_unused"
                while fresh in taken:
                    fresh += "_"
                taken.add(fresh)
                node.outputs[index] = gs.Variable(fresh, dtype=tensor.dtype, shape=tensor.shape)
    return sub


def _fill_types(graph: gs.Graph, sub: gs.Graph, registry: PluginRegistry) -> None:
    """Give the new graph's inputs and outputs a dtype and shape, from shape inference where missing."""
    boundary = [t for t in (*sub.inputs, *sub.outputs) if isinstance(t, gs.Variable)]
    lacking = [t for t in boundary if t.dtype is None or t.shape is None]
    if not lacking:
        return
    inferred = _inferred_types(graph, registry)
    for tensor in lacking:
        value = inferred.get(tensor.name)
        if value is not None and value.type.HasField("tensor_type"):
            if tensor.dtype is None and value.type.tensor_type.elem_type:
                tensor.dtype = gs_dtype(value.type.tensor_type.elem_type)
            if tensor.shape is None:
                tensor.shape = get_onnx_tensor_shape(value)
        if tensor.dtype is None:
            raise GskitError(
                f"tensor '{tensor.name}' has no known dtype, even after shape inference; "
                f"set its type in the model first (`gskit edit`) or choose another tensor"
            )
        if tensor.shape is None:
            log.warning("tensor '%s' has no known shape (unknown rank) in the isolated graph", tensor.name)


def _inferred_types(graph: gs.Graph, registry: PluginRegistry) -> dict[str, onnx.ValueInfoProto]:
    """Types of the graph's tensors from plugin-aware shape inference on a weightless view (constants still
    on disk are never read)."""
    try:
        g = infer_types(graph, registry, check_type=True, on_disk=True).graph
    except GskitError as err:  # the graph's own types are all there is
        log.warning("%s; using the model's own types", err)
        return {}
    return {v.name: v for v in (*g.input, *g.value_info, *g.output)}
