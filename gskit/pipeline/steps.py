"""The recipe's steps: every one a ``gskit.passes.transform.GraphPass``, one contract for all of them.

The transformations are the library's own passes (``gskit.passes.fold.FOLD`` ...), run by
``gskit prepare`` on the run's graph with the step's options and the run's ``PassContext`` (the plugins,
the target, the saved model, the results of the steps before, by name). The checks defined here
(``check_trt``, ``validate``, ``build``) are ``analysis`` passes: they read the model as saved so far and
change nothing; their report is the step's result (a comparison whose ``passed`` is False makes the step
"failed", a :class:`NotRun` report makes it "skipped").

:data:`PASSES` is the one registry; ``STEP_OPTIONS`` (what the recipe validates against) is derived from it.
A failed check raises ``StepError`` naming the pass, and ``gskit prepare`` stops there.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import onnx
import onnx_graphsurgeon as gs

from gskit.compare.options import check_tolerances, compare_default
from gskit.errors import GskitError
from gskit.io import model as gsmodel
from gskit.io.feeds import check_seed
from gskit.io.shape_args import (
    check_fixed_dims,
    check_profile,
    check_shape_options,
    format_shape,
    parse_fixed_shape,
)
from gskit.passes.convert import CONVERT
from gskit.passes.edit import EDIT
from gskit.passes.fold import FOLD
from gskit.passes.isolate import ISOLATE
from gskit.passes.lower import LOWER
from gskit.passes.nms import NMS
from gskit.passes.patterns.replace import REPLACE
from gskit.passes.sanitize import SANITIZE
from gskit.passes.shapes import INFER_SHAPES
from gskit.passes.transform import GraphPass, PassContext, PassResult, StepFlag, prepare_flag
from gskit.plugin.discovery import implementation_paths
from gskit.plugin.registry import PluginRegistry

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

    shapes: dict[str, tuple[int, ...]] = field(
        default_factory=dict,
        metadata=prepare_flag(
            StepFlag(
                "--shape",
                "validation input shape: x:1x3x224x224, x:1,3,224,224 or x:[1,3,224,224] (repeatable; "
                "validate.shapes)",
                kind="append",
                metavar="NAME:DIMS",
                parse=parse_fixed_shape,
                to_option=lambda given: {name: tuple(dims) for name, dims in dict(given).items()},
            )
        ),
    )
    inputs: str | None = field(
        default=None,
        metadata={
            **FILE_PATH,
            **prepare_flag(
                StepFlag(
                    "--inputs",
                    "validation inputs saved with numpy.savez (validate.inputs)",
                    metavar="F.npz",
                    # the working directory's, kept absolute
                    to_option=lambda given: str(Path(given).absolute()),
                )
            ),
        },
    )
    atol: float = compare_default(
        "atol", StepFlag("--atol", "validation absolute tolerance (validate.atol)", type=float)
    )
    rtol: float = compare_default(
        "rtol", StepFlag("--rtol", "validation relative tolerance (validate.rtol)", type=float)
    )
    seed: int = field(
        default=0,
        metadata=prepare_flag(
            StepFlag("--seed", "seed of the random validation inputs (validate.seed)", type=int)
        ),
    )

    def __post_init__(self) -> None:
        check_tolerances(self.atol, self.rtol)
        check_seed(self.seed)
        check_shape_options(self.shapes, check_fixed_dims)


@dataclass(frozen=True)
class BuildOptions:
    """Build a TensorRT engine (full TensorRT; TensorRT-RTX AOT when a compute capability is given)."""

    compute_capability: str | None = field(
        default=None,
        metadata=prepare_flag(
            StepFlag(
                "--compute-capability",
                "build a TensorRT-RTX engine ahead of time for this GPU, e.g. 8.9 (build.compute_capability)",
                metavar="X.Y",
            )
        ),
    )
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
    """A check's precondition or verdict stops the run; the message names the step."""


@dataclass(frozen=True)
class NotRun:
    """The report of a step that could not apply here (the step is "skipped"; ``reason`` says why)."""

    reason: str


