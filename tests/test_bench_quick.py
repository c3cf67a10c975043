"""The benchmark's model generators and one measurement path, at tiny sizes (bench/models.py, peers.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench import models
from bench.peers import Row, measure
from gskit.backends import ort as gort
from gskit.io import model as gsmodel
from gskit.io.feeds import random_feeds
from tests.conftest import LIGHT_MODELS


@pytest.mark.parametrize("blocks", [1, 3, 12])
def test_transformer_like_scales_and_runs(blocks: int) -> None:
    graph = models.transformer_like(blocks=blocks)
    assert len(graph.nodes) == blocks * models.NODES_PER_BLOCK
    proto = gsmodel.to_model(graph)
    feeds = random_feeds(proto, dim_values={"batch": 3})
    y = gort.run(proto, feeds)["y"]
    assert y.shape == (3, 4, 16) and np.isfinite(y).all()


def test_transformer_like_by_node_count() -> None:
    for target in (260, 2600):
        nodes = len(models.transformer_like(target).nodes)
        assert abs(nodes - target) <= models.NODES_PER_BLOCK


def test_transformer_like_first_block_is_layer_norm_then_attention() -> None:
    # Independent reference: the block written out in numpy.
    graph = models.transformer_like(blocks=1)
    consts = {t.name: t.values for t in graph.tensors().values() if hasattr(t, "values")}
    x = np.random.default_rng(1).standard_normal((2, 4, 16)).astype(np.float32)
    mean = x.mean(-1, keepdims=True)
    ln = (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5) * consts["gamma"] + consts[
        "beta"
    ]
    scores = (ln @ consts["wq"]) @ np.swapaxes(ln @ consts["wk"], 1, 2) / 4.0
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    want = x + probs @ ln
    got = gort.run(gsmodel.to_model(graph), {"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_large_model_generator_writes_external_data(tmp_path: Path) -> None:
    path = tmp_path / "big.onnx"
    info = models.large_model(path, 4 * 2**20)
    assert abs(info["weight_bytes"] - 4 * 2**20) <= 4 * 2**20 * 0.01
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) >= info["weight_bytes"]
    y = gort.run(str(path), random_feeds(gsmodel.load(path, load_weights=False)))["y"]
    assert y.shape[0] == 1


def test_measure_gskit_fold_end_to_end(tmp_path: Path) -> None:
    light = next(p for p in LIGHT_MODELS if p.stem == "light_squeezenet")
    row = measure("fold", light.stem, "gskit", light, tmp_path / "out", runs=1, timeout=45)
    data = row.as_dict()
    for key in (
        "seconds",
        "peak_rss",
        "rss_after_imports",
        "nodes_before",
        "nodes_after",
        "match",
        "max_abs_err",
    ):
        assert data[key] is not None, key
    assert row.status == "ok" and row.match is True
    assert 0 < row.nodes_after < row.nodes_before
    assert row.peak_rss >= row.rss_after_imports > 0
    assert not (tmp_path / "out").exists()


def test_measure_reports_timeout(tmp_path: Path) -> None:
    light = next(p for p in LIGHT_MODELS if p.stem == "light_squeezenet")
    row: Row = measure("fold", light.stem, "gskit", light, tmp_path / "out", runs=50, timeout=1)
    assert row.status == "timeout" and row.seconds is None
