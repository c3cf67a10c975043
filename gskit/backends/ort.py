"""Run models on onnxruntime (CPU): the reference that every prepared model is checked against.

Plugin nodes run in one of two ways:

* A node with a model-local function of the same ``(domain, name)`` runs as that function: onnxruntime
  inlines custom-domain local functions, so nothing is needed beyond plain onnxruntime.
* Otherwise the node runs through its spec's numpy reference as an onnxruntime-extensions PyOp. PyOps
  live in the fixed domain ``ai.onnx.contrib`` and take only int/float/string attributes, so the session
  gets a rewritten model: each plugin node moves into that domain under an op type unique per
  (spec, input/output dtypes, present inputs), and its attributes travel as one JSON string attribute.
  The caller's model is restored right after the session is created (no copy of the weights).

Chosen over splitting the graph at plugin nodes and running segments: one session, onnxruntime still
plans memory and runs the standard ops as usual, and a plugin inside a subgraph works too. Checked with
onnxruntime 1.31 and onnxruntime-extensions 0.15.2.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import logging
import os
import sys
import tempfile
import traceback
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort

from gskit.backends import ort_segments
from gskit.backends.model_run import ModelRun
from gskit.errors import PLUGIN_CODE_FAILURES, GskitError, ModelLoadError, PluginError
from gskit.io import interrupt
from gskit.io import model as gsmodel
from gskit.io.code_files import import_file
from gskit.plugin.ops import ORT_DOMAINS, is_default_domain
from gskit.plugin.registry import PluginRegistry
from gskit.plugin.spec import PluginSpec, attribute_value

log = logging.getLogger(__name__)

#: The domain of onnxruntime-extensions' Python custom ops (fixed by that package).
PYOP_DOMAIN = "ai.onnx.contrib"
#: The attributes of a rewritten plugin node: the original attributes as JSON, and the node's name.
PYOP_ATTRS = "gskit_attrs"
PYOP_NODE = "gskit_node"


def session(
    model: onnx.ModelProto | gs.Graph | str | os.PathLike,
    *,
    optimize: bool = False,
    plugins: PluginRegistry | None = None,
    loaded: onnx.ModelProto | None = None,
) -> ort.InferenceSession:
    """Create a CPU InferenceSession for a model, a graph or a file.

    Args:
        model: what to run. In-memory models whose weights are still on disk are written to a temporary
            file first, since onnxruntime resolves external data relative to a file.
        optimize: enable onnxruntime's graph optimizations. Off by default so a comparison checks the
            model as written, not onnxruntime's rewrite of it.
        plugins: specs of the plugin nodes in the model; their numpy references run inside the session.
        loaded: the file ``model`` as the caller already loaded it (weights left on disk): what tells
            whether it has plugin nodes, and what is rewritten when it has, so the file is not read again.

    The session's ``run`` raises a :class:`PluginError` naming the plugin, the node and the exception when a
    plugin reference raised inside it (see :func:`_guarded`).

    Raises:
        ModelLoadError: onnxruntime rejects the model (the message names the first problem it reports), or
            a node of a custom domain has neither a plugin spec nor a model-local function.
    """
    known = loaded if loaded is not None and isinstance(model, (str, os.PathLike)) else None
    custom = _custom_nodes(known or model) if not isinstance(model, gs.Graph) else None
    if custom is None or custom:
        proto = known or _as_proto(model)
        plugin_nodes = _plugin_nodes(proto, plugins)
        if plugin_nodes:
            with _pyop_model(proto, plugin_nodes, plugins) as rewritten:
                return _guarded(_session(rewritten, optimize=optimize, extensions=True))
        model = proto
    return _session(model, optimize=optimize, extensions=_uses_domain(model, PYOP_DOMAIN))


def runner(
    model: onnx.ModelProto | str | os.PathLike,
    plugins: PluginRegistry | None,
    name: str,
    loaded: onnx.ModelProto | None = None,
) -> Any:
    """A Polygraphy ``OnnxrtRunner`` whose session (:func:`session`, made on activation) knows plugin
    references, for Polygraphy's ``Comparator``; ``loaded`` as in :func:`session`."""
    from polygraphy.backend.onnxrt import OnnxrtRunner

    from gskit.backends.polygraphy_torch import use_without_torch

    use_without_torch()
    return OnnxrtRunner(lambda: runner_session(model, plugins, name, loaded), name=name)


