"""Evaluating a graph's constant nodes all at once (models under 1.5 GB of constants whose weights are in
memory) as graphsurgeon's ``fold_constants`` does with its unsafe parts turned off: its decisions, made on the
graph itself rather than on the copy of it graphsurgeon makes first."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.exporters.onnx_exporter import export_onnx
from onnx_graphsurgeon.importers.onnx_importer import get_itemsize
from onnx_graphsurgeon.util.misc import is_dynamic_shape, volume

from gskit.errors import GskitError
from gskit.io import interrupt
from gskit.io import model as gsmodel
from gskit.passes.fold.cost import has_subgraphs
from gskit.passes.fold.exclusion import Exclusion

log = logging.getLogger(__name__)


def fold_with_graphsurgeon(
    graph: gs.Graph, exclude: Exclusion, size_threshold: int | None, allow_partial: bool
) -> None:
    """Evaluate the constant nodes of ``graph`` (not its subgraphs) and replace the results graphsurgeon's
    ``fold_constants`` would replace by constants.

    Without ``allow_partial`` this is :func:`evaluate_like_graphsurgeon`: graphsurgeon's decisions, made on
    ``graph`` itself instead of a copy of it. With ``allow_partial`` graphsurgeon's own fold runs (its
    recursive partitioning, which evaluates what it can when onnxruntime fails), on a view of ``graph``.
    """
    exclude.start_batch()
    if not allow_partial:
        # deciding is cheap and mostly finds nothing (most bodies after the first pass): only onnxruntime
        # runs in a thread of its own (interrupt.call)
        _reported(graph, lambda: evaluate_like_graphsurgeon(graph, exclude, size_threshold), threaded=False)
        return
    view = evaluation_view(graph)
    if view is None:
        # graphsurgeon would copy and export the graph to find nothing to fold (most If/Loop bodies after
        # the first pass: a third of silero-vad's fold time)
        return

    def evaluate() -> None:
        view.fold_constants(
            fold_shapes=False,  # gskit folds shapes itself; gs's pass also runs the unsafe cast elision
            recurse_subgraphs=False,  # gs's recursion forgets should_exclude_node
            partitioning="recursive",
            error_ok=True,
            flatten_subgraphs=False,  # gs's flattening corrupts outer-scope tensors
            size_threshold=size_threshold,
            should_exclude_node=exclude,
            recurse_functions=False,
        )

    _reported(graph, evaluate)


def _reported(graph: gs.Graph, evaluate: Callable[[], None], *, threaded: bool = True) -> None:
    """``evaluate()``, its failure reported as a GskitError naming ``graph``; ``threaded``: run it where a
    signal still interrupts the main thread (:func:`gskit.io.interrupt.call`)."""
    with quiet_graphsurgeon():
        try:
            # onnxruntime's session cannot be cancelled: a signal still ends the command (gskit.io.interrupt),
            # the evaluation is left behind
            interrupt.call(evaluate) if threaded else evaluate()
        except Exception as err:  # onnxruntime and gs raise many types; all mean the same here
            first = (str(err).strip().splitlines() or [repr(err)])[0]
            raise GskitError(
                f"fold: onnxruntime could not evaluate constant nodes in graph '{graph.name}': {first}; "
                f"pass allow_partial=True (--allow-partial) to keep those nodes unfolded"
            ) from err


#: Ops graphsurgeon's ``fold_constants`` never evaluates.
_GS_NO_FOLD_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})
#: The attributes a ``Constant`` node graphsurgeon lowers may have.
_GS_CONSTANT_ATTRS = frozenset({"value", "value_float", "value_floats", "value_int", "value_ints"})


def evaluate_like_graphsurgeon(graph: gs.Graph, exclude: Exclusion, size_threshold: int | None) -> None:
    """graphsurgeon's ``fold_constants(fold_shapes=False, recurse_subgraphs=False, partitioning=None,
    flatten_subgraphs=False, recurse_functions=False)``: the same decisions, the same model handed to
    onnxruntime's default session, the same constants; without the copy of the graph (subgraphs included)
    it makes first, which was most of fold's evaluation time (silero-vad's nested ``If`` bodies, PaddleOCR).

    Its steps, each as graphsurgeon takes it: ``Constant`` nodes are lowered to constants; walking the nodes
    in order, a node is foldable when its op is not a (de)quantization, every input and every outer tensor
    its subgraphs read is a constant of the graph or a foldable result, no attribute refers to a function's
    attribute, and ``should_exclude_node`` (``exclude``) lets it; a foldable result is evaluated when some
    reader's *name* is not a known constant or result (graphsurgeon compares node names with tensor names),
    or it has no reader, and its declared size is not over ``size_threshold``; the nodes those results need
    are exported in graph order and run; each result within ``size_threshold`` becomes a constant.
    """
    tensors = graph.tensors()
    lowered = _lower_constant_nodes(tensors)
    # by name, as graphsurgeon keeps them: a result named like an earlier tensor takes its place
    constants: dict[str, gs.Tensor] = {n: t for n, t in tensors.items() if isinstance(t, gs.Constant)}
    foldable: list[gs.Node] = []
    for node in graph.nodes:
        if node.op in _GS_NO_FOLD_OPS:
            continue
        reads = [*node.inputs, *_outer_tensors(node)]
        if not all(t.name in constants for t in reads if not t.is_empty()):
            continue
        if any(isinstance(value, gs.Node.AttributeRef) for value in node.attrs.values()) or exclude(node):
            continue
        foldable.append(node)
        constants.update((t.name, t) for t in node.outputs)
    if lowered:
        # the lowered nodes make nothing now: graphsurgeon's cleanup after the pass would remove them, but
        # first print each for a log line nobody sees (its ``ultra_verbose``), the repr of its value by numpy:
        # 5-10% of the fold of layout_cdla, whose 878 Constant nodes all go
        graph.nodes = [node for node in graph.nodes if id(node) not in lowered]
    if not foldable:
        return
    readers = _node_ids(graph)
    wanted = [t for t in constants.values() if _evaluated(t, constants, readers, size_threshold)]
    if not wanted:
        return
    values = _run(graph, _needed(foldable, wanted), wanted)
    for tensor, value in zip(wanted, values, strict=True):
        if size_threshold is not None and value.nbytes > size_threshold:
            continue
        tensor.to_constant(value)
        tensor.inputs.clear()


def _lower_constant_nodes(tensors: dict[str, gs.Tensor]) -> set[int]:
    """graphsurgeon's first step: a tensor whose producer is a ``Constant`` node (one attribute of a known
    kind, not a reference) becomes a constant. Returns the ``id`` of each node lowered (it makes nothing
    now)."""
    lowered: set[int] = set()
    for tensor in tensors.values():
        if len(tensor.inputs) != 1 or tensor.inputs[0].op != "Constant":
            continue
        node = tensor.inputs[0]
        if len(node.attrs) != 1:
            continue
        name, value = next(iter(node.attrs.items()))
        if name not in _GS_CONSTANT_ATTRS or isinstance(value, gs.Node.AttributeRef):
            continue
        tensor.to_constant(value._values if isinstance(value, gs.Constant) else np.array(value))
        tensor.inputs.clear()
        if not node.inputs and not node.outputs:
            lowered.add(id(node))
    return lowered


def _node_ids(graph: gs.Graph) -> set[int]:
    """The nodes of ``graph`` and of its subgraphs at any depth: the readers graphsurgeon's copy holds."""
    return {id(node) for sub in (graph, *graph.subgraphs(recursive=True)) for node in sub.nodes}


