"""``gskit edit``: rename tensors, change inputs, insert/remove nodes, set attributes, expose tensors.

The flags are ``gskit.passes.edit.EditOptions``' fields (the recipe's ``edit`` step takes the same options).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from gskit.cli import add_plugins_option
from gskit.cli.command import add_json, add_output, subcommand
from gskit.cli.options import add_options, options_from_args
from gskit.errors import GskitError
from gskit.io import model as gsmodel
from gskit.io import report
from gskit.passes import edit
from gskit.plugin.ops import is_plugin_node

if TYPE_CHECKING:
    import onnx

    from gskit.plugin.registry import PluginRegistry

_ORDER = (
    "Edits run in this order, whatever the order on the command line: drop initializer inputs, constants to "
    "initializers, rename, input dtype, input shape, remove node, insert after, set/remove attributes, "
    "expose. Later edits use the names left by earlier ones (after --rename use the new name)."
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subcommand(
        subparsers,
        "edit",
        description="Edit an ONNX model and save it (checked, atomic). " + _ORDER,
        model="input .onnx file",
    )
    add_output(p, "output .onnx file", required=False)
    p.add_argument("--in-place", action="store_true", help="overwrite the input model")
    add_options(p, edit.EditOptions)
    add_plugins_option(p, " whose output rules type plugin nodes for --expose, --insert-after, --remove-node")
    add_json(p, "print the changes as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.output and not args.in_place:
        raise GskitError("edit: give -o OUTPUT or --in-place")
    if args.output and args.in_place:
        raise GskitError("edit: give -o OUTPUT or --in-place, not both")
    output = gsmodel.resolve_output(
        args.model, args.output or args.model, in_place=args.in_place, has_in_place=True
    )
    options = options_from_args(args, edit.EditOptions)
    # In place, weights must be in memory: the data file they would be read from is being replaced.
    model = gsmodel.load(args.model, load_weights=args.in_place)
    graph, changes = edit.apply_edits(model, options, plugins=_plugins(model, args.plugins))
    path = gsmodel.save(graph, output, in_place=args.in_place)
    if args.json:
        report.print_json({"output": path, "changes": changes})
        return 0
    out = report.console()
    rows = [(c.step, c.target, c.detail) for c in changes]
    out.print(report.table(f"gskit edit -> {path}", ("step", "target", "change"), rows))
    if not changes:
        out.print("no edits requested; model re-saved")
    return 0


def _plugins(model: onnx.ModelProto, folders: list[str] | None) -> PluginRegistry | None:
    """The plugins that type the model's plugin nodes; none loaded (their imports cost) for a model without
    plugin nodes unless --plugins is given."""
    if not folders and not any(is_plugin_node(n) for g in gsmodel.graph_protos(model.graph) for n in g.node):
        return None
    from gskit.plugin.discovery import load_plugins

    return load_plugins(folders)