def runner_session(
    model: onnx.ModelProto | str | os.PathLike,
    plugins: PluginRegistry | None,
    name: str,
    loaded: onnx.ModelProto | None,
) -> Any:
    """The session a runner uses (and ``gskit.compare``, where it runs a model without a runner): a model
    with more weights on disk than ``ort_segments.SEGMENTED_OVER`` runs in segments (one session at a time
    maps part of its weights; see ``gskit.backends.ort_segments``), any other as one :func:`session`. The
    runs in segments are noted for :func:`take_segmented_runs`."""
    known = loaded if loaded is not None and isinstance(model, (str, os.PathLike)) else None
    proto = known if known is not None else model if isinstance(model, onnx.ModelProto) else None
    if proto is None and Path(model).is_file():
        proto = known = gsmodel.load(model, load_weights=False)
    segments = ort_segments.plan(proto) if proto is not None else []
    if not segments:
        return session(model, plugins=plugins, loaded=known)
    mib = ort_segments.SEGMENT_BYTES / 2**20
    log.info("%s: %d segments of at most %g MiB of weights", name, len(segments), mib)
    return _NotedSegments(
        name,
        proto,
        segments,
        lambda part: session(part, plugins=plugins),
        lambda: session(model, plugins=plugins, loaded=known),
    )


class _NotedSegments(ort_segments.SegmentedSession):
    """A :class:`~gskit.backends.ort_segments.SegmentedSession` whose runs in segments are noted by name."""

    def __init__(self, name: str, *args: Any) -> None:
        super().__init__(*args)
        self.name = name

    def run(self, *args: Any) -> list[Any]:
        values = super().run(*args)
        if self.last_run == "segments":
            _SEGMENTED_RUNS.append((self.name, len(self.segments)))
        return values


#: (runner name, segments) of each run in segments since :func:`take_segmented_runs` last answered.
_SEGMENTED_RUNS: list[tuple[str, int]] = []


def default_session(model: bytes) -> ort.InferenceSession:
    """A CPU session with onnxruntime's default graph optimizations, as graphsurgeon's ``fold_constants``
    creates one: fold evaluates constant nodes with it, so its constants are the ones graphsurgeon's
    evaluation gives. Its threads do not spin idle and it prepacks no weight (:func:`_few_runs_options`):
    the outputs are the same bit for bit, and spinning threads took CPU from the rest of the fold on shared
    cores."""
    return ort.InferenceSession(model, _few_runs_options(), providers=["CPUExecutionProvider"])


def _few_runs_options() -> ort.SessionOptions:
    """Options of a session run a few times at most (every session gskit makes); outputs bit for bit those
    of onnxruntime's defaults."""
    options = ort.SessionOptions()
    # Prepacking (a second, repacked copy of every MatMul/Conv weight, made at load) costs more than it
    # saves, and it keeps weights that onnxruntime would map from their data file in anonymous memory (2.5 GB
    # of MatMul weights: 7.5 s and 2.5 GB, against 0.04 s and pages of the file).
    options.add_session_config_entry("session.disable_prepacking", "1")
    # Nor do idle worker threads spin waiting for the next parallel op (onnxruntime's default): on a machine
    # whose cores are shared they take CPU from the thread that runs the model, and a session is freed only
    # once they stop spinning (2-6 ms a session of a small model on 2 cores). The work is split among the
    # threads as before.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def take_segmented_runs() -> list[tuple[str, int]]:
    """The runs since the last call that ran a model in segments, as (runner name, number of segments)."""
    runs = list(_SEGMENTED_RUNS)
    _SEGMENTED_RUNS.clear()
    return runs


