"""``gskit convert MODEL -o OUT``: opset conversion, fp16 (with clamping), int64 inputs to int32."""

from __future__ import annotations

import argparse

from gskit.cli.options import add_options, options_from_args
from gskit.errors import GskitError
from gskit.io import model as gsmodel
from gskit.io.report import console, print_json, table
from gskit.passes.convert import CONVERT, ConvertOptions
from gskit.passes.transform import run_pass


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "convert",
        help="convert opset, precision (fp16) or int64 inputs",
        description="Opset conversion, then fp16, then int64 -> int32, as asked.",
    )
    parser.add_argument("model", help="the .onnx file")
    parser.add_argument("-o", "--output", required=True, help="where to write the converted model")
    add_options(parser, ConvertOptions)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not (args.opset or args.fp16 or args.int32):
        raise GskitError("convert: nothing to do; pass --opset N, --fp16 and/or --int32")
    out_path = gsmodel.resolve_output(args.model, args.output, in_place=False)
    result = run_pass(CONVERT, gsmodel.load(args.model), options_from_args(args, ConvertOptions))
    gsmodel.save(result.model, out_path)
    report = result.report
    if args.json:
        print_json({name: value for name, value in vars(report).items() if value is not None})
        return 0
    out = console()
    rows = [("written", out_path)]
    if report.opset is not None:
        rows.append(("opset", report.opset))
    fp16 = report.fp16
    if fp16 is not None:
        rows += [
            ("fp16 nodes", fp16.fp16_nodes),
            ("fp32 nodes", sum(fp16.fp32_nodes.values())),
            ("casts inserted", fp16.casts_inserted),
            ("constants converted", fp16.constants_converted),
            ("values clamped", fp16.values_clamped),
        ]
    int32 = report.int32
    if int32 is not None:
        rows += [("int32 inputs", ", ".join(int32.inputs) or "-"), ("int32 constants", len(int32.constants))]
    out.print(table("Convert", ("", "value"), rows))
    return 0
