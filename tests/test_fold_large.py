"""gskit.passes.fold on models over 2 GB: batched evaluation, weights read per batch, large results kept on
disk.

The fast tests force the batched mode on small models (``_PARTITION_BYTES = -1``) and check it against the
original model on onnxruntime; the slow test folds a 2.2 GB model in a child process and measures its peak
RSS.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from conftest import LIGHT_MODELS, parse_model

from gskit.backends import ort as gsort
from gskit.errors import GskitError
from gskit.io import model as gsmodel
from gskit.passes import fold as gsfold
from gskit.passes.fold import batched as fold_batched

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def batched(monkeypatch):
    """Batched mode for any model, small batches, and every folded constant over 1 KiB spilled to disk."""
    monkeypatch.setattr(fold_batched, "_PARTITION_BYTES", -1)
    monkeypatch.setattr(fold_batched, "_BATCH_BYTES", 2 * 2**20)
    monkeypatch.setattr(fold_batched, "_SPILL_BYTES", 1024)


def _random_feeds(model: onnx.ModelProto, rng) -> dict[str, np.ndarray]:
    return {
        i.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in i.shape]).astype(np.float32)
        for i in gsort.session(model).get_inputs()
    }


@pytest.mark.parametrize("name", ["light_squeezenet", "light_shufflenet", "light_zfnet512"])
def test_batched_mode_folds_like_graphsurgeon_and_keeps_outputs(name, batched, rng, tmp_path):
    path = next(p for p in LIGHT_MODELS if p.stem == name)
    model = gsmodel.load(path)
    folded, report = gsfold.fold(model, spill_dir=tmp_path / "spill")
    assert report.mode == "batched" and report.batches >= 2 and report.evaluated_nodes > 0
    assert report.spilled_bytes > 0 and any((tmp_path / "spill").iterdir())
    with pytest.MonkeyPatch.context() as mp:  # the reference: graphsurgeon's whole-graph evaluation
        mp.setattr(fold_batched, "_PARTITION_BYTES", 1_500_000_000)
        reference, _ = gsfold.fold(model)
    assert sorted(n.op_type for n in folded.graph.node) == sorted(n.op_type for n in reference.graph.node)
    feeds = _random_feeds(model, rng)
    want, got = gsort.run(model, feeds), gsort.run(folded, feeds)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=0, atol=1e-5, err_msg=key)
    out = gsmodel.save(folded, tmp_path / "folded.onnx")  # streams the spilled constants into its data file
    got = gsort.run(out, feeds)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=0, atol=1e-5, err_msg=key)


CHAIN = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[4,3] x) => (float[4,3] y) <float[3,4] w = {1,2,3,4,5,6,7,8,9,10,11,12}, int64[2] bad = {5,5},
                                    int64[2] s = {4,3}> {
  t = Transpose(w)
  r = Reshape(t, bad)
  u = Reshape(t, s)
  v = Neg(u)
  a = Add(x, v)
  y = Add(a, r)
}
"""