class Snapshots:
    """The run's graph saved as a file, for passes that read files (``PassContext.snapshot``); saved again
    only after a step changed the graph.

    A snapshot writes no weight that is still on disk: their data files are linked beside it
    (``gsmodel.save_linked``), so a check on a model of any size writes its graph and the weights the steps
    made, never a copy of the original's.
    """

    def __init__(self, work_dir: Path) -> None:
        self._work_dir = work_dir
        self._path: Path | None = None
        self._taken = 0

    def __call__(self, graph: gs.Graph) -> Path:
        if self._path is None:
            self._taken += 1
            target = self._work_dir / f"step{self._taken}" / "model.onnx"
            # The run's graph itself is exported, as the passes export it: a copy of every node and tensor
            # first (4-9 ms on a 65-node graph) kept nothing apart, since graphsurgeon's copy shares the one
            # thing its export changes, the list of imported domains; only a graph without that list would
            # get one, and it is taken back.
            domains = graph.import_domains
            try:
                self._path = gsmodel.save_linked(graph, target)
            finally:
                graph.import_domains = domains
        return self._path

    def current(self) -> Path | None:
        """The snapshot of the graph as it is now, when one was saved after the last change."""
        return self._path

    def graph_changed(self) -> None:
        """Called after every step that modified the graph: the next check must see the graph as it is now."""
        self._path = None


def step_status(result: PassResult) -> Literal["ok", "skipped", "failed"]:
    """A step's verdict from its result: "skipped" (a :class:`NotRun` report), "failed" (a report whose
    ``passed`` is False, e.g. outputs differ), else "ok"."""
    if isinstance(result.report, NotRun):
        return "skipped"
    return "failed" if getattr(result.report, "passed", None) is False else "ok"


def _registry(context: PassContext) -> PluginRegistry:
    """The run's plugins (``gskit prepare`` gives a registry; none: an empty one)."""
    plugins = context.plugins
    return plugins if isinstance(plugins, PluginRegistry) else PluginRegistry()


# ------------------------------------------------------------------------------------------------- checks
# The transformations are the library's passes (PASSES below); the checks import their backends locally.


class CheckTrt(GraphPass[CheckTrtOptions]):
    name, options, effect = "check_trt", CheckTrtOptions, "analysis"

    def call(self, model: gs.Graph, options: CheckTrtOptions, context: PassContext) -> PassResult:
        from gskit.backends.trt_check import NEEDS_PLUGIN, NOT_CHECKED, check_trt

        report = check_trt(
            context.saved(model),
            plugins=context.plugin_dirs,
            backend=options.backend,
            target=context.target,
            registry=context.plugins if isinstance(context.plugins, PluginRegistry) else None,  # loaded once
        )
        bad = len(report.rejected)
        if options.fail_on_unsupported and not report.ok:
            raise StepError(
                f"step '{self.name}' broke its promise: {bad} node(s) TensorRT will not take (see the report)"
            )
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


