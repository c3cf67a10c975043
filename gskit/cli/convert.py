"""``gskit convert MODEL -o OUT``: opset conversion, fp16 (with clamping), int64 inputs to int32."""

from __future__ import annotations

import argparse

from gskit import model as gsmodel
from gskit.convert import convert_opset, int64_to_int32, to_fp16
from gskit.errors import GskitError
from gskit.report import console, print_json, table


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "convert",
        help="convert opset, precision (fp16) or int64 inputs",
        description="Opset conversion, then fp16, then int64 -> int32, as asked.",
    )
    parser.add_argument("model", help="the .onnx file")
    parser.add_argument("-o", "--output", required=True, help="where to write the converted model")
    parser.add_argument("--opset", type=int, help="target default-domain opset")
    parser.add_argument("--fp16", action="store_true", help="convert float32 computation to float16")
    parser.add_argument(
        "--keep-io-fp32", action="store_true", help="with --fp16: keep float32 inputs/outputs"
    )
    parser.add_argument(
        "--block-op", action="append", default=[], metavar="TYPE", help="with --fp16: keep this op fp32"
    )
    parser.add_argument("--int32", action="store_true", help="int64 inputs and index constants to int32")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not (args.opset or args.fp16 or args.int32):
        raise GskitError("convert: nothing to do; pass --opset N, --fp16 and/or --int32")
    out_path = gsmodel.resolve_output(args.model, args.output, in_place=False)
    model = gsmodel.load(args.model)
    reports: dict[str, object] = {}
    if args.opset:
        model = convert_opset(model, args.opset)
        reports["opset"] = args.opset
    if args.fp16:
        model, reports["fp16"] = to_fp16(
            model, keep_io_types=args.keep_io_fp32, block_ops=tuple(args.block_op)
        )
    if args.int32:
        model, reports["int32"] = int64_to_int32(model)
    gsmodel.save(model, out_path)
    if args.json:
        print_json(reports)
        return 0
    out = console()
    rows = [("written", out_path)]
    if "opset" in reports:
        rows.append(("opset", reports["opset"]))
    fp16 = reports.get("fp16")
    if fp16 is not None:
        rows += [
            ("fp16 nodes", fp16.fp16_nodes),
            ("fp32 nodes", sum(fp16.fp32_nodes.values())),
            ("casts inserted", fp16.casts_inserted),
            ("constants converted", fp16.constants_converted),
            ("values clamped", fp16.values_clamped),
        ]
    int32 = reports.get("int32")
    if int32 is not None:
        rows += [("int32 inputs", ", ".join(int32.inputs) or "-"), ("int32 constants", len(int32.constants))]
    out.print(table("Convert", ("", "value"), rows))
    return 0
