"""``gskit prepare``: run a recipe on a model and write the prepared model with its reports.

OUTDIR receives ``model.onnx`` (+ ``model.onnx.data`` when large), ``report.json``, ``report.html`` and, when
an engine is built, ``model.engine`` with its sidecar: one run's set of files. The run writes them into its
work folder inside OUTDIR and then puts them in place of the earlier run's set together
(``gskit.io.outputs.replace_set``): what OUTDIR shows at any moment belongs to one run, and ``report.json``
is there only beside the rest of its run's files (it is removed first and placed last). A failed run's set is
its reports alone, saying why; when even they cannot be written (a full disk) OUTDIR is left without a run.
The input model is only read. One run at a time writes to an OUTDIR (it holds ``OUTDIR/.gskit.lock`` while it
runs); a run clears the work folders that killed runs left.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import onnx
import onnx_graphsurgeon as gs

from gskit.errors import GskitError, WriteError, write_error
from gskit.io import model as gsmodel
from gskit.io.outputs import (
    blaming,
    check_output,
    guarding_inputs,
    output_entry,
    replace_set,
)
from gskit.io.strict_json import dumps
from gskit.passes.nms import PLUGIN_KEY
from gskit.passes.transform import PassContext, PassResult, StepFlag, run_pass, step_flags
from gskit.pipeline.outdir import claim_outdir
from gskit.pipeline.recipe import Recipe, RecipeStep, check_validation_order, make_recipe
from gskit.pipeline.steps import DEFAULT_STEPS, PASSES, Build, CheckTrt, NotRun, Snapshots, step_status
from gskit.plugin.discovery import load_plugins
from gskit.plugin.registry import PluginRegistry
from gskit.plugin.target import TensorRTTarget, resolve_target

if TYPE_CHECKING:  # the page's modules load when the pictures start or the page is written
    from gskit.pipeline.report_page import RegionDrawings

log = logging.getLogger(__name__)

MODEL_NAME = "model.onnx"
ENGINE_NAME = Build.ENGINE_NAME
REPORT_NAMES = ("report.json", "report.html")


@dataclass
class StepResult:
    """One step as run: where it was written, how long it took, what it did to the graph."""

    name: str
    line: int | None
    seconds: float
    nodes_before: int
    nodes_after: int
    status: str  # "ok", "skipped", "failed"
    summary: str
    #: the step's options as run (the recipe's values with the command's flags applied)
    options: Any = None


@dataclass
class PrepareReport:
    """Everything ``report.json`` holds."""

    model: str
    output_dir: str
    recipe: str
    #: the TensorRT version prepared for: ``{"tensorrt": "10.3", "source": "--tensorrt 10.3"}``
    target: dict[str, str] = field(default_factory=dict)
    steps: list[StepResult] = field(default_factory=list)
    prepared_model: str | None = None
    plugins_inserted: dict[str, int] = field(default_factory=dict)
    #: ops rewritten by lower steps into ops TensorRT takes, ``{"Col2Im -> reshape": 3}``
    lowered: dict[str, int] = field(default_factory=dict)
    #: native ops written in place of matched regions (op -> count; regions already native not counted)
    native_inserted: dict[str, int] = field(default_factory=dict)
    regions: list[Any] = field(default_factory=list)
    comparison: Any = None
    tensorrt: Any = None
    engine: Any = None
    #: True when a validate step compared the written model with the original (the recipe puts it after
    #: every step that changes the model); False: the run says "not validated"
    validated: bool = False
    #: True only when validated and every output within tolerance; False when validation or a step failed;
    #: None when nothing was validated and nothing failed
    passed: bool | None = False
    error: str | None = None


@dataclass
class _Run:
    """One run's graph and context; what the steps found is read from their results, by step name."""

    graph: gs.Graph
    context: PassContext
    snapshots: Snapshots
    #: False once a failed run dropped its engine (a failed run's set is its reports alone)
    keep_engine: bool = True
    #: report.html's pictures, started once no step left changes the graph
    drawings: RegionDrawings | None = None

    def reports(self, step: str) -> list[Any]:
        return self.context.reports(step)

    def last(self, step: str) -> Any:
        """The report of the last step of this name that ran, or None."""
        reports = self.reports(step)
        return reports[-1] if reports else None

    @property
    def regions(self) -> list[Any]:
        return [region for report in self.reports("replace") for region in report.regions]

    @property
    def skipped(self) -> list[tuple[str, Any]]:
        """(plugin, Skip) for each match replace found and did not replace, with the reason (report.html)."""
        return [(p.plugin, skip) for r in self.reports("replace") for p in r.plugins for skip in p.skipped]

    @property
    def engine(self) -> Any:
        """The built engine's ``BuildInfo``, or None."""
        info = self.last(Build.name)
        return info if self.keep_engine and info is not None and not isinstance(info, NotRun) else None

    @property
    def registry(self) -> PluginRegistry:
        """The loaded plugins (``prepare`` gives the context a registry)."""
        plugins = self.context.plugins
        return plugins if isinstance(plugins, PluginRegistry) else PluginRegistry()


