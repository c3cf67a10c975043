"""Constant folding that keeps the model's meaning: graphsurgeon's ``fold_constants``, unsafe parts replaced.

``fold(model)`` repeats, up to ``max_passes`` times or until nothing changes:

1. shape inference (on a weightless view of the graph, so it works past 2 GB); where onnx leaves the input
   of a ``Shape`` unknown (main graph or subgraph), onnxruntime's symbolic shape inference (Polygraphy's
   default) is asked too,
2. gskit's own shape folding: ``Shape`` (honouring its ``start``/``end`` attributes) and ``Shape -> Gather`` /
   ``Shape -> Slice`` (also through an integer ``Cast``) become constants where the dims they read are static,
3. graphsurgeon's ``fold_constants`` evaluating every node whose inputs are all constant on onnxruntime, with
   graphsurgeon's shape folding, cast elision, ``If`` flattening and subgraph recursion turned off,
4. gskit's own flattening of ``If`` nodes with a constant condition, and recursion into subgraphs,

then cleans up and sorts the graph and gives graph outputs back the dtype and shape they had.

Models whose constants exceed ``_PARTITION_BYTES`` (1.5 GB; protobuf cannot serialize 2 GB) or whose
weights are still on disk (``gskit.io.model.load(path, load_weights=False)``) are never serialized whole: step
3 becomes gskit's batched evaluation. The nodes whose inputs are all constant are grouped, in topological
order, into batches reading and writing at most ``_BATCH_BYTES``; each batch becomes a small model (those
nodes only) whose large constants are fed as inputs, read from disk just for that batch. Folded constants of
``_SPILL_BYTES`` or more go to a temporary data file and stay on disk as lazy values, so
``gskit.io.model.save`` streams them and peak memory stays near one batch. A batch that onnxruntime cannot
evaluate is evaluated node by node, so the error (or, with ``allow_partial``, the failure recorded in the
report) names the node. Nodes with subgraphs are not evaluated in this mode (constant ``If`` nodes are still
flattened).

Why not graphsurgeon's defaults (each found with onnx's backend node tests,
``tests/test_fold_conformance.py``):

* its shape folding ignores ``Shape``'s ``start``/``end`` attributes (opset 15) and folds the whole shape;
* its cast elision turns ``Cast(int->float) -> op -> Cast(->int)`` into the integer op, which changes results
  (fractional constants, comparison outputs);
* its ``If`` flattening rebinds the producer of a branch output that is an outer-scope tensor or a constant,
  corrupting the outer graph;
* its subgraph recursion drops ``should_exclude_node``, so plugin nodes inside subgraphs would be evaluated;
* it hands sequences and optionals returned by onnxruntime to ``Constant``;
* it cleans up the copy it evaluates with ``remove_unused_graph_inputs=True``, subgraphs included, so a
  constant ``Loop`` whose body never reads the iteration number loses that input and onnxruntime rejects it:
  such nodes are not evaluated.

Kept on purpose where Polygraphy removes nodes: graphsurgeon's cast elision (above; on PaddleOCR's SLANet it
removes 8 more ``Cast`` nodes than gskit) and constants over ``size_threshold`` (16 MiB by default, none in
Polygraphy's CLI).

Never evaluated: plugin nodes (``gskit.plugin.ops.is_plugin_node``: a domain onnxruntime does not implement, a
``plugin_namespace`` attribute, or the ``(namespace, name, version)`` of a loaded plugin spec), random ops,
and nodes whose outputs are sequences or optionals. Constants around them still fold.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx.external_data_helper import uses_external_data
from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter, update_import_domains

from gskit.errors import GskitError
from gskit.io import interrupt, progress
from gskit.io import model as gsmodel
from gskit.io.gs_export import type_constant_nodes
from gskit.passes.edit import unique_name
from gskit.passes.fold_cost import RUN_BUDGET, ResultSizes, run_cost, volume
from gskit.passes.tensor_types import (
    GsLosses,
    constant_elem_type,
    constant_nbytes,
    export_graph,
    infer_tensor_types,
)
from gskit.passes.transform import Before, GraphPass, PassContext, PassResult, ensure, option, run_pass
from gskit.plugin.ops import canonical_domain, is_default_domain, is_plugin_node, op_counts, plugin_keys

log = logging.getLogger(__name__)

#: Ops that must not be folded: a new sample per run, or values that are not plain tensors.
NEVER_FOLD_OPS = frozenset(
    {
        ("", "RandomNormal"),
        ("", "RandomUniform"),
        ("", "RandomNormalLike"),
        ("", "RandomUniformLike"),
        ("", "Multinomial"),
        ("", "Bernoulli"),
        ("", "SequenceConstruct"),
        ("", "SequenceEmpty"),
        ("", "SequenceInsert"),
        ("", "SequenceErase"),
        ("", "SplitToSequence"),
        ("", "SequenceMap"),
        ("", "Optional"),
        ("", "OptionalGetElement"),
    }
)
#: Above this many bytes of constants, evaluate foldable nodes partition by partition (protobuf's 2 GB limit).
_PARTITION_BYTES = 1_500_000_000
#: Batched folding: most bytes of constants (read) plus known results (written) one onnxruntime run handles.
_BATCH_BYTES = 512 * 2**20
#: Batched folding: folded constants at least this large are written to a data file instead of kept in memory.
_SPILL_BYTES = 2**20
#: Batched folding: in-memory constants up to this size go into a batch model as initializers, others are fed.
_FEED_BYTES = 64 * 1024
#: Element types read from data files with numpy directly (one copy, no protobuf round trip).
_PLAIN_TYPES = frozenset(
    {
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.DOUBLE,
        onnx.TensorProto.FLOAT16,
        onnx.TensorProto.BOOL,
        onnx.TensorProto.INT8,
        onnx.TensorProto.INT16,
        onnx.TensorProto.INT32,
        onnx.TensorProto.INT64,
        onnx.TensorProto.UINT8,
        onnx.TensorProto.UINT16,
        onnx.TensorProto.UINT32,
        onnx.TensorProto.UINT64,
    }
)

ModelT = TypeVar("ModelT", onnx.ModelProto, gs.Graph)


@dataclass
class FoldReport:
    """What ``fold`` did.

    Attributes:
        nodes_before: nodes in the graph and its subgraphs before folding.
        nodes_after: the same after folding and cleanup.
        passes: folding passes run (the last one changed nothing unless ``max_passes`` was reached).
        folded_ops: removed nodes by op (``domain::op`` outside the default domain), most first.
        excluded: nodes that were never evaluated although their inputs were constant, with the reason.
        failures: folds that failed and were skipped (only with ``allow_partial``).
        restored_outputs: graph outputs whose dtype or shape was restored after folding.
        mode: how constant nodes were evaluated: ``"graphsurgeon"`` (whole graph at once) or ``"batched"``
            (over ``_PARTITION_BYTES`` of constants, or weights on disk: batch by batch, weights read per
            batch).
        evaluated_nodes: batched mode: nodes evaluated on onnxruntime and replaced by their results.
        batches: batched mode: onnxruntime runs.
        spilled_bytes: batched mode: bytes of folded constants written to a data file, not kept in memory.
    """

    nodes_before: int = 0
    nodes_after: int = 0
    passes: int = 0
    folded_ops: dict[str, int] = field(default_factory=dict)
    excluded: dict[str, str] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    restored_outputs: list[str] = field(default_factory=list)
    mode: str = "graphsurgeon"
    evaluated_nodes: int = 0
    batches: int = 0
    spilled_bytes: int = 0


def _bytes_or_no_limit(text: str) -> int | None:
    """The CLI's ``--size-threshold``: a byte count, 0 meaning no limit."""
    return int(text) or None


