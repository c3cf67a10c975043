"""``gskit replace MODEL -o OUT [--plugins DIR ...] [--only NAME ...] [--keep-function] [--explain]
[--json]``: replace matched subgraphs with plugin nodes."""

from __future__ import annotations

import logging
from typing import Any

from gskit.cli import plugins_help
from gskit.cli.command import PassCommand, Ran
from gskit.io.report import console, table
from gskit.passes.patterns import ReplaceReport
from gskit.passes.patterns.replace import REPLACE

log = logging.getLogger(__name__)


def _infer(graph: Any, registry: Any) -> None:
    """Ranks let the matcher compare axes like [2] with [-1]; the plugin nodes get their types after."""
    try:
        from gskit.passes.shapes import infer_graph_shapes
    except ImportError:  # shape inference is optional for this command
        return
    infer_graph_shapes(graph, registry, strict=False)


def _report(ran: Ran) -> dict[str, Any]:
    return {"model": ran.args.model, "output": str(ran.written), **_as_dict(ran.result.report)}


def _show(ran: Ran) -> None:
    _print(ran.result.report, str(ran.written))


def _as_dict(report: ReplaceReport) -> dict:
    from gskit.io.strict_json import to_jsonable

    data = to_jsonable(report)
    data["replaced"] = report.replaced
    return data


def _print(report: ReplaceReport, written: str) -> None:
    out = console()
    rows = []
    for p in report.plugins:
        reasons = "; ".join(sorted({s.reason for s in p.skipped}))
        as_plugin = p.replaced - (p.native - p.kept)
        rows.append(
            (
                p.plugin,
                p.found,
                as_plugin,
                p.native - p.kept,
                p.kept,
                f"{len(p.skipped)} ({reasons})" if p.skipped else 0,
            )
        )
    out.print(
        table(
            f"Written to {written} for TensorRT {report.target}",
            ("plugin", "matches found", "plugin nodes", "native ops", "already native", "skipped (reason)"),
            rows,
        )
    )
    out.print(f"target: TensorRT {report.target} ({report.target_source})")
    forms = sorted({(r.op, r.why) for r in report.regions if r.form == "native"})
    for op, why in forms:
        out.print(f"  {op}: {why}")
    if report.opset_raised:
        out.print(f"opset raised {report.opset_raised[0]} -> {report.opset_raised[1]} for the native ops")
    for opset, why in sorted(report.opset_refused.items()):
        out.print(f"opset {opset} not reached (native ops needing it not used): {why}")
    if report.functions_removed:
        out.print(f"local functions removed (no call left): {', '.join(report.functions_removed)}")
    if report.functions_kept:
        out.print(f"local functions kept for onnxruntime: {', '.join(report.functions_kept)}")
    if report.norm_like_left:
        left = report.norm_like_left
        out.print(
            f"{len(left)} norm-like computation(s) left unreplaced (at {', '.join(left[:3])}"
            f"{' ...' if len(left) > 3 else ''}); --explain says which check failed"
        )
    for rule, nodes in report.watched_left.items():
        out.print(
            f"{len(nodes)} node(s) of what '{rule}' replaces left (at {', '.join(nodes[:3])}"
            f"{' ...' if len(nodes) > 3 else ''}); --explain says which check failed"
        )
    if report.explanations:
        out.print(explain_table(report))
        out.print(
            f"{len(report.explanations)} failed attempt(s) in all; --json lists each one "
            "(plugin, rule, anchor, matched, failed at, reason)"
        )


def explain_table(report: ReplaceReport, title: str = "Rules: matches, and the best partial match") -> Any:
    """One row per plugin and rule: what it replaced, or where its furthest attempt stopped (the anchor it
    started from, how many of its nodes matched, the node or constant where it stopped, and why)."""
    rows = []
    for r in report.rules:
        best = r.best
        if r.replaced or best is None:  # a rule that replaced instances: its other attempts are noise
            where, matched, failed_at, reason = "-", "-", "-", "-"
        else:
            where = best.anchor or "-"
            matched = f"{best.depth} of {r.size}"
            failed_at, reason = best.node or "-", best.reason
        rows.append((r.plugin, r.rule, r.replaced, where, matched, failed_at, reason))
    return table(
        title,
        ("plugin", "rule", "replaced", "best attempt at", "matched", "failed at", "reason"),
        rows,
    )


COMMAND = PassCommand(
    "replace",
    REPLACE,
    description=(
        "Find each plugin's patterns in the model (If/Loop bodies included) and replace every instance "
        "by one plugin node; boundary tensors keep their names. Shapes are inferred afterwards."
    ),
    output="where to write the model",
    show=_show,
    report=_report,
    plugins=plugins_help(),
    layout=("model", "output", "plugins", "options", "json"),
    epilog=(
        "--explain adds one row per plugin and rule: what it replaced, and for the rest the attempt that got "
        "furthest (the anchor it started from, how many of the rule's nodes matched, the node or constant "
        "where it stopped, and why); with --only NAME, that plugin's rules only. --json lists every attempt."
    ),
    graph=True,
    around=_infer,
)
add_parser, run = COMMAND.add_parser, COMMAND.run
