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
from gskit.passes.fold.exclusion import Exclusion

log = logging.getLogger(__name__)


def fold_with_graphsurgeon(
    graph: gs.Graph, exclude: Exclusion, size_threshold: int | None, allow_partial: bool
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
    if not any(_reads_only_constants(node) for node in graph.nodes):
        # graphsurgeon would copy and export the graph to find nothing to fold (most If/Loop bodies after
        # the first pass: a third of silero-vad's fold time)
        return
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


def _reads_only_constants(node: gs.Node) -> bool:
    """What graphsurgeon's fold starts from: a node whose inputs are all constants or omitted (a ``Constant``
    node too, which it lowers to a constant tensor)."""
    return all(isinstance(t, gs.Constant) or t.is_empty() for t in node.inputs)


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
