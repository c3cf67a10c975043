"""``gskit check-trt MODEL [--plugins DIR]... [--json]``: nodes TensorRT's parser will not take."""

from __future__ import annotations

import argparse

from gskit.backends.trt import BACKENDS
from gskit.backends.trt_check import TrtSupportReport, check_trt
from gskit.cli.command import add_json, subcommand
from gskit.io.report import console, print_json, table

#: ``--help``: the command's line in ``gskit --help`` and its description.
DESCRIPTION = (
    "Check a model against TensorRT's ONNX parser for a target TensorRT version (full TensorRT, else "
    "TensorRT-RTX, where its parser fits the target, else the target's table of what the parser "
    "imports). Exits 1 when a node is unsupported or a plugin node is unusable."
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subcommand(subparsers, "check-trt", description=DESCRIPTION)
    parser.add_argument(
        "--plugins",
        action="append",
        metavar="DIR",
        default=None,
        help="a plugin folder (gskit specs, trt_plugin.py, .so libraries); repeatable; default: plugins/",
    )
    parser.add_argument("--backend", choices=BACKENDS, default="auto", help="what answers (default: auto)")
    parser.add_argument(
        "--tensorrt",
        metavar="VERSION",
        help="the TensorRT version to answer for, e.g. 8.6, 10.3, 11 (default: the installed TensorRT, else "
        "the newest gskit knows); a parser of another line gives way to that version's table",
    )
    add_json(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    report = check_trt(args.model, plugins=args.plugins, backend=args.backend, target=args.tensorrt)
    if args.json:
        print_json(report)
    else:
        print_tables(report)
    return 0 if report.ok else 1


def print_tables(report: TrtSupportReport) -> None:
    """Print the verdict, the nodes with issues, the parser's partitions and the notes."""
    out = console()
    verdict = "OK" if report.ok else "NOT OK"
    # The model's path last: a long path wraps, the verdict and what answered stay on one line.
    out.print(
        f"{verdict} for TensorRT {report.target} (answered by {report.source}, {report.node_count} nodes): "
        f"{report.model}"
    )
    if report.issues:
        rows = [
            (i.index, i.name, f"{i.domain or 'ai.onnx'}::{i.op_type}", i.status, i.reason)
            for i in report.issues
        ]
        out.print(table("Nodes", ("#", "node", "op", "status", "reason"), rows))
    if report.partitions:
        rows = [
            (k, "yes" if p.supported else "-", len(p.nodes), _names(p.nodes))
            for k, p in enumerate(report.partitions)
        ]
        out.print(table("Parser partitions", ("partition", "whole model", "nodes", "node names"), rows))
    for error in report.model_errors:
        out.print(f"model error: {error}")
    for note in report.notes:
        out.print(f"note: {note}")


def _names(names: tuple[str, ...], limit: int = 6) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... (+{len(names) - limit})" if len(names) > limit else "")
