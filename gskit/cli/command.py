"""The shape every command shares: its parser's common arguments, and a pass as a command.

``subcommand`` registers a command with its ``MODEL`` argument; ``add_output`` and ``add_json`` add ``-o`` and
``--json`` (``gskit.cli.add_plugins_option`` adds ``--plugins``). A :class:`PassCommand` is one pass as
``gskit NAME MODEL -o OUT [the pass's flags] [--plugins DIR] [--json]``: the flags come from the pass's
options dataclass, and running it is always load -> ``run_pass`` -> save -> print the report (JSON or
tables), so a pass command declares only its texts, how it loads, and how it prints.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gskit.cli import COMMANDS, add_plugins_option
from gskit.cli.options import add_options, options_from_args

if TYPE_CHECKING:  # the helpers load with every command: only a pass command's run loads onnx
    from gskit.passes.transform import GraphPass, PassResult

#: The help of the MODEL argument most commands take.
MODEL_HELP = "the .onnx file"


def subcommand(
    subparsers: argparse._SubParsersAction,
    name: str,
    *,
    help: str | None = None,  # noqa: A002 - argparse's word
    description: str | None = None,
    model: str | None = MODEL_HELP,
) -> argparse.ArgumentParser:
    """Register command ``name`` and its positional ``model`` argument (``model=None``: none); ``help``
    defaults to the command's line in :data:`gskit.cli.COMMANDS` (what ``gskit --help`` lists)."""
    if help is None:
        help = COMMANDS[name.replace("-", "_")]  # noqa: A001
    parser = subparsers.add_parser(name, help=help, description=description)
    if model is not None:
        parser.add_argument("model", help=model)
    return parser


def add_output(
    parser: argparse.ArgumentParser,
    help: str,
    *,
    required: bool = True,
    metavar: str | None = None,  # noqa: A002
) -> None:
    """``-o/--output``: where the command writes."""
    parser.add_argument("-o", "--output", required=required, metavar=metavar, help=help)


def add_json(parser: argparse.ArgumentParser, help: str = "print the report as JSON") -> None:  # noqa: A002
    """``--json``: the result as JSON on stdout instead of tables."""
    parser.add_argument("--json", action="store_true", help=help)


@dataclass(frozen=True)
class Ran:
    """One run of a pass command, for its printers."""

    args: argparse.Namespace
    #: what the pass was given (a ``gs.Graph`` or a ``ModelProto``, as the command loads it)
    model: Any
    result: PassResult
    #: the output as the command line named it
    output: Path
    #: the file written (its absolute path)
    written: Path


def _report(ran: Ran) -> Any:
    return ran.result.report


@dataclass(frozen=True)
class PassCommand:
    """One pass as a command; ``add_parser`` and ``run`` are the subcommand module's functions.

    ``layout`` orders the arguments in the parser (and so in ``--help``): ``model``, ``output``, ``options``
    (the pass's option flags), ``plugins`` (only with a ``plugins`` help) and ``json``.
    """

    name: str
    graph_pass: GraphPass
    description: str
    #: the help of ``-o``
    output: str
    #: prints the result as tables
    show: Callable[[Ran], None]
    #: what ``--json`` prints (default: the pass's report)
    report: Callable[[Ran], Any] = _report
    #: its line in ``gskit --help``; None: the command's line in :data:`gskit.cli.COMMANDS`
    help: str | None = None
    model: str = MODEL_HELP
    json: str = "print the report as JSON"
    #: the help of ``--plugins``; None: the command takes no plugins
    plugins: str | None = None
    #: only the plugin folders given (fold: just the nodes to leave alone), not every plugin gskit finds
    given_plugins_only: bool = False
    layout: tuple[str, ...] = ("model", "output", "options", "plugins", "json")
    epilog: str | None = None
    #: load the weights into memory; False streams them from disk (models over 2 GB)
    weights: bool = True
    #: hand the pass a ``gs.Graph`` rather than the ``ModelProto``
    graph: bool = False
    #: refuses options before any file is read
    check: Callable[[Any], None] | None = None
    #: runs on the graph before and after the pass, with the plugins (replace: shape inference)
    around: Callable[[Any, Any], None] | None = None

    def add_parser(self, subparsers: argparse._SubParsersAction) -> None:
        parser = subcommand(subparsers, self.name, help=self.help, description=self.description, model=None)
        parts: dict[str, Callable[[], None]] = {
            "model": lambda: parser.add_argument("model", help=self.model),
            "output": lambda: add_output(parser, self.output),
            "options": lambda: add_options(parser, self.graph_pass.options),
            "plugins": lambda: add_plugins_option(parser, help=self.plugins),
            "json": lambda: add_json(parser, self.json),
        }
        for part in self.layout:
            if part != "plugins" or self.plugins is not None:
                parts[part]()
        parser.epilog = self.epilog
        parser.set_defaults(func=self.run)

    def run(self, args: argparse.Namespace) -> int:
        from gskit.io.model import load, resolve_output, save, to_graph
        from gskit.io.strict_json import print_json
        from gskit.passes.transform import run_pass

        options = options_from_args(args, self.graph_pass.options)
        if self.check is not None:
            self.check(options)
        out = resolve_output(args.model, args.output, in_place=False)
        context = {} if self.plugins is None else {"plugins": self._plugins(args.plugins)}
        model = load(args.model, load_weights=self.weights)
        if self.graph:
            model = to_graph(model)
        if self.around is not None:
            self.around(model, context.get("plugins"))
        result = run_pass(self.graph_pass, model, options, **context)
        if self.around is not None:
            self.around(result.model, context.get("plugins"))
        ran = Ran(args, model, result, out, save(result.model, out))
        if args.json:
            print_json(self.report(ran))
        else:
            self.show(ran)
        return 0

    def _plugins(self, folders: list[str] | None) -> Any:
        from gskit.plugin.discovery import load_plugins

        if self.given_plugins_only:
            return load_plugins(folders, entry_points=False) if folders else None
        return load_plugins(folders)
