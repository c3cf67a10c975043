"""``gskit prepare MODEL -o OUTDIR``: the whole job, driven by a recipe."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any, TextIO

from gskit.cli import COMMANDS, add_plugins_option
from gskit.errors import GskitError
from gskit.io import progress
from gskit.io.strict_json import print_json
from gskit.io.text import Line, Table, plain_output, writes_plain
from gskit.passes.transform import StepFlag
from gskit.pipeline.prepare import (
    PrepareReport,
    StepResult,
    default_recipe,
    prepare,
    prepare_flags,
    recipe_with_overrides,
)
from gskit.pipeline.recipe import Recipe, load_recipe


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "prepare",
        help=COMMANDS["prepare"],
        description="Run a recipe (default: sanitize, replace, infer_shapes, fold, infer_shapes, check_trt, "
        "validate, build) and write OUTDIR/model.onnx, report.json and report.html. Exit code 0 when "
        "validation passes (or the recipe has no validate step: the run then says 'not validated'), 1 when "
        "it fails, 2 on an error.",
    )
    p.add_argument("model", nargs="?", help="the ONNX model to prepare")
    p.add_argument("-o", "--output", metavar="OUTDIR", help="output folder")
    p.add_argument("--recipe", metavar="RECIPE.yaml", help="steps and options (see --print-default-recipe)")
    add_plugins_option(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--print-default-recipe", action="store_true", help="print the default recipe and exit")
    p.add_argument(
        "--print-recipe",
        action="store_true",
        help="print the recipe that --recipe and the flags below make (YAML for --recipe) and exit",
    )
    flags = p.add_argument_group(
        "recipe options",
        "each sets the option of the same meaning in the recipe (default or --recipe), overriding its value; "
        "--verbose/--debug work here too",
    )
    for _, flag in prepare_flags():  # declared on the steps' options (gskit.passes.transform.StepFlag)
        _add_flag(flags, flag)
    flags.add_argument(
        "--skip", action="append", metavar="STEP", help="drop every step of this name (repeatable)"
    )
    flags.add_argument(
        "--tensorrt",
        metavar="VERSION",
        help="the TensorRT version to prepare for, e.g. 8.6, 10.3, 11 (the recipe's target.tensorrt): each "
        "matched region becomes the ONNX op that version runs natively, else the plugin node, and check_trt "
        "answers for it (default: the installed TensorRT, else the newest gskit knows)",
    )
    p.set_defaults(func=run)


class _Printer:
    """Tables and lines on stdout or stderr as ``gskit.io.report``'s console prints them.

    Where rich would write no escapes (a pipe, a file) the same text is written directly
    (``gskit.io.text.plain_output``), so that a plain run does not import rich for it.
    """

    def __init__(self, stderr: bool = False) -> None:
        self._stderr = stderr
        self._console: Any = None

    def show(self, tables: Sequence[Table] = (), lines: Sequence[Line] = ()) -> None:
        stream = self._stream()
        plain = plain_output(tables, lines) if writes_plain(stream) else None
        if plain is not None:
            stream.write(plain)
            stream.flush()  # as rich does after each print: the order with the other stream is kept
            return
        from gskit.io.report import console, styled, table

        if self._console is None:
            self._console = console(stderr=self._stderr)
        for title, columns, rows in tables:
            self._console.print(table(title, columns, rows))
        for line in lines:
            self._console.print(styled(*line))

    def _stream(self) -> TextIO:
        return sys.stderr if self._stderr else sys.stdout


class _Progress:
    """A spinner while a step runs (a progress task: a step's own bars, fold's batches, show below it), one
    line when it ends."""

    def __init__(self, quiet: bool) -> None:
        self._out = _Printer(stderr=True)
        self._quiet = quiet
        self._step = ExitStack()
        self._start = time.perf_counter()

    def started(self, name: str, index: int, total: int) -> None:
        self._step.enter_context(progress.task(f"[{index + 1}/{total}] {name}"))

    def finished(self, result: StepResult) -> None:
        self._step.close()
        if self._quiet:
            return
        mark = {"ok": ("ok", "green"), "skipped": ("skip", "yellow"), "failed": ("FAIL", "red")}[
            result.status
        ]
        total = time.perf_counter() - self._start
        line: Line = (
            mark,
            f" {result.name:<13} {result.seconds:6.2f}s  {result.nodes_before:>6} -> "
            f"{result.nodes_after:<6} {result.summary}  ",
            (f"(total {total:.1f}s)", "dim"),
        )
        self._out.show(lines=[line])


def _add_flag(group: argparse._ArgumentGroup, flag: StepFlag) -> None:
    """One recipe-option flag as its step's options declare it."""
    if flag.kind == "switch":
        group.add_argument(flag.flag, dest=flag.name, action="store_true", help=flag.help)
        return
    kwargs: dict[str, Any] = {"dest": flag.name, "help": flag.help, "metavar": flag.metavar}
    if flag.type is not None:
        kwargs["type"] = flag.type
    if flag.kind == "append":
        kwargs["action"] = "append"
    group.add_argument(flag.flag, **kwargs)


