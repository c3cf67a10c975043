"""The ``gskit`` command: one subcommand per module in this package, each calling one library function."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import difflib
import gc
import importlib
import logging
import os
import re
import signal
import sys
import traceback
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

from gskit.errors import GskitError, describe_os_error
from gskit.io import interrupt
from gskit.io.interrupt import Terminated
from gskit.io.text import is_terminal, is_utf8, visible

#: Every command: its module in this package and its line in ``gskit --help``, in the order listed there. Each
#: module defines ``add_parser(subparsers)``, which registers its parser (with that line as its help) and
#: sets ``func`` to a callable taking the parsed args and returning an exit code. The lines are kept here
#: too, so that ``gskit --help`` and a mistyped command import no command module (each imports what its
#: command runs: onnx, numpy, Polygraphy ...); tests/test_imports.py checks them against the parsers.
COMMANDS: dict[str, str] = {
    "prepare": "replace plugin patterns, infer shapes, fold, check with TensorRT, validate, build",
    "inspect": "summarize a model: opsets, ops, inputs/outputs, custom nodes, functions, missing shapes",
    "edit": "edit a model: rename, input shape/dtype, insert/remove nodes, attributes, expose",
    "isolate": "extract the subgraph between named tensors into a new model",
    "infer_shapes": "infer dtypes and shapes (plugin nodes use their specs' rules)",
    "compare": "compare two models' outputs on the same inputs (onnxruntime or TensorRT)",
    "plugin": "list, create, check and derive plugins",
    "check_trt": "report the nodes TensorRT's ONNX parser rejects and the plugins a model needs",
    "build": "build a TensorRT engine (TensorRT-RTX: ahead of time for a compute capability) with a sidecar",
    "replace": "replace patterns (multi-node, single op, local function) by plugin nodes",
    "fold": "fold constants (shape chains too); never evaluates plugin nodes",
    "sanitize": "tidy a model without changing what it computes",
    "convert": "convert opset, precision (fp16) or int64 inputs",
}

#: Commands that run no model in another library's onnxruntime session (graphsurgeon's folding): the log
#: level is not set on onnxruntime ahead, which would import it; a session of gskit's own backend
#: (:func:`gskit.backends.ort.session`) applies it anyway.
RUN_NO_FOREIGN_SESSION = ("inspect",)


def command_name(module: str) -> str:
    """The command a module of :data:`COMMANDS` defines: ``check_trt`` -> ``check-trt``."""
    return module.replace("_", "-")


def add_plugins_option(
    parser: argparse.ArgumentParser, purpose: str = "", *, help: str | None = None
) -> None:  # noqa: A002
    """``--plugins DIR`` (repeatable): plugin folders loaded besides the shipped plugins, installed plugin
    packages, ``$GSKIT_PLUGINS`` and ``./plugins``; ``help`` replaces the whole help text."""
    parser.add_argument("--plugins", action="append", metavar="DIR", help=help or plugins_help(purpose))


def plugins_help(purpose: str = "") -> str:
    """The help of ``--plugins`` where it adds folders to the plugins gskit finds."""
    return (
        f"plugin folder{purpose}, added to the shipped and installed plugins, $GSKIT_PLUGINS and ./plugins "
        "(repeatable)"
    )


#: argparse's message for a value outside ``choices`` (a subcommand or an option such as --backend).
_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<value>[^']*)' \(choose from (?P<choices>.*)\)")


def did_you_mean(word: str, candidates: list[str]) -> str:
    """``"; did you mean X?"`` for the candidate closest to a misspelled word; ``""`` when none is close."""
    close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


class SuggestingParser(argparse.ArgumentParser):
    """An ArgumentParser that answers a misspelled option or subcommand with the closest real one.

    Python 3.11's argparse has no ``suggest_on_error``; subparsers inherit this class (argparse makes them
    with the parent's class), so every command and nested action gets the same help.
    """

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        namespace, extras = super().parse_known_args(args, namespace)
        unknown = [a for a in extras if a.startswith("-") and not _is_number(a)]
        if unknown:
            name = unknown[0].split("=", 1)[0]
            options = [o for action in self._actions for o in action.option_strings if o.startswith("--")]
            self.error(f"unknown option {name}{did_you_mean(name, options)}")
        return namespace, extras

    def error(self, message: str) -> NoReturn:
        match = _INVALID_CHOICE.search(message)
        if match:
            choices = [c.strip().strip("'") for c in match["choices"].split(",")]  # quoted before 3.12.8
            hint = did_you_mean(match["value"], choices)
            if hint:
                message = f"{message[: match.start()]}unknown {match['value']!r}{hint}"
        super().error(visible(message))  # it quotes argv: a file name may hold escape sequences


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def build_parser(words: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``gskit`` parser; given the command line, only the named command's module is imported.

    Each command module imports what its command runs (onnx, numpy, Polygraphy ...): a second of imports
    when all 13 are loaded. With ``words`` that name no command (``--help``, a mistyped or missing command)
    the commands are listed from :data:`COMMANDS`, without their parsers; without ``words`` every command's
    parser is built.
    """
    parser = SuggestingParser(
        prog="gskit", description="Prepare ONNX models for TensorRT (plugins, folding, checks, comparison)."
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    parser.add_argument("-v", "--verbose", action="store_true", help="show info logs")
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = _named_command(words) if words is not None else None
    if words is not None and chosen is None:
        for name, summary in COMMANDS.items():
            sub.add_parser(command_name(name), help=summary)  # listed only: no command runs
        return parser
    for name in COMMANDS if chosen is None else (chosen,):
        importlib.import_module(f"gskit.cli.{name}").add_parser(sub)
    return parser


def _named_command(words: Sequence[str]) -> str | None:
    """The module of the command ``words`` run (``check-trt`` -> ``check_trt``); None for help, version or
    an unknown word."""
    for word in words:
        if word in GLOBAL_FLAGS:
            continue
        module = word.replace("-", "_")
        return module if module in COMMANDS and not word.startswith("-") else None
    return None


def _quiet_onnxruntime(level: int, command: str) -> None:
    """onnxruntime's own coloured log lines follow --verbose/--debug, also in other libraries' sessions.

    Importing the backend imports onnxruntime: not for a command of :data:`RUN_NO_FOREIGN_SESSION`, whose
    sessions, if any, come from the backend, which applies the "gskit" logger's level to each.
    """
    if command in RUN_NO_FOREIGN_SESSION and "gskit.backends.ort" not in sys.modules:
        return
    from gskit.backends.ort import quiet_default_logger

    quiet_default_logger(level)


class _VersionAction(argparse.Action):
    """``--version`` after a command (``gskit prepare --version``): the version is read from the package
    metadata only then; ``importlib.metadata`` would add tens of milliseconds to every command's start."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        kwargs.setdefault("help", "show program's version number and exit")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> NoReturn:
        print(f"{parser.prog} {_version()}")
        parser.exit()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gskit")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


class _VisibleFormatter(logging.Formatter):
    """Log lines quote names from models and paths: their control characters are shown escaped."""

    def format(self, record: logging.LogRecord) -> str:
        return visible(super().format(record), keep="\n")  # a traceback's own lines stay lines


class _CurrentStderr:
    """Writes to ``sys.stderr`` as it is at each log line: a progress bar swaps it to print above itself."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


#: Options of the ``gskit`` command itself, which people also write after the subcommand.
GLOBAL_FLAGS = ("--debug", "-v", "--verbose")


def hoist_global_flags(argv: list[str]) -> list[str]:
    """Move ``--debug``/``--verbose`` written after the subcommand to the front, where argparse wants them.

    Only tokens before a ``--`` separator move; no subcommand defines a flag of the same name.
    """
    end = argv.index("--") if "--" in argv else len(argv)
    flags = [a for a in argv[:end] if a in GLOBAL_FLAGS]
    rest = [a for a in argv[:end] if a not in GLOBAL_FLAGS]
    return flags + rest + argv[end:]


def main(argv: list[str] | None = None) -> int:
    """Run one ``gskit`` command; the exit code: 0 done, 1 validation failed, 2 a user error, 130 interrupted.

    Every failure ends in one line on stderr; ``--debug`` prints the traceback before it (the code stays 2).
    """
    own_process = argv is None
    if own_process:
        _blas_threads_sleep()
        # The work done and reported, a SIGINT while the interpreter shuts down (milliseconds: exit handlers,
        # module teardown) met Python's own handler, which printed a KeyboardInterrupt traceback and killed
        # the process by the signal, and a SIGTERM killed it silently, its exit handlers (fold's spill
        # folder) not run. Ignored from here, they are handled inside signals_unwind, which puts this back
        # as it ends: the command's own exit code stands.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
    words = hoist_global_flags(list(sys.argv[1:] if argv is None else argv))
    # From the start: building the parser imports every subcommand (onnx, numpy, ... for seconds), and a
    # SIGINT or SIGTERM then ends the command as cleanly as later (even one a library's import swallows).
    code: int | None = None
    try:
        with interrupt.signals_unwind():
            code = _run(words, own_process=own_process)
    except (KeyboardInterrupt, Terminated) as err:  # one that arrived as _run reported an error or returned
        if code is None:
            code = _interrupted(
                "gskit", signal.SIGINT if isinstance(err, KeyboardInterrupt) else signal.SIGTERM
            )
    return code


#: OpenBLAS's environment variable: its idle threads spin for 2^N cycles before they sleep (default 28).
BLAS_TIMEOUT_ENV = "OPENBLAS_THREAD_TIMEOUT"


def _blas_threads_sleep() -> None:
    """numpy's OpenBLAS threads spin for 2^28 cycles (about 0.1 s) after they start and after each call,
    waiting for the next: 100 ms of a core at each start of the command (``import numpy``: 68 ms of CPU
    alone, 166 ms with them), taken from the TensorRT worker and Graphviz where cores are few. Spinning only
    shortens the wake-up between two BLAS calls; gskit makes few (plugin references on validation inputs).
    So the command line's own process has them sleep at once (2^4 cycles), as its onnxruntime sessions do,
    unless the variable is set already; before numpy is loaded, and only for ``gskit`` itself."""
    os.environ.setdefault(BLAS_TIMEOUT_ENV, "4")


def _progress_display(enabled: bool) -> contextlib.AbstractContextManager[None]:
    """``gskit.io.report.progress_display``: bars on stderr where it is a terminal; elsewhere it draws
    nothing, and rich is not imported for it."""
    if not is_terminal(sys.stderr):
        return contextlib.nullcontext()
    from gskit.io.report import progress_display

    return progress_display(enabled=enabled)


@contextlib.contextmanager
def _imported_uncollected() -> Iterator[None]:
    """Import without the cycle collector, then keep what was imported out of its later scans.

    Modules, classes and functions live as long as the process: the collector scanned them over and over
    while the command's modules were imported, and at each full collection after (0.1 s of a small
    ``prepare``'s 0.6 s of CPU). ``gc.freeze`` moves them to the generation it never scans. Only for the
    process's own command line (``main()``): a caller's process keeps its collector as it was.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def _dataclass_code_kept(own_process: bool) -> contextlib.AbstractContextManager[None]:
    """``gskit.io.dataclass_code.code_kept`` for the process's own command line (its dataclasses' methods
    compiled once across runs); a library caller's process is left as it is."""
    if not own_process:
        return contextlib.nullcontext()
    from gskit.io.dataclass_code import code_kept

    return code_kept()