class Validate(GraphPass[ValidateOptions]):
    """Compares the model as saved so far with the original (``context.original``); the outputs a convert
    step changed the type of are expected changed, and after an nms step detections are compared."""

    name, options, effect = "validate", ValidateOptions, "analysis"

    def check_input(self, model: onnx.ModelProto, options: ValidateOptions) -> None:
        """Validation feeds the original model: a shape for an input it lacks fails before any step runs."""
        known = sorted({i.name for i in model.graph.input})
        unknown = sorted(set(options.shapes) - set(known))
        if unknown:
            raise GskitError(f"--shape names unknown input(s) {unknown}; model inputs are {known}")
        if options.inputs:
            from gskit.io.feeds import check_inputs_file

            check_inputs_file(options.inputs)

    @staticmethod
    def describe_inputs(comparison: Any, original: onnx.ModelProto, options: ValidateOptions | None) -> str:
        """``inputs x float32[2x4x8x8], random (seed 0); tolerances given: atol 1e-05, rtol 1e-05 ...``
        (report.html's line above the comparison)."""
        dtypes = {name: dtype.name for name, dtype in gsmodel.input_dtypes(original).items()}
        fed = ", ".join(
            f"{name} {dtypes.get(name, '?')}[{'x'.join(str(d) for d in shape)}]"
            for name, shape in comparison.input_shapes.items()
        )
        source = getattr(options, "inputs", None)
        how = f"from {source}" if source else f"random (seed {getattr(options, 'seed', 0)})"
        return (
            f"inputs {fed}, {how}; tolerances given: atol {comparison.atol:g}, rtol {comparison.rtol:g} "
            "(float32 outputs; lower-precision outputs get at least their dtype's floor, see each row)"
        )

    def call(self, model: gs.Graph, options: ValidateOptions, context: PassContext) -> PassResult:
        from gskit.backends.ort import take_segmented_runs
        from gskit.compare.outputs import (
            DtypeChange,
            ReferenceRunError,
            compare,
            describe_feeds,
            failing_node,
        )
        from gskit.io.feeds import load_feeds, random_feeds

        snapshot, registry, original_path = context.saved(model), _registry(context), context.original
        if original_path is None:
            raise StepError("validate: no original model to compare with (a gskit bug)")
        take_segmented_runs()  # runs of earlier comparisons in this process are not this step's
        changes = [
            DtypeChange(old, new, by="the recipe's convert step", output=name)
            for report in context.reports(CONVERT.name)
            for name, (old, new) in report.output_dtypes.items()
        ]
        common = dict(atol=options.atol, rtol=options.rtol, plugins=registry, dtype_changes=changes)
        nms = context.reports(NMS.name)
        if nms:  # the outputs changed: detections are compared (gskit.compare.detections)
            from functools import partial

            from gskit.compare.detections import compare_detections

            compare = partial(compare_detections, nms=nms[-1])

        def prepared(feeds: dict) -> Any:
            """The comparison; a message naming the run's snapshot file names "the prepared model" instead."""
            try:
                return compare(original_path, snapshot, feeds=feeds, **common)
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
            return _validated(report, _unsteady_note(original_path, registry, report, feeds))
        # The comparison draws its inputs from the original as it loads it: the file is read once.
        loaded: dict[str, Any] = {}
        failures = []
        for default_dim, image_dim in VALIDATION_SIZES:

            def draw(original: onnx.ModelProto, dims: tuple[int, int] = (default_dim, image_dim)) -> dict:
                loaded["original"] = original
                loaded["feeds"] = random_feeds(
                    original,
                    options.shapes or None,
                    seed=options.seed,
                    default_dim=dims[0],
                    image_dim=dims[1],
                )
                return loaded["feeds"]

            given: Any = draw
            if failures:  # a smaller size failed: the same inputs again would fail the same way
                given = draw(loaded["original"])
                if describe_feeds(given) == failures[-1][0]:
                    continue
            try:
                report = prepared(given)
            except ReferenceRunError as err:
                failures.append((describe_feeds(loaded["feeds"]), err.failure))
                continue
            feeds = loaded["feeds"]
            note = f" (inputs {_shapes_text(report.input_shapes)}"
            note += f"; {len(failures)} smaller size(s) failed in the original)" if failures else ")"
            return _validated(report, note + _unsteady_note(original_path, registry, report, feeds))
        tried, failure = failures[-1]
        culprit = failing_node(loaded["original"], failure)
        where = f"node {culprit[0]} fails on input(s) {culprit[1]}: " if culprit and culprit[1] else ""
        raise StepError(
            f"validate: the original model cannot run on generated inputs (last tried {tried}, "
            f"{len(failures)} size(s) in all): {where}{failure}; {INPUTS_HINT}"
        )


def _unsteady_note(original: Path, registry: PluginRegistry, report: Any, feeds: dict) -> str:
    """On a failed validation: whether the original itself gives different outputs on two identical runs."""
    if report.passed:
        return ""
    from gskit.compare.outputs import unsteady_outputs

    unsteady = unsteady_outputs(original, feeds, registry)
    if not unsteady:
        return ""
    return (
        f"; the ORIGINAL model gives different {unsteady} on two runs of the same inputs (random ops, or "
        "Dropout exported in training mode): no prepared model can match it; export it in eval mode"
    )