@dataclass(frozen=True)
class FoldOptions:
    """Constant folding to a fixed point, safe around plugin nodes (``fold``'s options; the single source
    of their defaults for the library call, the CLI flags and the recipe step)."""

    max_passes: int = option(
        10, help="most folding passes; folding stops earlier when a pass changes nothing", metavar="N"
    )
    fold_shapes: bool = option(
        True, help="turn Shape (and Shape -> Gather/Slice) of tensors with static dims into constants"
    )
    size_threshold: int | None = option(
        16 * 2**20,
        help="largest constant fold may create, in bytes (0 on the CLI, null in a recipe: no limit)",
        metavar="BYTES",
        parse=_bytes_or_no_limit,
    )
    allow_partial: bool = option(False, help="skip folds onnxruntime cannot evaluate instead of failing")


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
        plugins: a ``gskit.plugin.spec.PluginRegistry`` (or iterable of PluginSpec) whose nodes are never
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
    exclude = _Exclusion(plugin_keys(plugins), report, size_threshold, opsets=_opsets(graph))
    constant_bytes = _constant_bytes(graph)
    exclude.set_budget(constant_bytes, max_passes)
    spill = None
    if constant_bytes > _PARTITION_BYTES or _has_disk_weights(graph):
        log.info("constants exceed %d bytes or are on disk: folding batch by batch", _PARTITION_BYTES)
        report.mode = "batched"
        spill = _Spill(spill_dir)

    state = _signature(graph)
    for index in range(max_passes):
        report.passes = index + 1
        infer_tensor_types(graph, odd_types)
        _fold_graph(graph, exclude, fold_shapes, size_threshold, allow_partial, spill, report)
        graph.cleanup(remove_unused_graph_inputs=False).toposort()
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


# --- one pass over one graph -------------------------------------------------------------------------------


