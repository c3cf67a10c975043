"""``gskit fold MODEL -o OUT``: fold constants to a fixed point, safely around plugin nodes."""

from __future__ import annotations

import argparse

from gskit.cli.options import add_options, options_from_args
from gskit.io import model as gsmodel
from gskit.io.report import console, print_json, table
from gskit.passes.fold import FOLD, FoldOptions
from gskit.passes.transform import run_pass


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "fold",
        help="fold constants (shape chains too); never evaluates plugin nodes",
        description="Fold constants to a fixed point, then clean up and sort the graph.",
    )
    parser.add_argument("model", help="the .onnx file")
    parser.add_argument("-o", "--output", required=True, help="where to write the folded model")
    add_options(parser, FoldOptions)
    parser.add_argument(
        "--plugins", action="append", metavar="DIR", help="plugin folder whose nodes stay unevaluated"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out_path = gsmodel.resolve_output(args.model, args.output, in_place=False)
    plugins = None
    if args.plugins:
        from gskit.plugin.discovery import load_plugins

        plugins = load_plugins(args.plugins, entry_points=False)
    # Weights stay on disk: folding reads only what each batch needs, so models over 2 GB fold in bounded
    # memory.
    model = gsmodel.load(args.model, load_weights=False)
    result = run_pass(FOLD, model, options_from_args(args, FoldOptions), plugins=plugins)
    report = result.report
    gsmodel.save(result.model, out_path)
    if args.json:
        print_json(report)
        return 0
    out = console()
    out.print(
        table(
            "Fold",
            ("", "value"),
            [
                ("nodes before", report.nodes_before),
                ("nodes after", report.nodes_after),
                ("passes", report.passes),
                ("mode", report.mode),
                ("batches evaluated", report.batches),
                ("written", out_path),
            ],
        )
    )
    if report.folded_ops:
        out.print(table("Folded ops (nodes removed)", ("op", "count"), report.folded_ops.items()))
    if report.excluded:
        out.print(table("Not evaluated", ("node", "reason"), report.excluded.items()))
    if report.failures:
        out.print(table("Skipped folds", ("failure",), ((f,) for f in report.failures)))
    return 0
