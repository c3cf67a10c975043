"""The pipeline's passes: one class per recipe step, one contract for all of them.

Every transformation is a core pass (``gskit.passes.transform.GraphPass`` beside its library function, e.g.
``gskit.passes.fold.FOLD``); its step here runs it on the run's graph with the step's options. A :class:`Pass`
declares its name, its options dataclass (the recipe schema and the defaults), whether it
changes the graph in place, replaces it, or only reads the model as saved so far (a check), and:

* ``requires``: what must hold before it runs (cheap; raises :class:`StepError`),
* ``call``: the work, returning a :class:`gskit.passes.transform.PassResult` (the graph, whether it was
  modified, the pass's own report, a summary and the verdict),
* ``ensures``: what it promises afterwards, checked cheaply from facts taken before the call (never a
  second run of the pass).

:data:`PASSES` is the one registry; ``STEP_OPTIONS`` (what the recipe validates against) is derived from it.
A failed check raises ``StepError`` naming the pass, and ``gskit prepare`` stops there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, TypeVar

import numpy as np
import onnx_graphsurgeon as gs

from gskit.compare.options import check_tolerances, compare_default
from gskit.errors import GskitError
from gskit.io import model as gsmodel
from gskit.io.feeds import check_seed
from gskit.io.gs_export import copy_graph
from gskit.io.shape_args import check_fixed_dims, check_profile, check_shape_options, format_shape
from gskit.passes.convert import CONVERT, ConvertOptions
from gskit.passes.edit import EDIT, EditOptions
from gskit.passes.fold import FOLD, FoldOptions
from gskit.passes.isolate import ISOLATE, IsolateOptions
from gskit.passes.lower import LOWER, LowerOptions
from gskit.passes.nms import NMS, NmsOptions
from gskit.passes.patterns.replace import REPLACE, ReplaceOptions, summarize
from gskit.passes.sanitize import SANITIZE, SanitizeOptions
from gskit.passes.shapes import INFER_SHAPES, InferShapesOptions, unshaped_plugin_outputs
from gskit.passes.transform import Before, GraphPass, PassResult, run_pass
from gskit.plugin.spec import PluginRegistry, implementation_paths
from gskit.plugin.target import TensorRTTarget, default_target

#: Field metadata of options that name a file: a recipe file's relative paths resolve against its folder.
FILE_PATH = {"file_path": True}


@dataclass(frozen=True)
class CheckTrtOptions:
    """Ask the TensorRT parser (or the static table) which nodes it will not take."""

    fail_on_unsupported: bool = False
    backend: Literal["auto", "tensorrt", "tensorrt_rtx", "static"] = "auto"


@dataclass(frozen=True)
class ValidateOptions:
    """Run original and prepared on onnxruntime with the same inputs and compare every output (the
    tolerances are ``gskit compare``'s: :class:`gskit.compare.options.CompareOptions`)."""

    atol: float = compare_default("atol")
    rtol: float = compare_default("rtol")
    seed: int = 0
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    inputs: str | None = field(default=None, metadata=FILE_PATH)

    def __post_init__(self) -> None:
        check_tolerances(self.atol, self.rtol)
        check_seed(self.seed)
        check_shape_options(self.shapes, check_fixed_dims)


@dataclass(frozen=True)
class BuildOptions:
    """Build a TensorRT engine (full TensorRT; TensorRT-RTX AOT when a compute capability is given)."""

    compute_capability: str | None = None
    shapes: dict[str, tuple[tuple[int, ...], ...]] = field(default_factory=dict)
    timing_cache: str | None = field(default=None, metadata=FILE_PATH)
    required: bool = False

    def __post_init__(self) -> None:
        check_shape_options(self.shapes, check_profile)

    @staticmethod
    def refused() -> Mapping[str, str]:
        """Options a recipe may write that gskit refuses, with what to do instead (weakly typed precision)."""
        from gskit.backends.trt_build import WEAK_TYPING_REFUSED

        return WEAK_TYPING_REFUSED


DEFAULT_STEPS: tuple[str, ...] = (
    "sanitize",
    "lower",
    "replace",
    "infer_shapes",
    "fold",
    "infer_shapes",
    "check_trt",
    "validate",
    "build",
)


# ------------------------------------------------------------------------------------------------ contract


class StepError(GskitError):
    """A pass's precondition or postcondition failed; the message names the pass."""


@dataclass
class RunState:
    """What passes share during one ``gskit prepare`` run."""

    graph: gs.Graph
    original_path: Path
    registry: PluginRegistry
    plugin_dirs: tuple[Path, ...] | None
    work_dir: Path
    #: the TensorRT version the run prepares for (the recipe's target, else the default): replace picks the
    #: forms and check_trt answers for it
    target: TensorRTTarget = field(default_factory=default_target)
    replaced: list[Any] = field(default_factory=list)
    #: (plugin, Skip) for each match replace found and did not replace, with the reason (report.html)
    skipped: list[tuple[str, Any]] = field(default_factory=list)
    comparison: Any = None
    #: output dtype changes that convert steps made (``gskit.compare.outputs.DtypeChange``): not failures
    dtype_changes: list[Any] = field(default_factory=list)
    #: what an nms step did (``gskit.passes.nms.NmsReport``): validation then compares detections
    nms: Any = None
    #: the nodes lower steps rewrote (``gskit.passes.lower.Lowered``)
    lowered: list[Any] = field(default_factory=list)
    trt_report: Any = None
    engine: Any = None
    _snapshot: Path | None = field(default=None, repr=False)
    _snapshots_taken: int = field(default=0, repr=False)

    @property
    def engine_path(self) -> Path:
        return self.work_dir / "model.engine"

    def snapshot(self) -> Path:
        """The current graph saved as a file, for passes that read files; saved again only after a change."""
        if self._snapshot is None:
            self._snapshots_taken += 1
            target = self.work_dir / f"step{self._snapshots_taken}" / "model.onnx"
            self._snapshot = gsmodel.save(copy_graph(self.graph), target)
        return self._snapshot

    def graph_changed(self) -> None:
        """Called after every pass that modified the graph: the next check must see the graph as it is now."""
        self._snapshot = None


OptionsT = TypeVar("OptionsT")


class Pass(Generic[OptionsT]):
    """One step of the pipeline. Subclasses set the class attributes and implement :meth:`call`."""

    #: the step's name in a recipe
    name: ClassVar[str]
    #: the options dataclass: the recipe schema and the defaults
    options: ClassVar[type]
    #: "in_place" (changes ``state.graph``), "replaces" (sets a new ``state.graph``), or "check" (reads the
    #: model as saved so far and changes no graph)
    effect: ClassVar[Literal["in_place", "replaces", "check"]]
    #: the graph's output names are the same after the pass (every transform but edit and isolate)
    keeps_outputs: ClassVar[bool] = True

    def requires(self, state: RunState, options: OptionsT) -> None:
        """Raise ``StepError`` when the pass cannot run on this state (default: no precondition)."""

    def call(self, state: RunState, options: OptionsT) -> PassResult:
        raise NotImplementedError

    def ensures(self, state: RunState, options: OptionsT, result: PassResult, before: Before) -> None:
        """Raise ``StepError`` when the pass broke a promise; the default checks the declared ones."""
        if self.effect != "check" and self.keeps_outputs:
            _ensure(
                tuple(t.name for t in state.graph.outputs) == before.outputs, self.name, "outputs changed"
            )

    def __call__(self, state: RunState, options: OptionsT) -> PassResult:
        self.requires(state, options)
        before = Before.of(state.graph)
        result = self.call(state, options)
        if self.effect == "check" and result.modified:
            raise StepError(f"pass '{self.name}' is a check but says it modified the graph (a gskit bug)")
        self.ensures(state, options, result, before)
        return result


def _ensure(condition: bool, step: str, message: str) -> None:
    if not condition:
        raise StepError(f"step '{step}' broke its promise: {message}")


# ------------------------------------------------------------------------------------------------- passes
# Every transformation is a core pass (``gskit.passes.transform.GraphPass``) beside its library function; a
# step here runs it on the run's graph. The checks import their backends locally.


class _Transform(Pass[OptionsT]):
    """A pipeline step that is one core pass (``core``) run on the run's graph with the step's options.

    Name, options and effect come from the core pass; ``run_pass`` checks its requires/ensures and its
    declared effect.
    """

    core: ClassVar[GraphPass]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.name, cls.options = cls.core.name, cls.core.options
        cls.effect = "in_place" if cls.core.effect == "in_place" else "replaces"
        cls.keeps_outputs = cls.core.keeps_outputs

    def call(self, state: RunState, options: OptionsT) -> PassResult:
        result = run_pass(self.core, state.graph, options, plugins=state.registry)
        state.graph = result.model
        return result

    def ensures(self, state: RunState, options: OptionsT, result: PassResult, before: Before) -> None:
        """``run_pass`` checked the core pass's promises already."""


class Sanitize(_Transform[SanitizeOptions]):
    core = SANITIZE


class Edit(_Transform[EditOptions]):
    core = EDIT


class Isolate(_Transform[IsolateOptions]):
    core = ISOLATE

    def requires(self, state: RunState, options: IsolateOptions) -> None:
        if not options.inputs or not options.outputs:
            raise StepError("isolate: the step needs both 'inputs' and 'outputs' tensor names")


class Lower(_Transform[LowerOptions]):
    core = LOWER

    def call(self, state: RunState, options: LowerOptions) -> PassResult:
        result = super().call(state, options)
        state.lowered.extend(result.report.lowered)
        return result


class Replace(_Transform[ReplaceOptions]):
    core = REPLACE

    def requires(self, state: RunState, options: ReplaceOptions) -> None:
        if not list(state.registry):
            raise StepError("replace: no plugins loaded; pass --plugins DIR or set GSKIT_PLUGINS")

    def call(self, state: RunState, options: ReplaceOptions) -> PassResult:
        """Forms are chosen for the run's target (a recipe gives it once, at the top)."""
        options = dataclasses.replace(options, tensorrt=str(state.target))
        result = run_pass(self.core, state.graph, options, plugins=list(state.registry))
        result.report.target_source = state.target.source
        result.summary = summarize(result.report)
        state.replaced.extend(result.report.regions)
        state.skipped.extend((p.plugin, skip) for p in result.report.plugins for skip in p.skipped)
        return result


class Nms(_Transform[NmsOptions]):
    """EfficientNMS_TRT behind the detection head; the model's outputs become the plugin's four."""

    core = NMS

    def requires(self, state: RunState, options: NmsOptions) -> None:
        if state.nms is not None:
            raise StepError("nms: the recipe has a second nms step; the model has its NMS already")

    def call(self, state: RunState, options: NmsOptions) -> PassResult:
        result = super().call(state, options)
        state.nms = result.report
        return result


class InferShapes(_Transform[InferShapesOptions]):
    core = INFER_SHAPES

    def call(self, state: RunState, options: InferShapesOptions) -> PassResult:
        result = super().call(state, options)
        unshaped = unshaped_plugin_outputs(state.graph, state.registry)
        # Only a plugin rule that gives no rank for inputs with one stops the run: TensorRT asks the plugin
        # for its output shapes. Where an upstream op lost the shape, TensorRT still knows it (the network).
        blocking = [u.describe() for u in unshaped if u.origin is None]
        if options.strict:
            _ensure(not blocking, self.name, "; ".join(blocking[:3]))
        result.report = unshaped
        result.summary = (
            f"{len(unshaped)} plugin output(s) without a rank: {unshaped[0].describe()}"
            if unshaped
            else "every plugin output has a rank"
        )
        return result


class Fold(_Transform[FoldOptions]):
    core = FOLD


class Convert(_Transform[ConvertOptions]):
    core = CONVERT

    def call(self, state: RunState, options: ConvertOptions) -> PassResult:
        """Also records the output dtypes it changed (``keep_io_fp32: false``), so validation expects them."""
        from gskit.compare.outputs import DtypeChange

        before = _output_dtypes(state.graph)
        result = super().call(state, options)
        for name, (old, new) in _changed(before, _output_dtypes(state.graph)).items():
            state.dtype_changes.append(DtypeChange(old, new, by="the recipe's convert step", output=name))
        return result


def _output_dtypes(graph: gs.Graph) -> dict[str, str]:
    return {t.name: np.dtype(t.dtype).name for t in graph.outputs if t.dtype is not None}


def _changed(before: dict[str, str], after: dict[str, str]) -> dict[str, tuple[str, str]]:
    return {name: (before[name], dtype) for name, dtype in after.items() if before.get(name, dtype) != dtype}


class CheckTrt(Pass[CheckTrtOptions]):
    name, options, effect = "check_trt", CheckTrtOptions, "check"

    def call(self, state: RunState, options: CheckTrtOptions) -> PassResult:
        from gskit.backends.trt_check import NEEDS_PLUGIN, NOT_CHECKED, check_trt

        report = check_trt(
            state.snapshot(), plugins=state.plugin_dirs, backend=options.backend, target=state.target
        )
        state.trt_report = report
        bad = len(report.rejected)
        if options.fail_on_unsupported:
            _ensure(report.ok, self.name, f"{bad} node(s) TensorRT will not take (see the report)")
        plugins = len(report.nodes_with(NEEDS_PLUGIN))
        summary = (
            f"{report.source} for TensorRT {report.target}: {bad} node(s) rejected, {plugins} plugin node(s) "
            "with known plugins"
        )
        unchecked = len(report.nodes_with(NOT_CHECKED))
        if unchecked:
            summary += f", {unchecked} node(s) not checked (the target imports them, {report.source} cannot)"
        return PassResult(summary=summary, report=report)


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


class Validate(Pass[ValidateOptions]):
    name, options, effect = "validate", ValidateOptions, "check"

    def call(self, state: RunState, options: ValidateOptions) -> PassResult:
        from gskit.compare.outputs import ReferenceRunError, compare, describe_feeds, failing_node
        from gskit.io.feeds import load_feeds, random_feeds

        snapshot = state.snapshot()
        common = dict(
            atol=options.atol, rtol=options.rtol, plugins=state.registry, dtype_changes=state.dtype_changes
        )
        if state.nms is not None:  # the outputs changed: detections are compared (gskit.compare.detections)
            from functools import partial

            from gskit.compare.detections import compare_detections

            compare = partial(compare_detections, nms=state.nms)

        def prepared(feeds: dict) -> Any:
            """The comparison; a message naming the run's snapshot file names "the prepared model" instead."""
            try:
                return compare(state.original_path, snapshot, feeds=feeds, **common)
            except ReferenceRunError:
                raise
            except GskitError as err:
                if str(snapshot) not in str(err):
                    raise
                raise StepError(str(err).replace(str(snapshot), "the prepared model")) from err

        if options.inputs:
            feeds = load_feeds(options.inputs)
            try:
                report = prepared(feeds)
            except ReferenceRunError as err:
                raise StepError(
                    f"validate: {err}; check the file given as inputs ({options.inputs})"
                ) from err
            return _validated(state, report, _unsteady_note(state, report, feeds))
        original = gsmodel.load(state.original_path, load_weights=False)
        failures = []
        for default_dim, image_dim in VALIDATION_SIZES:
            feeds = random_feeds(
                original,
                options.shapes or None,
                seed=options.seed,
                default_dim=default_dim,
                image_dim=image_dim,
            )
            if failures and describe_feeds(feeds) == failures[-1][0]:
                continue  # nothing left open to grow: the same inputs would fail the same way
            try:
                report = prepared(feeds)
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
    from gskit.compare.outputs import unsteady_outputs

    unsteady = unsteady_outputs(state.original_path, feeds, state.registry)
    if not unsteady:
        return ""
    return (
        f"; the ORIGINAL model gives different {unsteady} on two runs of the same inputs (random ops, or "
        "Dropout exported in training mode): no prepared model can match it; export it in eval mode"
    )


def _validated(state: RunState, report: Any, note: str) -> PassResult:
    state.comparison = report
    worst = max((o.max_abs_err for o in report.outputs), default=0.0)
    verdict = "passed" if report.passed else f"FAILED on {[o.name for o in report.failed]}"
    notes = "".join(f"; output {o.name}: {o.note}" for o in report.outputs if o.note)
    return PassResult(
        summary=f"{len(report.outputs)} outputs, max abs err {worst:.3g}: {verdict}{note}{notes}",
        report=report,
        status="ok" if report.passed else "failed",
    )


def _shapes_text(shapes: dict[str, tuple[int, ...]]) -> str:
    return ", ".join(f"{name}:{format_shape(dims)}" for name, dims in shapes.items())


class Build(Pass[BuildOptions]):
    name, options, effect = "build", BuildOptions, "check"

    def call(self, state: RunState, options: BuildOptions) -> PassResult:
        from gskit.backends.trt import full_tensorrt_available, resolve_backend
        from gskit.backends.trt_build import build_engine

        flavour = resolve_backend("auto")
        has_plugins = any(state.registry.for_node(n) for n in state.graph.nodes)
        reason = None
        if flavour == "static":
            reason = "no TensorRT installed"
        elif not full_tensorrt_available() and has_plugins:
            # Said first: giving --compute-capability would not help, TensorRT-RTX cannot build them at all.
            plugins = sorted(
                {spec.qualified_name for n in state.graph.nodes if (spec := state.registry.for_node(n))}
            )
            reason = (
                f"TensorRT-RTX has no custom plugins and the model has plugin nodes ({', '.join(plugins)}); "
                "build with full TensorRT (docker/)"
            )
        elif not full_tensorrt_available() and options.compute_capability is None:
            reason = "TensorRT-RTX only: give --compute-capability X.Y for an AOT build"
        if reason:
            # A build asked for (required, or a compute capability given for it) and not done is an error.
            if options.required or options.compute_capability is not None:
                raise StepError(f"build: {reason}")
            return PassResult(summary=reason, status="skipped")
        shapes = {name: tuple(tuple(s) for s in dims) for name, dims in options.shapes.items()} or None
        info = build_engine(
            state.snapshot(),
            state.engine_path,
            # The loaded plugins' own implementations (shipped ones included), only when the model needs
            # them: TensorRT-RTX refuses any plugin file.
            plugins=implementation_paths(state.registry, state.plugin_dirs or ()) if has_plugins else [],
            shapes=shapes,
            timing_cache=options.timing_cache,
            compute_capability=options.compute_capability,
        )
        state.engine = info
        return PassResult(summary=f"built {info.engine.name} in {info.build_seconds:.1f}s", report=info)


#: Every pass a recipe can name, by name.
PASSES: Mapping[str, Pass] = {
    p.name: p
    for p in (
        Sanitize(),
        Edit(),
        Isolate(),
        Lower(),
        Replace(),
        Nms(),
        InferShapes(),
        Fold(),
        Convert(),
        CheckTrt(),
        Validate(),
        Build(),
    )
}

#: The options dataclass of each step (what ``gskit.pipeline.recipe`` validates a recipe against).
STEP_OPTIONS: Mapping[str, type] = {name: p.options for name, p in PASSES.items()}