def run(args: argparse.Namespace) -> int:
    if args.print_default_recipe:
        sys.stdout.write(default_recipe().to_yaml())
        return 0
    recipe = _recipe(args)
    if args.print_recipe:
        sys.stdout.write(recipe.to_yaml())
        return 0
    if not args.model or not args.output:
        raise GskitError("give MODEL and -o OUTDIR, e.g. gskit prepare model.onnx -o out/")
    if args.output.lower().endswith(".onnx"):
        # -o is a folder; "out/model.onnx" used to become a folder of that name without a word.
        raise GskitError(
            f"-o {args.output}: give an output folder, not a model file name "
            "(prepare writes OUTDIR/model.onnx, report.json and report.html)"
        )
    report = prepare(
        args.model, args.output, recipe=recipe, plugin_dirs=args.plugins, listener=_Progress(args.json)
    )
    if args.json:
        print_json(report)
    else:
        _print_summary(report)
    return 1 if report.passed is False else 0


def _recipe(args: argparse.Namespace) -> Recipe:
    """The default recipe or --recipe, with the recipe-option flags applied."""
    given = {}
    for _, flag in prepare_flags():
        value = getattr(args, flag.name)
        if flag.parse is not None and value is not None:
            value = [flag.parse(text) for text in value] if flag.kind == "append" else flag.parse(value)
        given[flag.name] = value
    return recipe_with_overrides(
        load_recipe(args.recipe) if args.recipe else default_recipe(),
        skip=args.skip or (),
        tensorrt=args.tensorrt,
        **given,
    )


def _print_summary(report: PrepareReport) -> None:
    tables: list[Table] = [
        (
            "gskit prepare",
            ("step", "time (s)", "nodes before", "nodes after", "result"),
            [
                (s.name, f"{s.seconds:.2f}", s.nodes_before, s.nodes_after, f"{s.status}: {s.summary}")
                for s in report.steps
            ],
        )
    ]
    if report.comparison is not None:
        tables.append(
            (
                "validation against the original (onnxruntime)",
                ("output", "shape", "max abs err", "max rel err", "result"),
                [
                    (
                        o.name,
                        o.shape,
                        f"{o.max_abs_err:.3g}",
                        f"{o.max_rel_err:.3g}",
                        ("pass" if o.passed else "FAIL") + (f": {o.note}" if o.note else ""),
                    )
                    for o in report.comparison.outputs
                ],
            )
        )
    target = report.target
    inserted = ", ".join(f"{k} x{v}" for k, v in report.plugins_inserted.items()) or "none"
    native = ", ".join(f"{k} x{v}" for k, v in report.native_inserted.items()) or "none"
    lines: list[Line] = [
        (f"prepared for TensorRT {target.get('tensorrt')} ({target.get('source')})",),
        (f"plugins inserted: {inserted}; native ops written: {native}",),
        (f"wrote {report.prepared_model}, {report.output_dir}/report.json, {report.output_dir}/report.html",),
    ]
    if report.passed is None:
        lines.append(
            (
                ("not validated", "yellow"),
                ": the recipe has no validate step, so the written model was not compared with the original "
                "(run `gskit compare` on it, or keep the validate step)",
            )
        )
    else:
        lines.append((("validation passed", "green") if report.passed else ("validation FAILED", "red"),))
    _Printer().show(tables, lines)