def _fold_graph(
    graph: gs.Graph,
    exclude: _Exclusion,
    fold_shapes: bool,
    size_threshold: int | None,
    allow_partial: bool,
    spill: _Spill | None,
    report: FoldReport,
) -> None:
    type_constant_nodes(graph)  # graphsurgeon would lower a value_float as float64
    if fold_shapes:
        _fold_shape_nodes(graph)
    if spill is not None:
        _fold_batched(graph, exclude, size_threshold, allow_partial, spill, report)
    else:
        _fold_with_graphsurgeon(graph, exclude, size_threshold, allow_partial)
    _drop_non_tensor_constants(graph)
    _flatten_constant_ifs(graph)
    for node in graph.nodes:
        for sub in gsmodel.node_subgraphs(node):
            sub.ir_version = (
                graph.ir_version
            )  # else graphsurgeon exports its sub-models with onnx's newest IR
            _fold_graph(sub, exclude, fold_shapes, size_threshold, allow_partial, None, report)
            sub.cleanup(remove_unused_graph_inputs=False).toposort()


def _fold_with_graphsurgeon(
    graph: gs.Graph, exclude: _Exclusion, size_threshold: int | None, allow_partial: bool
) -> None:
    def evaluate() -> None:
        graph.fold_constants(
            fold_shapes=False,  # gskit folds shapes itself; gs's pass also runs the unsafe cast elision
            recurse_subgraphs=False,  # gs's recursion forgets should_exclude_node
            partitioning="recursive" if allow_partial else None,
            error_ok=allow_partial,
            flatten_subgraphs=False,  # gs's flattening corrupts outer-scope tensors
            size_threshold=size_threshold,
            should_exclude_node=exclude,
            recurse_functions=False,
        )

    exclude.start_batch()
    with _quiet_graphsurgeon():
        try:
            # graphsurgeon's onnxruntime session cannot be cancelled: a signal still ends the command
            # (gskit.io.interrupt), the evaluation is left behind
            interrupt.call(evaluate)
        except Exception as err:  # onnxruntime and gs raise many types; all mean the same here
            first = (str(err).strip().splitlines() or [repr(err)])[0]
            raise GskitError(
                f"fold: onnxruntime could not evaluate constant nodes in graph '{graph.name}': {first}; "
                f"pass allow_partial=True (--allow-partial) to keep those nodes unfolded"
            ) from err


#: An evaluation may produce ``size_threshold`` plus this many times the bytes of the constants it reads (a
#: cast of fp16 weights to fp32 makes twice as many bytes); the whole fold, ``max_passes x size_threshold``
#: plus this many times the model's own constant bytes.
FOLD_GROWTH = 4


