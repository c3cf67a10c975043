"""The pass contract every transformation of gskit follows (after onnx_ir's ``PassBase``).

A :class:`GraphPass` declares its ``name``, its ``options`` dataclass (the single source of its defaults: the
library function, the CLI flags and the recipe step all read them from it), its ``effect`` on a ``gs.Graph``
it is given (``in_place``: that graph is changed and returned; ``copying``: a new graph is returned and the
given one is left as it was; ``analysis``: the graph is only read, nothing comes back; a ``ModelProto`` is
never changed) and:

* ``check_input(model, options)``: in ``gskit prepare``, before any step runs, whether the options fit the
  input model (validate's shapes name its inputs),
* ``requires(model, options)``: cheap preconditions (raises ``GskitError``),
* ``call(model, options, context) -> PassResult``: the work; ``context`` is a :class:`PassContext` (the
  plugins, and in a ``gskit prepare`` run the plugin folders, the work folder, the target, the saved model and
  the results of the steps before),
* ``ensures(model, options, result, before)``: cheap postconditions from facts taken before the call,
  never a second run.

:func:`run_pass` is the one way to run a pass, in the pipeline and outside it; each library function
(``fold``, ``sanitize``, ``to_fp16``, ``isolate``, ``replace``, ``infer_shapes`` ...) is that call with its
options. The recipe steps of ``gskit prepare`` are these passes too (``gskit.pipeline.steps.PASSES``), its
checks (``check_trt``, ``validate``, ``build``) ``analysis`` passes.

Options fields carry their CLI spelling and help in field metadata (:func:`option`), so ``gskit.cli`` derives
the flags from the dataclass and no default or help text is written twice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, TypeVar

import onnx
import onnx_graphsurgeon as gs

from gskit.errors import GskitError

if TYPE_CHECKING:
    from gskit.plugin.registry import PluginRegistry
    from gskit.plugin.spec import PluginSpec
    from gskit.plugin.target import TensorRTTarget

OptionsT = TypeVar("OptionsT")

#: What a pass does to a gs.Graph it is given (see the module's docstring).
Effect = Literal["in_place", "copying", "analysis"]


def option(
    default: Any = dataclasses.MISSING,
    *,
    help: str,  # noqa: A002 - argparse's word
    flag: str | None = None,
    metavar: str | None = None,
    parse: Callable[[str], Any] | None = None,
    entry: Callable[[str], Any] | None = None,
    cli: bool = True,
    step_flag: StepFlag | None = None,
    **extra: Any,
) -> Any:
    """A dataclass field of a pass's options, with what the CLI needs to offer it as a flag.

    Args:
        default: the default (a tuple for sequences; a mutable default is copied per instance).
        help: the one help text (the CLI's ``--help``; the recipe documents the same field).
        flag: the CLI flag, e.g. ``"--with"``; default ``--name-with-dashes`` (``--no-name`` for a
            boolean whose default is True).
        metavar: the CLI metavar.
        parse: turns one CLI value into the field's value (default: from the field's type).
        entry: for a repeatable flag, turns one CLI value into one item of a tuple, or into entries of a
            mapping (merged: a later value wins, nested mappings and tuples combine). It runs after
            argparse, so its ``GskitError`` is the command's one error line.
        cli: False for options a recipe can set but the command line does not offer.
        step_flag: ``gskit prepare``'s flag that sets this field in every step of its pass.
        extra: more ``argparse.add_argument`` keywords (``choices``, ``nargs``, ``required``).
    """
    metadata = {
        "help": help,
        "flag": flag,
        "metavar": metavar,
        "parse": parse,
        "entry": entry,
        "cli": cli,
        "extra": extra,
        **prepare_flag(step_flag),
    }
    if isinstance(default, (dict, list)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True)
class StepFlag:
    """A ``gskit prepare`` flag that sets an option of every step of one pass in a recipe, or adds the step.

    A flag is declared on the options field it sets (``option(step_flag=...)``, or ``prepare_flag`` in a
    plain field's metadata): the field gives its ``name`` and ``option``. A flag that sets no field, only adds
    its step with the defaults (``--nms``), is listed in the options class attribute ``step_flags``.
    ``gskit prepare``'s parser and ``gskit.pipeline.prepare.recipe_with_overrides`` are derived from them, so
    neither names a step.

    Attributes:
        flag: the flag, e.g. ``"--atol"``.
        help: its help text (say which recipe option it sets).
        name: the keyword of ``recipe_with_overrides`` (and the argparse dest): the field's name; for a flag
            that sets no field, the flag's words joined by ``_``.
        option: the options field it sets (filled in from the field); None: the flag only adds the step.
        kind: "value" (one value), "append" (repeatable: a list) or "switch" (no value; sets ``value``).
        metavar: the metavar of a value.
        type: argparse's ``type`` for one value (``float``, ``int``); None keeps the text.
        parse: turns one given text into a value where a bad one is a ``GskitError`` (``--shape``).
        to_option: the given value (a list for "append") into the field's value; None keeps it (a tuple
            for "append").
        value: what a switch sets.
        adds_step: where the flag adds its pass's step when the recipe has none: ``("after", names)``
            after the first step of one of ``names`` (first when none), ``("before", names)`` before the
            first of them (last when none); None: the recipe must have the step.
    """

    flag: str
    help: str
    name: str = ""
    option: str | None = None
    kind: Literal["value", "append", "switch"] = "value"
    metavar: str | None = None
    type: Callable[[str], Any] | None = None
    parse: Callable[[str], Any] | None = None
    to_option: Callable[[Any], Any] | None = None
    value: Any = True
    adds_step: tuple[Literal["after", "before"], tuple[str, ...]] | None = None

    def option_value(self, given: Any) -> Any:
        """The field's value for what was given (a list for "append", the value for a switch)."""
        if self.kind == "switch":
            return self.value
        if self.to_option is not None:
            return self.to_option(given)
        return tuple(given) if self.kind == "append" else given


