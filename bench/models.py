"""Models the benchmarks run on: onnx's light models, PyTorch exports, and generated transformer-like graphs.

Nothing here is committed: generators write into a folder the caller gives (a temporary one, or
``bench/results/`` which git ignores).

* :func:`light_models`: the nine ``light_*.onnx`` models shipped in the onnx wheel.
* :func:`exported_models`: ``scripts/make_example_model.py``'s ExampleNet and the TorchScript exports of
  ``tests/exported_models.py`` (needs torch; those that onnxruntime cannot run are left out).
* :func:`transformer_like`: a chain of blocks, each a decomposed LayerNorm (one LayerNorm plugin instance),
  a self-attention-like MatMul/Softmax part with a foldable ``Shape -> Gather -> Cast -> Sqrt`` scale and a
  ``Shape -> Gather -> Unsqueeze -> Concat -> Reshape`` chain on the dynamic batch dim, and a residual Add;
  :data:`NODES_PER_BLOCK` nodes per block, weights shared between blocks so 100k nodes stay small.
* :func:`large_model`: a model whose weights total ``size_bytes`` (external data), built by
  ``bench/large_model_memory.py``'s ``build`` (in a child process).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gskit.io import model as gsmodel  # noqa: E402

log = logging.getLogger(__name__)

#: Nodes in one block of :func:`transformer_like` (9 of them are the decomposed LayerNorm).
NODES_PER_BLOCK = 26
#: Nodes per block that ``gskit fold`` can remove when the sequence and width dims are static.
FOLDABLE_PER_BLOCK = 4
#: Exported models that onnxruntime cannot run on its own (custom-domain node without a plugin).
_NOT_ON_ORT = frozenset({"deform_conv_custom"})


def light_models() -> list[Path]:
    """The ``light_*.onnx`` models of the installed onnx wheel, sorted by name."""
    return sorted((Path(onnx.__file__).parent / "backend" / "test" / "data" / "light").glob("light_*.onnx"))


def exported_models(directory: Path) -> list[Path]:
    """Export ExampleNet and the ``tests/exported_models.py`` cases (TorchScript exporter) into ``directory``.

    Returns an empty list when torch is not installed.
    """
    try:
        import torch  # noqa: F401
    except ImportError:
        log.warning("torch is not installed: no exported models")
        return []
    from scripts.make_example_model import make_example
    from tests import exported_models as cases

    directory.mkdir(parents=True, exist_ok=True)
    paths = [make_example(directory / "example_net.onnx")]
    for name, case in cases.CASES.items():
        if name in _NOT_ON_ORT or False not in case.exporters:
            continue
        try:
            paths.append(cases.export(name, directory, dynamo=False))
        except cases.ExportUnsupported as err:
            log.warning("skipping exported model %s: %s", name, err)
    return paths


def transformer_like(
    num_nodes: int | None = None, *, blocks: int | None = None, width: int = 16, seq: int = 4, seed: int = 0
) -> gs.Graph:
    """A transformer-like graph with about ``num_nodes`` nodes (or exactly ``blocks`` blocks).

    Input ``x`` is ``("batch", seq, width)`` float32; output ``y`` has the same shape.

    Raises:
        ValueError: neither or both of ``num_nodes`` and ``blocks`` are given.
    """
    if (num_nodes is None) == (blocks is None):
        raise ValueError("give exactly one of num_nodes and blocks")
    count = blocks if blocks is not None else max(1, round(num_nodes / NODES_PER_BLOCK))
    rng = np.random.default_rng(seed)

    def const(name: str, value, dtype=np.float32) -> gs.Constant:
        return gs.Constant(name, np.asarray(value, dtype=dtype))

    axes, two, eps = const("axes", [-1], np.int64), const("two", 2.0), const("eps", 1e-5)
    gamma, beta = (
        const("gamma", 1 + 0.1 * rng.standard_normal(width)),
        const("beta", 0.1 * rng.standard_normal(width)),
    )
    wq = const("wq", rng.standard_normal((width, width)) / np.sqrt(width))
    wk = const("wk", rng.standard_normal((width, width)) / np.sqrt(width))
    idx_batch, idx_width = const("idx0", 0, np.int64), const("idx2", 2, np.int64)
    zero_axis, rest = const("unsq_axes", [0], np.int64), const("rest", [-1, width], np.int64)
    x = gs.Variable("x", np.float32, ("batch", seq, width))
    nodes: list[gs.Node] = []
    h = x

    def op(name: str, op_type: str, inputs: list, **attrs) -> gs.Variable:
        out = gs.Variable(name)
        nodes.append(gs.Node(op_type, name, attrs, inputs, [out]))  # graph.layer is quadratic in graph size
        return out

    for i in range(count):
        p = f"b{i}_"
        mean = op(p + "mean", "ReduceMean", [h, axes])
        d = op(p + "sub", "Sub", [h, mean])
        sq = op(p + "pow", "Pow", [d, two])
        var = op(p + "var", "ReduceMean", [sq, axes])
        ve = op(p + "add_eps", "Add", [var, eps])
        std = op(p + "sqrt", "Sqrt", [ve])
        n = op(p + "div", "Div", [d, std])
        nw = op(p + "gamma", "Mul", [n, gamma])
        ln = op(p + "ln", "Add", [nw, beta])
        q = op(p + "q", "MatMul", [ln, wq])
        k = op(p + "k", "MatMul", [ln, wk])
        kt = op(p + "kt", "Transpose", [k], perm=[0, 2, 1])
        scores = op(p + "scores", "MatMul", [q, kt])
        shape = op(p + "shape", "Shape", [ln])  # static width: Shape -> Gather -> Cast -> Sqrt folds
        dim = op(p + "dim", "Gather", [shape, idx_width], axis=0)
        dimf = op(p + "dimf", "Cast", [dim], to=onnx.TensorProto.FLOAT)
        scale = op(p + "scale", "Sqrt", [dimf])
        scaled = op(p + "scaled", "Div", [scores, scale])
        probs = op(p + "softmax", "Softmax", [scaled], axis=-1)
        attn = op(p + "attn", "MatMul", [probs, ln])
        ashape = op(p + "ashape", "Shape", [attn])  # dynamic batch: x.view(x.size(0), -1, width) stays
        batch = op(p + "batch", "Gather", [ashape, idx_batch], axis=0)
        batch1 = op(p + "batch1", "Unsqueeze", [batch, zero_axis])
        target = op(p + "target", "Concat", [batch1, rest], axis=0)
        flat = op(p + "reshape", "Reshape", [attn, target])
        h = op(p + "residual", "Add", [h, flat])
    h.name = "y"
    h.dtype, h.shape = np.float32, ("batch", seq, width)
    return gs.Graph(nodes=nodes, inputs=[x], outputs=[h], opset=18, name="transformer_like")


def write_transformer_like(path: Path, num_nodes: int | None = None, *, blocks: int | None = None) -> Path:
    """Write :func:`transformer_like` to ``path`` (through ``gskit.io.model.save``) and return it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return gsmodel.save(transformer_like(num_nodes, blocks=blocks), path)


def large_model(path: Path, size_bytes: int) -> dict:
    """Write a MatMul chain whose float32 weights total about ``size_bytes`` as external data.

    Reuses ``bench/large_model_memory.py``'s ``build``. Returns its info (``weights``, ``weight_bytes``).
    """
    from bench.large_model_memory import _run_stage

    path.parent.mkdir(parents=True, exist_ok=True)
    return _run_stage("build", str(path), str(size_bytes))  # in a child: keeps this process small


def node_count(model: onnx.ModelProto | onnx.GraphProto) -> int:
    """Nodes in a model's graph and all its subgraphs."""
    graph = model.graph if isinstance(model, onnx.ModelProto) else model
    total = 0
    for node in graph.node:
        total += 1
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                total += node_count(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                total += sum(node_count(g) for g in attr.graphs)
    return total
