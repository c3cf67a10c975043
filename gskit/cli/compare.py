"""``gskit compare ORIGINAL PREPARED``: run both on the same inputs and compare outputs by name."""

from __future__ import annotations

import argparse

from gskit import report
from gskit.compare import CompareReport, compare
from gskit.feeds import load_feeds, parse_shape_arg
from gskit.plugin import load_plugins


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "compare",
        help="compare two models' outputs on the same inputs (onnxruntime)",
        description="Run ORIGINAL and PREPARED on onnxruntime with the same inputs (plugin nodes through "
        "their "
        "numpy references) and compare every output of ORIGINAL by name. Exit 0 if all match, 1 if not.",
    )
    parser.add_argument("original", help="reference .onnx")
    parser.add_argument("prepared", help=".onnx under test")
    parser.add_argument("--atol", type=float, default=1e-5, help="absolute tolerance (default 1e-5)")
    parser.add_argument("--rtol", type=float, default=1e-5, help="relative tolerance (default 1e-5)")
    parser.add_argument(
        "--inputs", metavar="FILE.npz", help="inputs saved with numpy.savez (default: random)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    parser.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME:DIMS",
        help="input shape for random inputs, e.g. x:1x3x224x224",
    )
    parser.add_argument(
        "--plugins",
        action="append",
        metavar="DIR",
        help="plugin folder (repeatable; default: $GSKIT_PLUGINS or plugins/)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    result = compare(
        args.original,
        args.prepared,
        feeds=load_feeds(args.inputs) if args.inputs else None,
        shapes=dict(parse_shape_arg(text) for text in args.shape),
        seed=args.seed,
        atol=args.atol,
        rtol=args.rtol,
        plugins=load_plugins(args.plugins),
    )
    print_report(result, as_json=args.json)
    return 0 if result.passed else 1


def print_report(result: CompareReport, *, as_json: bool) -> None:
    """The report as a table per output (or JSON); shared by compare variants."""
    if as_json:
        report.print_json(result)
        return
    rows = [
        (
            o.name,
            "x".join(map(str, o.shape)) or "scalar",
            o.dtype,
            f"{o.max_abs_err:.3g}",
            f"{o.max_rel_err:.3g}",
            "[green]pass[/]" if o.passed else "[red]FAIL[/]",
        )
        for o in result.outputs
    ]
    inputs = ", ".join(f"{n}: {'x'.join(map(str, s))}" for n, s in result.input_shapes.items())
    tolerances = f"atol={result.atol:g}, rtol={result.rtol:g}"
    title = f"{result.reference} vs {result.under_test} ({tolerances}; inputs {inputs})"
    out = report.console()
    out.print(report.table(title, ("output", "shape", "dtype", "max abs err", "max rel err", "result"), rows))
    verdict = (
        "all outputs match"
        if result.passed
        else f"{len(result.failed)} of {len(result.outputs)} outputs differ"
    )
    out.print(("[green]" if result.passed else "[red]") + verdict + "[/]")
