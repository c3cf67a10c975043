"""``gskit inspect MODEL [--tensors] [--nodes] [--json]``: summarize a model without reading its weights, or
list every tensor / node of its main graph."""

from __future__ import annotations

import argparse

from gskit.cli.command import add_json, subcommand
from gskit.io.model import load
from gskit.io.report import console, print_json, table
from gskit.passes.inspect import (
    ModelSummary,
    TensorEntry,
    list_nodes,
    list_tensors,
    shape_text,
    summarize_file,
)
from gskit.plugin.ops import NodeSummary

#: Tensors without shapes listed in the table; --json lists them all.
MAX_MISSING_ROWS = 20


#: ``--help``: the command's line in ``gskit --help`` and its description.
DESCRIPTION = "Summarize an ONNX model without reading its weights (works for models over 2 GB)."


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subcommand(subparsers, "inspect", description=DESCRIPTION)
    add_json(parser, "print the summary as JSON")
    parser.add_argument(
        "--no-infer",
        dest="infer_shapes",
        action="store_false",
        help="skip shape inference (use value_info only)",
    )
    parser.add_argument(
        "--tensors",
        action="store_true",
        help="list every tensor of the main graph instead: name, dtype, shape, producer, consumers",
    )
    parser.add_argument(
        "--nodes",
        action="store_true",
        help="list every node of the main graph instead: name, domain::op, inputs, outputs",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.tensors or args.nodes:
        return _run_listing(args)
    summary = summarize_file(args.model, infer_shapes=args.infer_shapes)
    if args.json:
        print_json(summary.to_json())
    else:
        print_tables(summary)
    return 0


def print_tables(summary: ModelSummary) -> None:
    """Print the summary as rich tables: overview, I/O, ops, custom nodes, functions, missing shapes."""
    out = console()
    init = summary.initializers
    overview = [
        ("model", summary.path or ""),
        ("IR version", summary.ir_version),
        ("producer", summary.producer or "-"),
        ("opsets", ", ".join(f"{domain} {version}" for domain, version in summary.opsets.items())),
        (
            "nodes",
            f"{summary.node_count} main, {summary.subgraph_node_count} in subgraphs, "
            f"{summary.function_node_count} in functions",
        ),
        ("initializers", f"{init.count} ({_size(init.nbytes)}, {init.external_count} on disk)"),
        ("initializers listed as inputs", _names(init.listed_as_inputs)),
    ]
    if summary.shape_inference_error:
        overview.append(("shape inference failed", summary.shape_inference_error))
    if summary.missing_data_files:
        overview.append(
            (
                "external data missing",
                f"{', '.join(summary.missing_data_files)} (inspect reads no weights; other commands need it)",
            )
        )
    out.print(table("Model", ("field", "value"), overview))

    io_rows = [("input", t.name, t.dtype, t.shape_text()) for t in summary.inputs]
    io_rows += [("output", t.name, t.dtype, t.shape_text()) for t in summary.outputs]
    out.print(table("Inputs and outputs", ("", "name", "dtype", "shape"), io_rows))

    scopes = summary.ops_by_scope
    op_rows = [
        (op, count, scopes["main"].get(op, 0), scopes["subgraph"].get(op, 0))
        for op, count in summary.ops.items()
    ]
    out.print(table("Ops (main graph + subgraphs)", ("op", "count", "main", "subgraphs"), op_rows))

    if summary.custom_nodes:
        rows = [
            (
                n.name,
                n.domain,
                n.op_type,
                n.scope,
                n.plugin_namespace,
                n.plugin_version,
                "yes" if n.calls_function else "",
            )
            for n in summary.custom_nodes
        ]
        columns = ("node", "domain", "op", "scope", "plugin_namespace", "plugin_version", "local function")
        out.print(table("Custom-domain nodes", columns, rows))
    if summary.functions:
        rows = [(f.key, f.overload, f.node_count, f.call_count) for f in summary.functions]
        out.print(table("Local functions", ("function", "overload", "nodes", "calls"), rows))
        out.print(table("Ops inside local functions", ("op", "count"), scopes["function"].items()))
    missing = summary.missing_shapes
    if missing:
        rows = [(name,) for name in missing[:MAX_MISSING_ROWS]]
        if len(missing) > MAX_MISSING_ROWS:
            rows.append((f"... and {len(missing) - MAX_MISSING_ROWS} more (see --json)",))
        out.print(table("Tensors without shape information", (f"tensor ({len(missing)})",), rows))


def _run_listing(args: argparse.Namespace) -> int:
    model = load(args.model, load_weights=False, allow_missing_data=True)  # names and types only
    tensors = list_tensors(model, infer_shapes=args.infer_shapes) if args.tensors else None
    nodes = list_nodes(model) if args.nodes else None
    if args.json:
        print_json({k: v for k, v in (("tensors", tensors), ("nodes", nodes)) if v is not None})
        return 0
    out = console()
    if tensors is not None:
        out.print(table(f"Tensors ({len(tensors)})", _TENSOR_COLUMNS, [_tensor_row(t) for t in tensors]))
    if nodes is not None:
        out.print(table(f"Nodes ({len(nodes)})", ("node", "op", "inputs", "outputs"), map(_node_row, nodes)))
    return 0


_TENSOR_COLUMNS = ("tensor", "dtype", "shape", "kind", "producer", "consumers")


def _tensor_row(tensor: TensorEntry) -> tuple[str, ...]:
    kind = f"{tensor.kind}, output" if tensor.is_output else tensor.kind
    shape = shape_text(tensor.shape)
    return tensor.name, tensor.dtype, shape, kind, tensor.producer or "-", str(tensor.consumers)


def _node_row(node: NodeSummary) -> tuple[str, ...]:
    return node.name or "-", node.op, ", ".join(node.inputs), ", ".join(node.outputs)


def _names(names: tuple[str, ...], limit: int = 5) -> str:
    if not names:
        return "-"
    shown = ", ".join(names[:limit])
    return f"{len(names)}: {shown}" + (", ..." if len(names) > limit else "")


def _size(nbytes: int) -> str:
    if nbytes < 1024:
        return f"{nbytes} B"
    for exponent, unit in ((3, "GiB"), (2, "MiB"), (1, "KiB")):
        if nbytes >= 1024**exponent:
            return f"{nbytes / 1024**exponent:.1f} {unit}"
    raise AssertionError("unreachable")