class StepListener(Protocol):
    """Receives progress: the CLI shows a spinner per step and a line when it ends."""

    def started(self, name: str, index: int, total: int) -> None: ...

    def finished(self, result: StepResult) -> None: ...


def default_recipe() -> Recipe:
    """The recipe ``gskit prepare`` runs without ``--recipe``."""
    return dataclasses.replace(make_recipe([(name, {}) for name in DEFAULT_STEPS]), source="default")


def prepare_flags() -> list[tuple[str, StepFlag]]:
    """``(step, flag)`` for every ``gskit prepare`` flag the passes' options declare, in registry order.

    Raises:
        TypeError: two flags have one keyword (two passes' fields of one name: give ``StepFlag(name=...)``).
    """
    found = [(name, flag) for name, graph_pass in PASSES.items() for flag in step_flags(graph_pass.options)]
    seen: dict[str, str] = {}
    for step, flag in found:
        if seen.setdefault(flag.name, step) != step:
            raise TypeError(f"{flag.flag}: keyword {flag.name!r} is taken by a flag of {seen[flag.name]}")
    return found


def recipe_with_overrides(
    recipe: Recipe,
    *,
    skip: Sequence[str] = (),
    tensorrt: str | None = None,
    **given: Any,
) -> Recipe:
    """``recipe`` with the options of ``gskit prepare``'s flags set; None or empty leaves an option as is.

    ``tensorrt`` sets the recipe's target (``target: {tensorrt: ...}``), checked here. ``skip`` drops every
    step of each name, first. Every other keyword is a flag the steps' options declare
    (``gskit.passes.transform.StepFlag``, see ``prepare_flags()``: ``shapes``, ``inputs``, ``atol``, ``rtol``,
    ``seed``, ``only``, ``compute_capability``, ``fp16``, ``nms``): it sets its option in every step of its
    pass, adding the step where the flag says so (``fp16``: a convert step before the checks; ``nms``: an
    nms step after sanitize) when the recipe has none. ``inputs`` is relative to the working directory and
    kept absolute. The recipe's source lists the flags in the order given.

    Raises:
        GskitError: ``skip`` names a step the recipe does not have, every step is skipped, an option is
            given for a step the recipe does not have, or a value is invalid (e.g. a dim below 1).
        TypeError: a keyword that is no flag.
    """
    declared = {flag.name: (step, flag) for step, flag in prepare_flags()}
    unknown = sorted(set(given) - set(declared))
    if unknown:
        raise TypeError(f"recipe_with_overrides: no flag {unknown}; flags: {', '.join(declared)}")
    chosen = [declared[name] for name, value in given.items() if _is_given(declared[name][1], value)]
    for step_name, flag in chosen:
        if flag.adds_step and step_name in skip:
            raise GskitError(
                f"{flag.flag} needs the {step_name} step, which --skip {step_name} drops; give one of them"
            )
    steps = _without(recipe, skip)
    flags: list[str] = list(dict.fromkeys(f"--skip {name}" for name in skip))
    if tensorrt is not None:
        TensorRTTarget.parse(tensorrt)
        flags.append("--tensorrt")
        # a replace step's own target follows the flag, as the recipe's does
        steps = [
            _with_options(step, {"tensorrt": tensorrt}) if getattr(step.options, "tensorrt", None) else step
            for step in steps
        ]
    for step_name, flag in chosen:
        if flag.adds_step is None or any(step.name == step_name for step in steps):
            continue
        steps.insert(_position(steps, flag.adds_step), RecipeStep(step_name, PASSES[step_name].options()))
        if flag.option is None:  # a flag that only adds its step is named when it did
            flags.append(flag.flag)
    setting: dict[str, dict[str, Any]] = {}
    for step_name, flag in chosen:
        if flag.option is not None:
            setting.setdefault(step_name, {})[flag.flag] = (flag.option, flag.option_value(given[flag.name]))
    for step_name, values in setting.items():
        named = list(values)
        flags += named
        if not any(step.name == step_name for step in steps):
            raise GskitError(
                f"{', '.join(named)}: the recipe has no {step_name} step to apply it to; its steps: "
                f"{', '.join(step.name for step in steps)}"
            )
        options = dict(values.values())
        steps = [_with_options(step, options) if step.name == step_name else step for step in steps]
    if not flags:
        return recipe
    return Recipe(
        steps=tuple(steps),
        source=f"{recipe.source} with {' '.join(flags)}",
        tensorrt=tensorrt if tensorrt is not None else recipe.tensorrt,
    )


