"""How `gskit.patterns.replace` scales: transformer-like graphs of decomposed LayerNorms and MatMuls.

Each block is a decomposed LayerNorm (9 nodes), MatMul+Add, Relu, MatMul+Add and a residual Add
(15 nodes). Run: ``python bench/replace_scaling.py [--nodes 10000 50000 100000] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import onnx_graphsurgeon as gs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gskit.patterns import replace  # noqa: E402
from plugins.layer_norm.spec import SPEC as LAYER_NORM  # noqa: E402
from plugins.rms_norm.spec import SPEC as RMS_NORM  # noqa: E402

NODES_PER_BLOCK = 15


def transformer_like(num_nodes: int, width: int = 16) -> gs.Graph:
    """A chain of blocks with about ``num_nodes`` nodes; weights are shared to keep memory small."""
    c = lambda name, value: gs.Constant(name, np.asarray(value, dtype=np.float32))  # noqa: E731
    axes, two, eps = gs.Constant("axes", np.array([-1], np.int64)), c("two", 2.0), c("eps", 1e-5)
    w, b = c("w", np.ones(width)), c("b", np.zeros(width))
    m1, m2 = c("m1", np.eye(width)), c("m2", np.eye(width))
    x = gs.Variable("x", np.float32, ("batch", width))
    graph = gs.Graph(inputs=[x], opset=18)
    h = x
    for i in range(max(1, num_nodes // NODES_PER_BLOCK)):
        mean = graph.layer(op="ReduceMean", inputs=[h, axes], outputs=[f"mean{i}"])[0]
        d = graph.layer(op="Sub", inputs=[h, mean], outputs=[f"d{i}"])[0]
        sq = graph.layer(op="Pow", inputs=[d, two], outputs=[f"sq{i}"])[0]
        var = graph.layer(op="ReduceMean", inputs=[sq, axes], outputs=[f"var{i}"])[0]
        ve = graph.layer(op="Add", inputs=[var, eps], outputs=[f"ve{i}"])[0]
        std = graph.layer(op="Sqrt", inputs=[ve], outputs=[f"std{i}"])[0]
        n = graph.layer(op="Div", inputs=[d, std], outputs=[f"n{i}"])[0]
        nw = graph.layer(op="Mul", inputs=[n, w], outputs=[f"nw{i}"])[0]
        ln = graph.layer(op="Add", inputs=[nw, b], outputs=[f"ln{i}"])[0]
        f1 = graph.layer(op="MatMul", inputs=[ln, m1], outputs=[f"f1_{i}"])[0]
        f1b = graph.layer(op="Add", inputs=[f1, b], outputs=[f"f1b{i}"])[0]
        r = graph.layer(op="Relu", inputs=[f1b], outputs=[f"r{i}"])[0]
        f2 = graph.layer(op="MatMul", inputs=[r, m2], outputs=[f"f2_{i}"])[0]
        f2b = graph.layer(op="Add", inputs=[f2, b], outputs=[f"f2b{i}"])[0]
        h = graph.layer(op="Add", inputs=[h, f2b], outputs=[f"h{i}"])[0]
    h.dtype, h.shape = np.float32, ("batch", width)
    graph.outputs = [h]
    return graph


def measure(num_nodes: int) -> dict[str, float | int]:
    graph = transformer_like(num_nodes)
    nodes = len(graph.nodes)
    start = time.perf_counter()
    report = replace(graph, [LAYER_NORM, RMS_NORM])
    seconds = time.perf_counter() - start
    return {
        "nodes": nodes,
        "instances_replaced": report.replaced,
        "seconds": round(seconds, 4),
        "us_per_node": round(seconds / nodes * 1e6, 2),
        "nodes_after": len(graph.nodes),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[2000, 10000], help="graph sizes (default: quick)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    results = [measure(n) for n in args.nodes]
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"{'nodes':>8} {'replaced':>9} {'seconds':>9} {'us/node':>9}")
        for r in results:
            print(f"{r['nodes']:>8} {r['instances_replaced']:>9} {r['seconds']:>9.3f} {r['us_per_node']:>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