def _session(
    model: onnx.ModelProto | str | os.PathLike, *, optimize: bool, extensions: bool
) -> ort.InferenceSession:
    options = _few_runs_options()
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    options.log_severity_level = log_severity()
    quiet_default_logger()
    if extensions:
        options.register_custom_ops_library(_extensions_library())
    providers = ["CPUExecutionProvider"]
    try:
        if isinstance(model, (str, os.PathLike)):
            return _interruptible(ort.InferenceSession(str(model), options, providers=providers))
        proto = model
        on_disk = _has_disk_weights(proto)
        if on_disk or proto.ByteSize() > gsmodel.EXTERNAL_DATA_THRESHOLD:
            with tempfile.TemporaryDirectory(prefix="gskit-ort-") as tmp:
                # weights still on disk are linked, not copied (a model over 2 GB with plugin nodes)
                path = (
                    gsmodel.save_linked(proto, Path(tmp) / "model.onnx")
                    if on_disk
                    else gsmodel.save(proto, Path(tmp) / "model.onnx", external_data=True, check=False)
                )
                return _interruptible(ort.InferenceSession(str(path), options, providers=providers))
        with gsmodel._ir_version_for_onnxruntime(proto):
            payload = proto.SerializeToString()
        return _interruptible(ort.InferenceSession(payload, options, providers=providers))
    except (
        ort.capi.onnxruntime_pybind11_state.Fail,
        ort.capi.onnxruntime_pybind11_state.InvalidGraph,
        ort.capi.onnxruntime_pybind11_state.NotImplemented,
        ort.capi.onnxruntime_pybind11_state.InvalidArgument,
    ) as err:
        raise ModelLoadError(f"onnxruntime cannot load the model: {short_error(err)}") from err


#: The level the command line asked for (--verbose, --debug); None: follow the "gskit" logger.
_CLI_LEVEL: int | None = None


def log_severity() -> int:
    """onnxruntime's log level that follows gskit's: its lines stay hidden unless --verbose or --debug.

    Its errors arrive anyway as the exception gskit turns into one line; printed too, they come twice and in
    colour (and graph-optimizer warnings such as "UnsqueezeElimination cannot remove node" flood).
    """
    logger = logging.getLogger("gskit")
    level = _CLI_LEVEL if _CLI_LEVEL is not None else logger.getEffectiveLevel()
    if level <= logging.DEBUG:
        return 1  # info
    return 2 if level <= logging.INFO else 4  # warnings / fatal only


def quiet_default_logger(level: int | None = None) -> None:
    """Apply :func:`log_severity` to onnxruntime's process-wide logger (sessions made by other libraries,
    e.g. graphsurgeon's constant folding, log through it).

    Args:
        level: the ``logging`` level the command line chose; kept for later sessions. None: keep the last.
    """
    global _CLI_LEVEL
    if level is not None:
        _CLI_LEVEL = level
    ort.set_default_logger_severity(log_severity())


def symbolic_shape_inference(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """onnxruntime's symbolic shape inference (what Polygraphy uses) on ``model``; None where it gives up.

    ``auto_merge`` (as Polygraphy runs it) lets it take two dims an op requires to match as equal, which is
    what the model itself assumes for the op to be valid. Its per-op warnings are silenced: callers use the
    result as a second opinion only. Raises whatever it raises on ops it does not know.
    """
    inference = _symbolic_shape_infer().SymbolicShapeInference
    logger = logging.getLogger("onnxruntime.tools.symbolic_shape_infer")
    old, logger.level = logger.level, logging.ERROR
    # When it gives up it saves the model as ``sym_shape_infer_temp.onnx`` (+ data files) in the working
    # folder: run it from a temporary folder, so nothing lands where the user did not ask.
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="gskit-symbolic-") as scratch:
        os.chdir(scratch)
        try:
            return inference.infer_shapes(model, auto_merge=True)
        finally:
            os.chdir(cwd)
            logger.setLevel(old)


@lru_cache(maxsize=1)
def _symbolic_shape_infer() -> Any:
    """onnxruntime's ``tools/symbolic_shape_infer.py``, loaded as a module of its own: the package
    ``onnxruntime.tools`` imports torch on import where torch is installed (its PyTorch export helpers), which
    costs a second or more and hundreds of MB for a fold that needs none of it. The file imports only numpy,
    onnx, sympy and packaging."""
    name = "onnxruntime.tools.symbolic_shape_infer"
    if name in sys.modules:
        return sys.modules[name]
    path = Path(ort.__file__).parent / "tools" / "symbolic_shape_infer.py"
    module = import_file("gskit._ort_symbolic_shape_infer", path) if path.is_file() else None
    if module is None:  # an onnxruntime laid out otherwise: its package, torch and all
        import onnxruntime.tools.symbolic_shape_infer as module
    return module


