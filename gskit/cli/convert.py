"""``gskit convert MODEL -o OUT``: opset conversion, fp16 (with clamping), int64 inputs to int32."""

from __future__ import annotations

from typing import Any

from gskit.cli.command import PassCommand, Ran
from gskit.errors import GskitError
from gskit.io.report import console, table
from gskit.passes.convert import CONVERT, ConvertOptions


def _check(options: ConvertOptions) -> None:
    if not (options.opset or options.fp16 or options.int32):
        raise GskitError("convert: nothing to do; pass --opset N, --fp16 and/or --int32")


def _report(ran: Ran) -> dict[str, Any]:
    """The conversions asked for (the others are None)."""
    return {name: value for name, value in vars(ran.result.report).items() if value is not None}


def _show(ran: Ran) -> None:
    report = ran.result.report
    rows = [("written", ran.output)]
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
    console().print(table("Convert", ("", "value"), rows))


COMMAND = PassCommand(
    "convert",
    CONVERT,
    description="Opset conversion, then fp16, then int64 -> int32, as asked.",
    output="where to write the converted model",
    show=_show,
    report=_report,
    check=_check,
)
add_parser, run = COMMAND.add_parser, COMMAND.run