def test_batched_failure_names_the_node_unless_allow_partial(batched):
    model = onnx.parser.parse_model(CHAIN)
    with pytest.raises(GskitError, match=r"node 'Reshape:r'.*allow_partial"):
        gsfold.fold(model)
    folded, report = gsfold.fold(model, allow_partial=True)
    assert len(report.failures) == 1 and "Reshape:r" in report.failures[0]
    # Everything else folded: the transpose (read by the failing Reshape too) and the Reshape -> Neg chain.
    assert [n.op_type for n in folded.graph.node] == ["Reshape", "Add", "Add"]
    values = {t.name: onnx.numpy_helper.to_array(t) for t in folded.graph.initializer}
    w = np.arange(1, 13, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(values["v"], -w.T)
    np.testing.assert_array_equal(values["t"], w.T)


def test_batched_size_threshold_is_reported_not_silent(batched):
    graph = gs.import_onnx(
        parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[64,64] x) => (float[64,64] y) {
      s = Constant <value = int64[2] {64, 64}> ()
      big = ConstantOfShape <value = float[1] {1}> (s)
      y = Add(x, big)
    }""")
    )
    _, report = gsfold.fold(graph, size_threshold=1024)
    assert "ConstantOfShape" in [n.op for n in graph.nodes]
    assert any("size_threshold" in why for why in report.excluded.values())
    _, report = gsfold.fold(graph, size_threshold=None)
    assert [n.op for n in graph.nodes] == ["Add"] and report.spilled_bytes == 64 * 64 * 4


def test_lazy_weights_are_read_per_batch_and_not_kept(tmp_path, rng, monkeypatch):
    """Weights left on disk (load_weights=False) select the batched mode whatever the model's size."""
    monkeypatch.setattr(fold_batched, "_SPILL_BYTES", 1024)
    monkeypatch.setattr(
        fold_batched, "_BATCH_BYTES", 3 * (64 * 48 * 4) * 2
    )  # 3 transposes (read + written) a batch
    weights = [rng.standard_normal((64, 48)).astype(np.float32) for _ in range(6)]
    path = _save_transpose_model(tmp_path / "m.onnx", weights)
    graph = gsmodel.to_graph(gsmodel.load(path, load_weights=False))
    folded, report = gsfold.fold(graph, size_threshold=None)
    assert report.mode == "batched" and report.folded_ops == {"Transpose": 6} and report.batches == 2
    constants = [
        t for t in folded.tensors().values() if isinstance(t, gs.Constant) and t.name.startswith("T")
    ]
    assert len(constants) == 6
    assert all(isinstance(t._values, gs.ir.tensor.LazyValues) for t in constants)  # on disk, not in memory
    out = gsmodel.save(folded, tmp_path / "out.onnx")
    saved = {t.name: onnx.numpy_helper.to_array(t) for t in gsmodel.load(out).graph.initializer}
    for i, w in enumerate(weights):
        np.testing.assert_array_equal(saved[f"T{i}"], w.T)
    x = rng.standard_normal((1, 48)).astype(np.float32)
    want = sum(x @ w.T for w in weights)
    np.testing.assert_allclose(gsort.run(out, {"x": x})["y"], want, rtol=1e-5, atol=1e-4)


# --- a model over 2 GB -----------------------------------------------------------------------------------

BIG_COUNT = 40
BIG_SHAPE = (4096, 3392)  # 55.6 MB of float32 each, 2.22 GB in all


def _pattern(i: int, shape: tuple[int, int]) -> np.ndarray:
    """Cheap, distinct, non-symmetric weights (no RNG: 2 GB of random numbers is slow to draw)."""
    flat = np.arange(shape[0] * shape[1], dtype=np.int64)
    return (((flat * 7 + i * 131) % 1009).astype(np.float32) / 1009.0 - 0.5).reshape(shape)


def _save_transpose_model(path: Path, weights) -> Path:
    """``y = sum_i MatMul(x, Transpose(W_i))`` with ``W_i`` of shape ``[cols, rows]``, ``x`` of ``[1, rows]``.

    The weights (arrays, or callables with a ``shape`` making them) go through a raw file into
    gskit.io.model.save, so the test process never holds them all.
    """
    nodes, acc = [], None
    for i in range(len(weights)):
        nodes.append(onnx.helper.make_node("Transpose", [f"W{i}"], [f"T{i}"], name=f"transpose{i}"))
        nodes.append(onnx.helper.make_node("MatMul", ["x", f"T{i}"], [f"m{i}"], name=f"matmul{i}"))
        if acc is not None:
            nodes.append(onnx.helper.make_node("Add", [acc, f"m{i}"], [f"a{i}"], name=f"add{i}"))
        acc = f"m{i}" if acc is None else f"a{i}"
    nodes.append(onnx.helper.make_node("Identity", [acc], ["y"], name="out"))
    cols, rows = weights[0].shape
    graph = onnx.helper.make_graph(
        nodes,
        "transposes",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, rows])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, cols])],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=8)
    raw = path.parent / "raw.bin"
    with open(raw, "wb") as f:
        for i, w in enumerate(weights):
            values = w() if callable(w) else w
            tensor = model.graph.initializer.add(
                name=f"W{i}", data_type=onnx.TensorProto.FLOAT, dims=values.shape
            )
            tensor.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (
                ("location", raw.name),
                ("offset", str(f.tell())),
                ("length", str(values.nbytes)),
                ("basepath", str(raw.parent)),
            ):
                tensor.external_data.add(key=key, value=value)
            values.tofile(f)
    gsmodel.save(model, path, external_data=True)
    raw.unlink()
    return path