def _is_given(flag: StepFlag, value: Any) -> bool:
    """A switch is given when true, a repeatable flag when not empty, a value when not None."""
    if flag.kind == "value":
        return value is not None
    return bool(value)


def _position(steps: list[RecipeStep], where: tuple[str, tuple[str, ...]]) -> int:
    """Where a flag adds its step: after the first step named in ``where`` (first when none), or before
    it (last when none)."""
    side, names = where
    found = next((i for i, step in enumerate(steps) if step.name in names), None)
    if side == "after":
        return 0 if found is None else found + 1
    return len(steps) if found is None else found


def _without(recipe: Recipe, skip: Sequence[str]) -> list[RecipeStep]:
    """The recipe's steps but those named in ``skip``; a name it lacks, or skipping all, is an error."""
    names = [step.name for step in recipe.steps]
    for name in skip:
        if name not in names:
            raise GskitError(f"--skip {name}: the recipe has no step '{name}'; its steps: {', '.join(names)}")
    steps = [step for step in recipe.steps if step.name not in skip]
    if not steps:
        raise GskitError(f"--skip {' '.join(skip)}: that leaves no step to run")
    return steps


def _with_options(step: RecipeStep, values: dict[str, Any]) -> RecipeStep:
    try:
        return dataclasses.replace(step, options=dataclasses.replace(step.options, **values))
    except (TypeError, ValueError) as err:
        raise GskitError(f"step '{step.name}': {err}") from err


