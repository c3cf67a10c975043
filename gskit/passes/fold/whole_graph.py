"""Evaluating a graph's constant nodes all at once with graphsurgeon's ``fold_constants`` (models under
1.5 GB of constants whose weights are in memory), with graphsurgeon's unsafe parts turned off."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import onnx_graphsurgeon as gs

from gskit.errors import GskitError
from gskit.io import interrupt
from gskit.io import model as gsmodel
from gskit.passes.fold.exclusion import Exclusion

log = logging.getLogger(__name__)


def fold_with_graphsurgeon(
    graph: gs.Graph, exclude: Exclusion, size_threshold: int | None, allow_partial: bool
) -> None:
    exclude.start_batch()
    view = evaluation_view(graph)
    if view is None:
        # graphsurgeon would copy and export the graph to find nothing to fold (most If/Loop bodies after
        # the first pass: a third of silero-vad's fold time)
        return

    def evaluate() -> None:
        view.fold_constants(
            fold_shapes=False,  # gskit folds shapes itself; gs's pass also runs the unsafe cast elision
            recurse_subgraphs=False,  # gs's recursion forgets should_exclude_node
            partitioning="recursive" if allow_partial else None,
            error_ok=allow_partial,
            flatten_subgraphs=False,  # gs's flattening corrupts outer-scope tensors
            size_threshold=size_threshold,
            should_exclude_node=exclude,
            recurse_functions=False,
        )

    with quiet_graphsurgeon():
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
    if 2 * len(left_out) < len(graph.nodes) and not any(_has_subgraphs(node) for node in left_out):
        # copying the few nodes left out costs less than the view (PaddleOCR's and layout models' graphs)
        return graph
    view = gs.Graph.__new__(gs.Graph)
    view.__dict__.update(graph.__dict__)  # name, opsets, IR version, functions: the same objects
    view.nodes = kept
    view.inputs = list(graph.inputs)
    view.outputs = list(tensors.values())
    return view


def _has_subgraphs(node: gs.Node) -> bool:
    return next(gsmodel.node_subgraphs(node), None) is not None


def _outer_reads(node: gs.Node) -> list[str]:
    """Names of the tensors from outside that the node's subgraphs read."""
    return [
        t.name
        for sub in gsmodel.node_subgraphs(node)
        for t in sub._foreign_tensors().values()
        if not t.is_empty()
    ]


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
