"""Which constant nodes fold never evaluates, and which wait for a later pass: plugin nodes, random ops,
non-tensor values, loops that would run too long, and results too large (:class:`Exclusion`, graphsurgeon's
``should_exclude_node`` and the batched evaluation's filter alike)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from gskit.io import model as gsmodel
from gskit.passes.fold.cost import RUN_BUDGET, ResultSizes, run_cost
from gskit.passes.fold.options import FoldReport
from gskit.passes.tensor_types import constant_nbytes
from gskit.plugin.ops import canonical_domain, is_plugin_node

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


#: An evaluation may produce ``size_threshold`` plus this many times the bytes of the constants it reads (a
#: cast of fp16 weights to fp32 makes twice as many bytes); the whole fold, ``max_passes x size_threshold``
#: plus this many times the model's own constant bytes.
FOLD_GROWTH = 4


class Exclusion:
    """``should_exclude_node`` for graphsurgeon (and the batched evaluation): plugin nodes, random ops,
    non-tensor values, loops that would run too long, and results too large.

    Sizes are the ones evaluation will really produce (``gskit.passes.fold.cost.ResultSizes``), never a
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
            self.report.excluded[report_key(node)] = reason
            return True
        reason = self.size_reason(node)
        if reason:
            self.deferred[report_key(node)] = reason
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


def report_key(node: gs.Node) -> str:
    return node.name or f"{node.op}:{node.outputs[0].name if node.outputs else ''}"


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
