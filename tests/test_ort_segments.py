"""Models with large weights on disk run on onnxruntime in consecutive segments (gskit.backends.ort_segments):
the same outputs as one session, one segment's weights mapped at a time, failures said as one session says
them, and validate's summary says so. The thresholds are lowered so that kilobytes stand for gigabytes."""

from __future__ import annotations

import json
import weakref
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from gskit.backends import ort as ort_backend
from gskit.backends import ort_segments
from gskit.cli import main
from gskit.compare.outputs import compare
from gskit.io import model as gsmodel

WIDTH = 64
WEIGHT_BYTES = WIDTH * WIDTH * 4


@pytest.fixture
def small_segments(monkeypatch) -> None:
    """Any weight on disk makes a model run in segments, and a segment holds one 16 KB weight."""
    monkeypatch.setattr(ort_segments, "SEGMENTED_OVER", 0)
    monkeypatch.setattr(ort_segments, "SEGMENT_BYTES", WEIGHT_BYTES + 1000)
    ort_backend.take_segmented_runs()


def _chain(path: Path) -> Path:
    """A model whose values cross segments in every way the split must keep: a skip connection into the
    next segment, a graph output that later nodes also read, an input read only at the end, an ``If`` whose
    branches read a weight and a value from the outer scope, and a model-local function; with the value_info
    of onnx's shape inference."""
    rng = np.random.default_rng(3)
    weights = [(rng.standard_normal((WIDTH, WIDTH)) / 8).astype(np.float32) for _ in range(4)]
    branch = helper.make_graph(
        [helper.make_node("MatMul", ["mid", "W3"], ["branch_out"])],
        "then",
        [],
        [helper.make_tensor_value_info("branch_out", TensorProto.FLOAT, None)],
    )
    other = helper.make_graph(
        [helper.make_node("Neg", ["mid"], ["other_out"])],
        "else",
        [],
        [helper.make_tensor_value_info("other_out", TensorProto.FLOAT, None)],
    )
    twice = helper.make_function(
        "test.local", "Twice", ["a"], ["b"], [helper.make_node("Add", ["a", "a"], ["b"])],
        [helper.make_opsetid("", 17)],
    )  # fmt: skip
    nodes = [
        helper.make_node("MatMul", ["x", "W0"], ["h0"]),
        helper.make_node("Relu", ["h0"], ["r0"]),
        helper.make_node("MatMul", ["r0", "W1"], ["h1"]),
        helper.make_node("Add", ["h1", "r0"], ["s"]),  # r0 skips over to the next segment
        helper.make_node("MatMul", ["s", "W2"], ["mid"]),
        helper.make_node("ReduceSum", ["mid"], ["total"], keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["positive"]),
        helper.make_node("If", ["positive"], ["chosen"], then_branch=branch, else_branch=other),
        helper.make_node("Add", ["chosen", "late"], ["sum"]),
        helper.make_node("Twice", ["sum"], ["y"], domain="test.local"),
    ]
    graph = helper.make_graph(
        nodes,
        "segmented",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", WIDTH]),
            helper.make_tensor_value_info("late", TensorProto.FLOAT, ["N", WIDTH]),
        ],
        [
            helper.make_tensor_value_info("mid", TensorProto.FLOAT, ["N", WIDTH]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", WIDTH]),
        ],
        [onnx.numpy_helper.from_array(w, f"W{i}") for i, w in enumerate(weights)]
        + [onnx.numpy_helper.from_array(np.zeros((), np.float32), "zero")],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("test.local", 1)],
        functions=[twice],
    )
    model.ir_version = 10
    model = onnx.shape_inference.infer_shapes(model)  # value_info for every value, as prepare writes it
    assert len(model.graph.value_info) >= 8
    return gsmodel.save(model, path, external_data=True)


def _feeds(sign: float = 1.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        "x": (sign * np.abs(rng.standard_normal((3, WIDTH)))).astype(np.float32),
        "late": rng.standard_normal((3, WIDTH)).astype(np.float32),
    }