def _evaluated(
    tensor: gs.Tensor, known: dict[str, gs.Tensor], readers: set[int], size_threshold: int | None
) -> bool:
    """graphsurgeon's ``should_eval_foldable`` for a known constant or foldable result (its readers: those
    in ``readers``, the nodes its copy of the graph would hold)."""
    if isinstance(tensor, gs.Constant):
        return False
    consumers = [node for node in tensor.outputs if id(node) in readers]
    if consumers and all(node.name in known for node in consumers):
        return False
    if size_threshold is None or tensor.shape is None or tensor.dtype is None:
        return True
    if is_dynamic_shape(tensor.shape):
        return True
    return volume(tensor.shape) * get_itemsize(tensor.dtype) <= size_threshold


def _needed(foldable: list[gs.Node], wanted: list[gs.Tensor]) -> list[gs.Node]:
    """The foldable nodes the ``wanted`` results depend on, in graph order (graphsurgeon's cleanup)."""
    producers = {id(t): node for node in foldable for t in node.outputs}
    needed: set[int] = set()
    pending = [producers[id(t)] for t in wanted]
    while pending:
        node = pending.pop()
        if id(node) in needed:
            continue
        needed.add(id(node))
        pending.extend(producers[id(t)] for t in (*node.inputs, *_outer_tensors(node)) if id(t) in producers)
    return [node for node in foldable if id(node) in needed]


