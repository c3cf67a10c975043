"""``gskit plugin list``: the plugins gskit can find and which implementations each one has."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from gskit import report
from gskit.plugin import REQUIRED, load_plugins, plugin_files


@dataclass(frozen=True)
class PluginRow:
    """One plugin as ``gskit plugin list`` shows it."""

    namespace: str
    name: str
    version: str
    attributes: list[str]
    patterns: int
    implementations: list[str]
    source: str | None


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("plugin", help="list the plugins gskit finds", description=__doc__)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="namespace, name, version, attributes and implementations")
    listing.add_argument(
        "--plugins",
        action="append",
        metavar="DIR",
        help="plugin folder (repeatable; default: $GSKIT_PLUGINS or plugins/)",
    )
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    rows = []
    for spec in sorted(load_plugins(args.plugins), key=lambda s: s.key):
        attrs = [
            f"{a.name}: {a.type.value}" + ("" if a.default is REQUIRED else f" = {_short(a.default)}")
            for a in spec.attributes
        ]
        found = [kind for kind, path in plugin_files(spec).items() if path is not None]
        rows.append(
            PluginRow(
                spec.namespace,
                spec.name,
                spec.version,
                attrs,
                len(spec.patterns),
                found,
                str(spec.source) if spec.source else None,
            )
        )
    if args.json:
        report.print_json(rows)
        return 0
    columns = ("namespace", "name", "version", "attributes", "patterns", "implementations")
    table_rows = [
        (
            r.namespace,
            r.name,
            r.version,
            "\n".join(r.attributes) or "-",
            r.patterns,
            ", ".join(r.implementations) or "-",
        )
        for r in rows
    ]
    report.console().print(report.table(f"{len(rows)} plugin(s)", columns, table_rows))
    return 0


def _short(value: object) -> str:
    text = repr(value.tolist() if hasattr(value, "tolist") else value)
    return text if len(text) <= 24 else text[:21] + "..."
