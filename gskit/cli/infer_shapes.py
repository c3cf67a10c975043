"""``gskit infer-shapes MODEL -o OUT``: infer dtypes and shapes, through plugin nodes too."""

from __future__ import annotations

from typing import Any

from gskit.cli import plugins_help
from gskit.cli.command import PassCommand, Ran
from gskit.io import report
from gskit.passes.shapes import INFER_SHAPES, missing_shapes


def _report(ran: Ran) -> dict[str, Any]:
    return {"output": ran.written, "missing_shapes": missing_shapes(ran.result.model)}


def _show(ran: Ran) -> None:
    missing = _report(ran)["missing_shapes"]
    rows = [("written", ran.written), ("tensors without shapes", ", ".join(missing) or "none")]
    report.console().print(report.table("infer-shapes", ("", ""), rows))


COMMAND = PassCommand(
    "infer-shapes",
    INFER_SHAPES,
    description="Infer dtypes and shapes of every tensor with onnx's shape inference; plugin nodes get "
    "their output rules from their specs, and symbolic dims are kept.",
    model="input .onnx",
    output="output .onnx (must differ from the input)",
    show=_show,
    report=_report,
    json="print the result as JSON",
    plugins=plugins_help(),
    layout=("model", "output", "plugins", "options", "json"),
    weights=False,
)
add_parser, run = COMMAND.add_parser, COMMAND.run