def _run(words: list[str], *, own_process: bool = False) -> int:
    debug = "--debug" in words
    name = "gskit"
    not_utf8 = next((word for word in words if not is_utf8(word)), None)
    if not_utf8 is not None:
        # onnx and onnxruntime take paths as UTF-8 strings: such a name would fail deep inside a step
        return _fail(name, f"{not_utf8}: not UTF-8 text (a file name in another encoding?); rename it")
    try:
        if _named_command(words) is None and "--version" in words:
            print(f"gskit {_version()}")  # before the parser: it would import every command to say this
            return 0
        with _parser_started_early(words), _dataclass_code_kept(own_process):
            with _imported_uncollected() if own_process else contextlib.nullcontext():
                # The command's imports finish before a signal takes effect: its exception raised in Python
                # code that a C extension runs as it initializes (onnx's) aborted or crashed the process.
                with interrupt.signals_held():
                    parser = build_parser(words)
                args = parser.parse_args(words)
                name = f"gskit {args.command}"
                level = logging.DEBUG if args.debug else logging.INFO if args.verbose else logging.WARNING
                handler = logging.StreamHandler(_CurrentStderr())
                handler.setFormatter(_VisibleFormatter("%(levelname)s %(name)s: %(message)s"))
                logging.basicConfig(level=level, handlers=[handler])
                _quiet_onnxruntime(level, args.command)
                from gskit.io.outputs import guarding_inputs

                display = _progress_display(enabled=not getattr(args, "json", False))  # rich if it draws

            # Whatever the command loads is its input: no output of it may replace one of those files.
            with guarding_inputs(), display:
                return int(args.func(args) or 0)
    except GskitError as err:
        if interrupt.arrived():
            return _interrupted(name, interrupt.arrived())
        if debug:  # the traceback, and still exit 2: exit 1 means only "validation failed"
            _print_traceback()
        return _fail(name, str(err))
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away; stay quiet like other command-line tools.
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        return _interrupted(name, signal.SIGINT)
    except Terminated:
        return _interrupted(name, signal.SIGTERM)
    except OSError as err:
        if interrupt.arrived():
            return _interrupted(name, interrupt.arrived())
        if debug:
            _print_traceback()
        return _fail(name, describe_os_error(err))
    except MemoryError:
        if debug:
            _print_traceback()
        return _fail(name, "out of memory; try smaller input shapes or a machine with more memory")
    except RecursionError:
        if debug:
            _print_traceback()
        return _fail(name, "the model or file is nested too deeply to process")
    except Exception as err:  # the safety net: a bug still ends in one line, not a traceback
        if interrupt.arrived():  # an import or a library cut short by the signal
            return _interrupted(name, interrupt.arrived())
        if debug:
            _print_traceback()
        first = (str(err).strip().splitlines() or [""])[0]
        return _fail(
            name,
            f"unexpected {type(err).__name__}: {first} (a gskit bug: rerun with `gskit --debug ...` for the "
            "traceback and report it)",
        )