class _Exclusion:
    """``should_exclude_node`` for graphsurgeon (and the batched evaluation): plugin nodes, random ops,
    non-tensor values, loops that would run too long, and results too large.

    Sizes are the ones evaluation will really produce (``gskit.passes.fold_cost.ResultSizes``), never a
    declared ``value_info``, and they are judged three ways, intermediate results included:

    * one node's results: at most ``size_threshold``;
    * one evaluation (a pass over a graph; in batched mode, one pass): its nodes' results together at most
      ``size_threshold + FOLD_GROWTH x`` the bytes of the constants it reads, so what onnxruntime holds at
      once stays near what the model already holds (400 ``Expand`` results of 4 MB each are not one batch);
    * the whole fold: at most ``max_passes x size_threshold + FOLD_GROWTH x`` the model's constant bytes, so
      evaluations that read earlier results cannot grow the model pass after pass.

    A node over the evaluation's limit waits for the next pass; over the fold's, it stays unevaluated.
    """

    def __init__(
        self,
        plugin_keys: frozenset[tuple[str, str, str]],
        report: FoldReport,
        size_threshold: int | None = None,
        *,
        opsets: dict[str, int] | None = None,
    ) -> None:
        self.plugin_keys = plugin_keys
        self.report = report
        self.size_threshold = size_threshold
        #: batched mode: nodes onnxruntime failed to evaluate (``allow_partial``), not retried in later passes
        self.failed: set[int] = set()
        #: nodes not evaluated for their size, which may change as their inputs fold (reported if they stay)
        self.deferred: dict[str, str] = {}
        self.sizes = ResultSizes(opsets or {})
        #: bytes all evaluations of this fold may produce together; None: no limit (no size_threshold)
        self.budget: int | None = None
        self.spent = 0
        #: the current evaluation: bytes its nodes produce, bytes of the constants they read (each once)
        self.batch_spent = 0
        self.batch_reads = 0
        self._batch_read: set[int] = set()
        #: bytes of each accepted node's results (``id(node)``), for the batched evaluation's batches
        self.result_bytes: dict[int, int] = {}

    def set_budget(self, constant_bytes: int, max_passes: int) -> None:
        """The model holds ``constant_bytes`` of constants and fold runs up to ``max_passes`` passes."""
        if self.size_threshold is not None:
            self.budget = max_passes * self.size_threshold + FOLD_GROWTH * constant_bytes

    def start_batch(self) -> None:
        """A new evaluation begins (each pass, each subgraph): earlier results are constants now."""
        self.sizes.start()
        self.batch_spent, self.batch_reads = 0, 0
        self._batch_read.clear()

    def __call__(self, node: gs.Node) -> bool:
        reason = self.reason(node)
        if reason:
            self.report.excluded[_node_key(node)] = reason
            return True
        reason = self.size_reason(node)
        if reason:
            self.deferred[_node_key(node)] = reason
            return True
        return False

    def size_reason(self, node: gs.Node) -> str | None:
        """Why ``node`` is not evaluated now although it could be: its results would exceed
        ``size_threshold``, the evaluation's or the fold's limit, or their size is not known yet.

        Checked before evaluating, because onnxruntime computes a node's whole result even when a later node
        shrinks it (``ConstantOfShape -> ReduceSum``): a tiny model must not take gigabytes to fold. When it
        is accepted, its results count against the limits and their types are known to the nodes after it.
        """
        if self.size_threshold is None or self.budget is None:
            return None
        found = self.sizes.nbytes(node)
        if found is None:
            return "result size unknown before evaluating (an input's shape or values are not known yet)"
        nbytes, types = found
        if nbytes > self.size_threshold:
            return f"result would be {nbytes} bytes, over size_threshold ({self.size_threshold} bytes)"
        new_reads = {id(t): t for t in _constant_reads(node) if id(t) not in self._batch_read}
        reads = self.batch_reads + sum(constant_nbytes(t) for t in new_reads.values())
        limit = self.size_threshold + FOLD_GROWTH * reads
        if self.batch_spent + nbytes > limit:
            return (
                f"results of {nbytes} bytes would take one evaluation past {limit} bytes (size_threshold + "
                f"{FOLD_GROWTH} x the {reads} bytes of constants it reads)"
            )
        if self.spent + nbytes > self.budget:
            return (
                f"results of {nbytes} bytes would take fold past {self.budget} bytes in all (max_passes x "
                f"size_threshold + {FOLD_GROWTH} x the model's constants)"
            )
        self.spent += nbytes
        self.batch_spent += nbytes
        self.batch_reads = reads
        self._batch_read.update(new_reads)
        self.sizes.accept(types)
        self.result_bytes[id(node)] = nbytes
        return None

    def reason(self, node: gs.Node) -> str | None:
        if is_plugin_node(node, self.plugin_keys):
            return f"plugin node ({node.domain or ''}::{node.op})"
        if (canonical_domain(node.domain), node.op) in NEVER_FOLD_OPS:
            return f"{node.op} is not folded"
        for tensor in node.outputs:
            kind = getattr(tensor, "type", "tensor_type")
            if kind not in (None, "tensor_type"):
                return f"output '{tensor.name}' is a {kind.replace('_type', '')}"
        if any(_has_unread_inputs(sub) for sub in gsmodel.node_subgraphs(node)):
            return f"{node.op} has a subgraph input that nothing reads (graphsurgeon would drop it)"
        strings = [t.name for t in (*node.inputs, *node.outputs) if _is_string(t)]
        if strings:
            # graphsurgeon cannot write a folded string tensor back (it stores every constant as raw data)
            return f"tensor '{strings[0]}' holds strings, which are not folded"
        cost = run_cost(node)
        if cost is None:
            return f"{node.op} has a trip count that is not a constant: it may run without end"
        if cost > RUN_BUDGET:
            return (
                f"{node.op} would run {cost} nodes (trip count x its body), over fold's limit of {RUN_BUDGET}"
            )
        return None


def _constant_reads(node: gs.Node) -> Iterator[gs.Constant]:
    """The constants a node reads: its inputs and the outer tensors its subgraphs read."""
    for tensor in node.inputs:
        if isinstance(tensor, gs.Constant):
            yield tensor
    for sub in gsmodel.node_subgraphs(node):
        yield from (t for t in sub._foreign_tensors().values() if isinstance(t, gs.Constant))


def _has_unread_inputs(subgraph: gs.Graph) -> bool:
    """A subgraph input no output depends on (a ``Loop`` body's unused iteration number).

    graphsurgeon's fold cleans up its copy of the graph with ``remove_unused_graph_inputs=True``, subgraphs
    included: such an input is removed and onnxruntime rejects the ``Loop`` (its body inputs are positional).
    """
    probe = subgraph.copy()
    count = len(probe.inputs)
    probe.cleanup(remove_unused_graph_inputs=True)
    return len(probe.inputs) != count


# --- batched evaluation (models over 2 GB) -----------------------------------------------------------------