class _Lazy:
    """One big weight, made when written (keeps the test process small)."""

    def __init__(self, i: int) -> None:
        self.i, self.shape = i, BIG_SHAPE

    def __call__(self) -> np.ndarray:
        return _pattern(self.i, BIG_SHAPE)


def _external(path: Path, tensor: onnx.TensorProto) -> np.ndarray:
    entries = {e.key: e.value for e in tensor.external_data}
    return np.memmap(
        path.parent / entries["location"],
        dtype=np.float32,
        mode="r",
        offset=int(entries["offset"]),
        shape=tuple(tensor.dims),
    )


FOLD_CHILD = textwrap.dedent("""
    import json, sys, time
    from gskit.io import model
    from gskit.passes import fold
    t0 = time.perf_counter()
    folded, report = fold.fold(model.load(sys.argv[1], load_weights=False), size_threshold=None)
    model.save(folded, sys.argv[2])
    seconds = time.perf_counter() - t0
    with open("/proc/self/status") as f:
        peak = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    print(json.dumps({"peak_rss": peak, "seconds": seconds, "mode": report.mode, "batches": report.batches,
                      "folded_ops": report.folded_ops, "failures": report.failures,
                      "spilled_bytes": report.spilled_bytes}))
""")


@pytest.mark.slow
def test_fold_model_over_2gb_streams_and_stays_frugal(tmp_path):
    src = _save_transpose_model(tmp_path / "big.onnx", [_Lazy(i) for i in range(BIG_COUNT)])
    model_bytes = src.stat().st_size + (tmp_path / "big.onnx.data").stat().st_size
    assert model_bytes > 2**31
    out = tmp_path / "out" / "folded.onnx"
    proc = subprocess.run(
        [sys.executable, "-c", FOLD_CHILD, str(src), str(out)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["mode"] == "batched" and not result["failures"]
    assert result["folded_ops"] == {"Transpose": BIG_COUNT}
    assert result["peak_rss"] < 2 * model_bytes, result  # the bench tracks the 1.5x goal

    original, folded = gsmodel.load(src, load_weights=False), gsmodel.load(out, load_weights=False)
    assert [n.op_type for n in folded.graph.node].count("Transpose") == 0
    assert len(folded.graph.node) == len(original.graph.node) - BIG_COUNT
    before = {t.name: t for t in original.graph.initializer}
    after = {t.name: t for t in folded.graph.initializer}
    assert sorted(after) == sorted(f"T{i}" for i in range(BIG_COUNT))
    for i in range(BIG_COUNT):
        w, t = _external(src, before[f"W{i}"]), _external(out, after[f"T{i}"])
        assert t.shape == BIG_SHAPE[::-1]
        if i in (0, 17, BIG_COUNT - 1):  # a few in full, the others by two rows and two columns
            np.testing.assert_array_equal(t, np.transpose(w))
        else:
            np.testing.assert_array_equal(t[[0, -1]], w[:, [0, -1]].T)
            np.testing.assert_array_equal(t[:, [1, -2]], w[[1, -2]].T)
        del w, t

    # Numerics of the folded 2.2 GB model on onnxruntime against numpy on the original weights.
    x = ((np.arange(BIG_SHAPE[1]) % 13 - 6.0) / 6.0).astype(np.float32)[None]
    want = np.zeros((1, BIG_SHAPE[0]), dtype=np.float64)
    for i in range(BIG_COUNT):
        want += x.astype(np.float64) @ np.asarray(_external(src, before[f"W{i}"]), dtype=np.float64).T
    got = gsort.run(out, {"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
