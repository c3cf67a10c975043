"""``gskit plugin list``: the plugins gskit can find, where each one came from, and its implementations.

``gskit plugin new`` writes a plugin folder; ``gskit plugin check`` and ``gskit plugin derive``
(``gskit/cli/plugin_author.py``) are the author's loop and the derived-rule cache.

Sources, later ones winning for the same plugin: the shipped plugins, installed packages' ``gskit.plugins``
entry points, ``$GSKIT_PLUGINS``, ``./plugins`` (where ``gskit plugin new`` writes) and ``--plugins DIR``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from gskit.cli import COMMANDS, add_plugins_option, plugin_author
from gskit.cli.command import add_json
from gskit.io import report
from gskit.plugin.discovery import LOCAL_PLUGINS, load_plugins, plugin_files
from gskit.plugin.native import choose_form
from gskit.plugin.spec import REQUIRED, PluginSpec
from gskit.plugin.stubs import stub_parts
from gskit.plugin.target import TensorRTTarget


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
    origin: str
    #: implementations that are still the stubs ``gskit plugin new`` wrote (raise NotImplementedError)
    stubs: list[str]
    #: its forms: ``plugin node`` (unless the spec has none) and each native form
    #: (``LayerNormalization-17 from TensorRT 8.6``)
    forms: list[str]
    #: with ``--tensorrt``: what a matched region becomes for that version (``form``: native, plugin or none;
    #: ``op``; ``why``), else None
    for_target: dict[str, str] | None = None
    #: of ``patterns``, the rules derived from PyTorch code (``from_torch``)
    derived: int = 0
    #: the ONNX domain of its nodes (the namespace, except for TensorRT's own plugins: namespace "")
    domain: str = ""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("plugin", help=COMMANDS["plugin"], description=__doc__)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="namespace, name, version, attributes and implementations")
    add_plugins_option(listing)
    listing.add_argument(
        "--tensorrt",
        metavar="VERSION",
        help="also show what each plugin's patterns become for this TensorRT version (native op or plugin)",
    )
    add_json(listing, "print JSON")
    listing.set_defaults(func=run)
    _add_new_parser(actions)
    plugin_author.add_parsers(actions)


def run(args: argparse.Namespace) -> int:
    rows = []
    registry = load_plugins(args.plugins)
    target = TensorRTTarget.parse(args.tensorrt) if args.tensorrt else None
    for spec in sorted(registry, key=lambda s: s.key):
        attrs = [
            f"{a.name}: {a.type.value}" + ("" if a.default is REQUIRED else f" = {_short(a.default)}")
            for a in spec.attributes
        ]
        found = [kind for kind, path in plugin_files(spec).items() if path is not None]
        if spec.shipped is not None:  # TensorRT implements it: no kernel, no trt_plugin.py
            found.append(spec.shipped.life())
        rows.append(
            PluginRow(
                spec.namespace,
                spec.name,
                spec.version,
                attrs,
                len(spec.patterns),
                found,
                str(spec.source) if spec.source else None,
                registry.origin(spec),
                list(stub_parts(spec)),
                _forms(spec),
                None if target is None else _for_target(spec, target),
                derived=sum(1 for rule in spec.patterns if hasattr(rule, "forms")),
                domain=spec.domain,
            )
        )
    if args.json:
        report.print_json(rows)
        return 0
    columns = ("namespace", "name", "version", "attributes", "patterns", "forms", "implementations", "from")
    if target is not None:
        columns = (*columns[:6], f"for TensorRT {target}", *columns[6:])
    table_rows = []
    for r in rows:
        cells = [
            # TensorRT's own plugins: namespace "" and their nodes' domain
            r.namespace if r.namespace == r.domain else f'"{r.namespace}" ({r.domain})',
            r.name,
            r.version,
            report.lines(r.attributes) if r.attributes else "-",
            f"{r.patterns} ({r.derived})" if r.derived else r.patterns,
            report.lines(r.forms),
        ]
        if r.for_target is not None:
            cells.append(r.for_target["short"])
        cells += [
            report.lines(_short_kind(kind, r) for kind in r.implementations) if r.implementations else "-",
            r.origin or "-",
        ]
        table_rows.append(tuple(cells))
    out = report.console()
    out.print(report.table(f"{len(rows)} plugin(s)", columns, table_rows))
    if any(r.derived for r in rows):
        out.print("patterns: N (M): N rules, M of them derived from PyTorch code (from_torch)")
    return 0


def _short_kind(kind: str, row: PluginRow) -> str:
    """An implementation as the table shows it: stubs marked, TensorRT's library by name (JSON: the rest)."""
    if kind in row.stubs:
        return f"{kind} (stub)"
    return kind.split(" since ")[0]