def short_error(err: BaseException) -> str:
    """onnxruntime's error as one line, without its ``[ONNXRuntimeError] : 2 : INVALID_ARGUMENT :`` prefix."""
    text = str(err).strip()
    first = text.splitlines()[0] if text else type(err).__name__
    if "[ONNXRuntimeError]" in first:
        first = first.split(" : ", 3)[-1]
    return first.strip()


def run(
    model: onnx.ModelProto | gs.Graph | str | os.PathLike | ort.InferenceSession,
    feeds: Mapping[str, np.ndarray],
    outputs: list[str] | None = None,
    plugins: PluginRegistry | None = None,
) -> dict[str, np.ndarray]:
    """Run a model once and return its outputs by name.

    Raises:
        GskitError: the session cannot be created (see :func:`session`) or onnxruntime fails to run.
    """
    sess = model if isinstance(model, ort.InferenceSession) else session(model, plugins=plugins)
    names = outputs or [o.name for o in sess.get_outputs()]
    try:
        values = sess.run(names, dict(feeds))
    except PluginError:
        raise  # a plugin reference raised: it names the plugin and the node
    except Exception as err:  # onnxruntime raises its own pybind types; keep one line of it
        raise GskitError(f"onnxruntime failed to run the model: {short_error(err)}") from err
    return dict(zip(names, values, strict=True))


# -- the model under test of a comparison (``gskit.compare``); ``gskit.backends.trt`` offers the same ------


#: How reports name this backend.
NAME = "onnxruntime"


def require_runtime(what: str) -> None:
    """onnxruntime is a dependency of gskit: it always runs here."""


@contextlib.contextmanager
def comparison_runner(model_run: ModelRun) -> Iterator[Any]:
    """:func:`runner` for the model, for Polygraphy's ``Comparator``."""
    yield runner(model_run.model, model_run.plugins, model_run.name, model_run.loaded)


def run_unit(model_run: ModelRun, outputs: Sequence[str]) -> dict[str, np.ndarray]:
    """Run a small model (a plugin node with what feeds it) once, plugin nodes through their references.

    Raises:
        GskitError: as :func:`run`.
    """
    return run(model_run.model, model_run.feeds, outputs=list(outputs), plugins=model_run.plugins)


class ExposedTensors:
    """Reads any tensors of a model on onnxruntime by exposing them as graph outputs for one session.

    Each run's tensors are added as graph outputs of the in-memory model for the time it takes to create a
    session (the caller's model is restored), so memory holds only the tensors asked for.
    """

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
            sess = session(self.model, plugins=self.plugins)
        known = {i.name for i in sess.get_inputs()}
        values = run(sess, {k: v for k, v in self.feeds.items() if k in known}, outputs=wanted)
        values.update({n: self.feeds[n] for n in names if n in inputs and n in self.feeds})
        return values


@contextlib.contextmanager
def tensor_source(model_run: ModelRun, candidates: Sequence[str]) -> Iterator[ExposedTensors]:
    """The intermediate tensors of the model (:class:`ExposedTensors`); every candidate can be read."""
    loaded = model_run.loaded if model_run.loaded is not None else _as_proto(model_run.model)
    yield ExposedTensors(loaded, model_run.feeds, model_run.plugins, model_run.name)


