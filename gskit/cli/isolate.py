"""``gskit isolate MODEL --inputs A,B --outputs C -o SUB [--json]``: extract a subgraph by tensor names."""

from __future__ import annotations

import argparse
from typing import Any

import onnx_graphsurgeon as gs

from gskit.cli import add_plugins_option
from gskit.cli.options import add_options, options_from_args
from gskit.io.model import load, resolve_output, save, to_graph
from gskit.io.report import console, print_json, table
from gskit.passes.isolate import ISOLATE, IsolateOptions
from gskit.passes.transform import run_pass
from gskit.plugin.discovery import load_plugins


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "isolate",
        help="extract the subgraph between named tensors into a new model",
        description=(
            "Extract the subgraph that computes --outputs from --inputs into a new model. Weights are "
            "never loaded into memory: they are streamed from the model's data file to the new one, so "
            "models over 2 GB work."
        ),
    )
    parser.add_argument("model", help="the .onnx file")
    add_options(parser, IsolateOptions)
    parser.add_argument("-o", "--output", required=True, help="the subgraph's .onnx file")
    add_plugins_option(parser, ", for plugin output types")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out = resolve_output(args.model, args.output, in_place=False)
    graph = to_graph(load(args.model, load_weights=False))
    options = options_from_args(args, IsolateOptions)
    sub = run_pass(ISOLATE, graph, options, plugins=load_plugins(args.plugins)).model
    written = save(sub, out)
    result = {
        "model": args.model,
        "output": str(written),
        "nodes_before": len(graph.nodes),
        "nodes_after": len(sub.nodes),
        "inputs": [_tensor(t) for t in sub.inputs],
        "outputs": [_tensor(t) for t in sub.outputs],
    }
    if args.json:
        print_json(result)
        return 0
    rows = [("input", t["name"], t["dtype"], t["shape"]) for t in result["inputs"]]
    rows += [("output", t["name"], t["dtype"], t["shape"]) for t in result["outputs"]]
    out_console = console()
    out_console.print(table(f"Subgraph written to {written}", ("", "name", "dtype", "shape"), rows))
    out_console.print(f"nodes (main graph): {result['nodes_before']} -> {result['nodes_after']}")
    return 0


def _tensor(tensor: gs.Tensor) -> dict[str, Any]:
    dtype = tensor.dtype
    shape = None if tensor.shape is None else [d if isinstance(d, (int, str)) else None for d in tensor.shape]
    return {"name": tensor.name, "dtype": getattr(dtype, "name", str(dtype)), "shape": shape}