def prepare(
    model_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    recipe: Recipe | None = None,
    plugin_dirs: Sequence[str | os.PathLike] | None = None,
    listener: StepListener | None = None,
) -> PrepareReport:
    """Run ``recipe`` (default: ``default_recipe()``) on a model and write the results to ``out_dir``.

    Returns:
        The report (also written as report.json and report.html). ``passed`` is True when every step
        succeeded and the written model matched the original within the validation tolerances; None when
        the recipe has no validate step (``validated`` is False then).

    Raises:
        GskitError: the model cannot be read or has no outputs, OUTDIR would overwrite the input or is not
            a folder, or a step or the final save failed (the message names the step; the reports are
            written before raising, the model is not).
    """
    model_path, out_dir = Path(model_path), Path(out_dir)
    recipe = recipe or default_recipe()
    check_validation_order(recipe)
    target = _target(recipe)
    final_model = out_dir / MODEL_NAME
    if final_model.resolve() == model_path.resolve():
        raise GskitError(f"{out_dir}: {MODEL_NAME} there is the input model; choose another OUTDIR")
    with guarding_inputs(), _parser_started(recipe, target):
        original = gsmodel.load(model_path, load_weights=False)
        if not original.graph.output:
            raise GskitError(f"{model_path}: the model has no graph outputs; there is nothing to prepare")
        _check_input(recipe, original)
        registry = load_plugins(plugin_dirs)
        if any(step.name == "replace" for step in recipe.steps):
            registry.import_patterns()  # a bad rule fails here, before any step runs, not in the middle
        for name in _set_names(recipe):  # before the work: a name that cannot be written fails now
            check_output(out_dir / name)
        with claim_outdir(out_dir) as work:
            report = PrepareReport(
                model=str(model_path),
                output_dir=str(out_dir),
                recipe=recipe.source,
                target={"tensorrt": str(target), "source": target.source},
            )
            snapshots = Snapshots(work)
            context = PassContext(
                plugins=registry,
                plugin_dirs=tuple(Path(p) for p in plugin_dirs) if plugin_dirs is not None else None,
                work_dir=work,
                target=target,
                original=model_path,
                snapshot=snapshots,
            )
            state = _Run(gsmodel.to_graph(original), context, snapshots)
            staged = work / "outputs"  # this run's files, until they take their names in OUTDIR together
            staged.mkdir()
            failure: GskitError | None = None
            try:
                _run_steps(recipe, state, report, listener, original)
                _stage(report, original, state, recipe, staged)
            except GskitError as err:
                failure = _named_in(out_dir, staged, err)
                _stage_failure(failure, report, original, state, recipe, staged)
            replace_set(_staged_files(staged, out_dir, state), [out_dir / name for name in set_names()])
            if failure is not None:
                raise failure
    return report


def _parser_started(recipe: Recipe, target: TensorRTTarget) -> AbstractContextManager:
    """The TensorRT parser's worker of the first check_trt step, started now: its interpreter and TensorRT
    load (0.1-0.4 s) while the steps before it run, on the other core (``gskit.backends.trt.started_worker``).
    """
    step = next((s for s in recipe.steps if s.name == CheckTrt.name), None)
    if step is None:
        return nullcontext()
    from gskit.backends.trt import started_worker
    from gskit.backends.trt_check import answering_flavour

    try:
        flavour = answering_flavour(step.options.backend, target)
    except GskitError:  # the step says so when it runs
        return nullcontext()
    return started_worker(flavour)


def _target(recipe: Recipe) -> TensorRTTarget:
    """The run's target: the recipe's (``--tensorrt`` sets it) or the default, saying where it came from."""
    version = recipe.target
    if version is None:
        return resolve_target(None)
    by_flag = "--tensorrt" in recipe.source.partition(" with ")[2].split()
    where = "--tensorrt" if by_flag else f"target of {recipe.source}"
    return TensorRTTarget.parse(version, f"{where} {version}")


def set_names() -> tuple[str, ...]:
    """Every file a run may put in OUTDIR, in the order they take their names: the model's data before the
    model, the engine's sidecar before the engine, report.json last (it seals the set, ``replace_set``)."""
    from gskit.backends.trt_build import sidecar_path  # the sidecar's name is the builder's to say

    return (
        MODEL_NAME + ".data",
        MODEL_NAME,
        sidecar_path(ENGINE_NAME).name,
        ENGINE_NAME,
        *REPORT_NAMES[::-1],
    )


def _set_names(recipe: Recipe) -> list[str]:
    """The names this recipe's run may write (the engine's only with a build step): none may be a folder,
    a device or a FIFO, or a file the input reads."""
    builds = any(step.name == Build.name for step in recipe.steps)
    return [name for name in set_names() if builds or not name.startswith(ENGINE_NAME)]


def _stage(
    report: PrepareReport, original: onnx.ModelProto, state: _Run, recipe: Recipe, staged: Path
) -> None:
    """Write the prepared model and the reports of a run whose steps all ran into ``staged``."""
    _save_model(state, staged / MODEL_NAME)
    out_dir = Path(report.output_dir)
    report.prepared_model = str(output_entry(out_dir / MODEL_NAME))
    if state.engine is not None:
        report.engine = {
            "engine": str(out_dir / ENGINE_NAME),
            "sidecar": str(out_dir / state.engine.sidecar.name),
            "tensorrt": state.engine.tensorrt,
        }
    report.validated, report.passed = _verdict(report, state)
    _write_reports(report, original, state, staged, recipe)