def _as_input_dtypes(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``feeds`` cast to the dtypes of ``model``'s graph inputs, as Polygraphy's data loader does for plain
    compare: the same float32 inputs feed an original and its ``convert --fp16`` copy (float16 inputs)."""
    dtypes = gsmodel.input_dtypes(model)
    return {
        name: value.astype(dtypes[name]) if name in dtypes and value.dtype != dtypes[name] else value
        for name, value in feeds.items()
    }


@contextlib.contextmanager
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


def _has_disk_weights(model: onnx.ModelProto) -> bool:
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    return any(uses_external_data(t) for t in _get_all_tensors(model))


# -- plugin nodes through onnxruntime-extensions PyOps ------------------------------------------------------


@dataclass(frozen=True)
class _PyOpTarget:
    """What a PyOp op type runs: the spec, which of its inputs are present, and the model's dtypes."""

    spec: PluginSpec
    present: tuple[bool, ...]
    input_dtypes: tuple[np.dtype, ...]
    output_dtypes: tuple[np.dtype, ...]


#: op type -> target; read by the PyOp bodies at run time, updated whenever a session is created.
_TARGETS: dict[str, _PyOpTarget] = {}
#: op types already registered with onnxruntime-extensions (registration is process-wide and permanent).
_REGISTERED_PYOPS: set[str] = set()


def _as_proto(model: onnx.ModelProto | gs.Graph | str | os.PathLike) -> onnx.ModelProto:
    if isinstance(model, gs.Graph):
        return gsmodel.to_model(model)
    if isinstance(model, (str, os.PathLike)):
        return gsmodel.load(model, load_weights=False)
    return model


def _custom_nodes(model: onnx.ModelProto | str | os.PathLike) -> bool:
    """Whether the model may have nodes of custom domains (files are checked by their opset imports)."""
    if isinstance(model, (str, os.PathLike)):
        imports = gsmodel.load(model, load_weights=False).opset_import if Path(model).is_file() else []
    else:
        imports = model.opset_import
    return any(o.domain not in ORT_DOMAINS and o.domain != PYOP_DOMAIN for o in imports)


def _uses_domain(model: onnx.ModelProto | str | os.PathLike, domain: str) -> bool:
    if isinstance(model, (str, os.PathLike)):
        return False
    return any(o.domain == domain for o in model.opset_import)


#: Tensor types the PyOp API cannot carry (float16 aborts the process): widened to float32 by Cast nodes
#: around the PyOp, and narrowed back inside it before the reference runs, so the reference sees its dtype.
_WIDENED = {
    onnx.TensorProto.FLOAT16: onnx.TensorProto.FLOAT,
    onnx.TensorProto.BFLOAT16: onnx.TensorProto.FLOAT,
}


def _plugin_nodes(
    model: onnx.ModelProto, plugins: PluginRegistry | None
) -> list[tuple[onnx.GraphProto, dict[int, PluginSpec]]]:
    """Plugin nodes to run through references, as (graph, {node index: spec}); raises for unrunnable ones."""
    functions = {(f.domain, f.name) for f in model.functions}
    found = []
    for graph in gsmodel.graph_protos(model.graph):
        specs: dict[int, PluginSpec] = {}
        for index, node in enumerate(graph.node):
            if node.domain in ORT_DOMAINS or node.domain == PYOP_DOMAIN:
                continue
            if (node.domain, node.op_type) in functions:
                continue
            spec = plugins.for_node(node) if plugins is not None else None
            if spec is None:
                raise ModelLoadError(
                    f"node '{node.name}' ({node.domain}::{node.op_type}) has no plugin spec and no "
                    f"model-local function, onnxruntime cannot run it; pass its plugin folder with --plugins"
                )
            specs[index] = spec
        if specs:
            found.append((graph, specs))
    return found


@contextlib.contextmanager
def _pyop_model(
    model: onnx.ModelProto,
    nodes: list[tuple[onnx.GraphProto, dict[int, PluginSpec]]],
    plugins: PluginRegistry | None,
) -> Iterator[onnx.ModelProto]:
    """The model with its plugin nodes turned into PyOps; every change is undone on exit."""
    dtypes = _plugin_dtypes(model, nodes, plugins)
    saved: list[tuple[onnx.GraphProto, list[onnx.NodeProto]]] = []
    added_import = False
    try:
        for graph, specs in nodes:
            original = [_copy(node) for node in graph.node]
            saved.append((graph, original))
            rewritten: list[onnx.NodeProto] = []
            for index, node in enumerate(original):
                rewritten.extend(_rewrite(_copy(node), specs[index], dtypes) if index in specs else [node])
            del graph.node[:]
            graph.node.extend(rewritten)
        if not _uses_domain(model, PYOP_DOMAIN):
            model.opset_import.append(onnx.helper.make_opsetid(PYOP_DOMAIN, 1))
            added_import = True
        yield model
    finally:
        for graph, original in saved:
            del graph.node[:]
            graph.node.extend(original)
        if added_import:
            del model.opset_import[-1]


def _plugin_dtypes(
    model: onnx.ModelProto,
    nodes: list[tuple[onnx.GraphProto, dict[int, PluginSpec]]],
    plugins: PluginRegistry | None,
) -> dict[str, int]:
    """Element types by tensor name, for the tensors of the plugin nodes (what their PyOps are declared
    with): the model's own where it types all of them and gives every node output of its graph a dtype and
    a shape (a model gskit wrote: its infer_shapes step typed every tensor), else inferred.

    Inference keeps the types a model declares, so it would only repeat them; skipping it spares the
    registration of the plugins' onnx schemas and onnx's inference (tens of ms for a small model in a
    process that has not inferred shapes before, such as ``gskit compare``).
    """
    from gskit.passes.shapes import infer_shapes, missing_shapes

    declared = _elem_types(model)
    needed = {
        name
        for graph, specs in nodes
        for index in specs
        for name in (*graph.node[index].input, *graph.node[index].output)
        if name
    }
    if needed <= declared.keys() and not missing_shapes(model):
        return declared
    return _elem_types(infer_shapes(model, plugins or PluginRegistry(), strict=False))


def _rewrite(node: onnx.NodeProto, spec: PluginSpec, dtypes: Mapping[str, int]) -> list[onnx.NodeProto]:
    """Turn ``node`` into a PyOp node; returns it with the Cast nodes it needs before and after."""
    if len(node.output) > len(spec.outputs):
        raise GskitError(
            f"node '{node.name}' has {len(node.output)} outputs; "
            f"{spec.qualified_name} has {len(spec.outputs)}"
        )
    present = tuple(i < len(node.input) and bool(node.input[i]) for i in range(len(spec.inputs)))
    inputs = [name for name in node.input if name]
    in_types = [_dtype_of(node, name, dtypes, "input") for name in inputs]
    out_types = [_dtype_of(node, name, dtypes, "output") for name in node.output]
    before, after = [], []
    for i, (name, dtype) in enumerate(zip(inputs, in_types, strict=True)):
        if dtype in _WIDENED:
            inputs[i] = f"{name}__gskit_widened_{node.name or id(node)}_{i}"
            before.append(onnx.helper.make_node("Cast", [name], [inputs[i]], to=_WIDENED[dtype]))
    outputs = list(node.output)
    for i, (name, dtype) in enumerate(zip(outputs, out_types, strict=True)):
        if dtype in _WIDENED and name:
            outputs[i] = f"{name}__gskit_widened"
            after.append(onnx.helper.make_node("Cast", [outputs[i]], [name], to=dtype))
    signature = repr((spec.key, id(spec), present, in_types, out_types))
    op_type = f"Gskit_{spec.name}_{hashlib.sha1(signature.encode()).hexdigest()[:12]}"
    target = _PyOpTarget(spec, present, _np_dtypes(in_types), _np_dtypes(out_types))
    _register_pyop(
        op_type, [_WIDENED.get(t, t) for t in in_types], [_WIDENED.get(t, t) for t in out_types], target
    )
    attrs = {a.name: _jsonable(attribute_value(a)) for a in node.attribute}
    del node.attribute[:]
    node.attribute.append(onnx.helper.make_attribute(PYOP_ATTRS, json.dumps(attrs, sort_keys=True)))
    node.attribute.append(onnx.helper.make_attribute(PYOP_NODE, node.name or f"producing {node.output[0]}"))
    del node.input[:]
    node.input.extend(inputs)
    del node.output[:]
    node.output.extend(outputs)
    node.domain = PYOP_DOMAIN
    node.op_type = op_type
    return [*before, node, *after]


def _copy(node: onnx.NodeProto) -> onnx.NodeProto:
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    return copy


def _np_dtypes(types: list[int]) -> tuple[np.dtype, ...]:
    return tuple(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t)) for t in types)


