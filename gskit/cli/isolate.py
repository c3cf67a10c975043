"""``gskit isolate MODEL --inputs A,B --outputs C -o SUB [--json]``: extract a subgraph by tensor names."""

from __future__ import annotations

from typing import Any

import onnx_graphsurgeon as gs

from gskit.cli import plugins_help
from gskit.cli.command import PassCommand, Ran
from gskit.io.report import console, table
from gskit.passes.isolate import ISOLATE


def _report(ran: Ran) -> dict[str, Any]:
    sub = ran.result.model
    return {
        "model": ran.args.model,
        "output": str(ran.written),
        "nodes_before": len(ran.model.nodes),  # the pass copies: the given graph is the whole model
        "nodes_after": len(sub.nodes),
        "inputs": [_tensor(t) for t in sub.inputs],
        "outputs": [_tensor(t) for t in sub.outputs],
    }


def _show(ran: Ran) -> None:
    result = _report(ran)
    rows = [("input", t["name"], t["dtype"], t["shape"]) for t in result["inputs"]]
    rows += [("output", t["name"], t["dtype"], t["shape"]) for t in result["outputs"]]
    out = console()
    out.print(table(f"Subgraph written to {result['output']}", ("", "name", "dtype", "shape"), rows))
    out.print(f"nodes (main graph): {result['nodes_before']} -> {result['nodes_after']}")


def _tensor(tensor: gs.Tensor) -> dict[str, Any]:
    dtype = tensor.dtype
    shape = None if tensor.shape is None else [d if isinstance(d, (int, str)) else None for d in tensor.shape]
    return {"name": tensor.name, "dtype": getattr(dtype, "name", str(dtype)), "shape": shape}


COMMAND = PassCommand(
    "isolate",
    ISOLATE,
    description=(
        "Extract the subgraph that computes --outputs from --inputs into a new model. Weights are "
        "never loaded into memory: they are streamed from the model's data file to the new one, so "
        "models over 2 GB work."
    ),
    output="the subgraph's .onnx file",
    show=_show,
    report=_report,
    json="print the result as JSON",
    plugins=plugins_help(", for plugin output types"),
    layout=("model", "options", "output", "plugins", "json"),
    weights=False,
    graph=True,
)
add_parser, run = COMMAND.add_parser, COMMAND.run