def _fold_batched(
    graph: gs.Graph,
    exclude: _Exclusion,
    size_threshold: int | None,
    allow_partial: bool,
    spill: _Spill,
    report: FoldReport,
) -> None:
    """Evaluate the constant nodes of ``graph`` batch by batch and replace their used results by constants."""
    graph.toposort()
    context = _BatchContext(graph, size_threshold, allow_partial, spill, report, exclude.failed)
    exclude.start_batch()
    nodes = _foldable_nodes(graph, exclude, report)
    with progress.task("fold: constant nodes evaluated", total=len(nodes)) as advance:
        for batch in _batches(nodes, exclude.result_bytes):
            context.evaluate(batch)
            advance(len(batch))


def _foldable_nodes(graph: gs.Graph, exclude: _Exclusion, report: FoldReport) -> list[gs.Node]:
    """Nodes (topological order) whose inputs are constants or results of earlier foldable nodes."""
    produced: set[int] = set()
    foldable = []
    for node in graph.nodes:
        if not node.outputs or id(node) in exclude.failed:
            continue
        if not all(_is_available(t, produced) for t in node.inputs):
            continue
        if exclude(node):
            continue
        key = _node_key(node)
        if any(True for _ in gsmodel.node_subgraphs(node)):
            report.excluded[key] = "has a subgraph (not evaluated when folding batch by batch)"
            continue
        foldable.append(node)
        produced.update(id(t) for t in node.outputs)
    return foldable


def _batches(nodes: list[gs.Node], result_bytes: dict[int, int]) -> Iterator[list[gs.Node]]:
    """Consecutive groups of ``nodes`` reading and writing about ``_BATCH_BYTES`` at most (or one node).

    A node's results count with the size fold judged they will have (``result_bytes``), else (no size
    threshold) with their declared size.
    """
    batch: list[gs.Node] = []
    seen: set[int] = set()
    size = 0
    for node in nodes:
        reads = [t for t in node.inputs if isinstance(t, gs.Constant) and id(t) not in seen]
        writes = result_bytes.get(id(node))
        if writes is None:
            writes = sum(_known_nbytes(t) or 0 for t in node.outputs)
        cost = sum(constant_nbytes(t) for t in reads) + writes
        if batch and size + cost > _BATCH_BYTES:
            yield batch
            batch, seen, size = [], set(), 0
            reads = [t for t in node.inputs if isinstance(t, gs.Constant)]
        batch.append(node)
        seen.update(id(t) for t in reads)
        size += cost
    if batch:
        yield batch


class _BatchContext:
    """Evaluates batches of constant nodes of one graph on onnxruntime and folds their results."""

    def __init__(
        self,
        graph: gs.Graph,
        size_threshold: int | None,
        allow_partial: bool,
        spill: _Spill,
        report: FoldReport,
        failed: set[int],
    ) -> None:
        self.graph = graph
        self.failed = failed
        self.size_threshold = size_threshold
        self.allow_partial = allow_partial
        self.spill = spill
        self.report = report
        self.graph_outputs = {id(t) for t in graph.outputs}
        self.opsets = list(update_import_domains(graph))

    def evaluate(self, batch: list[gs.Node]) -> None:
        """Evaluate ``batch``; on failure evaluate its nodes one by one to name the culprit."""
        produced: set[int] = set()
        nodes = []
        for node in batch:  # an input may have stayed unfolded (a failure, a result over the size threshold)
            if all(_is_available(t, produced) for t in node.inputs):
                nodes.append(node)
                produced.update(id(t) for t in node.outputs)
        if not nodes:
            return
        in_batch = {id(n) for n in nodes}
        outputs = [  # results read outside the batch; the others are never materialized
            t
            for n in nodes
            for t in n.outputs
            if not t.is_empty()
            and (id(t) in self.graph_outputs or any(id(c) not in in_batch for c in t.outputs))
        ]
        if not outputs:
            return
        try:
            values = self._run(nodes, outputs)
        except GskitError as err:
            if len(nodes) > 1:
                log.info("fold: a batch of %d nodes failed (%s); evaluating node by node", len(nodes), err)
                for node in nodes:
                    self.evaluate([node])
                return
            node = nodes[0]
            message = f"fold: onnxruntime could not evaluate node '{_node_key(node)}' ({node.op}): {err}"
            if not self.allow_partial:
                raise GskitError(
                    f"{message}; pass allow_partial=True (--allow-partial) to keep it unfolded"
                ) from err
            log.warning("%s; left unfolded", message)
            self.report.failures.append(message)
            self.failed.add(id(node))
            return
        self.report.batches += 1
        self.report.evaluated_nodes += len(nodes)
        for tensor, value in zip(outputs, values, strict=True):
            self._fold_tensor(tensor, value)

    def _run(self, nodes: list[gs.Node], outputs: list[gs.Tensor]) -> list[np.ndarray]:
        consts: dict[int, gs.Constant] = {}
        for node in nodes:
            for tensor in node.inputs:
                if isinstance(tensor, gs.Constant):
                    consts.setdefault(id(tensor), tensor)
        fed = [
            t
            for t in consts.values()
            if isinstance(t._values, gs.ir.tensor.LazyValues) or constant_nbytes(t) > _FEED_BYTES
        ]
        fed_ids = {id(t) for t in fed}
        kept = [t for t in consts.values() if id(t) not in fed_ids]
        graph = onnx.helper.make_graph(
            [OnnxExporter.export_node(n) for n in nodes],
            "gskit_fold_batch",
            [onnx.helper.make_tensor_value_info(t.name, constant_elem_type(t), t.shape) for t in fed],
            [OnnxExporter.export_value_info_proto(t, do_type_check=False) for t in outputs],
            initializer=[OnnxExporter.export_tensor_proto(t) for t in kept],
        )
        model = onnx.helper.make_model(graph, opset_imports=self.opsets, ir_version=self.graph.ir_version)
        feeds = {t.name: _read_values(t) for t in fed}
        # Evaluating nodes is execution, which lives in gskit.backends: imported here, where it is needed
        # (the one core-to-backend import docs/architecture.md allows).
        from gskit.backends import ort

        results = ort.run(ort.session(model), feeds, [t.name for t in outputs])
        return [results[t.name] for t in outputs]

    def _fold_tensor(self, tensor: gs.Tensor, value: Any) -> None:
        if not isinstance(value, np.ndarray):
            log.warning("fold: '%s' evaluated to a non-tensor value; left unfolded", tensor.name)
            return
        if _over(value.nbytes, self.size_threshold):
            self.report.excluded[tensor.name] = (
                f"result of {value.nbytes} bytes is larger than size_threshold ({self.size_threshold} bytes)"
            )
            return
        _make_constant(tensor, value)
        if value.nbytes >= _SPILL_BYTES and value.dtype.kind in "biuf" and value.dtype.isnative:
            tensor._values = self.spill.write(tensor.name, value)
            self.report.spilled_bytes += value.nbytes


