"""``gskit sanitize MODEL -o OUT``: constants to initializers, dedupe, drop no-ops and unused things."""

from __future__ import annotations

import argparse

from gskit.cli.options import add_options, options_from_args
from gskit.io import model as gsmodel
from gskit.io.report import console, print_json, table
from gskit.passes.sanitize import DEFAULT_STEPS, SANITIZE, SanitizeOptions
from gskit.passes.transform import run_pass


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "sanitize",
        help="tidy a model without changing what it computes",
        description=f"Run the tidy steps: {', '.join(DEFAULT_STEPS)}.",
    )
    parser.add_argument("model", help="the .onnx file")
    parser.add_argument("-o", "--output", required=True, help="where to write the sanitized model")
    add_options(parser, SanitizeOptions)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out_path = gsmodel.resolve_output(args.model, args.output, in_place=False)
    result = run_pass(SANITIZE, gsmodel.load(args.model), options_from_args(args, SanitizeOptions))
    report = result.report
    gsmodel.save(result.model, out_path)
    if args.json:
        print_json(report)
        return 0
    out = console()
    rows = [
        ("nodes", report.nodes_before, report.nodes_after),
        ("initializers", report.initializers_before, report.initializers_after),
    ]
    out.print(table("Sanitize", ("", "before", "after"), rows))
    out.print(table("Steps", ("step", "changes"), report.changes.items()))
    if report.removed_ops:
        out.print(table("Removed nodes", ("op", "count"), report.removed_ops.items()))
    return 0
