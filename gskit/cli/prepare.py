"""``gskit prepare MODEL -o OUTDIR``: the whole job, driven by a recipe."""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import ExitStack

from rich.markup import escape

from gskit import progress
from gskit.cli import add_plugins_option
from gskit.errors import GskitError
from gskit.prepare import PrepareReport, StepResult, default_recipe, prepare
from gskit.recipe import load_recipe
from gskit.report import console, print_json, table


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "prepare",
        help="replace plugin patterns, infer shapes, fold, check with TensorRT, validate, build",
        description="Run a recipe (default: sanitize, replace, infer_shapes, fold, infer_shapes, check_trt, "
        "validate, build) and write OUTDIR/model.onnx, report.json and report.html. Exit code 0 only when "
        "validation passes.",
    )
    p.add_argument("model", nargs="?", help="the ONNX model to prepare")
    p.add_argument("-o", "--output", metavar="OUTDIR", help="output folder")
    p.add_argument("--recipe", metavar="RECIPE.yaml", help="steps and options (see --print-default-recipe)")
    add_plugins_option(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--print-default-recipe", action="store_true", help="print the default recipe and exit")
    p.set_defaults(func=run)


class _Progress:
    """A spinner while a step runs (a progress task: a step's own bars, fold's batches, show below it), one
    line when it ends."""

    def __init__(self, quiet: bool) -> None:
        self._console = console(stderr=True)
        self._quiet = quiet
        self._step = ExitStack()
        self._start = time.perf_counter()

    def started(self, name: str, index: int, total: int) -> None:
        self._step.enter_context(progress.task(f"[{index + 1}/{total}] {name}"))

    def finished(self, result: StepResult) -> None:
        self._step.close()
        if self._quiet:
            return
        mark = {"ok": "[green]ok[/]", "skipped": "[yellow]skip[/]", "failed": "[red]FAIL[/]"}[result.status]
        total = time.perf_counter() - self._start
        self._console.print(
            f"{mark} {result.name:<13} {result.seconds:6.2f}s  {result.nodes_before:>6} -> "
            f"{result.nodes_after:<6} {escape(result.summary)}  [dim](total {total:.1f}s)[/]"
        )


def run(args: argparse.Namespace) -> int:
    if args.print_default_recipe:
        sys.stdout.write(default_recipe().to_yaml())
        return 0
    if not args.model or not args.output:
        raise SystemExit("gskit prepare: error: MODEL and -o OUTDIR are required")
    if args.output.lower().endswith(".onnx"):
        # -o is a folder; "out/model.onnx" used to become a folder of that name without a word.
        raise GskitError(
            f"-o {args.output}: give an output folder, not a model file name "
            "(prepare writes OUTDIR/model.onnx, report.json and report.html)"
        )
    recipe = load_recipe(args.recipe) if args.recipe else None
    report = prepare(
        args.model, args.output, recipe=recipe, plugin_dirs=args.plugins, listener=_Progress(args.json)
    )
    if args.json:
        print_json(report)
    else:
        _print_summary(report)
    return 0 if report.passed else 1


def _print_summary(report: PrepareReport) -> None:
    out = console()
    out.print(
        table(
            "gskit prepare",
            ("step", "time (s)", "nodes before", "nodes after", "result"),
            [
                (s.name, f"{s.seconds:.2f}", s.nodes_before, s.nodes_after, f"{s.status}: {s.summary}")
                for s in report.steps
            ],
        )
    )
    if report.comparison is not None:
        out.print(
            table(
                "validation against the original (onnxruntime)",
                ("output", "shape", "max abs err", "max rel err", "result"),
                [
                    (
                        o.name,
                        o.shape,
                        f"{o.max_abs_err:.3g}",
                        f"{o.max_rel_err:.3g}",
                        "pass" if o.passed else "FAIL",
                    )
                    for o in report.comparison.outputs
                ],
            )
        )
    inserted = ", ".join(f"{k} x{v}" for k, v in report.plugins_inserted.items()) or "none"
    out.print(f"plugins inserted: {inserted}")
    out.print(
        f"wrote {report.prepared_model}, {report.output_dir}/report.json, {report.output_dir}/report.html"
    )
    out.print("[green]validation passed[/]" if report.passed else "[red]validation FAILED[/]")