def _run(graph: gs.Graph, nodes: list[gs.Node], outputs: list[gs.Tensor]) -> list[Any]:
    """``outputs`` computed by ``nodes`` on onnxruntime's default CPU session, as graphsurgeon runs them."""
    part = _graph_of(graph, nodes, [], list(outputs))
    part.producer_name, part.producer_version = "", ""
    if any(has_subgraphs(node) for node in nodes):
        # graphsurgeon's cleanup of its copy also cleans the subgraphs of the nodes it keeps (dead nodes and
        # unread inputs of a body go): the same, on a copy of these nodes only
        part = part.copy()
        part.cleanup(remove_unused_graph_inputs=True, recurse_functions=False)
    model = export_onnx(part, do_type_check=False)
    # Evaluating nodes is execution, which lives in gskit.backends: imported here, where it is needed
    from gskit.backends import ort

    payload = model.SerializeToString()
    return interrupt.call(lambda: ort.default_session(payload).run([t.name for t in outputs], {}))


def evaluation_view(graph: gs.Graph) -> gs.Graph | None:
    """What graphsurgeon's ``fold_constants`` needs of ``graph`` (``graph`` itself when that is most of it),
    or None when it would find nothing to do.

    graphsurgeon copies the whole graph, subgraphs included, to find the nodes it can evaluate, then cleans
    the copy down to them: on a large graph with few constant nodes, or on silero-vad's nested ``If``
    bodies, copying was most of its work. The view is a graph object holding the same node and tensor
    objects (so what the fold changes, it changes in ``graph``) but only the nodes it looks at: the nodes
    that may fold (every input, and every outer tensor their subgraphs read, a constant or the result of
    such a node: graphsurgeon's test, before ``should_exclude_node``, which it still asks) and every node
    that reads one of their results (whether a result has a reader that does not fold decides whether it
    is evaluated). Its outputs list every tensor of ``graph``, so the view names each tensor as ``graph``
    does and graphsurgeon sees the same constants; it replaces the outputs of its copy before using them.
    """
    tensors = graph.tensors()
    known = {name for name, tensor in tensors.items() if isinstance(tensor, gs.Constant)}
    results: set[str] = set()
    may_fold: set[int] = set()
    for node in graph.nodes:
        if all(t.name in known for t in node.inputs if not t.is_empty()) and all(
            name in known for name in _outer_reads(node)
        ):
            may_fold.add(id(node))
            outputs = {t.name for t in node.outputs if not t.is_empty()}
            known |= outputs
            results |= outputs
    if not may_fold:
        return None
    kept = [
        node
        for node in graph.nodes
        if id(node) in may_fold
        or any(t.name in results for t in node.inputs)
        or any(name in results for name in _outer_reads(node))
    ]
    kept_ids = {id(node) for node in kept}
    left_out = [node for node in graph.nodes if id(node) not in kept_ids]
    if 2 * len(left_out) < len(graph.nodes) and not any(has_subgraphs(node) for node in left_out):
        # copying the few nodes left out costs less than the view (PaddleOCR's and layout models' graphs)
        return graph
    return _graph_of(graph, kept, list(graph.inputs), list(tensors.values()))


def _graph_of(
    graph: gs.Graph, nodes: list[gs.Node], inputs: list[gs.Tensor], outputs: list[gs.Tensor]
) -> gs.Graph:
    """A graph object holding ``nodes`` (the same node and tensor objects), with ``graph``'s name, opsets,
    IR version and functions: the same objects, not registered again as ``gs.Graph()`` would."""
    part = gs.Graph.__new__(gs.Graph)
    part.__dict__.update(graph.__dict__)
    part.nodes, part.inputs, part.outputs = nodes, inputs, outputs
    return part


def _outer_tensors(node: gs.Node) -> list[gs.Tensor]:
    """The tensors from outside that the node's subgraphs read."""
    return [t for sub in gsmodel.node_subgraphs(node) for t in sub._foreign_tensors().values()]


def _outer_reads(node: gs.Node) -> list[str]:
    """Names of the tensors from outside that the node's subgraphs read."""
    return [t.name for t in _outer_tensors(node) if not t.is_empty()]


def drop_non_tensor_constants(graph: gs.Graph) -> None:
    """Constants graphsurgeon built from sequences/None returned by onnxruntime are not tensors: undo them."""
    for tensor in graph.tensors().values():
        if isinstance(tensor, gs.Constant) and not isinstance(
            tensor._values, (np.ndarray, gs.ir.tensor.LazyValues)
        ):
            log.warning("fold: '%s' evaluated to a non-tensor value; left unfolded", tensor.name)


@contextmanager
def quiet_graphsurgeon() -> Iterator[None]:
    """graphsurgeon logs to stdout; keep only its errors while gskit calls it (gskit logs what matters)."""
    logger = gs.logger.G_LOGGER
    old = logger.severity
    logger.severity = max(old, logger.ERROR)
    try:
        yield
    finally:
        logger.severity = old
