"""The pipeline's passes: one class per recipe step, one contract for all of them.

A :class:`Pass` declares its name, its options dataclass (the recipe schema and the defaults), whether it
changes the graph in place, replaces it, or only reads the model as saved so far (a check), and:

* ``requires``: what must hold before it runs (cheap; raises :class:`StepError`),
* ``call``: the work, returning a :class:`PassResult` (summary, the pass's own report, whether it modified
  the graph, and its verdict),
* ``ensures``: what it promises afterwards, checked cheaply from facts taken before the call (never a
  second run of the pass).

:data:`PASSES` is the one registry; ``STEP_OPTIONS`` (what the recipe validates against) is derived from it.
A failed check raises ``StepError`` naming the pass, and ``gskit prepare`` stops there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, TypeVar

import onnx_graphsurgeon as gs

from gskit import model as gsmodel
from gskit.errors import GskitError
from gskit.feeds import check_seed
from gskit.fold import FoldOptions
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
    """Graph edits: everything ``gskit edit`` does, applied in its order (see ``gskit.edit``).

    ``insert_after`` entries are mappings ``{tensor: NAME, op: OP, attrs: {...}, inputs: [...], domain: D}``
    (``tensor`` and ``op`` required); an ``inputs`` item is a tensor name or a list of numbers (a constant).
    """

    rename: dict[str, str] = field(default_factory=dict)
    input_shapes: dict[str, tuple[int | str | None, ...]] = field(default_factory=dict)
    input_dtypes: dict[str, str] = field(default_factory=dict)
    remove_nodes: tuple[str, ...] = ()
    insert_after: tuple[dict[str, Any], ...] = ()
    set_attrs: dict[str, dict[str, Any]] = field(default_factory=dict)
    remove_attrs: dict[str, tuple[str, ...]] = field(default_factory=dict)
    expose: tuple[str, ...] = ()
    constants_to_initializers: bool = False
    drop_initializer_inputs: bool = False
    #: skip attribute checks against op schemas (insertions and attribute changes)
    force: bool = False

    def __post_init__(self) -> None:
        for entry in self.insert_after:
            _insertion(entry)  # a malformed entry fails when the recipe is read, with its line


_INSERTION_KEYS = frozenset({"tensor", "op", "attrs", "inputs", "domain"})


def _insertion(entry: Any) -> Any:
    """An ``insert_after`` recipe entry as a ``gskit.edit.Insertion``; ValueError names what is wrong."""
    import numpy as np

    from gskit.edit import Insertion

    if not isinstance(entry, dict) or not {"tensor", "op"} <= entry.keys() or entry.keys() - _INSERTION_KEYS:
        raise ValueError(
            f"insert_after entry {entry!r}: expected {{tensor: NAME, op: OP}} with optional "
            "attrs, inputs, domain"
        )
    inputs = []
    for item in entry.get("inputs") or ():
        if isinstance(item, str):
            inputs.append(item)
        elif isinstance(item, (list, tuple)) and item and all(isinstance(v, (int, float)) for v in item):
            whole = all(isinstance(v, int) and not isinstance(v, bool) for v in item)
            inputs.append(np.array(item, dtype=np.int64 if whole else np.float32))
        else:
            raise ValueError(f"insert_after input {item!r}: a tensor name or a list of numbers")
    return Insertion(
        tensor=str(entry["tensor"]),
        op=str(entry["op"]),
        attrs=dict(entry.get("attrs") or {}),
        extra_inputs=inputs,
        domain=str(entry.get("domain") or ""),
    )


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

    def __post_init__(self) -> None:
        from gskit.compare import check_tolerances

        check_tolerances(self.atol, self.rtol)
        check_seed(self.seed)


@dataclass(frozen=True)
class BuildOptions:
    """Build a TensorRT engine (full TensorRT; TensorRT-RTX AOT when a compute capability is given)."""

    compute_capability: str | None = None
    shapes: dict[str, tuple[tuple[int, ...], ...]] = field(default_factory=dict)
    timing_cache: str | None = field(default=None, metadata=FILE_PATH)
    required: bool = False


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
        """The current graph saved as a file, for passes that read files; saved again only after a change."""
        if self._snapshot is None:
            self._snapshots_taken += 1
            target = self.work_dir / f"step{self._snapshots_taken}" / "model.onnx"
            self._snapshot = gsmodel.save(self.graph.copy(), target)
        return self._snapshot

    def graph_changed(self) -> None:
        """Called after every pass that modified the graph: the next check must see the graph as it is now."""
        self._snapshot = None


@dataclass
class PassResult:
    """What one pass did.

    ``modified``: the graph changed (a check never changes it; a transform that found nothing to do says
    so, and the saved snapshot is reused). ``status``: "ok", "skipped" (the pass could not apply here, and
    ``summary`` says why) or "failed" (a check ran and its verdict is negative, e.g. outputs differ).
    """

    summary: str
    report: Any = None
    modified: bool = False
    status: Literal["ok", "skipped", "failed"] = "ok"


@dataclass(frozen=True)
class Before:
    """Cheap facts taken before a pass runs, for its ``ensures``."""

    outputs: tuple[str, ...]
    nodes: int


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
        before = Before(tuple(t.name for t in state.graph.outputs), gsmodel.count_nodes(state.graph))
        result = self.call(state, options)
        if self.effect == "check" and result.modified:
            raise StepError(f"pass '{self.name}' is a check but says it modified the graph (a gskit bug)")
        self.ensures(state, options, result, before)
        return result


def _ensure(condition: bool, step: str, message: str) -> None:
    if not condition:
        raise StepError(f"step '{step}' broke its promise: {message}")


# ------------------------------------------------------------------------------------------------- passes
# Imports are local: a recipe that never folds never imports the folding machinery.


class Sanitize(Pass[SanitizeOptions]):
    name, options, effect = "sanitize", SanitizeOptions, "in_place"

    def call(self, state: RunState, options: SanitizeOptions) -> PassResult:
        from gskit.sanitize import sanitize

        state.graph, report = sanitize(state.graph, skip=options.skip, extra=options.extra)
        changed = ", ".join(f"{step} {n}" for step, n in report.changes.items() if n) or "nothing to tidy"
        return PassResult(
            f"{report.nodes_before} -> {report.nodes_after} nodes ({changed})",
            report,
            modified=any(report.changes.values()) or report.nodes_after != report.nodes_before,
        )


class Edit(Pass[EditOptions]):
    name, options, effect, keeps_outputs = "edit", EditOptions, "in_place", False

    def call(self, state: RunState, options: EditOptions) -> PassResult:
        from gskit import edit

        plan = edit.EditPlan(
            drop_initializer_inputs=options.drop_initializer_inputs,
            constants_to_initializers=options.constants_to_initializers,
            renames=dict(options.rename),
            input_dtypes=dict(options.input_dtypes),
            input_shapes={name: list(dims) for name, dims in options.input_shapes.items()},
            remove_nodes=list(options.remove_nodes),
            insertions=[_insertion(entry) for entry in options.insert_after],
            set_attrs={node: dict(values) for node, values in options.set_attrs.items()},
            remove_attrs={node: list(keys) for node, keys in options.remove_attrs.items()},
            expose=list(options.expose),
            force=options.force,
        )
        changes = edit.apply_plan(state.graph, plan)
        steps = list(dict.fromkeys(c.step for c in changes))
        summary = f"{len(changes)} edit(s): {', '.join(steps)}" if changes else "no edits requested"
        return PassResult(summary, changes, modified=bool(changes))

    def ensures(self, state: RunState, options: EditOptions, result: PassResult, before: Before) -> None:
        outputs = {t.name for t in state.graph.outputs}
        renamed = {options.rename.get(name, name) for name in before.outputs}
        _ensure(
            renamed | set(options.expose) >= outputs, self.name, "an output appeared that no edit asked for"
        )


class Isolate(Pass[IsolateOptions]):
    name, options, effect, keeps_outputs = "isolate", IsolateOptions, "replaces", False

    def requires(self, state: RunState, options: IsolateOptions) -> None:
        if not options.inputs or not options.outputs:
            raise StepError("isolate: the step needs both 'inputs' and 'outputs' tensor names")

    def call(self, state: RunState, options: IsolateOptions) -> PassResult:
        from gskit.isolate import isolate

        state.graph = isolate(state.graph, options.inputs, options.outputs)
        return PassResult(
            f"kept the subgraph {list(options.inputs)} -> {list(options.outputs)}", modified=True
        )

    def ensures(self, state: RunState, options: IsolateOptions, result: PassResult, before: Before) -> None:
        outputs = [t.name for t in state.graph.outputs]
        _ensure(outputs == list(options.outputs), self.name, f"outputs are {outputs}")


class Replace(Pass[ReplaceOptions]):
    name, options, effect = "replace", ReplaceOptions, "in_place"

    def requires(self, state: RunState, options: ReplaceOptions) -> None:
        if not list(state.registry):
            raise StepError("replace: no plugins loaded; pass --plugins DIR or set GSKIT_PLUGINS")

    def call(self, state: RunState, options: ReplaceOptions) -> PassResult:
        from gskit.patterns import replace

        report = replace(
            state.graph, list(state.registry), only=options.only, keep_function=options.keep_function
        )
        state.replaced.extend(report.regions)
        skipped = sum(len(p.skipped) for p in report.plugins)
        per_plugin = ", ".join(f"{p.plugin}: {p.replaced}" for p in report.plugins if p.found)
        left = report.norm_like_left
        missed = (
            f"; {len(left)} norm-like computation(s) left unreplaced (at {', '.join(left[:3])}"
            f"{' ...' if len(left) > 3 else ''}; gskit replace --explain says why)"
            if left
            else ""
        )
        summary = f"{report.replaced} replaced, {skipped} skipped" + (
            f" ({per_plugin})" if per_plugin else ""
        )
        return PassResult(summary + missed, report, modified=report.replaced > 0)

    def ensures(self, state: RunState, options: ReplaceOptions, result: PassResult, before: Before) -> None:
        """Each replaced region is one plugin node now: its own node is there and none of its originals is."""
        super().ensures(state, options, result, before)
        regions = result.report.regions
        if not regions:
            return
        names = {n.name for g in (state.graph, *state.graph.subgraphs(recursive=True)) for n in g.nodes}
        missing = [r.node for r in regions if r.node not in names]
        _ensure(not missing, self.name, f"plugin node(s) {missing[:3]} are not in the graph")
        left = [n for r in regions for n in r.original_nodes if n in names and n != r.node]
        _ensure(not left, self.name, f"replaced node(s) {left[:3]} are still in the graph")


class InferShapes(Pass[InferShapesOptions]):
    name, options, effect = "infer_shapes", InferShapesOptions, "in_place"

    def call(self, state: RunState, options: InferShapesOptions) -> PassResult:
        from gskit.shapes import infer_graph_shapes, unshaped_plugin_outputs

        infer_graph_shapes(state.graph, state.registry, strict=options.strict)
        unshaped = unshaped_plugin_outputs(state.graph, state.registry)
        # Only a plugin rule that gives no rank for inputs with one stops the run: TensorRT asks the plugin
        # for its output shapes. Where an upstream op lost the shape, TensorRT still knows it (the network).
        blocking = [u.describe() for u in unshaped if u.origin is None]
        if options.strict:
            _ensure(not blocking, self.name, "; ".join(blocking[:3]))
        if not unshaped:
            return PassResult("every plugin output has a rank", unshaped, modified=True)
        return PassResult(
            f"{len(unshaped)} plugin output(s) without a rank: {unshaped[0].describe()}",
            unshaped,
            modified=True,
        )


class Fold(Pass[FoldOptions]):
    name, options, effect = "fold", FoldOptions, "in_place"

    def call(self, state: RunState, options: FoldOptions) -> PassResult:
        from gskit.fold import fold

        state.graph, report = fold(
            state.graph,
            max_passes=options.max_passes,
            fold_shapes=options.fold_shapes,
            size_threshold=options.size_threshold,
            allow_partial=options.allow_partial,
            plugins=state.registry,
        )
        return PassResult(
            f"{report.nodes_before} -> {report.nodes_after} nodes in {report.passes} passes",
            report,
            # shapes folded into constants change the graph even when the node count stays
            modified=True,
        )

    def ensures(self, state: RunState, options: FoldOptions, result: PassResult, before: Before) -> None:
        super().ensures(state, options, result, before)
        _ensure(result.report.nodes_after <= result.report.nodes_before, self.name, "folding added nodes")


class Convert(Pass[ConvertOptions]):
    name, options, effect = "convert", ConvertOptions, "replaces"

    def call(self, state: RunState, options: ConvertOptions) -> PassResult:
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
        return PassResult(", ".join(done) or "nothing to convert", modified=bool(done))


class CheckTrt(Pass[CheckTrtOptions]):
    name, options, effect = "check_trt", CheckTrtOptions, "check"

    def call(self, state: RunState, options: CheckTrtOptions) -> PassResult:
        from gskit.backends.trt_check import NEEDS_PLUGIN, PLUGIN_PROBLEM, UNSUPPORTED, check_trt

        report = check_trt(state.snapshot(), plugins=state.plugin_dirs, backend=options.backend)
        state.trt_report = report
        bad = len(report.nodes_with(UNSUPPORTED)) + len(report.nodes_with(PLUGIN_PROBLEM))
        if options.fail_on_unsupported:
            _ensure(report.ok, self.name, f"{bad} node(s) TensorRT will not take (see the report)")
        plugins = len(report.nodes_with(NEEDS_PLUGIN))
        return PassResult(
            f"{report.source}: {bad} node(s) rejected, {plugins} plugin node(s) with known plugins", report
        )


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
        from gskit.compare import ReferenceRunError, compare, describe_feeds, failing_node
        from gskit.feeds import load_feeds, random_feeds

        prepared = state.snapshot()
        common = dict(atol=options.atol, rtol=options.rtol, plugins=state.registry)
        if options.inputs:
            feeds = load_feeds(options.inputs)
            try:
                report = compare(state.original_path, prepared, feeds=feeds, **common)
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


def _validated(state: RunState, report: Any, note: str) -> PassResult:
    state.comparison = report
    worst = max((o.max_abs_err for o in report.outputs), default=0.0)
    verdict = "passed" if report.passed else f"FAILED on {[o.name for o in report.failed]}"
    return PassResult(
        f"{len(report.outputs)} outputs, max abs err {worst:.3g}: {verdict}{note}",
        report,
        status="ok" if report.passed else "failed",
    )


def _shapes_text(shapes: dict[str, tuple[int, ...]]) -> str:
    return ", ".join(f"{name}:{'x'.join(str(d) for d in dims) or 'scalar'}" for name, dims in shapes.items())


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
        elif not full_tensorrt_available() and options.compute_capability is None:
            reason = "TensorRT-RTX only: give build.compute_capability for an AOT build"
        elif not full_tensorrt_available() and has_plugins:
            reason = "TensorRT-RTX has no custom plugins; build with full TensorRT (docker/)"
        if reason:
            if options.required:
                raise StepError(f"build: {reason}")
            return PassResult(reason, status="skipped")
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
        return PassResult(f"built {info.engine.name} in {info.build_seconds:.1f}s", info)


#: Every pass a recipe can name, by name.
PASSES: Mapping[str, Pass] = {
    p.name: p
    for p in (
        Sanitize(),
        Edit(),
        Isolate(),
        Replace(),
        InferShapes(),
        Fold(),
        Convert(),
        CheckTrt(),
        Validate(),
        Build(),
    )
}

#: The options dataclass of each step (what ``gskit.recipe`` validates a recipe against).
STEP_OPTIONS: Mapping[str, type] = {name: p.options for name, p in PASSES.items()}
