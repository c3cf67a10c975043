"""``gskit plugin check NAME MODEL`` and ``gskit plugin derive NAME``: what a plugin author runs.

``check`` is the loop while writing a plugin: its rules and what each replaced in MODEL (or where its best
attempt stopped), each plugin node against the region it replaced on onnxruntime, the stubs still left.
``derive`` writes the plugin's ``derived_patterns.json``: the rules its ``from_torch`` calls get with the
installed torch, so the plugin loads them without torch.
"""

from __future__ import annotations

import argparse

from gskit.cli import add_plugins_option
from gskit.cli.command import add_json, add_output, subcommand
from gskit.io import report

#: What each stub part still needs, for the check's last lines.
STUB_HINTS = {
    "reference": "reference.py: the numpy reference (onnxruntime runs plugin nodes through it)",
    "kernel": "kernel.py: the GPU kernel",
    "trt_plugin": "trt_plugin.py: the TensorRT plugin (it calls the kernel)",
}


#: ``--help``: the command's line in ``gskit --help`` and its description.
CHECK_HELP = "replace one plugin's patterns in MODEL, compare each node with what it replaced, list stubs"
CHECK_DESCRIPTION = (
    "The plugin author's loop: load the plugin (derived rules included), report each rule and what "
    "it replaced in MODEL or where its best attempt stopped, compare each plugin node with the "
    "region it replaced on onnxruntime (compare --per-plugin), and name the parts still stubs. "
    "Exit 0 when something was replaced and every node matches, 1 otherwise."
)
DERIVE_HELP = "write the plugin's derived_patterns.json (its from_torch rules, for loads without torch)"
DERIVE_DESCRIPTION = (
    "Derive the rules of the plugin's from_torch calls with the installed torch (or take them from "
    "the user cache where this torch derived them already) and write them to derived_patterns.json "
    "beside the PyTorch code, keeping the rules other torch versions wrote there. Ship that file "
    "with the plugin: without torch, gskit loads derived rules from it."
)


def add_parsers(actions: argparse._SubParsersAction) -> None:
    check = subcommand(actions, "check", help=CHECK_HELP, description=CHECK_DESCRIPTION, model=None)
    check.add_argument(
        "name", metavar="NAME", help="the plugin: op name (RMSNorm), namespace::name or folder"
    )
    check.add_argument("model", metavar="MODEL", help="an ONNX model the plugin is meant for")
    add_output(check, "keep the prepared copy here (default: not kept)", required=False)
    check.add_argument("--atol", type=float, default=1e-5, help="absolute tolerance (default 1e-5)")
    check.add_argument("--rtol", type=float, default=1e-5, help="relative tolerance (default 1e-5)")
    add_plugins_option(check)
    add_json(check, "print JSON")
    check.set_defaults(func=run_check)

    derive = subcommand(actions, "derive", help=DERIVE_HELP, description=DERIVE_DESCRIPTION, model=None)
    derive.add_argument("name", metavar="NAME", help="the plugin: op name, namespace::name or folder")
    derive.add_argument("--fresh", action="store_true", help="export again even when the user cache has them")
    add_plugins_option(derive)
    add_json(derive, "print JSON")
    derive.set_defaults(func=run_derive)


def run_check(args: argparse.Namespace) -> int:
    from gskit.cli.replace import explain_table
    from gskit.compare.outputs import check_tolerances
    from gskit.passes.patterns import ReplaceReport
    from gskit.pipeline.plugin_check import check_plugin

    check_tolerances(args.atol, args.rtol)
    result = check_plugin(
        args.name, args.model, plugins=args.plugins, output=args.output, atol=args.atol, rtol=args.rtol
    )
    if args.json:
        report.print_json({**report.to_jsonable(result), "passed": result.passed})
        return 0 if result.passed else 1
    out = report.console()
    out.print(f"{result.plugin} from {result.source or '?'}")
    for line in result.derived:
        out.print(f"  {line}")
    title = f"{len(result.rules)} rule(s) on {result.model}: {result.replaced} replaced"
    out.print(explain_table(ReplaceReport(rules=result.rules), title=title))
    for skip in result.skipped:
        out.print(f"skipped at {skip.anchor} ({skip.rule}): {skip.reason}")
    if result.comparison is not None:
        from gskit.cli.compare import print_plugins

        print_plugins(result.comparison, as_json=False)
    elif result.comparison_error:
        out.print(f"per-plugin comparison did not run: {result.comparison_error}")
    elif not result.replaced:
        out.print("nothing replaced: the row of each rule says where its best attempt stopped")
    if result.prepared:
        out.print(f"prepared copy: {result.prepared}")
    if result.stubs:
        out.print("still stubs:")
        for part in result.stubs:
            out.print(f"  {STUB_HINTS.get(part, part)}")
    else:
        out.print("no stubs left (reference, kernel, TensorRT plugin)")
    out.print(report.verdict(result.passed))
    return 0 if result.passed else 1


def run_derive(args: argparse.Namespace) -> int:
    from gskit.errors import GskitError
    from gskit.pipeline.plugin_check import find_plugin
    from gskit.plugin.derive import read_cache_file, sources_of, write_plugin_cache
    from gskit.plugin.discovery import load_plugins

    spec = find_plugin(load_plugins(args.plugins), args.name)
    sources = sources_of(spec.patterns)
    if not sources:
        raise GskitError(
            f"{spec.qualified_name}: its patterns come from no from_torch call; nothing to derive"
        )
    written = write_plugin_cache(sources, fresh=args.fresh)
    rows = [
        (str(path), entry.function, entry.torch, len(entry.rules), "; ".join(entry.failed[:2]) or "-")
        for path in written
        for entry in read_cache_file(path)
    ]
    if args.json:
        report.print_json(
            [
                dict(zip(("file", "function", "torch", "rules", "not exported"), row, strict=True))
                for row in rows
            ]
        )
        return 0
    out = report.console()
    out.print(
        report.table(
            f"derived rules of {spec.qualified_name}",
            ("file", "function", "torch", "rules", "forms that did not export"),
            rows,
        )
    )
    return 0