def _validated(report: Any, note: str) -> PassResult:
    """The step's result: the comparison is its report (``passed`` False makes the step "failed")."""
    note += _segments_note()
    worst = max((o.max_abs_err for o in report.outputs), default=0.0)
    verdict = "passed" if report.passed else f"FAILED on {[o.name for o in report.failed]}"
    notes = "".join(f"; output {o.name}: {o.note}" for o in report.outputs if o.note)
    return PassResult(
        summary=f"{len(report.outputs)} outputs, max abs err {worst:.3g}: {verdict}{note}{notes}",
        report=report,
    )


def _segments_note() -> str:
    """Which models the comparison ran in segments (``gskit.backends.ort_segments``: weights over 1 GiB on
    disk), so that the summary says the verdict came from chained sessions over the same files."""
    from gskit.backends import ort_segments
    from gskit.backends.ort import take_segmented_runs

    runs = dict(take_segmented_runs())
    if not runs:
        return ""
    each = ", ".join(f"{name} {count}" for name, count in runs.items())
    mib = ort_segments.SEGMENT_BYTES / 2**20
    return (
        f"; run in consecutive segments of at most {mib:g} MiB of weights, one onnxruntime session at a time "
        f"over the same files (segments: {each})"
    )


def _shapes_text(shapes: dict[str, tuple[int, ...]]) -> str:
    return ", ".join(f"{name}:{format_shape(dims)}" for name, dims in shapes.items())


class Build(GraphPass[BuildOptions]):
    """Builds ``model.engine`` in the run's work folder; its report is the engine's ``BuildInfo``."""

    name, options, effect = "build", BuildOptions, "analysis"

    #: the engine's file name in the work folder (and in OUTDIR)
    ENGINE_NAME = "model.engine"

    def call(self, model: gs.Graph, options: BuildOptions, context: PassContext) -> PassResult:
        from gskit.backends.trt import full_tensorrt_available, resolve_backend
        from gskit.backends.trt_build import build_engine

        if context.work_dir is None:
            raise StepError("build: no work folder to build the engine in (a gskit bug)")
        registry = _registry(context)
        flavour = resolve_backend("auto")
        has_plugins = any(registry.for_node(n) for n in model.nodes)
        reason = None
        if flavour == "static":
            reason = "no TensorRT installed"
        elif not full_tensorrt_available() and has_plugins:
            # Said first: giving --compute-capability would not help, TensorRT-RTX cannot build them at all.
            plugins = sorted({spec.qualified_name for n in model.nodes if (spec := registry.for_node(n))})
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
            return PassResult(summary=reason, report=NotRun(reason))
        shapes = {name: tuple(tuple(s) for s in dims) for name, dims in options.shapes.items()} or None
        info = build_engine(
            context.saved(model),
            context.work_dir / self.ENGINE_NAME,
            # The loaded plugins' own implementations (shipped ones included), only when the model needs
            # them: TensorRT-RTX refuses any plugin file.
            plugins=implementation_paths(registry, context.plugin_dirs or ()) if has_plugins else [],
            shapes=shapes,
            timing_cache=options.timing_cache,
            compute_capability=options.compute_capability,
        )
        return PassResult(summary=f"built {info.engine.name} in {info.build_seconds:.1f}s", report=info)


#: Every pass a recipe can name, by name: the one registry. A project adds a step by adding its pass here
#: (one ``GraphPass`` class with its options and their ``step_flags``); the recipe schema and
#: ``gskit prepare``'s flags follow.
PASSES: dict[str, GraphPass] = {
    p.name: p
    for p in (
        SANITIZE,
        EDIT,
        ISOLATE,
        LOWER,
        REPLACE,
        NMS,
        INFER_SHAPES,
        FOLD,
        CONVERT,
        CheckTrt(),
        Validate(),
        Build(),
    )
}


class _StepOptions(Mapping[str, type]):
    """The options dataclass of each step in ``PASSES`` now (a view: a step added later is in it)."""

    def __getitem__(self, name: str) -> type:
        return PASSES[name].options

    def __iter__(self) -> Iterator[str]:
        return iter(PASSES)

    def __len__(self) -> int:
        return len(PASSES)


#: The options dataclass of each step (what ``gskit.pipeline.recipe`` validates a recipe against).
STEP_OPTIONS: Mapping[str, type] = _StepOptions()