def prepare_flag(flag: StepFlag | None) -> dict[str, Any]:
    """Field metadata that declares ``flag`` as the ``gskit prepare`` flag of a plain dataclass field."""
    return {} if flag is None else {"step_flag": flag}


def step_flags(options: type) -> tuple[StepFlag, ...]:
    """The ``gskit prepare`` flags an options dataclass declares: those of its fields, in field order, then
    the class's ``step_flags`` (flags that only add the step)."""
    found = [
        dataclasses.replace(declared, name=declared.name or each.name, option=each.name)
        for each in dataclasses.fields(options)
        if (declared := each.metadata.get("step_flag")) is not None
    ]
    for declared in getattr(options, "step_flags", ()):
        if declared.option is not None:
            raise TypeError(
                f"{options.__name__}.step_flags: declare {declared.flag} on its field {declared.option}"
            )
        found.append(
            declared if declared.name else dataclasses.replace(declared, name=_flag_name(declared.flag))
        )
    return tuple(found)


def _flag_name(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


@dataclass
class PassResult:
    """What one pass did.

    Attributes:
        model: the graph or model after the pass (same kind as given; the given graph itself for an
            in-place pass). ``None`` for an analysis pass, which changes nothing.
        modified: the pass changed something (a pass that found nothing to do says so, and the pipeline
            reuses the model it saved last).
        report: the pass's own report (``FoldReport``, ``ReplaceReport``, a comparison ...).
        summary: one line for people (the pipeline's step table).
    """

    model: Any = None
    modified: bool = False
    report: Any = None
    summary: str = ""


@dataclass
class PassContext:
    """What a pass may use besides its model and options; a library call gives ``plugins`` at most.

    Attributes:
        plugins: the loaded plugins (a registry, or the specs to use).
        spill_dir: where fold may write large folded values (None: a temporary folder).
        plugin_dirs: the plugin folders given (None: the default ones); a TensorRT check or build loads
            their implementations.
        work_dir: a folder the pass may write into (a ``gskit prepare`` run's work folder).
        target: the TensorRT version the run prepares for (None: each pass's own option, else the default).
        original: the model file the run started from (validation compares with it).
        snapshot: saves a graph as a model file and gives its path (passes that read files); the pipeline
            saves again only after a step changed the graph.
        results: the results of the steps run so far, by step name, in order.
    """

    plugins: PluginRegistry | Sequence[PluginSpec] | None = None
    spill_dir: Path | None = None
    plugin_dirs: tuple[Path, ...] | None = None
    work_dir: Path | None = None
    target: TensorRTTarget | None = None
    original: Path | None = None
    snapshot: Callable[[gs.Graph], Path] | None = None
    results: dict[str, list[PassResult]] = field(default_factory=dict)

    def reports(self, step: str) -> list[Any]:
        """The reports of the steps of this name that ran so far, in order."""
        return [result.report for result in self.results.get(step, ())]

    def saved(self, graph: gs.Graph) -> Path:
        """``graph`` as a model file (the run's snapshot)."""
        if self.snapshot is None:
            raise GskitError("this pass reads the model from a file; run it in gskit prepare")
        return self.snapshot(graph)


@dataclass(frozen=True)
class Before:
    """Cheap facts taken before a pass runs, for its ``ensures``."""

    outputs: tuple[str, ...]

    @classmethod
    def of(cls, model: gs.Graph | onnx.ModelProto) -> Before:
        if isinstance(model, onnx.ModelProto):
            return cls(tuple(t.name for t in model.graph.output))
        return cls(tuple(t.name for t in model.outputs))


ModelT = TypeVar("ModelT", gs.Graph, onnx.ModelProto)


class GraphPass(Generic[OptionsT]):
    """One transformation. Subclasses set the class attributes and implement :meth:`call`."""

    #: the pass's name (the recipe step's name)
    name: ClassVar[str]
    #: the options dataclass: the single source of the defaults
    options: ClassVar[type]
    #: what happens to a gs.Graph given to the pass: changed in place, left alone (a new one returned), or
    #: only read (an analysis: nothing comes back)
    effect: ClassVar[Effect]
    #: the graph's output names are the same after the pass
    keeps_outputs: ClassVar[bool] = True
    #: ``call`` handles a ModelProto itself; False: :func:`run_pass` gives it a graph made from the model
    takes_model: ClassVar[bool] = True

    def requires(self, model: Any, options: OptionsT) -> None:
        """Raise ``GskitError`` when the pass cannot run on this model (default: no precondition)."""

    def check_input(self, model: onnx.ModelProto, options: OptionsT) -> None:
        """Raise ``GskitError`` when the options cannot fit the input model (``gskit prepare`` asks every
        step before the first runs; cheap: the model's weights are not loaded). Default: they fit."""

    def call(self, model: Any, options: OptionsT, context: PassContext) -> PassResult:
        raise NotImplementedError

    def ensures(self, model: Any, options: OptionsT, result: PassResult, before: Before) -> None:
        """Raise ``GskitError`` when the pass broke a promise; the default checks the declared ones."""
        if self.keeps_outputs and self.effect != "analysis":
            after = Before.of(result.model).outputs
            ensure(
                after == before.outputs,
                self.name,
                f"outputs changed: {list(before.outputs)} -> {list(after)}",
            )


def ensure(condition: bool, name: str, message: str) -> None:
    """Raise the error a broken promise of pass ``name`` raises."""
    if not condition:
        raise PromiseError(f"pass '{name}' broke its promise: {message}")


class PromiseError(GskitError):
    """A pass's postcondition failed (a gskit bug, or a plugin that lies about what it did)."""


def run_pass(
    graph_pass: GraphPass[OptionsT],
    model: ModelT,
    options: OptionsT | None = None,
    context: PassContext | None = None,
    **fields: Any,
) -> PassResult:
    """Run one pass on a graph or model: ``requires``, ``call``, then ``ensures``.

    Args:
        graph_pass: the pass (e.g. ``gskit.passes.fold.FOLD``).
        model: a gs.Graph (changed in place by an in-place pass) or a ModelProto (never changed).
        options: the pass's options dataclass; None takes every default.
        context: what the pass needs besides its options; None: one made of ``fields``.
        fields: :class:`PassContext` fields (``plugins=...``, ``spill_dir=...``), when ``context`` is None.

    Returns:
        The PassResult: ``model`` the result (same kind as given), ``modified`` and the pass's ``report``.

    Raises:
        GskitError: a precondition failed, the pass failed, or it broke a promise (``PromiseError``).
    """
    options = graph_pass.options() if options is None else options
    if context is None:
        context = PassContext(**fields)
    elif fields:
        raise TypeError(f"run_pass: give a PassContext or its fields ({sorted(fields)}), not both")
    if not isinstance(options, graph_pass.options):
        raise TypeError(
            f"pass '{graph_pass.name}' takes {graph_pass.options.__name__}, got {type(options).__name__}"
        )
    if isinstance(model, onnx.ModelProto) and not graph_pass.takes_model:
        # A graph made from the model: the pass changes that one, and the given ModelProto stays as it was.
        from gskit.io.model import to_graph, to_model

        result = run_pass(graph_pass, to_graph(model), options, context)
        result.model = to_model(result.model)
        return result
    graph_pass.requires(model, options)
    before = Before.of(model)
    result = graph_pass.call(model, options, context)
    if graph_pass.effect == "analysis":
        ensure(
            not result.modified and result.model in (None, model),
            graph_pass.name,
            "declared analysis but says it modified the graph (a gskit bug)",
        )
    elif isinstance(model, gs.Graph):
        same = result.model is model
        want = graph_pass.effect == "in_place"
        ensure(
            same == want,
            graph_pass.name,
            f"declared {graph_pass.effect} but returned {'the given graph' if same else 'a new graph'}",
        )
    graph_pass.ensures(model, options, result, before)
    return result