class _Spill:
    """A data file holding large folded constants until the model is saved; constants read it lazily."""

    def __init__(self, folder: str | os.PathLike | None) -> None:
        self.folder = Path(folder) if folder is not None else None
        self.temporary = folder is None
        self.path: Path | None = None

    def write(self, name: str, value: np.ndarray) -> gs.ir.tensor.LazyValues:
        """Append ``value`` to the data file; return lazy values reading it back from there."""
        if self.path is None:
            if self.folder is None:
                self.folder = Path(tempfile.mkdtemp(prefix="gskit-fold-"))
            self.folder.mkdir(parents=True, exist_ok=True)
            handle, path = tempfile.mkstemp(prefix="folded-", suffix=".data", dir=self.folder)
            os.close(handle)
            self.path = Path(path)
        with open(self.path, "ab") as data:
            offset = data.tell()
            pad = (-offset) % 4096
            data.write(b"\0" * pad)
            offset += pad
            data.write(memoryview(np.ascontiguousarray(value)).cast("B"))
        tensor = onnx.TensorProto(
            name=name,
            data_type=onnx.helper.np_dtype_to_tensor_dtype(value.dtype),
            dims=value.shape,
            data_location=onnx.TensorProto.EXTERNAL,
        )
        entries = {
            "location": self.path.name,
            "offset": offset,
            "length": value.nbytes,
            "basepath": self.path.parent,
        }
        for key, entry in entries.items():
            tensor.external_data.add(key=key, value=str(entry))
        return gsmodel.DiskValues(tensor)

    def keep_while(self, owner: object) -> None:
        """Remove a temporary folder once ``owner`` is collected (or at exit)."""
        if self.temporary and self.folder is not None:
            weakref.finalize(owner, shutil.rmtree, str(self.folder), True)

    def keep_until_exit(self) -> None:
        """Remove a temporary folder when the interpreter exits."""
        if self.temporary and self.folder is not None:
            atexit.register(shutil.rmtree, str(self.folder), True)


def _is_available(tensor: gs.Tensor, produced: set[int]) -> bool:
    return isinstance(tensor, gs.Constant) or tensor.is_empty() or id(tensor) in produced


def _node_key(node: gs.Node) -> str:
    return node.name or f"{node.op}:{node.outputs[0].name if node.outputs else ''}"


def _known_nbytes(tensor: gs.Tensor) -> int | None:
    if tensor.dtype is None or tensor.shape is None or not _static(tensor.shape):
        return None
    try:
        itemsize = np.dtype(tensor.dtype).itemsize
    except TypeError:
        return None
    return volume(tensor.shape) * itemsize