#: ``gskit prepare`` options after which its command line no longer says cheaply which parser its first
#: check_trt step asks: another recipe (its YAML may name the backend), or a run that does no work.
_RECIPE_UNKNOWN = ("--recipe", "--print-default-recipe", "--print-recipe", "--help", "--version")


def _parser_started_early(words: Sequence[str]) -> contextlib.AbstractContextManager[None]:
    """For ``gskit prepare`` with the default recipe, the worker of the TensorRT parser its check_trt step
    will ask, started before the command imports its modules (onnx, onnxruntime, the passes: 0.2-0.3 s), so
    that the worker's interpreter and TensorRT load meanwhile; ``prepare`` hands the step's task to it
    (``gskit.backends.trt.started_worker``).

    Nothing starts where the command line does not say it for sure (:func:`_early_parser`). On the way out
    (done, an error, Ctrl-C) a worker that no task took is stopped and its folder removed.
    """
    flavour = _early_parser(words)
    if flavour is None:
        return contextlib.nullcontext()
    from gskit.backends.trt import started_worker

    return started_worker(flavour, debug="--debug" in words)


def _early_parser(words: Sequence[str]) -> str | None:
    """The parser flavour that ``gskit prepare``'s first check_trt step asks, read from the command line
    alone: the default recipe (no --recipe), check_trt not skipped, the target of --tensorrt or the default
    (``gskit.backends.trt.default_check_parser``). None when that is not sure: another command, another
    recipe, an abbreviated option that argparse might read as one of those, a "--" separator."""
    if _named_command(words) != "prepare":
        return None
    command = next(i for i, word in enumerate(words) if word not in GLOBAL_FLAGS)
    rest = list(words[command + 1 :])
    skipped, version = [], None
    while rest:
        word = rest.pop(0)
        if word in ("--", "-h"):
            return None
        if not word.startswith("--"):
            continue
        option, has_value, value = word.partition("=")
        if option not in ("--skip", "--tensorrt"):
            if any(known.startswith(option) for known in (*_RECIPE_UNKNOWN, "--skip", "--tensorrt")):
                return None  # one of them, or an abbreviation argparse may take for one
            continue
        if not has_value:
            if not rest:
                return None
            value = rest.pop(0)
        if option == "--skip":
            skipped.append(value)
        else:
            version = value
    if "check_trt" in skipped:
        return None
    from gskit.backends.trt import default_check_parser

    return default_check_parser(version)


