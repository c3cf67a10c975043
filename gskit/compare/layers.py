"""Layer-by-layer comparison: the first tensor, in the prepared model's order, where two runs part ways.

Every tensor that both models compute (a node output of the same name in both main graphs) is a
candidate; the candidates are checked in the topological order of the prepared model, ``chunk`` at a time,
and the scan stops at the first chunk holding a failure. The report lists every tensor checked up to and
including the first failure, with its producing node in both models: the place where a plugin or a fold
went wrong.

The backends read the intermediate tensors (``tensor_source``), ``chunk`` at a time:

* onnxruntime (both sides, or the reference side): each chunk's tensors are exposed as graph outputs for
  one session (``gskit.backends.ort.ExposedTensors``), so memory holds at most ``chunk`` activations per side.
* TensorRT (``backend="trt"``): one engine whose debug tensors are the ones that survive TensorRT's fusions,
  each chunk's switched on per run (``gskit.backends.trt.DebugTensors``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import onnx

from gskit.backends import ort as ort_backend
from gskit.backends.model_run import ModelRun
from gskit.compare.options import CompareOptions, ComparisonHeader, ModelSource, header_fields, source_model
from gskit.compare.outputs import OutputComparison, backend_for, compare_arrays, quiet_polygraphy
from gskit.errors import GskitError
from gskit.io import progress

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeRef:
    """A node by name and op (``op_type``, or ``domain::op_type`` for a custom domain)."""

    name: str
    op: str


@dataclass(frozen=True)
class TensorCheck:
    """One intermediate tensor compared between the two runs.

    Attributes:
        tensor: the comparison (name, shape, dtype, errors, verdict).
        original_node: the node that produces the tensor in the original model.
        prepared_node: the node that produces it in the prepared model.
    """

    tensor: OutputComparison
    original_node: NodeRef
    prepared_node: NodeRef


@dataclass(frozen=True, kw_only=True)
class LayerwiseReport(ComparisonHeader):
    """Result of :func:`compare_layerwise`: the header (:class:`ComparisonHeader`: ``passed``: no tensor
    failed), then

    Attributes:
        checked: tensors compared, in the prepared model's order, up to and including the first failure.
        first_failure: the first tensor whose error exceeds the tolerance; ``None`` when all match.
        candidates: tensors computed by both models (and, on TensorRT, kept by the engine).
        runs: runs per side (one per chunk scanned).
        chunk: tensors marked per run.
        reference: what ran the original.
    """

    checked: list[TensorCheck]
    first_failure: TensorCheck | None
    candidates: int
    runs: int
    chunk: int
    reference: str = "onnxruntime"
    under_test: str = "onnxruntime"


class TensorSource(Protocol):
    """One side of a layerwise comparison: runs the model and returns the named tensors."""

    name: str

    def available(self, names: Sequence[str]) -> list[str]: ...

    def run(self, names: Sequence[str]) -> dict[str, np.ndarray]: ...


def compare_layerwise(
    original: ModelSource,
    prepared: ModelSource,
    options: CompareOptions | None = None,
    **changes: Any,
) -> LayerwiseReport:
    """Compare every tensor both models compute and report the first one that differs.

    Args:
        original: the reference model (runs on onnxruntime).
        prepared: the model under test; tensors are matched to the original's by name.
        options: inputs, tolerances (per element: within ``atol`` or within ``rtol``, as in ``compare``),
            backend, plugins and ``chunk``, the tensors marked per run (at least 1), which bounds memory and
            the size of each modified model (:class:`CompareOptions`; its defaults if None).
        changes: fields of ``options`` to change (``chunk=16``).

    Raises:
        GskitError: ``chunk`` < 1, a model cannot be loaded or run, or ``"trt"`` without TensorRT and a GPU.
    """
    options = CompareOptions.given(options, changes)
    chunk = options.chunk
    if chunk < 1:
        raise GskitError(f"--chunk must be at least 1 (got {chunk})")
    backend = backend_for(options)
    original_proto, prepared_proto = source_model(original), source_model(prepared)
    options = options.plugins_for(original_proto, prepared_proto)
    feeds = options.feeds_for(original_proto)
    original_nodes = producers(original_proto.graph)
    prepared_nodes = producers(prepared_proto.graph)
    candidates = [name for name in prepared_nodes if name in original_nodes]
    reference = ort_backend.ExposedTensors(original_proto, feeds, options.plugins, "original (onnxruntime)")
    with ExitStack() as stack:
        with quiet_polygraphy():  # TensorRT's engine is built on entry
            test: TensorSource = stack.enter_context(
                backend.tensor_source(
                    ModelRun(
                        prepared,
                        feeds,
                        f"prepared ({backend.NAME})",
                        options.plugins,
                        options.trt_plugins,
                        loaded=prepared_proto,
                    ),
                    candidates,
                )
            )
        candidates = test.available(candidates)
        log.info("layerwise: %d tensors in both models, %d per run", len(candidates), chunk)
        checked: list[TensorCheck] = []
        first: TensorCheck | None = None
        runs = 0
        with progress.task("layerwise: tensors compared", total=len(candidates)) as advance:
            for start in range(0, len(candidates), chunk):
                names = candidates[start : start + chunk]
                rows = compare_arrays(
                    reference.run(names), test.run(names), names, atol=options.atol, rtol=options.rtol
                )
                runs += 1
                advance(len(names))
                for row in rows:
                    checked.append(TensorCheck(row, original_nodes[row.name], prepared_nodes[row.name]))
                    if not row.passed:
                        first = checked[-1]
                        break
                if first is not None:
                    break
    return LayerwiseReport(
        checked=checked,
        first_failure=first,
        candidates=len(candidates),
        runs=runs,
        chunk=chunk,
        reference=reference.name,
        under_test=test.name,
        **header_fields(options, feeds, first is None),
    )


def producers(graph: onnx.GraphProto) -> dict[str, NodeRef]:
    """Node outputs of the main graph in node order (topological in a valid model) -> producing node."""
    found: dict[str, NodeRef] = {}
    for index, node in enumerate(graph.node):
        ref = NodeRef(
            node.name or f"#{index}", f"{node.domain}::{node.op_type}" if node.domain else node.op_type
        )
        for name in node.output:
            if name:
                found.setdefault(name, ref)
    return found
