"""``gskit sanitize MODEL -o OUT``: constants to initializers, dedupe, drop no-ops and unused things."""

from __future__ import annotations

from gskit.cli.command import PassCommand, Ran
from gskit.io.report import console, table
from gskit.passes.sanitize import DEFAULT_STEPS, SANITIZE


def _show(ran: Ran) -> None:
    report = ran.result.report
    out = console()
    rows = [
        ("nodes", report.nodes_before, report.nodes_after),
        ("initializers", report.initializers_before, report.initializers_after),
    ]
    out.print(table("Sanitize", ("", "before", "after"), rows))
    out.print(table("Steps", ("step", "changes"), report.changes.items()))
    if report.removed_ops:
        out.print(table("Removed nodes", ("op", "count"), report.removed_ops.items()))


COMMAND = PassCommand(
    "sanitize",
    SANITIZE,
    description=f"Run the tidy steps: {', '.join(DEFAULT_STEPS)}.",
    output="where to write the sanitized model",
    show=_show,
)
add_parser, run = COMMAND.add_parser, COMMAND.run
