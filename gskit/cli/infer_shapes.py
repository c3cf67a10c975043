"""``gskit infer-shapes MODEL -o OUT``: infer dtypes and shapes, through plugin nodes too."""

from __future__ import annotations

import argparse

from gskit.cli import add_plugins_option
from gskit.cli.options import add_options, options_from_args
from gskit.io import model as gsmodel
from gskit.io import report
from gskit.passes.shapes import INFER_SHAPES, InferShapesOptions, missing_shapes
from gskit.passes.transform import run_pass
from gskit.plugin.discovery import load_plugins


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "infer-shapes",
        help="infer dtypes and shapes (plugin nodes use their specs' rules)",
        description="Infer dtypes and shapes of every tensor with onnx's shape inference; plugin nodes get "
        "their output rules from their specs, and symbolic dims are kept.",
    )
    parser.add_argument("model", help="input .onnx")
    parser.add_argument("-o", "--output", required=True, help="output .onnx (must differ from the input)")
    add_plugins_option(parser)
    add_options(parser, InferShapesOptions)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    output = gsmodel.resolve_output(args.model, args.output, in_place=False)
    registry = load_plugins(args.plugins)
    options = options_from_args(args, InferShapesOptions)
    model = gsmodel.load(args.model, load_weights=False)
    model = run_pass(INFER_SHAPES, model, options, plugins=registry).model
    path = gsmodel.save(model, output)
    missing = missing_shapes(model)
    if args.json:
        report.print_json({"output": path, "missing_shapes": missing})
    else:
        rows = [("written", path), ("tensors without shapes", ", ".join(missing) or "none")]
        report.console().print(report.table("infer-shapes", ("", ""), rows))
    return 0
