"""Layer-by-layer comparison: the first tensor, in the prepared model's order, where two runs part ways.

Every tensor that both models compute (a node output of the same name in both main graphs) is a
candidate; the candidates are checked in the topological order of the prepared model, ``chunk`` at a time,
and the scan stops at the first chunk holding a failure. The report lists every tensor checked up to and
including the first failure, with its producing node in both models: the place where a plugin or a fold
went wrong.

How intermediate tensors are read:

* onnxruntime (both sides, or the reference side): each chunk's tensors are added as graph outputs of the
  in-memory model for the time it takes to create a session (the caller's model is restored), so memory
  holds at most ``chunk`` activations per side.
* TensorRT (``backend="trt"``): one engine is built with ``mark_unfused_tensors_as_debug_tensors`` where
  TensorRT has it, so the engine under test is the one TensorRT builds anyway (fusions intact) and only the
  tensors that survive fusion are compared; older TensorRT marks the candidates with Polygraphy's
  ``MarkDebug``. Each chunk switches the debug state of its tensors on (``set_tensor_debug_state``), so
  only ``chunk`` tensors are copied to the host per run.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import onnx

from gskit.backends import ort as ort_backend
from gskit.backends import trt as trt_backend
from gskit.compare.outputs import (
    ModelSource,
    OutputComparison,
    check_backend,
    check_tolerances,
    compare_arrays,
    model_file,
    quiet_polygraphy,
    source_model,
)
from gskit.errors import GskitError
from gskit.io import model as gsmodel
from gskit.io import progress
from gskit.io.feeds import feed_shapes, resolve_feeds
from gskit.plugin.registry import PluginRegistry

log = logging.getLogger(__name__)

#: Tensors marked per run by default: enough to keep the number of runs low, small enough for memory.
DEFAULT_CHUNK = 256


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


@dataclass(frozen=True)
class LayerwiseReport:
    """Result of :func:`compare_layerwise`.

    Attributes:
        checked: tensors compared, in the prepared model's order, up to and including the first failure.
        first_failure: the first tensor whose error exceeds the tolerance; ``None`` when all match.
        passed: no tensor failed.
        candidates: tensors computed by both models (and, on TensorRT, kept by the engine).
        runs: runs per side (one per chunk scanned).
        chunk: tensors marked per run.
        input_shapes: the shape of each input fed to both runs.
        atol: absolute tolerance used.
        rtol: relative tolerance used.
        reference: what ran the original.
        under_test: what ran the prepared model.
    """

    checked: list[TensorCheck]
    first_failure: TensorCheck | None
    passed: bool
    candidates: int
    runs: int
    chunk: int
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    atol: float = 1e-5
    rtol: float = 1e-5
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
    *,
    feeds: Mapping[str, np.ndarray] | None = None,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    seed: int = 0,
    atol: float = 1e-5,
    rtol: float = 1e-5,
    plugins: PluginRegistry | None = None,
    chunk: int = DEFAULT_CHUNK,
    backend: str = "onnxruntime",
    trt_plugins: Sequence[str | os.PathLike] = (),
) -> LayerwiseReport:
    """Compare every tensor both models compute and report the first one that differs.

    Args:
        original: the reference model (runs on onnxruntime).
        prepared: the model under test; tensors are matched to the original's by name.
        feeds: inputs by name; ``None`` draws random inputs from ``seed`` (shapes from ``shapes``).
        shapes: input shapes for random inputs, overriding symbolic dims.
        seed: seed of the random inputs.
        atol: absolute tolerance (per element: within ``atol`` or within ``rtol``, as in ``compare``).
        rtol: relative tolerance.
        plugins: specs of plugin nodes; on onnxruntime they run through their numpy references.
        chunk: tensors marked per run (at least 1); bounds memory and the size of each modified model.
        backend: what runs ``prepared``: ``"onnxruntime"`` or ``"trt"`` (full TensorRT and a GPU).
        trt_plugins: plugin libraries / folders loaded into TensorRT (``"trt"`` only).

    Raises:
        GskitError: ``chunk`` < 1, a model cannot be loaded or run, or ``"trt"`` without TensorRT and a GPU.
    """
    if chunk < 1:
        raise GskitError(f"--chunk must be at least 1 (got {chunk})")
    check_tolerances(atol, rtol)
    backend = check_backend(backend)
    original_proto, prepared_proto = source_model(original), source_model(prepared)
    feeds = resolve_feeds(original_proto, feeds, shapes, seed=seed)
    original_nodes = producers(original_proto.graph)
    prepared_nodes = producers(prepared_proto.graph)
    candidates = [name for name in prepared_nodes if name in original_nodes]
    reference = OrtTensors(original_proto, feeds, plugins, "original (onnxruntime)")
    with _under_test(backend, prepared, prepared_proto, feeds, plugins, trt_plugins, candidates) as test:
        candidates = test.available(candidates)
        log.info("layerwise: %d tensors in both models, %d per run", len(candidates), chunk)
        checked: list[TensorCheck] = []
        first: TensorCheck | None = None
        runs = 0
        with progress.task("layerwise: tensors compared", total=len(candidates)) as advance:
            for start in range(0, len(candidates), chunk):
                names = candidates[start : start + chunk]
                rows = compare_arrays(reference.run(names), test.run(names), names, atol=atol, rtol=rtol)
                runs += 1
                advance(len(names))
                for row in rows:
                    checked.append(TensorCheck(row, original_nodes[row.name], prepared_nodes[row.name]))
                    if not row.passed:
                        first = checked[-1]
                        break
                if first is not None:
                    break
        under_test = test.name
    return LayerwiseReport(
        checked=checked,
        first_failure=first,
        passed=first is None,
        candidates=len(candidates),
        runs=runs,
        chunk=chunk,
        input_shapes=feed_shapes(feeds),
        atol=atol,
        rtol=rtol,
        reference=reference.name,
        under_test=under_test,
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


class OrtTensors:
    """Reads any tensors of a model on onnxruntime by exposing them as graph outputs for one session."""

    def __init__(
        self,
        model: onnx.ModelProto,
        feeds: Mapping[str, np.ndarray],
        plugins: PluginRegistry | None,
        name: str,
    ) -> None:
        self.model = model
        self.feeds = _as_input_dtypes(model, feeds)
        self.plugins = plugins
        self.name = name

    def available(self, names: Sequence[str]) -> list[str]:
        return list(names)

    def run(self, names: Sequence[str]) -> dict[str, np.ndarray]:
        """Run once and return ``names`` (graph inputs among them are returned as fed).

        Raises:
            GskitError: onnxruntime cannot load or run the model with these outputs.
        """
        inputs = {i.name for i in self.model.graph.input}
        wanted = [n for n in names if n not in inputs]
        with exposed(self.model, wanted):
            sess = ort_backend.session(self.model, plugins=self.plugins)
        known = {i.name for i in sess.get_inputs()}
        values = ort_backend.run(sess, {k: v for k, v in self.feeds.items() if k in known}, outputs=wanted)
        values.update({n: self.feeds[n] for n in names if n in inputs and n in self.feeds})
        return values


def _as_input_dtypes(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``feeds`` cast to the dtypes of ``model``'s graph inputs, as Polygraphy's data loader does for plain
    compare: the same float32 inputs feed an original and its ``convert --fp16`` copy (float16 inputs)."""
    dtypes = gsmodel.input_dtypes(model)
    return {
        name: value.astype(dtypes[name]) if name in dtypes and value.dtype != dtypes[name] else value
        for name, value in feeds.items()
    }


