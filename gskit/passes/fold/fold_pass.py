"""The fold pass: :func:`fold`, ``FOLD``, and the loop that folds a graph to a fixed point (shape inference,
shape folding, evaluation by one of the two engines, ``If`` flattening, subgraphs), then cleans up and gives
graph outputs back the dtype and shape they had."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import onnx
import onnx_graphsurgeon as gs

from gskit.errors import GskitError
from gskit.io import model as gsmodel
from gskit.io.gs_export import type_constant_nodes
from gskit.passes.fold.batched import Spill, fold_batched, uses_batches
from gskit.passes.fold.constant_if import flatten_constant_ifs
from gskit.passes.fold.exclusion import Exclusion, report_key
from gskit.passes.fold.options import FoldOptions, FoldReport
from gskit.passes.fold.shape_nodes import fold_shape_nodes
from gskit.passes.fold.whole_graph import drop_non_tensor_constants, fold_with_graphsurgeon
from gskit.passes.tensor_types import (
    GsLosses,
    SymbolicMemo,
    constant_nbytes,
    export_graph,
    infer_tensor_types,
    remembered_sizes,
)
from gskit.passes.transform import Before, GraphPass, PassContext, PassResult, ensure, run_pass
from gskit.plugin.ops import op_counts, plugin_keys

log = logging.getLogger(__name__)

ModelT = TypeVar("ModelT", onnx.ModelProto, gs.Graph)
_FOLD_DEFAULTS = FoldOptions()


def fold(
    graph_or_model: ModelT,
    *,
    max_passes: int = _FOLD_DEFAULTS.max_passes,
    fold_shapes: bool = _FOLD_DEFAULTS.fold_shapes,
    size_threshold: int | None = _FOLD_DEFAULTS.size_threshold,
    allow_partial: bool = _FOLD_DEFAULTS.allow_partial,
    plugins: Any = None,
    spill_dir: str | os.PathLike | None = None,
) -> tuple[ModelT, FoldReport]:
    """Fold constants to a fixed point without changing what the model computes (``run_pass(FOLD, ...)``).

    Args:
        graph_or_model: a gs.Graph (folded in place and returned) or a ModelProto (left as it is; a new
            ModelProto is returned).
        max_passes: most folding passes; folding stops earlier when a pass changes nothing.
        fold_shapes: turn ``Shape`` (and ``Shape -> Gather/Slice``) of tensors with static dims into
            constants.
        size_threshold: do not create constants larger than this many bytes (``None``: no limit).
        allow_partial: skip folds that onnxruntime cannot evaluate (recorded in ``FoldReport.failures``)
            instead of raising.
        plugins: a ``gskit.plugin.registry.PluginRegistry`` (or iterable of PluginSpec) whose nodes are never
            evaluated, in addition to every node of a custom domain.
        spill_dir: batched mode (over 1.5 GB of constants, or weights on disk): folder for the data file
            holding large folded constants until the model is saved; it must outlive the returned model and
            is left in place. ``None``: a temporary folder, removed when the returned graph is collected (a
            returned ModelProto: when the interpreter exits).

    Returns:
        ``(folded, report)``: the folded graph or model, same kind as given, and a FoldReport.

    Raises:
        GskitError: a fold failed (onnxruntime could not evaluate a constant subgraph) and ``allow_partial``
            is False; the message names the node or op onnxruntime reported; or ``max_passes`` < 1 or
            ``size_threshold`` < 0.
    """
    options = FoldOptions(
        max_passes=max_passes,
        fold_shapes=fold_shapes,
        size_threshold=size_threshold,
        allow_partial=allow_partial,
    )
    result = run_pass(FOLD, graph_or_model, options, plugins=plugins, spill_dir=spill_dir)
    return result.model, result.report


class _Fold(GraphPass[FoldOptions]):
    name, options, effect = "fold", FoldOptions, "in_place"

    def requires(self, model: Any, options: FoldOptions) -> None:
        if options.max_passes < 1:
            raise GskitError(f"fold: max_passes must be at least 1, got {options.max_passes}")
        if options.size_threshold is not None and options.size_threshold < 0:
            raise GskitError(
                f"fold: size_threshold {options.size_threshold} is negative; 0 on the CLI (null in a recipe) "
                "means no limit"
            )

    def call(self, model: Any, options: FoldOptions, context: PassContext) -> PassResult:
        with remembered_sizes():  # one fold: each constant's size counted once, not once per pass
            folded, report = _fold(model, options, context.plugins, context.spill_dir)
        return PassResult(
            folded,
            # shapes folded into constants change the graph even when the node count stays
            modified=True,
            report=report,
            summary=f"{report.nodes_before} -> {report.nodes_after} nodes in {report.passes} passes",
        )

    def ensures(self, model: Any, options: FoldOptions, result: PassResult, before: Before) -> None:
        super().ensures(model, options, result, before)
        ensure(result.report.nodes_after <= result.report.nodes_before, self.name, "folding added nodes")


#: The fold pass: ``run_pass(FOLD, graph_or_model, FoldOptions(...), plugins=..., spill_dir=...)``.
FOLD = _Fold()


def _fold(
    graph_or_model: ModelT, options: FoldOptions, plugins: Any, spill_dir: str | os.PathLike | None
) -> tuple[ModelT, FoldReport]:
    max_passes, fold_shapes = options.max_passes, options.fold_shapes
    size_threshold, allow_partial = options.size_threshold, options.allow_partial
    is_model = isinstance(graph_or_model, onnx.ModelProto)
    graph = gsmodel.to_graph(graph_or_model) if is_model else graph_or_model
    # graphsurgeon exports the sub-models it evaluates with the graph's IR version; onnxruntime needs <= 13.
    # IR < 4 needs initializers listed as inputs, which graphsurgeon drops: write IR 4 at least.
    graph.ir_version = max(4, min(graph.ir_version or gsmodel.MAX_ORT_IR_VERSION, gsmodel.MAX_ORT_IR_VERSION))
    # graphsurgeon keeps no optional/map/nested types: remember them to write them back on export.
    odd_types = GsLosses.of(graph_or_model.graph) if is_model else GsLosses()
    report = FoldReport()
    ops_before = op_counts(graph)
    report.nodes_before = sum(ops_before.values())
    outputs_before = {t.name: (t.dtype, t.shape) for t in graph.outputs}
    exclude = Exclusion(plugin_keys(plugins), report, size_threshold, opsets=_opsets(graph))
    constant_bytes = _constant_bytes(graph)
    exclude.set_budget(constant_bytes, max_passes)
    spill = None
    if uses_batches(graph, constant_bytes):
        report.mode = "batched"
        spill = Spill(spill_dir)

    state = _signature(graph)
    # onnxruntime's symbolic inference is asked once per unknown tensor, its answers reused by later passes:
    # on a model that needs it, it costs more than the rest of a pass
    symbolic = SymbolicMemo()
    for index in range(max_passes):
        report.passes = index + 1
        infer_tensor_types(graph, odd_types, symbolic_memo=symbolic)
        # the first pass cleans every graph (the model may hold dead nodes); later ones only those it changed
        changed = _fold_graph(
            graph, exclude, fold_shapes, size_threshold, allow_partial, spill, report, index == 0
        )
        if changed or index == 0:
            _clean(graph)
        new_state = _signature(graph)
        if new_state == state:
            break
        state = new_state

    report.excluded.update(_still_present(graph, exclude.deferred))
    report.restored_outputs = _restore_outputs(graph, outputs_before)
    ops_after = op_counts(graph)
    report.nodes_after = sum(ops_after.values())
    removed = ops_before - ops_after
    report.folded_ops = dict(removed.most_common())
    log.info("folded %d -> %d nodes in %d passes", report.nodes_before, report.nodes_after, report.passes)
    if is_model:
        folded = _with_model_fields(export_graph(graph, odd_types), graph_or_model)
        if spill is not None:
            spill.keep_until_exit()
        return folded, report
    if spill is not None:
        spill.keep_while(graph)
    return graph, report


def _fold_graph(
    graph: gs.Graph,
    exclude: Exclusion,
    fold_shapes: bool,
    size_threshold: int | None,
    allow_partial: bool,
    spill: Spill | None,
    report: FoldReport,
    clean: bool,
) -> bool:
    """One pass over ``graph`` and its subgraphs (each subgraph cleaned after its own pass when ``clean`` or
    when the pass changed it or a subgraph in it); returns whether anything in them changed."""
    type_constant_nodes(graph)  # graphsurgeon would lower a value_float as float64
    # every fold (shapes, graphsurgeon's, batched) detaches the tensors it makes constant from their producers
    produced = _produced(graph)
    if fold_shapes:
        fold_shape_nodes(graph)
    if spill is not None:
        fold_batched(graph, exclude, size_threshold, allow_partial, spill, report)
    else:
        fold_with_graphsurgeon(graph, exclude, size_threshold, allow_partial)
    drop_non_tensor_constants(graph)
    changed = _produced(graph) != produced
    changed |= flatten_constant_ifs(graph) > 0
    for node in graph.nodes:
        for sub in gsmodel.node_subgraphs(node):
            sub.ir_version = (
                graph.ir_version
            )  # else graphsurgeon exports its sub-models with onnx's newest IR
            sub_changed = _fold_graph(
                sub, exclude, fold_shapes, size_threshold, allow_partial, None, report, clean
            )
            if sub_changed or clean:
                _clean(sub)
            changed |= sub_changed
    return changed


def _produced(graph: gs.Graph) -> int:
    """Output tensors the graph's nodes still produce."""
    return sum(len(node.outputs) for node in graph.nodes)