def _still_present(graph: gs.Graph, entries: dict[str, str]) -> dict[str, str]:
    """The ``entries`` whose node is still in ``graph`` or a subgraph (deferred nodes that never folded)."""
    keys: set[str] = set()
    pending = [graph]
    while pending:
        current = pending.pop()
        for node in current.nodes:
            keys.add(_node_key(node))
            pending.extend(gsmodel.node_subgraphs(node))
    return {key: reason for key, reason in entries.items() if key in keys}


def _is_string(tensor: gs.Tensor) -> bool:
    dtype = tensor.dtype
    if dtype is None:
        return False
    if dtype == onnx.TensorProto.STRING:
        return True
    try:
        return np.dtype(dtype).kind in "OSU"
    except TypeError:
        return False


def _over(nbytes: int | None, size_threshold: int | None) -> bool:
    return nbytes is not None and size_threshold is not None and nbytes > size_threshold


def _read_values(tensor: gs.Constant) -> np.ndarray:
    """A constant's values without caching them on the tensor (so they are freed after the batch)."""
    values = tensor._values
    if not isinstance(values, gs.ir.tensor.LazyValues):
        return values
    proto = values.tensor
    if uses_external_data(proto) and proto.data_type in _PLAIN_TYPES:
        entries = {e.key: e.value for e in proto.external_data}
        path = Path(entries.get("basepath", ".")) / entries["location"]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(proto.data_type)
        count = int(np.prod(proto.dims, dtype=np.int64))
        array = np.fromfile(path, dtype=dtype, count=count, offset=int(entries.get("offset", 0)))
        if array.size != count:
            raise GskitError(
                f"{path}: external data ends early for tensor '{proto.name}'; the file is truncated"
            )
        return array.reshape(tuple(proto.dims))
    return values.load()


# --- shape folding -----------------------------------------------------------------------------------------


def _fold_shape_nodes(graph: gs.Graph) -> None:
    """Replace Shape, Shape->Gather and Shape->Slice outputs by constants where the dims read are static."""
    for node in list(graph.nodes):
        if node.op != "Shape" or not is_default_domain(node.domain) or not node.outputs or not node.inputs:
            continue  # a Shape without input is malformed: left for the checker to name
        data = node.inputs[0]
        if data.shape is None:
            continue
        dims = _shape_slice(list(data.shape), node.attrs.get("start", 0), node.attrs.get("end"))
        out = node.outputs[0]
        if _static(dims):
            _make_constant(out, np.array(dims, dtype=np.int64))
            continue
        for user in list(out.outputs):
            values = _fold_shape_user(user, out, dims)
            if values is not None:
                _make_constant(user.outputs[0], values)
            elif _is_int_cast(user):  # TensorFlow exports cast the shape to int32 before picking dims
                dtype = onnx.helper.tensor_dtype_to_np_dtype(user.attrs["to"])
                for picker in list(user.outputs[0].outputs):
                    values = _fold_shape_user(picker, user.outputs[0], dims)
                    if values is not None:
                        _make_constant(picker.outputs[0], values.astype(dtype))


def _is_int_cast(node: gs.Node) -> bool:
    return (
        node.op == "Cast"
        and (node.domain or "") in ("", "ai.onnx")
        and node.attrs.get("to") in (onnx.TensorProto.INT32, onnx.TensorProto.INT64)
        and bool(node.outputs)
    )


def _shape_slice(dims: list, start: int, end: int | None) -> list:
    """Shape's ``start``/``end`` semantics: negative counts from the back, both clamped to [0, rank]."""
    rank = len(dims)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = rank if end is None else min(max(end + rank if end < 0 else end, 0), rank)
    return dims[start:end]


def _static(dims: Iterable) -> bool:
    return all(isinstance(d, (int, np.integer)) and d >= 0 for d in dims)


def _fold_shape_user(user: gs.Node, shape_out: gs.Tensor, dims: list) -> np.ndarray | None:
    if not is_default_domain(user.domain) or not user.inputs or user.inputs[0] is not shape_out:
        return None
    if user.op == "Gather" and len(user.inputs) == 2 and isinstance(user.inputs[1], gs.Constant):
        if user.attrs.get("axis", 0) not in (0, -1):
            return None
        indices = np.asarray(user.inputs[1].values)
        if indices.size and (indices.min() < -len(dims) or indices.max() >= len(dims)):
            return None
        picked = np.array(dims, dtype=object)[indices] if dims else None
        if picked is None or not _static(np.ravel(picked)):
            return None
        return np.asarray(picked, dtype=np.int64)  # a scalar index picks a Python int
    if user.op == "Slice" and len(user.inputs) >= 3:
        consts = user.inputs[1:]
        if not all(isinstance(t, gs.Constant) for t in consts if not t.is_empty()):
            return None
        starts, ends = (np.ravel(t.values) for t in consts[:2])
        axes = np.ravel(consts[2].values) if len(consts) > 2 and not consts[2].is_empty() else np.array([0])
        steps = np.ravel(consts[3].values) if len(consts) > 3 and not consts[3].is_empty() else np.array([1])
        if (
            starts.size != 1
            or ends.size != 1
            or axes.size != 1
            or int(axes[0]) not in (0, -1)
            or steps[0] == 0
        ):
            return None
        picked = dims[_onnx_slice(len(dims), int(starts[0]), int(ends[0]), int(steps[0]))]
        return np.array(picked, dtype=np.int64) if _static(picked) else None
    return None


