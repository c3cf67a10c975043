"""gskit.passes.sanitize: tidies without changing outputs; graph output names survive no-op removal."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import parse_model

from gskit.backends import ort as gsort
from gskit.errors import GskitError
from gskit.io import model as gsmodel
from gskit.passes.sanitize import sanitize

MESSY = """
<ir_version: 8, opset_import: ["" : 17, "unused.dom" : 1]>
g (float[2,3] x) => (float[2,3] y) <float[3] w1 = {1,2,3}, float[3] w2 = {1,2,3}> {
  c = Constant <value = float[3] {1,1,1}> ()
  a = Add(x, w1)
  b = Mul(a, w2)
  i = Identity(b)
  d = Dropout(i)
  e = Cast <to = 1> (d)
  f = Add(e, c)
  y = Identity(f)
}
"""


def test_sanitize_removes_noops_merges_duplicates_and_keeps_outputs(rng):
    model = parse_model(MESSY)
    out, report = sanitize(model)
    onnx.checker.check_model(out)
    assert [n.op_type for n in out.graph.node] == ["Add", "Mul", "Add"]
    assert len(out.graph.initializer) == 2  # w2 merged into w1, Constant became an initializer
    assert [o.name for o in out.graph.output] == ["y"]
    assert out.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert [o.domain for o in out.opset_import] == [""]
    assert report.removed_ops == {"Identity": 2, "Constant": 1, "Dropout": 1, "Cast": 1}
    feeds = {"x": rng.standard_normal((2, 3)).astype(np.float32)}
    np.testing.assert_array_equal(gsort.run(out, feeds)["y"], gsort.run(model, feeds)["y"])


def test_identity_from_graph_input_to_output_is_kept():
    model = parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2] x) => (float[2] y) { y = Identity(x) }""")
    out, _ = sanitize(model)
    assert [n.op_type for n in out.graph.node] == ["Identity"]


def test_skip_and_unknown_steps():
    out, report = sanitize(parse_model(MESSY), skip=("remove_noops",))
    assert "remove_noops" not in report.changes
    assert "Identity" in [n.op_type for n in out.graph.node]
    with pytest.raises(GskitError, match="unknown step"):
        sanitize(parse_model(MESSY), skip=("nope",))


def test_onnxoptimizer_pass_runs_by_name():
    pytest.importorskip("onnxoptimizer")
    out, _ = sanitize(parse_model(MESSY), skip=("remove_noops",), extra=("onnxoptimizer:eliminate_identity",))
    assert "Identity" not in [n.op_type for n in out.graph.node]
    with pytest.raises(GskitError, match="no pass"):
        sanitize(parse_model(MESSY), extra=("onnxoptimizer:not_a_pass",))


def _weights_model(path, weights: dict[str, np.ndarray]):
    """y = x @ W for each weight (each product a graph output), saved with its weights in a data file."""
    names = list(weights)
    rows = next(iter(weights.values())).shape[0]
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["x", name], [f"y_{name}"]) for name in names],
        "weights",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, rows])],
        [
            onnx.helper.make_tensor_value_info(f"y_{name}", onnx.TensorProto.FLOAT, [1, None])
            for name in names
        ],
        [onnx.numpy_helper.from_array(value, name) for name, value in weights.items()],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    return gsmodel.save(model, path, external_data=True)


def _inputs_of(graph) -> dict[str, str]:
    """Each MatMul's output name -> the name of the weight it reads."""
    return {node.outputs[0].name: node.inputs[1].name for node in graph.nodes}


def test_weights_on_disk_merge_when_equal_and_stay_apart_when_only_their_shape_is(tmp_path, rng):
    """Equal bytes merge (also when they differ from the rest only past the first chunks compared); weights of
    the same dtype and shape that differ, in their first byte or in their last, stay apart."""
    base = rng.standard_normal((256, 300)).astype(np.float32)  # 300 KB: compared in more than one chunk
    last_differs = base.copy()
    last_differs[-1, -1] += 1.0
    weights = {
        "a": base,
        "a_again": base.copy(),
        "last_differs": last_differs,
        "first_differs": base + np.float32(1.0),
        "other": rng.standard_normal((256, 300)).astype(np.float32),
        "a_third_time": base.copy(),
    }
    path = _weights_model(tmp_path / "w.onnx", weights)
    graph = gsmodel.to_graph(gsmodel.load(path, load_weights=False))
    graph, report = sanitize(graph)
    assert report.changes["merge_duplicate_initializers"] == 2
    assert _inputs_of(graph) == {
        "y_a": "a",
        "y_a_again": "a",
        "y_last_differs": "last_differs",
        "y_first_differs": "first_differs",
        "y_other": "other",
        "y_a_third_time": "a",
    }
    feeds = {"x": rng.standard_normal((1, 256)).astype(np.float32)}
    sanitized = gsmodel.save(graph, tmp_path / "out" / "s.onnx")
    want, got = gsort.run(path, feeds), gsort.run(sanitized, feeds)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_weights_that_are_one_span_of_a_data_file_merge(tmp_path, rng):
    """Two tensors whose records name the same bytes of the same data file are one weight."""
    value = rng.standard_normal((64, 32)).astype(np.float32)
    path = _weights_model(tmp_path / "w.onnx", {"a": value, "b": value + np.float32(1.0)})
    model = onnx.load(str(path), load_external_data=False)
    first, second = model.graph.initializer
    del second.external_data[:]
    second.external_data.extend(first.external_data)  # b now reads a's bytes
    onnx.save_model(model, str(path))
    graph, report = sanitize(gsmodel.to_graph(gsmodel.load(path, load_weights=False)))
    assert report.changes["merge_duplicate_initializers"] == 1
    assert _inputs_of(graph) == {"y_a": "a", "y_b": "a"}


def test_unequal_weights_on_disk_are_read_only_as_far_as_they_differ(tmp_path, rng):
    """Weights of one dtype and shape that differ early are told apart without reading them through: the
    step reads a small part of the 8 MB of weights (the bytes the process read, from /proc/self/io)."""
    io = Path("/proc/self/io")
    if not io.is_file():
        pytest.skip("needs Linux's /proc/self/io")
    weights = {name: rng.standard_normal((1024, 1024)).astype(np.float32) for name in ("a", "b")}
    path = _weights_model(tmp_path / "w.onnx", weights)
    graph = gsmodel.to_graph(gsmodel.load(path, load_weights=False))

    def read_bytes() -> int:
        return next(int(line.split()[1]) for line in io.read_text().splitlines() if line.startswith("rchar:"))

    before = read_bytes()
    _, report = sanitize(graph, skip=("remove_noops", "remove_unused", "remove_unused_opsets"))
    assert report.changes["merge_duplicate_initializers"] == 0
    assert read_bytes() - before < 1_000_000  # a 64 KiB chunk of each, not 8 MB
