"""The steps a recipe can name: their options (validated by ``gskit.recipe``) and what each one does.

A transform step takes the graph and returns it changed; a check step reads the model as saved so far and
adds to the report. Every step checks what it needs before it runs and what it promises after: a failed
check raises ``StepError`` naming the step, and ``gskit prepare`` stops there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import onnx_graphsurgeon as gs

from gskit import model as gsmodel
from gskit.errors import GskitError
from gskit.plugin import PluginRegistry, implementation_paths

#: Sizes used for plugin-free parts of the default recipe.
DEFAULT_ATOL = 1e-5
DEFAULT_RTOL = 1e-5

#: Field metadata of options that name a file: a recipe file's relative paths resolve against its folder.
FILE_PATH = {"file_path": True}


@dataclass(frozen=True)
class SanitizeOptions:
    """Tidy a model: constants to initializers, dedupe, drop no-ops and unused things."""

    skip: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()


@dataclass(frozen=True)
class EditOptions:
    """Graph edits, applied in the order of the fields below."""

    rename: dict[str, str] = field(default_factory=dict)
    input_shapes: dict[str, tuple[int | str | None, ...]] = field(default_factory=dict)
    input_dtypes: dict[str, str] = field(default_factory=dict)
    remove_nodes: tuple[str, ...] = ()
    set_attrs: dict[str, dict[str, Any]] = field(default_factory=dict)
    expose: tuple[str, ...] = ()
    constants_to_initializers: bool = False
    drop_initializer_inputs: bool = False


@dataclass(frozen=True)
class IsolateOptions:
    """Keep only the subgraph between these tensors."""

    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()


@dataclass(frozen=True)
class ReplaceOptions:
    """Replace plugin patterns by plugin nodes (all known plugins unless ``only`` names some)."""

    only: tuple[str, ...] | None = None
    keep_function: bool = False


@dataclass(frozen=True)
class InferShapesOptions:
    """Custom-domain aware shape inference; strict: every plugin output must get a shape."""

    strict: bool = True


@dataclass(frozen=True)
class FoldOptions:
    """Constant folding to a fixed point, safe around plugin nodes."""

    max_passes: int = 10
    fold_shapes: bool = True
    size_threshold: int = 16 * 2**20
    allow_partial: bool = False


@dataclass(frozen=True)
class ConvertOptions:
    """Opset conversion, fp16 conversion and int64 -> int32."""

    opset: int | None = None
    fp16: bool = False
    keep_io_fp32: bool = True
    block_ops: tuple[str, ...] = ()
    clamp_min: float = 1e-7
    clamp_max: float = 1e4
    int32: bool = False


@dataclass(frozen=True)
class CheckTrtOptions:
    """Ask the TensorRT parser (or the static table) which nodes it will not take."""

    fail_on_unsupported: bool = False
    backend: Literal["auto", "tensorrt", "tensorrt_rtx", "static"] = "auto"


@dataclass(frozen=True)
class ValidateOptions:
    """Run original and prepared on onnxruntime with the same inputs and compare every output."""

    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL
    seed: int = 0
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    inputs: str | None = field(default=None, metadata=FILE_PATH)


@dataclass(frozen=True)
class BuildOptions:
    """Build a TensorRT engine (full TensorRT; TensorRT-RTX AOT when a compute capability is given)."""

    compute_capability: str | None = None
    shapes: dict[str, tuple[tuple[int, ...], ...]] = field(default_factory=dict)
    timing_cache: str | None = field(default=None, metadata=FILE_PATH)
    required: bool = False


STEP_OPTIONS: dict[str, type] = {
    "sanitize": SanitizeOptions,
    "edit": EditOptions,
    "isolate": IsolateOptions,
    "replace": ReplaceOptions,
    "infer_shapes": InferShapesOptions,
    "fold": FoldOptions,
    "convert": ConvertOptions,
    "check_trt": CheckTrtOptions,
    "validate": ValidateOptions,
    "build": BuildOptions,
}

#: Steps that read the saved model instead of changing the graph.
CHECK_STEPS = frozenset({"check_trt", "validate", "build"})

DEFAULT_STEPS: tuple[str, ...] = (
    "sanitize",
    "replace",
    "infer_shapes",
    "fold",
    "infer_shapes",
    "check_trt",
    "validate",
    "build",
)


# ------------------------------------------------------------------------------------------- step bodies
# Each body takes the run's state and its options and returns a one-line summary plus the step's own report.
# Imports are local: a recipe that never folds never imports the folding machinery.


class StepError(GskitError):
    """A step's precondition or postcondition failed; the message names the step."""