def _onnx_slice(length: int, start: int, end: int, step: int) -> slice:
    """A Python slice with ONNX Slice's clamping (ends past the range, INT64 sentinels, negative steps)."""

    def clamp(value: int, low: int, high: int) -> int:
        value = value + length if value < 0 else value
        return min(max(value, low), high)

    if step > 0:
        return slice(clamp(start, 0, length), clamp(end, 0, length), step)
    first, last = clamp(start, -1, length - 1), clamp(end, -1, length - 1)
    return slice(first, None if last < 0 else last, step)


def _make_constant(tensor: gs.Tensor, values: np.ndarray) -> None:
    tensor.to_constant(values)
    tensor.inputs.clear()


# --- If flattening, non-tensor results ----------------------------------------------------------------------


def _flatten_constant_ifs(graph: gs.Graph) -> None:
    """Inline the taken branch of each ``If`` with a constant condition; outer-scope tensors stay intact."""
    index = 0
    used_names = set(graph.tensors())
    while index < len(graph.nodes):
        node = graph.nodes[index]
        if (
            node.op != "If"
            or not is_default_domain(node.domain)
            or not node.inputs
            or not isinstance(node.inputs[0], gs.Constant)
        ):
            index += 1
            continue
        cond = np.asarray(node.inputs[0].values)
        if cond.size != 1:
            index += 1
            continue
        branch = node.attrs.get("then_branch" if bool(cond.reshape(())) else "else_branch")
        if not isinstance(branch, gs.Graph) or len(branch.outputs) != len(node.outputs):
            index += 1  # a malformed If (a branch missing, outputs miscounted): left for the checker
            continue
        local = branch._local_tensors()
        for tensor in local.values():
            tensor.name = unique_name(f"{tensor.name}__{node.name or 'if'}", used_names)
        new_nodes = list(branch.nodes)
        branch_node_ids = {id(n) for n in new_nodes}
        local_ids = {id(t) for t in local.values()}
        pairs = list(zip(list(node.outputs), list(branch.outputs), strict=True))
        node.inputs.clear()
        node.outputs.clear()  # also detaches the If from each output's producers
        for node_out, branch_out in pairs:
            consumers = list(branch_out.outputs)
            movable = (
                id(branch_out) in local_ids
                and isinstance(branch_out, gs.Variable)
                and len(branch_out.inputs) == 1
                and all(id(c) in branch_node_ids for c in consumers)
            )
            if movable:  # the branch computes it: let its producer write the If's output directly
                producer = branch_out.inputs[0]
                for consumer in consumers:
                    for i, tensor in enumerate(consumer.inputs):
                        if tensor is branch_out:
                            consumer.inputs[i] = node_out
                producer.outputs[producer.outputs.index(branch_out)] = node_out
            else:  # an outer-scope tensor, a constant or a branch input: copy it through
                new_nodes.append(
                    gs.Node(
                        "Identity",
                        name=unique_name(f"{node_out.name}__if_out", used_names),
                        inputs=[branch_out],
                        outputs=[node_out],
                    )
                )
        graph.nodes[index : index + 1] = new_nodes
        index += len(new_nodes)


def _drop_non_tensor_constants(graph: gs.Graph) -> None:
    """Constants graphsurgeon built from sequences/None returned by onnxruntime are not tensors: undo them."""
    for tensor in graph.tensors().values():
        if isinstance(tensor, gs.Constant) and not isinstance(
            tensor._values, (np.ndarray, gs.ir.tensor.LazyValues)
        ):
            log.warning("fold: '%s' evaluated to a non-tensor value; left unfolded", tensor.name)


# --- bookkeeping -------------------------------------------------------------------------------------------


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


def _has_disk_weights(graph: gs.Graph) -> bool:
    """Some constant still reads its values from a data file (``load_weights=False``)."""
    return any(
        isinstance(t, gs.Constant)
        and isinstance(t._values, gs.ir.tensor.LazyValues)
        and uses_external_data(t._values.tensor)
        for t in graph.tensors().values()
    )


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


@contextmanager
def _quiet_graphsurgeon() -> Iterator[None]:
    """graphsurgeon logs to stdout; keep only its errors while gskit calls it (gskit logs what matters)."""
    logger = gs.logger.G_LOGGER
    old = logger.severity
    logger.severity = max(old, logger.ERROR)
    try:
        yield
    finally:
        logger.severity = old