@contextmanager
def exposed(model: onnx.ModelProto, names: Sequence[str]) -> Iterator[onnx.ModelProto]:
    """``model`` with ``names`` added as (untyped) graph outputs; the outputs are removed on exit."""
    have = {o.name for o in model.graph.output}
    added = [name for name in dict.fromkeys(names) if name not in have]
    model.graph.output.extend(onnx.ValueInfoProto(name=name) for name in added)
    try:
        yield model
    finally:
        if added:
            del model.graph.output[len(model.graph.output) - len(added) :]


class _TrtTensors:
    """Reads debug tensors of one TensorRT engine; each run switches on only the tensors asked for."""

    def __init__(self, runner: Any, feeds: Mapping[str, np.ndarray]) -> None:
        self.runner = runner
        self.feeds = {k: np.ascontiguousarray(v) for k, v in feeds.items()}
        self.name = "prepared (tensorrt)"

    def available(self, names: Sequence[str]) -> list[str]:
        is_debug = getattr(self.runner.engine, "is_debug_tensor", None)
        kept = [n for n in names if is_debug(n)] if is_debug is not None else list(names)
        if len(kept) < len(names):
            log.info("layerwise: TensorRT keeps %d of %d tensors after fusion", len(kept), len(names))
        return kept

    def run(self, names: Sequence[str]) -> dict[str, np.ndarray]:
        context = self.runner.context
        if hasattr(context, "set_tensor_debug_state"):
            context.set_all_tensors_debug_state(False)
            for name in names:
                context.set_tensor_debug_state(name, True)
        try:
            outputs = self.runner.infer(self.feeds)
        except Exception as err:  # TensorRT and Polygraphy raise many types; keep the first line
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise GskitError(f"TensorRT failed to run the prepared model: {first}") from err
        values = {name: np.array(value) for name, value in outputs.items()}
        values.update({n: self.feeds[n] for n in names if n in self.feeds})
        return values


@contextmanager
def _under_test(
    backend: str,
    prepared: ModelSource,
    prepared_proto: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    plugins: PluginRegistry | None,
    trt_plugins: Sequence[str | os.PathLike],
    candidates: Sequence[str],
) -> Iterator[TensorSource]:
    if backend == "onnxruntime":
        yield OrtTensors(prepared_proto, feeds, plugins, "prepared (onnxruntime)")
        return
    unfused = trt_backend.marks_unfused_debug_tensors()
    with model_file(prepared) as path:
        runner = trt_backend.trt_runner(
            path,
            feeds,
            trt_plugins,
            name="prepared (tensorrt)",
            debug_unfused=unfused,
            mark_debug=() if unfused else candidates,
        )
        try:
            with quiet_polygraphy():
                runner.activate()
        except Exception as err:  # building the engine: keep the first line
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise GskitError(f"{path}: TensorRT cannot build the prepared model: {first}") from err
        try:
            yield _TrtTensors(runner, feeds)
        finally:
            runner.deactivate()