def _clean(graph: gs.Graph) -> None:
    """Remove unused nodes and sort, this graph only: its subgraphs were cleaned by their own passes, and
    cleaning them again (graphsurgeon's default recursion) repeated the work once per level of nesting,
    which on silero-vad's nested ``If`` bodies cost more than the folding."""
    with _removed_nodes_unprinted():
        graph.cleanup(remove_unused_graph_inputs=False, recurse_subgraphs=False)
    graph.toposort(recurse_subgraphs=False)


@contextmanager
def _removed_nodes_unprinted() -> Iterator[None]:
    """graphsurgeon's cleanup prints each node it removes (``"Removing unused node: {}".format(node)``) for
    an ``ultra_verbose`` line that its logger then drops, below its severity: while its logger drops those
    lines, a node prints as nothing (every folded node was printed, attributes and all, once per pass)."""
    logger = gs.logger.G_LOGGER
    if logger.severity <= logger.ULTRA_VERBOSE:  # the lines are shown: print the nodes
        yield
        return
    printed = gs.Node.__dict__["__str__"]
    gs.Node.__str__ = _unprinted  # type: ignore[method-assign]
    try:
        yield
    finally:
        gs.Node.__str__ = printed  # type: ignore[method-assign]


def _unprinted(node: gs.Node) -> str:
    return ""