def _save_model(state: _Run, target: Path) -> None:
    """Save the run's graph as ``target``; a snapshot of it that is one file (no data file, no linked
    weights) is that file already, written by the same ``gsmodel.save``: it takes a second name instead of
    the graph being serialized and checked again."""
    snapshot = state.snapshots.current()
    if snapshot is not None and [p.name for p in snapshot.parent.iterdir()] == [snapshot.name]:
        try:
            os.link(snapshot, target)
            return
        except OSError:  # no hard links on this file system: saved as usual
            pass
    gsmodel.save(state.graph, target)


def _stage_failure(
    err: GskitError,
    report: PrepareReport,
    original: onnx.ModelProto,
    state: _Run,
    recipe: Recipe,
    staged: Path,
) -> None:
    """Make ``staged`` the set of a failed run: its reports only (no model, no engine), saying why.

    When even they cannot be written (a full disk), ``staged`` is left empty: OUTDIR then holds no run.
    """
    report.error = str(err)
    report.passed = False
    report.prepared_model, report.engine, state.keep_engine = None, None, False
    shutil.rmtree(staged, ignore_errors=True)  # a half-written model frees its space for the reports
    staged.mkdir()
    try:
        _write_reports(report, original, state, staged, recipe)
    except (GskitError, OSError) as also:
        log.warning("the reports of the failed run could not be written either: %s", also)
        shutil.rmtree(staged, ignore_errors=True)
        staged.mkdir()


def _named_in(out_dir: Path, staged: Path, err: GskitError) -> GskitError:
    """A file of the run that could not be written is named as the user will look for it: in OUTDIR."""
    if isinstance(err, WriteError) and Path(str(err.path)).parent == staged:
        renamed = write_error(out_dir / Path(str(err.path)).name, err.error)
        renamed.__cause__ = err
        return renamed
    return err


def _staged_files(staged: Path, out_dir: Path, state: _Run) -> list[tuple[Path, Path]]:
    """``(staged file, final name)`` of the run's files, in ``set_names()`` order (report.json last)."""
    found = {path.name: path for path in staged.iterdir() if path.is_file()}
    if state.engine is not None:
        found[ENGINE_NAME] = state.engine.engine
        found[state.engine.sidecar.name] = state.engine.sidecar
    return [(found[name], out_dir / name) for name in set_names() if name in found]


def _verdict(report: PrepareReport, state: _Run) -> tuple[bool, bool | None]:
    """``(validated, passed)`` of a run that wrote its model.

    The recipe puts every validate step after the steps that change the model (``check_validation_order``),
    so a comparison describes the written model. Without one nothing was judged: ``passed`` is None, never
    True, unless a step failed.
    """
    failed = any(s.status == "failed" for s in report.steps)
    comparison = state.last("validate")
    if comparison is None:
        return False, False if failed else None
    return True, not failed and comparison.passed


def _check_input(recipe: Recipe, original: onnx.ModelProto) -> None:
    """Each step's options against the input model, before any step runs (a shape for an input the model
    lacks fails now, not after every step)."""
    for step in recipe.steps:
        try:
            PASSES[step.name].check_input(original, step.options)
        except GskitError as err:
            raise GskitError(f"step '{step.name}' (recipe line {step.line}): {err}") from err


