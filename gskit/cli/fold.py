"""``gskit fold MODEL -o OUT``: fold constants to a fixed point, safely around plugin nodes."""

from __future__ import annotations

from gskit.cli.command import PassCommand, Ran
from gskit.io.report import console, table
from gskit.passes.fold import FOLD


def _show(ran: Ran) -> None:
    report = ran.result.report
    out = console()
    rows = [
        ("nodes before", report.nodes_before),
        ("nodes after", report.nodes_after),
        ("passes", report.passes),
        ("mode", report.mode),
        ("batches evaluated", report.batches),
        ("written", ran.output),
    ]
    out.print(table("Fold", ("", "value"), rows))
    if report.folded_ops:
        out.print(table("Folded ops (nodes removed)", ("op", "count"), report.folded_ops.items()))
    if report.excluded:
        out.print(table("Not evaluated", ("node", "reason"), report.excluded.items()))
    if report.failures:
        out.print(table("Skipped folds", ("failure",), ((f,) for f in report.failures)))


COMMAND = PassCommand(
    "fold",
    FOLD,
    description="Fold constants to a fixed point, then clean up and sort the graph.",
    output="where to write the folded model",
    show=_show,
    plugins="plugin folder whose nodes stay unevaluated",
    given_plugins_only=True,
    # Weights stay on disk: folding reads only what each batch needs, so models over 2 GB fold in bounded
    # memory.
    weights=False,
)
add_parser, run = COMMAND.add_parser, COMMAND.run