def _dtype_of(node: onnx.NodeProto, name: str, dtypes: Mapping[str, int], role: str) -> int:
    dtype = dtypes.get(name, 0)
    if not dtype:
        raise GskitError(
            f"node '{node.name}' ({node.domain}::{node.op_type}): dtype of {role} '{name}' is unknown; "
            f"check the plugin's output rule with `gskit infer-shapes`"
        )
    return dtype


def _register_pyop(op_type: str, in_types: list[int], out_types: list[int], target: _PyOpTarget) -> None:
    _TARGETS[op_type] = target
    if op_type in _REGISTERED_PYOPS:
        return
    from gskit.backends.ort_extensions import pyop_module

    pyops = pyop_module()
    types = pyops.PyCustomOpDef  # the package's ``PyOp``: its ``dt_*`` constants name the tensor types

    def body(*arrays: np.ndarray, **attrs: Any) -> np.ndarray | tuple[np.ndarray, ...]:
        current = _TARGETS[op_type]
        if _FAILURES:  # an earlier node failed in this run: the run is void, end it fast
            return _void_outputs(current)
        try:
            return _run_target(current, arrays, attrs)
        except BaseException as err:  # noqa: BLE001  # must not reach C++: pybind11 would terminate
            # Plugin code raising (NotImplementedError from a scaffolded stub, anything else, Ctrl-C) is
            # described and raised by the session's run() once onnxruntime returns (_guarded). The exception
            # itself is not kept: its traceback holds this call's frames and the arrays onnxruntime lends
            # to it only for the call.
            _FAILURES.append(_Failure.of(err, current.spec, str(attrs.get(PYOP_NODE, "?"))))
            return _void_outputs(current)

    pyops.Opdef.declare(  # the package's ``onnx_op``
        op_type=op_type,
        inputs=[_pyop_type(types, t) for t in in_types],
        outputs=[_pyop_type(types, t) for t in out_types],
        attrs={PYOP_ATTRS: types.dt_string, PYOP_NODE: types.dt_string},
    )(body)
    _REGISTERED_PYOPS.add(op_type)
    log.debug("registered PyOp %s for %s", op_type, target.spec.qualified_name)