@dataclass
class RunState:
    """What steps share during one ``gskit prepare`` run."""

    graph: gs.Graph
    original_path: Path
    registry: PluginRegistry
    plugin_dirs: tuple[Path, ...] | None
    work_dir: Path
    replaced: list[Any] = field(default_factory=list)
    comparison: Any = None
    trt_report: Any = None
    engine: Any = None
    _snapshot: Path | None = field(default=None, repr=False)
    _snapshots_taken: int = field(default=0, repr=False)

    @property
    def engine_path(self) -> Path:
        return self.work_dir / "model.engine"

    def snapshot(self) -> Path:
        """The current graph saved as a file, for steps that read files; saved again only after a change."""
        if self._snapshot is None:
            self._snapshots_taken += 1
            target = self.work_dir / f"step{self._snapshots_taken}" / "model.onnx"
            self._snapshot = gsmodel.save(self.graph.copy(), target)
        return self._snapshot

    def graph_changed(self) -> None:
        """Called after every transform step: the next check step must see the graph as it is now."""
        self._snapshot = None


def run_sanitize(state: RunState, options: SanitizeOptions) -> tuple[str, Any]:
    from gskit.sanitize import sanitize

    outputs = [t.name for t in state.graph.outputs]
    state.graph, report = sanitize(state.graph, skip=options.skip, extra=options.extra)
    _ensure([t.name for t in state.graph.outputs] == outputs, "sanitize", "graph outputs changed")
    changed = ", ".join(f"{step} {n}" for step, n in report.changes.items() if n) or "nothing to tidy"
    return f"{report.nodes_before} -> {report.nodes_after} nodes ({changed})", report


def run_edit(state: RunState, options: EditOptions) -> tuple[str, Any]:
    from gskit import edit

    graph = state.graph
    if options.drop_initializer_inputs:
        edit.drop_initializer_inputs(graph)
    if options.constants_to_initializers:
        edit.constants_to_initializers(graph)
    if options.rename:
        edit.rename_tensors(graph, options.rename)
    for name, dtype in options.input_dtypes.items():
        edit.set_input_dtype(graph, name, dtype)
    for name, shape in options.input_shapes.items():
        edit.set_input_shape(graph, name, shape)
    for node in options.remove_nodes:
        edit.remove_node(graph, node)
    for node, values in options.set_attrs.items():
        edit.set_attributes(graph, node, values)
    if options.expose:
        edit.expose_tensors(graph, options.expose)
    count = sum(bool(v) for v in dataclasses.asdict(options).values())
    return f"{count} kinds of edit applied", None


def run_isolate(state: RunState, options: IsolateOptions) -> tuple[str, Any]:
    from gskit.isolate import isolate

    if not options.inputs or not options.outputs:
        raise StepError("isolate: the step needs both 'inputs' and 'outputs' tensor names")
    state.graph = isolate(state.graph, options.inputs, options.outputs)
    return f"kept the subgraph {list(options.inputs)} -> {list(options.outputs)}", None


def run_replace(state: RunState, options: ReplaceOptions) -> tuple[str, Any]:
    from gskit.patterns import replace

    specs = list(state.registry)
    if not specs:
        raise StepError("replace: no plugins loaded; pass --plugins DIR or set GSKIT_PLUGINS")
    report = replace(state.graph, specs, only=options.only, keep_function=options.keep_function)
    state.replaced.extend(report.regions)
    # Promise: no instance left that could have been replaced (a second pass finds nothing to do).
    again = replace(state.graph.copy(), specs, only=options.only, keep_function=options.keep_function)
    _ensure(again.replaced == 0, "replace", f"{again.replaced} pattern instance(s) left after replacement")
    skipped = sum(len(p.skipped) for p in report.plugins)
    per_plugin = ", ".join(f"{p.plugin}: {p.replaced}" for p in report.plugins if p.found)
    left = report.norm_like_left
    missed = (
        f"; {len(left)} norm-like computation(s) left unreplaced (at {', '.join(left[:3])}"
        f"{' ...' if len(left) > 3 else ''}; gskit replace --explain says why)"
        if left
        else ""
    )
    return f"{report.replaced} replaced, {skipped} skipped" + (
        f" ({per_plugin})" if per_plugin else ""
    ) + missed, report