def _still_present(graph: gs.Graph, entries: dict[str, str]) -> dict[str, str]:
    """The ``entries`` whose node is still in ``graph`` or a subgraph (deferred nodes that never folded)."""
    keys: set[str] = set()
    pending = [graph]
    while pending:
        current = pending.pop()
        for node in current.nodes:
            keys.add(report_key(node))
            pending.extend(gsmodel.node_subgraphs(node))
    return {key: reason for key, reason in entries.items() if key in keys}


def _restore_outputs(graph: gs.Graph, before: dict[str, tuple[Any, Any]]) -> list[str]:
    restored = []
    for tensor in graph.outputs:
        if tensor.name not in before or isinstance(tensor, gs.Constant):
            continue
        dtype, shape = before[tensor.name]
        changed = False
        if tensor.dtype is None and dtype is not None:
            tensor.dtype, changed = dtype, True
        if shape is not None and (tensor.shape is None or len(tensor.shape) != len(shape)):
            tensor.shape, changed = shape, True
        if changed:
            restored.append(tensor.name)
    return restored


def _signature(graph: gs.Graph) -> tuple[int, int]:
    nodes = gsmodel.count_nodes(graph)
    consts = sum(isinstance(t, gs.Constant) for t in graph.tensors().values())
    return nodes, consts


def _opsets(graph: gs.Graph) -> dict[str, int]:
    """The graph's opset version per domain (``""``: the default domain)."""
    opsets = {d.domain: d.version for d in graph.import_domains or ()}
    opsets.setdefault("", graph.opset)
    return opsets


def _constant_bytes(graph: gs.Graph) -> int:
    return sum(constant_nbytes(t) for t in graph.tensors().values() if isinstance(t, gs.Constant))


def _with_model_fields(new: onnx.ModelProto, old: onnx.ModelProto) -> onnx.ModelProto:
    """Keep model-level fields graphsurgeon does not carry (metadata, doc string, model version)."""
    new.doc_string = old.doc_string
    new.model_version = old.model_version
    if not new.metadata_props and old.metadata_props:
        new.metadata_props.extend(old.metadata_props)
    return new