def _run_target(
    target: _PyOpTarget, arrays: tuple[np.ndarray, ...], attrs: Mapping[str, Any]
) -> np.ndarray | tuple[np.ndarray, ...]:
    """Run the spec's reference on a PyOp's inputs; its outputs as the PyOp returns them."""
    values = iter(np.asarray(a, dtype=t) for a, t in zip(arrays, target.input_dtypes, strict=True))
    inputs = [next(values) if present else None for present in target.present]
    outputs = target.spec.run_reference(inputs, _decode_attrs(attrs.get(PYOP_ATTRS, "{}")))
    if len(outputs) != len(target.output_dtypes):
        raise PluginError(
            f"{target.spec.qualified_name}: reference returned {len(outputs)} output(s), "
            f"the node has {len(target.output_dtypes)}"
        )
    dtypes = target.output_dtypes
    cast = [_to_pyop(np.asarray(out, dtype=dtype)) for out, dtype in zip(outputs, dtypes, strict=False)]
    return tuple(cast) if len(cast) > 1 else cast[0]


@dataclass(frozen=True)
class _Failure:
    """A plugin reference's exception, described (type, first line, the traceback as text for --debug)."""

    kind: type[BaseException]
    text: str
    trace: str
    spec: PluginSpec
    node: str

    @classmethod
    def of(cls, err: BaseException, spec: PluginSpec, node: str) -> _Failure:
        lines = str(err).strip().splitlines()
        return cls(type(err), lines[0] if lines else "", traceback.format_exc(), spec, node)


#: What plugin references raised during the session run under way. A PyOp body must not raise
#: (onnxruntime-extensions calls it from C++, where a Python exception terminates the process with
#: "pybind11::error_already_set"), so it records the failure here and returns void outputs.
_FAILURES: list[_Failure] = []


def _void_outputs(target: _PyOpTarget) -> np.ndarray | tuple[np.ndarray, ...]:
    """Empty outputs of the PyOp's dtypes: any op after a failed plugin node sees no data, and the run's
    result is discarded by ``_guarded``."""
    void = [_to_pyop(np.zeros(0, dtype=dtype)) for dtype in target.output_dtypes]
    return tuple(void) if len(void) > 1 else void[0]


def _interruptible(sess: ort.InferenceSession) -> ort.InferenceSession:
    """``sess`` whose ``run`` SIGINT and SIGTERM interrupt (``gskit.io.interrupt.call``): onnxruntime runs in
    a worker thread, and an interrupt sets the run's ``terminate`` flag, which ends a long ``Loop`` at its
    next iteration. onnxruntime's own report of the terminated run is kept quiet like its other lines."""
    session_run = type(sess).run
    owner = weakref.ref(sess)  # a bound method here would make a cycle: the session freed only by the GC

    def run(output_names: Any, input_feed: Any, run_options: Any = None) -> Any:
        options = run_options if run_options is not None else ort.RunOptions()
        if run_options is None:
            options.log_severity_level = log_severity()
        return interrupt.call(
            lambda: session_run(owner(), output_names, input_feed, options),
            cancel=lambda: setattr(options, "terminate", True),
        )

    sess.run = run  # type: ignore[method-assign]  # Polygraphy's runner and run() both call sess.run
    return sess


