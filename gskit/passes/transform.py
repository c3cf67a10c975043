"""The pass contract every transformation of gskit follows (after onnx_ir's ``PassBase``).

A :class:`GraphPass` declares its ``name``, its ``options`` dataclass (the single source of its defaults: the
library function, the CLI flags and the recipe step all read them from it), its ``effect`` on a ``gs.Graph``
it is given (``in_place``: that graph is changed and returned; ``copying``: a new graph is returned and the
given one is left as it was; a ``ModelProto`` is never changed) and:

* ``requires(model, options)``: cheap preconditions (raises ``GskitError``),
* ``call(model, options, **context) -> PassResult``: the work,
* ``ensures(model, options, result, before)``: cheap postconditions from facts taken before the call,
  never a second run.

:func:`run_pass` is the one way to run a pass outside the pipeline; each library function (``fold``,
``sanitize``, ``to_fp16``, ``isolate``, ``replace``, ``infer_shapes`` ...) is that call with its options.

Options fields carry their CLI spelling and help in field metadata (:func:`option`), so ``gskit.cli`` derives
the flags from the dataclass and no default or help text is written twice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Literal, TypeVar

import onnx
import onnx_graphsurgeon as gs

from gskit.errors import GskitError

OptionsT = TypeVar("OptionsT")


def option(
    default: Any = dataclasses.MISSING,
    *,
    help: str,  # noqa: A002 - argparse's word
    flag: str | None = None,
    metavar: str | None = None,
    parse: Callable[[str], Any] | None = None,
    entry: Callable[[str], Any] | None = None,
    cli: bool = True,
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
    }
    if isinstance(default, (dict, list)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclass
class PassResult:
    """What one pass did.

    Attributes:
        model: the graph or model after the pass (same kind as given; the given graph itself for an
            in-place pass). ``None`` for a pipeline check, which works on the saved model.
        modified: the pass changed something (a pass that found nothing to do says so, and the pipeline
            reuses the model it saved last).
        report: the pass's own report (``FoldReport``, ``ReplaceReport`` ...).
        summary: one line for people (the pipeline's step table).
        status: the pipeline's verdict: "ok", "skipped" (the pass could not apply here; ``summary`` says
            why) or "failed" (a check ran and its verdict is negative, e.g. outputs differ).
    """

    model: Any = None
    modified: bool = False
    report: Any = None
    summary: str = ""
    status: Literal["ok", "skipped", "failed"] = "ok"


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
    #: what happens to a gs.Graph given to the pass: changed in place, or left alone (a new one returned)
    effect: ClassVar[Literal["in_place", "copying"]]
    #: the graph's output names are the same after the pass
    keeps_outputs: ClassVar[bool] = True
    #: ``call`` handles a ModelProto itself; False: :func:`run_pass` gives it a graph made from the model
    takes_model: ClassVar[bool] = True

    def requires(self, model: Any, options: OptionsT) -> None:
        """Raise ``GskitError`` when the pass cannot run on this model (default: no precondition)."""

    def call(self, model: Any, options: OptionsT, **context: Any) -> PassResult:
        raise NotImplementedError

    def ensures(self, model: Any, options: OptionsT, result: PassResult, before: Before) -> None:
        """Raise ``GskitError`` when the pass broke a promise; the default checks the declared ones."""
        if self.keeps_outputs:
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
    graph_pass: GraphPass[OptionsT], model: ModelT, options: OptionsT | None = None, **context: Any
) -> PassResult:
    """Run one pass on a graph or model: ``requires``, ``call``, then ``ensures``.

    Args:
        graph_pass: the pass (e.g. ``gskit.passes.fold.FOLD``).
        model: a gs.Graph (changed in place by an in-place pass) or a ModelProto (never changed).
        options: the pass's options dataclass; None takes every default.
        context: what the pass needs besides its options (``plugins`` ...), see each pass.

    Returns:
        The PassResult: ``model`` the result (same kind as given), ``modified`` and the pass's ``report``.

    Raises:
        GskitError: a precondition failed, the pass failed, or it broke a promise (``PromiseError``).
    """
    options = graph_pass.options() if options is None else options
    if not isinstance(options, graph_pass.options):
        raise TypeError(
            f"pass '{graph_pass.name}' takes {graph_pass.options.__name__}, got {type(options).__name__}"
        )
    if isinstance(model, onnx.ModelProto) and not graph_pass.takes_model:
        # A graph made from the model: the pass changes that one, and the given ModelProto stays as it was.
        from gskit.io.model import to_graph, to_model

        result = run_pass(graph_pass, to_graph(model), options, **context)
        result.model = to_model(result.model)
        return result
    graph_pass.requires(model, options)
    before = Before.of(model)
    result = graph_pass.call(model, options, **context)
    if isinstance(model, gs.Graph):
        same = result.model is model
        want = graph_pass.effect == "in_place"
        ensure(
            same == want,
            graph_pass.name,
            f"declared {graph_pass.effect} but returned {'the given graph' if same else 'a new graph'}",
        )
    graph_pass.ensures(model, options, result, before)
    return result
