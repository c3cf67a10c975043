"""How `gskit.passes.patterns.replace` scales: transformer-like graphs of decomposed LayerNorms and MatMuls.

Each block is a decomposed LayerNorm (9 nodes), MatMul+Add, Relu, MatMul+Add and a residual Add
(15 nodes). Run: ``python bench/replace_scaling.py [--nodes 10000 50000 100000] [--all-plugins] [--json]``;
the LayerNorm and RMSNorm plugins' rules by default, every plugin of ``plugins/`` with ``--all-plugins`` (as
``bench/run.py``'s replace suite). ``--blocks 400 4000`` measures ``bench/run.py``'s graphs instead
(``bench.models.transformer_like``: 26 nodes and one LayerNorm per block, so 400 blocks are the goal's 400
instances in 10.4k nodes). ``--runs N`` times each size N times, the sizes taking turns, and reports medians
(the ratio of the largest to the smallest is noisy on a shared machine). Prints the time of the ``replace``
call per size, t(largest)/t(smallest).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx_graphsurgeon as gs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gskit.passes.patterns import replace  # noqa: E402
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
    nodes = graph.nodes

    def op(op_type: str, inputs: list[gs.Tensor], out: str) -> gs.Variable:
        # gs.Graph.layer is quadratic in graph size; plain nodes keep generation linear.
        result = gs.Variable(out)
        nodes.append(gs.Node(op_type, name=out, inputs=inputs, outputs=[result]))
        return result

    h = x
    for i in range(max(1, num_nodes // NODES_PER_BLOCK)):
        mean = op("ReduceMean", [h, axes], f"mean{i}")
        d = op("Sub", [h, mean], f"d{i}")
        var = op("ReduceMean", [op("Pow", [d, two], f"sq{i}"), axes], f"var{i}")
        std = op("Sqrt", [op("Add", [var, eps], f"ve{i}")], f"std{i}")
        ln = op("Add", [op("Mul", [op("Div", [d, std], f"n{i}"), w], f"nw{i}"), b], f"ln{i}")
        f1 = op("Add", [op("MatMul", [ln, m1], f"f1_{i}"), b], f"f1b{i}")
        f2 = op("Add", [op("MatMul", [op("Relu", [f1], f"r{i}"), m2], f"f2_{i}"), b], f"f2b{i}")
        h = op("Add", [h, f2], f"h{i}")
    h.dtype, h.shape = np.float32, ("batch", width)
    graph.outputs = [h]
    return graph


def measure(
    num_nodes: int | None = None, plugins: list | None = None, *, blocks: int | None = None
) -> dict[str, float | int]:
    """One ``replace`` call on a fresh graph: ``num_nodes`` nodes of this file's blocks, or ``blocks`` blocks
    of ``bench.models.transformer_like``."""
    if blocks is not None:
        from bench.models import transformer_like as bench_graph

        graph = bench_graph(blocks=blocks)
    else:
        graph = transformer_like(num_nodes or 0)
    nodes = len(graph.nodes)
    start = time.perf_counter()
    # 8.5: older than every native form, so each instance becomes a plugin node (no opset conversion)
    report = replace(graph, plugins or [LAYER_NORM, RMS_NORM], tensorrt="8.5")
    seconds = time.perf_counter() - start
    return {
        "nodes": nodes,
        "instances_replaced": report.replaced,
        "seconds": round(seconds, 4),
        "us_per_node": round(seconds / nodes * 1e6, 2),
        "nodes_after": len(graph.nodes),
    }


def measure_sizes(
    sizes: list[int], plugins: list | None, *, blocks: bool, runs: int
) -> list[dict[str, float | int]]:
    """Each size ``runs`` times, the sizes taking turns; per size the median time (each run's in ``all``)."""
    times: dict[int, list[dict[str, float | int]]] = {size: [] for size in sizes}
    for _ in range(runs):
        for size in sizes:
            result = measure(None, plugins, blocks=size) if blocks else measure(size, plugins)
            times[size].append(result)
    results = []
    for size in sizes:
        seconds = [float(r["seconds"]) for r in times[size]]
        median = statistics.median(seconds)
        first = times[size][0]
        results.append(
            {
                **first,
                "seconds": round(median, 4),
                "us_per_node": round(median / float(first["nodes"]) * 1e6, 2),
                "all": seconds,
            }
        )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--nodes", type=int, nargs="+", default=[2000, 10000], help="graph sizes (default: quick)"
    )
    parser.add_argument(
        "--blocks",
        type=int,
        nargs="+",
        help="blocks of bench/run.py's graph (26 nodes, one LayerNorm each) instead of --nodes",
    )
    parser.add_argument("--runs", type=int, default=1, help="times per size, sizes taking turns (median)")
    parser.add_argument("--all-plugins", action="store_true", help="every plugin's rules (plugins/)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    plugins = None
    if args.all_plugins:
        from gskit.plugin import load_plugins

        plugins = list(load_plugins())
    sizes = args.blocks or args.nodes
    results = measure_sizes(sizes, plugins, blocks=args.blocks is not None, runs=max(1, args.runs))
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"{'nodes':>8} {'replaced':>9} {'seconds':>9} {'us/node':>9}")
        for r in results:
            print(
                f"{r['nodes']:>8} {r['instances_replaced']:>9} {r['seconds']:>9.3f} {r['us_per_node']:>9.2f}"
            )
        if len(results) > 1:
            lo, hi = min(results, key=lambda r: r["nodes"]), max(results, key=lambda r: r["nodes"])
            print(f"t({hi['nodes']})/t({lo['nodes']}) = {hi['seconds'] / lo['seconds']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