def _interrupted(name: str, signum: int | None) -> int:
    """``gskit CMD: interrupted`` (SIGINT, 130) or ``terminated`` (SIGTERM, 143)."""
    word = "interrupted" if signum == signal.SIGINT else "terminated"
    print(f"{name}: {word}", file=sys.stderr)
    return _ended(130 if signum == signal.SIGINT else 128 + signal.SIGTERM)


def _ended(code: int) -> int:
    """The exit code of an interrupted command, whose cleanup has run.

    A native call that did not stop when asked (``gskit.io.interrupt.stranded``) still runs in its thread; an
    interpreter that exits normally then aborts inside onnxruntime, so the process ends here, at once, after
    the exit handlers (temporary folders) and with its output flushed.
    """
    if not interrupt.stranded():
        return code
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    # atexit has no public way to run its handlers early; they remove temporary folders (fold's spill).
    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    if run_exit_handlers is not None:
        run_exit_handlers()
    os._exit(code)


def _fail(name: str, message: str) -> int:
    """Print the one error line: line breaks and tabs (of a library's message too) become spaces, every
    other control character in it (from a name or a path) shows escaped."""
    print(f"{name}: error: {' '.join(visible(message, keep=_SPACING).split())}", file=sys.stderr)
    return 2


#: Whitespace that an error line folds into single spaces.
_SPACING = "\n\t\r"


def _print_traceback() -> None:
    """``--debug``: the traceback on stderr, names in it shown as data."""
    print(visible(traceback.format_exc(), keep="\n"), end="", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