def _guarded(sess: ort.InferenceSession) -> ort.InferenceSession:
    """``sess`` whose ``run`` raises what a plugin reference raised inside it (as a ``PluginError`` naming the
    plugin, the node and the exception; ``KeyboardInterrupt`` and other ``BaseException`` as they were),
    also when an op after the failed node then failed on its void output."""
    session_run = sess.run  # the interruptible run: a closure that holds the session weakly

    def run(*args: Any, **kwargs: Any) -> Any:
        _FAILURES.clear()
        try:
            values = session_run(*args, **kwargs)
        except Exception:
            _raise_plugin_failure()
            raise
        _raise_plugin_failure()
        return values

    sess.run = run  # type: ignore[method-assign]  # Polygraphy's runner and run() both call sess.run
    return sess


def _raise_plugin_failure() -> None:
    if not _FAILURES:
        return
    failure = _FAILURES[0]
    _FAILURES.clear()
    if not issubclass(failure.kind, PLUGIN_CODE_FAILURES) and not _defined_by(failure.kind, failure.spec):
        raise failure.kind()  # Ctrl-C (KeyboardInterrupt), SIGTERM's unwinding: as they were raised
    log.debug("plugin reference failed:\n%s", failure.trace)
    code = getattr(failure.spec.reference, "__code__", None)
    where = f" (reference in {code.co_filename})" if code is not None else ""
    name = failure.spec.qualified_name
    if failure.kind is PluginError:  # gskit's own check of what the reference returned
        what = failure.text.removeprefix(f"{name}: ")
    else:
        what = f"the reference raised {failure.kind.__name__}{': ' + failure.text if failure.text else ''}"
    raise PluginError(f"plugin {name}, node '{failure.node}': {what}{where}")


def _defined_by(kind: type[BaseException], spec: PluginSpec) -> bool:
    """Whether an exception class comes from the plugin's own folder (a BaseException of its own is still its
    failure, not an interruption)."""
    module = sys.modules.get(kind.__module__)
    file = getattr(module, "__file__", None)
    if not file or spec.source is None:
        return False
    return Path(file).resolve().is_relative_to(Path(spec.source).resolve().parent)


def _to_pyop(array: np.ndarray) -> np.ndarray:
    """A reference output as the PyOp returns it (widened where the PyOp API needs it)."""
    if array.dtype.itemsize == 2 and array.dtype.kind not in "iub":  # float16, bfloat16
        array = array.astype(np.float32)
    return np.ascontiguousarray(array)


def _pyop_type(defs: Any, dtype: int) -> int:
    name = onnx.TensorProto.DataType.Name(dtype).lower()
    name = {"float": "float", "double": "double"}.get(name, name)
    found = getattr(defs, f"dt_{name}", None)
    if found is None:
        raise PluginError(f"onnxruntime-extensions PyOps cannot take tensors of {name}")
    return found


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        buffer = io.BytesIO()
        np.save(buffer, value, allow_pickle=False)
        return {"__npy__": base64.b64encode(buffer.getvalue()).decode("ascii")}
    return value


@lru_cache(maxsize=256)
def _decode_attrs(text: str) -> dict[str, Any]:
    def decode(value: Any) -> Any:
        if isinstance(value, dict) and "__npy__" in value:
            return np.load(io.BytesIO(base64.b64decode(value["__npy__"])), allow_pickle=False)
        return value

    return {name: decode(value) for name, value in json.loads(text).items()}


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    types: dict[str, int] = {}
    for graph in gsmodel.graph_protos(model.graph):
        for init in graph.initializer:
            types[init.name] = init.data_type
        for vi in (*graph.input, *graph.value_info, *graph.output):
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
                types[vi.name] = vi.type.tensor_type.elem_type
        for node in graph.node:  # Constant nodes have no value_info of their own when outputs are inferred
            if node.op_type == "Constant" and is_default_domain(node.domain):
                for attr in node.attribute:
                    if attr.name == "value":
                        types.setdefault(node.output[0], attr.t.data_type)
    return types


def _extensions_library() -> str:
    from gskit.backends.ort_extensions import library_path

    return library_path()