def _forms(spec: PluginSpec) -> list[str]:
    """``plugin node`` and ``LayerNormalization-17 from TensorRT 8.6`` for each native form."""
    native = [f"{form.label} from TensorRT {form.tensorrt}" for form in spec.native]
    return (["plugin node"] if spec.plugin_form else []) + native


def _for_target(spec: PluginSpec, target: TensorRTTarget) -> dict[str, str]:
    """What a region of this plugin becomes for ``target`` with the default attributes (a region's own
    attributes can rule a native form out, e.g. DeformConv's asymmetric pads): ``form``, ``op``, ``why`` and a
    ``short`` cell for the table."""
    defaults = {a.name: a.default for a in spec.attributes}
    choice = choose_form(spec, target, defaults)
    later = [f"{f.label} from {f.tensorrt}" for f in spec.native if not target.at_least(f.tensorrt)]
    if choice.kind == "native" and choice.native is not None:
        op, short = choice.native.label, f"{choice.native.label} (native)"
    elif choice.kind == "plugin":
        op, short = spec.qualified_name, "plugin node" + (f" ({', '.join(later)})" if later else "")
    else:
        op, short = "", "left as it is" + (f" ({', '.join(later)})" if later else "")
    return {"form": choice.kind, "op": op, "why": choice.why, "short": short}


def _short(value: object) -> str:
    text = repr(value.tolist() if hasattr(value, "tolist") else value)
    return text if len(text) <= 24 else text[:21] + "..."


# ---- `gskit plugin new` (gskit/plugin/scaffold.py) ---------------------------------------------------------


def _add_new_parser(actions: argparse._SubParsersAction) -> None:
    new = actions.add_parser(
        "new", help="create plugins/NAME/: spec, reference and kernel stubs, TensorRT plugin, README, test"
    )
    new.add_argument("name", metavar="NAME", help="plugin folder name (snake_case); op name = its CamelCase")
    new.add_argument(
        "--from-node", metavar="MODEL:NODE", help="copy op name, domain, attributes and I/O dtypes of a node"
    )
    new.add_argument(
        "--dir",
        default=LOCAL_PLUGINS,
        help=f"plugins folder to create it in (default: {LOCAL_PLUGINS}, which gskit searches when run here)",
    )
    new.add_argument("--namespace", default="gskit", help="plugin namespace when the node has no domain")
    add_json(new, "print JSON")
    new.set_defaults(func=run_new)


def run_new(args: argparse.Namespace) -> int:
    from gskit.plugin.scaffold import new_plugin

    files = new_plugin(args.name, args.dir, from_node=args.from_node, namespace=args.namespace)
    if args.json:
        report.print_json([str(f) for f in files])
        return 0
    out = report.console()
    out.print(report.table(f"created {files[0].parent}", ("file",), [(str(f),) for f in files]))
    out.print(_where_found(Path(args.dir)))
    return 0


def _where_found(folder: Path) -> str:
    """How gskit will find a plugin created in ``folder`` (a plugin made where it is used is found there)."""
    if folder.resolve() == Path(LOCAL_PLUGINS).resolve():
        return f"gskit finds it when run from this folder (./{LOCAL_PLUGINS}): try `gskit plugin list`"
    return f"gskit finds it with `--plugins {folder}`, or with {folder} in $GSKIT_PLUGINS"