def run_infer_shapes(state: RunState, options: InferShapesOptions) -> tuple[str, Any]:
    from gskit.shapes import infer_graph_shapes, unshaped_plugin_outputs

    infer_graph_shapes(state.graph, state.registry, strict=options.strict)
    unshaped = unshaped_plugin_outputs(state.graph, state.registry)
    # Only a plugin rule that gives no rank for inputs with one stops the run: TensorRT asks the plugin for
    # its output shapes. Where an upstream op lost the shape, TensorRT still knows it from the network.
    blocking = [u.describe() for u in unshaped if u.origin is None]
    if options.strict:
        _ensure(not blocking, "infer_shapes", "; ".join(blocking[:3]))
    if not unshaped:
        return "every plugin output has a rank", unshaped
    return f"{len(unshaped)} plugin output(s) without a rank: {unshaped[0].describe()}", unshaped


def run_fold(state: RunState, options: FoldOptions) -> tuple[str, Any]:
    from gskit.fold import fold

    outputs = [t.name for t in state.graph.outputs]
    state.graph, report = fold(
        state.graph,
        max_passes=options.max_passes,
        fold_shapes=options.fold_shapes,
        size_threshold=options.size_threshold,
        allow_partial=options.allow_partial,
        plugins=state.registry,
    )
    _ensure([t.name for t in state.graph.outputs] == outputs, "fold", "graph outputs changed")
    _ensure(report.nodes_after <= report.nodes_before, "fold", "folding added nodes")
    return f"{report.nodes_before} -> {report.nodes_after} nodes in {report.passes} passes", report


def run_convert(state: RunState, options: ConvertOptions) -> tuple[str, Any]:
    from gskit import convert

    done = []
    if options.opset is not None:
        proto = convert.convert_opset(gsmodel.to_model(state.graph), options.opset)
        state.graph = gsmodel.to_graph(proto)
        done.append(f"opset {options.opset}")
    if options.int32:
        state.graph, _ = convert.int64_to_int32(state.graph)
        done.append("int64 -> int32")
    if options.fp16:
        state.graph, _ = convert.to_fp16(
            state.graph,
            keep_io_types=options.keep_io_fp32,
            clamp_min=options.clamp_min,
            clamp_max=options.clamp_max,
            block_ops=options.block_ops,
            plugins=state.registry,
        )
        done.append("fp16")
    return ", ".join(done) or "nothing to convert", None


def run_check_trt(state: RunState, options: CheckTrtOptions) -> tuple[str, Any]:
    from gskit.backends.trt_check import NEEDS_PLUGIN, PLUGIN_PROBLEM, UNSUPPORTED, check_trt

    report = check_trt(state.snapshot(), plugins=state.plugin_dirs, backend=options.backend)
    state.trt_report = report
    bad = len(report.nodes_with(UNSUPPORTED)) + len(report.nodes_with(PLUGIN_PROBLEM))
    if options.fail_on_unsupported:
        _ensure(report.ok, "check_trt", f"{bad} node(s) TensorRT will not take (see the report)")
    plugins = len(report.nodes_with(NEEDS_PLUGIN))
    return f"{report.source}: {bad} node(s) rejected, {plugins} plugin node(s) with known plugins", report


#: Sizes of the dims that generated validation inputs leave open, tried in order while the ORIGINAL model
#: fails on them: (any symbolic or unknown dim, unknown height and width of an image input). Small first, so
#: validation stays fast; an image of 64 survives a 32x down-sampling, 320 what detectors' Resize chains need,
#: 512 samples an audio front end's reflect padding.
VALIDATION_SIZES: tuple[tuple[int, int], ...] = ((2, 64), (16, 128), (64, 320), (512, 640))

#: How a user gives validation inputs that fit (the CLI flags and the recipe options).
INPUTS_HINT = (
    "give shapes that fit with --shape NAME:DIMS (recipe: validate: {shapes: {NAME: [DIMS]}}) "
    "or real inputs with --inputs F.npz (recipe: validate: {inputs: F.npz})"
)