def _infer(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    runner = ort_backend.runner(path, None, "original", loaded=gsmodel.load(path, load_weights=False))
    runner.activate()
    try:
        return dict(runner.infer(feeds))
    finally:
        runner.deactivate()


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["then-branch", "else-branch"])
def test_a_segmented_run_gives_one_sessions_outputs_bit_for_bit(tmp_path, monkeypatch, sign) -> None:
    path = _chain(tmp_path / "m" / "chain.onnx")
    whole = _infer(path, _feeds(sign))
    assert ort_backend.take_segmented_runs() == []  # 64 KB of weights: under the real threshold

    monkeypatch.setattr(ort_segments, "SEGMENTED_OVER", 0)
    monkeypatch.setattr(ort_segments, "SEGMENT_BYTES", WEIGHT_BYTES + 1000)
    segments = ort_segments.plan(gsmodel.load(path, load_weights=False))
    assert [s.initializers for s in segments] == [("W0",), ("W1",), ("W2", "zero"), ("W3",)]
    assert "r0" in segments[1].inputs  # the skip connection crosses into the next segment
    assert "mid" in segments[2].outputs and "mid" in segments[3].inputs  # read inside the If's branch
    assert "late" in segments[3].inputs and "late" not in segments[0].inputs
    split = _infer(path, _feeds(sign))
    assert ort_backend.take_segmented_runs() == [("original", 4)]
    assert split.keys() == whole.keys() == {"mid", "y"}
    for name in whole:
        np.testing.assert_array_equal(split[name], whole[name])


def test_one_segments_session_lives_at_a_time_with_only_its_weights(tmp_path, small_segments) -> None:
    path = _chain(tmp_path / "m" / "chain.onnx")
    proto = gsmodel.load(path, load_weights=False)
    made: list[tuple[weakref.ref, list[str]]] = []

    def make_session(part: onnx.ModelProto):
        assert all(previous() is None for previous, _ in made), "the last segment's session is still alive"
        sess = ort_backend.session(part)
        made.append((weakref.ref(sess), [t.name for t in part.graph.initializer]))
        return sess

    session = ort_segments.SegmentedSession(
        proto, ort_segments.plan(proto), make_session, lambda: pytest.fail("ran whole")
    )
    outputs = session.run(None, _feeds())
    assert session.last_run == "segments" and len(outputs) == 2
    assert [names for _, names in made] == [["W0"], ["W1"], ["W2", "zero"], ["W3"]]


def test_a_failing_segmented_run_says_what_one_session_says(tmp_path, monkeypatch) -> None:
    """Inputs that do not fit fail in the last segment (the batch of ``late`` differs from the batch of
    ``x``); the model then runs whole, so the error reads as before."""
    path = _chain(tmp_path / "m" / "chain.onnx")
    wrong = {"x": np.zeros((3, WIDTH), np.float32), "late": np.zeros((2, WIDTH), np.float32)}  # N: 3, 2
    with pytest.raises(Exception) as whole:  # noqa: PT011  # onnxruntime's own error type
        _infer(path, wrong)
    monkeypatch.setattr(ort_segments, "SEGMENTED_OVER", 0)
    monkeypatch.setattr(ort_segments, "SEGMENT_BYTES", WEIGHT_BYTES + 1000)
    with pytest.raises(Exception) as split:  # noqa: PT011
        _infer(path, wrong)
    assert type(split.value) is type(whole.value) and str(split.value) == str(whole.value)
    assert ort_backend.take_segmented_runs() == []


def test_graphs_that_are_not_split(tmp_path) -> None:
    proto = gsmodel.load(_chain(tmp_path / "m" / "chain.onnx"), load_weights=False)
    assert ort_segments.plan(proto) == []  # under the threshold
    assert len(ort_segments.plan(proto, over=0, budget=WEIGHT_BYTES + 1000)) == 4
    assert ort_segments.plan(proto, over=0, budget=10 * WEIGHT_BYTES) == []  # one segment: run whole
    unsorted = onnx.ModelProto()
    unsorted.CopyFrom(proto)
    nodes = list(unsorted.graph.node)
    del unsorted.graph.node[:]
    unsorted.graph.node.extend([nodes[1], nodes[0], *nodes[2:]])
    assert ort_segments.plan(unsorted, over=0, budget=WEIGHT_BYTES + 1000) == []


def test_compare_and_validate_say_they_ran_in_segments(tmp_path, small_segments) -> None:
    path = _chain(tmp_path / "m" / "chain.onnx")
    report = compare(path, path, feeds=_feeds())
    assert report.passed and all(o.max_abs_err == 0 for o in report.outputs)
    assert ort_backend.take_segmented_runs() == [("original", 4), ("prepared", 4)]
    out, recipe = tmp_path / "out", tmp_path / "recipe.yaml"
    recipe.write_text("steps:\n- sanitize: {}\n- validate: {}\n")
    assert main(["prepare", str(path), "-o", str(out), "--recipe", str(recipe)]) == 0
    steps = json.loads((out / "report.json").read_text())["steps"]
    validate = next(s for s in steps if s["name"] == "validate")
    assert validate["status"] == "ok"
    assert "run in consecutive segments of at most" in validate["summary"]
    assert "(segments: original 4, prepared 4)" in validate["summary"]