def _run_steps(
    recipe: Recipe,
    state: _Run,
    report: PrepareReport,
    listener: StepListener | None,
    original: onnx.ModelProto,
) -> None:
    total = len(recipe.steps)
    analyses = [PASSES[step.name].effect == "analysis" for step in recipe.steps]
    try:
        for index, step in enumerate(recipe.steps):
            if all(analyses[index:]) and state.drawings is None:  # no step left changes the graph
                state.drawings = _draw_regions(state.regions, original, state.graph)
            if listener:
                listener.started(step.name, index, total)
            result, error = _timed_step(step, state)
            report.steps.append(result)
            if listener:
                listener.finished(result)
            if error is not None:
                where = f" (recipe line {step.line})" if step.line else ""
                raise GskitError(f"step '{step.name}'{where} failed: {error}") from error
    finally:  # a failed run's report keeps what the steps before the failure did
        regions = state.regions
        report.regions = regions
        report.comparison = state.last("validate")
        report.tensorrt = state.last("check_trt")
        report.plugins_inserted = dict(Counter(r.plugin for r in regions if r.form == "plugin"))
        report.native_inserted = dict(Counter(r.op for r in regions if r.form == "native" and not r.kept))
        lowered = [item for r in state.reports("lower") for item in r.lowered]
        report.lowered = dict(Counter(f"{item.op} -> {item.form}" for item in lowered))
        if state.reports("nms"):  # the nms step's node is a plugin node too
            label = (
                state.registry.get(*PLUGIN_KEY).qualified_name if state.registry.get(*PLUGIN_KEY) else "nms"
            )
            report.plugins_inserted[label] = report.plugins_inserted.get(label, 0) + 1


def _draw_regions(regions: list[Any], original: onnx.ModelProto, graph: gs.Graph) -> RegionDrawings:
    """report.html's pictures, started now (:func:`gskit.pipeline.report_page.draw_regions`): the page's
    modules load here, not when the command starts."""
    from gskit.pipeline.report_page import draw_regions

    return draw_regions(regions, original, graph)


def _timed_step(step: RecipeStep, state: _Run) -> tuple[StepResult, GskitError | None]:
    """Run one step and describe it; a step's GskitError comes back beside its failed result."""
    before = gsmodel.count_nodes(state.graph)
    start = time.perf_counter()
    try:
        outcome = _run_step(step.name, state, step.options)
    except GskitError as err:
        seconds, summary = time.perf_counter() - start, str(err)
        return StepResult(step.name, step.line, seconds, before, before, "failed", summary, step.options), err
    if outcome.modified:
        state.snapshots.graph_changed()
    seconds = time.perf_counter() - start
    after = gsmodel.count_nodes(state.graph)
    status, summary = step_status(outcome), outcome.summary
    return StepResult(step.name, step.line, seconds, before, after, status, summary, step.options), None


def _run_step(name: str, state: _Run, options: Any) -> PassResult:
    """One pass on the run's graph, its result kept under the step's name; an exception that is not a
    GskitError is a gskit bug, still reported as one line."""
    graph_pass = PASSES[name]
    try:
        result = run_pass(graph_pass, state.graph, options, state.context)
    except GskitError:
        raise
    except Exception as err:  # a library deep inside a step (onnx, graphsurgeon, onnxruntime) failing
        text = str(err).strip().splitlines()
        raise GskitError(
            f"unexpected {type(err).__name__}: {text[0] if text else ''} (a gskit bug: rerun with "
            f"`gskit --debug prepare ...` for the traceback and report it, or skip the step with --recipe)"
        ) from err
    if graph_pass.effect != "analysis":
        state.graph = result.model
    state.context.results.setdefault(name, []).append(result)
    return result


def _write_reports(
    report: PrepareReport, original: onnx.ModelProto, state: _Run, staged: Path, recipe: Recipe
) -> None:
    """Write report.json and report.html into ``staged`` (a full disk names the file as OUTDIR's)."""
    from gskit.pipeline.report_page import render_report  # the page's modules load when it is written

    json_name, html_name = REPORT_NAMES
    out_dir = Path(report.output_dir)
    with blaming(out_dir / json_name):
        (staged / json_name).write_text(dumps(report))
    page = render_report(
        report,
        original,
        graph=state.graph,
        registry=state.registry,
        skipped=state.skipped,
        recipe=recipe,
        written=staged / MODEL_NAME,
        drawings=state.drawings,
    )
    with blaming(out_dir / html_name):
        (staged / html_name).write_text(page)