def run_validate(state: RunState, options: ValidateOptions) -> tuple[str, Any]:
    from gskit.compare import ReferenceRunError, compare, describe_feeds, failing_node
    from gskit.feeds import load_feeds, random_feeds

    prepared = state.snapshot()
    common = dict(atol=options.atol, rtol=options.rtol, plugins=state.registry)
    if options.inputs:
        feeds = load_feeds(options.inputs)
        try:
            report = compare(state.original_path, prepared, feeds=feeds, **common)
        except ReferenceRunError as err:
            raise StepError(f"validate: {err}; check the file given as inputs ({options.inputs})") from err
        return _validated(state, report, _unsteady_note(state, report, feeds))
    original = gsmodel.load(state.original_path, load_weights=False)
    failures = []
    for default_dim, image_dim in VALIDATION_SIZES:
        feeds = random_feeds(
            original, options.shapes or None, seed=options.seed, default_dim=default_dim, image_dim=image_dim
        )
        if failures and describe_feeds(feeds) == failures[-1][0]:
            continue  # nothing left open to grow: the same inputs would fail the same way
        try:
            report = compare(state.original_path, prepared, feeds=feeds, **common)
        except ReferenceRunError as err:
            failures.append((describe_feeds(feeds), err.failure))
            continue
        note = f" (inputs {_shapes_text(report.input_shapes)}"
        note += f"; {len(failures)} smaller size(s) failed in the original)" if failures else ")"
        return _validated(state, report, note + _unsteady_note(state, report, feeds))
    tried, failure = failures[-1]
    culprit = failing_node(original, failure)
    where = f"node {culprit[0]} fails on input(s) {culprit[1]}: " if culprit and culprit[1] else ""
    raise StepError(
        f"validate: the original model cannot run on generated inputs (last tried {tried}, "
        f"{len(failures)} size(s) in all): {where}{failure}; {INPUTS_HINT}"
    )


def _unsteady_note(state: RunState, report: Any, feeds: dict) -> str:
    """On a failed validation: whether the original itself gives different outputs on two identical runs."""
    if report.passed:
        return ""
    from gskit.compare import unsteady_outputs

    unsteady = unsteady_outputs(state.original_path, feeds, state.registry)
    if not unsteady:
        return ""
    return (
        f"; the ORIGINAL model gives different {unsteady} on two runs of the same inputs (random ops, or "
        "Dropout exported in training mode): no prepared model can match it; export it in eval mode"
    )


def _validated(state: RunState, report: Any, note: str) -> tuple[str, Any]:
    state.comparison = report
    worst = max((o.max_abs_err for o in report.outputs), default=0.0)
    verdict = "passed" if report.passed else f"FAILED on {[o.name for o in report.failed]}"
    return f"{len(report.outputs)} outputs, max abs err {worst:.3g}: {verdict}{note}", report


def _shapes_text(shapes: dict[str, tuple[int, ...]]) -> str:
    return ", ".join(f"{name}:{'x'.join(str(d) for d in dims) or 'scalar'}" for name, dims in shapes.items())


def run_build(state: RunState, options: BuildOptions) -> tuple[str, Any]:
    from gskit.backends.trt import full_tensorrt_available, resolve_backend
    from gskit.backends.trt_build import build_engine

    flavour = resolve_backend("auto")
    has_plugins = any(state.registry.for_node(n) for n in state.graph.nodes)
    reason = None
    if flavour == "static":
        reason = "no TensorRT installed"
    elif not full_tensorrt_available() and options.compute_capability is None:
        reason = "TensorRT-RTX only: give build.compute_capability for an AOT build"
    elif not full_tensorrt_available() and has_plugins:
        reason = "TensorRT-RTX has no custom plugins; build with full TensorRT (docker/)"
    if reason:
        if options.required:
            raise StepError(f"build: {reason}")
        return f"skipped: {reason}", None
    shapes = {name: tuple(tuple(s) for s in dims) for name, dims in options.shapes.items()} or None
    info = build_engine(
        state.snapshot(),
        state.engine_path,
        # The loaded plugins' own implementations (shipped ones included), only when the model needs them:
        # TensorRT-RTX refuses any plugin file.
        plugins=implementation_paths(state.registry, state.plugin_dirs or ()) if has_plugins else [],
        shapes=shapes,
        timing_cache=options.timing_cache,
        compute_capability=options.compute_capability,
    )
    state.engine = info
    return f"built {info.engine.name} in {info.build_seconds:.1f}s", info


STEP_RUNNERS: dict[str, Callable[[RunState, Any], tuple[str, Any]]] = {
    "sanitize": run_sanitize,
    "edit": run_edit,
    "isolate": run_isolate,
    "replace": run_replace,
    "infer_shapes": run_infer_shapes,
    "fold": run_fold,
    "convert": run_convert,
    "check_trt": run_check_trt,
    "validate": run_validate,
    "build": run_build,
}


def _ensure(condition: bool, step: str, message: str) -> None:
    if not condition:
        raise StepError(f"step '{step}' broke its promise: {message}")
