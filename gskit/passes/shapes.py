"""Shape inference that knows plugin nodes: the ``infer_shapes`` pass.

Plugin nodes are typed by their specs' output rules, registered as onnx ``OpSchema``s
(:mod:`gskit.passes.plugin_schemas`), so onnx's own ``infer_shapes`` propagates dtypes and shapes (symbolic
dims included) through plugin nodes and the standard ops after them in one pass. The inference itself, on
a weightless view (large constants as stubs: dims and type, no data, so a model of any size is inferred in
memory), is :func:`gskit.passes.tensor_types.infer_types`; ``infer_shapes_path`` runs onnx's path-based
inference for files.
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.importers.onnx_importer import get_onnx_tensor_shape

from gskit.errors import GskitError
from gskit.io import model as gsmodel
from gskit.io.outputs import place_file
from gskit.passes.plugin_schemas import deregister_schemas, plugin_schema, register_schemas, strict_inference
from gskit.passes.tensor_types import (
    data_propagation_bounded,
    first_line,
    gs_dtype,
    infer_types,
    with_inferred_types,
)
from gskit.passes.transform import GraphPass, PassContext, PassResult, ensure, option, run_pass
from gskit.plugin.registry import PluginRegistry

log = logging.getLogger(__name__)


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
    result = with_inferred_types(model, registry, strict=strict, check_type=True)
    if not strict:
        _warn_missing(result)
    return result


def _warn_missing(inferred: onnx.ModelProto) -> None:
    missing = missing_shapes(inferred)
    if missing:
        log.warning("no shape inferred for %d tensor(s): %s", len(missing), ", ".join(missing[:10]))


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
        try:
            data_prop = data_propagation_bounded(onnx.load(str(path), load_external_data=False))
            with strict_inference(strict):
                onnx.shape_inference.infer_shapes_path(
                    str(path), str(tmp), check_type=True, strict_mode=strict, data_prop=data_prop
                )
        except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as err:
            raise GskitError(f"{path}: shape inference failed: {first_line(err)}") from err
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
    inferred = infer_types(graph, registry, strict=strict, check_type=True)
    if not strict:
        _warn_missing(inferred)
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
            tensor.dtype = gs_dtype(vi.type.tensor_type.elem_type)
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


__all__ = [
    "deregister_schemas",  # kept importable from here: plugin_schemas holds them
    "plugin_schema",
    "infer_graph_shapes",
    "infer_shapes",
    "infer_shapes_path",
    "missing_shapes",
    "register_schemas",
]
