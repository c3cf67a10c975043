"""gskit.passes.sanitize: tidies without changing outputs; graph output names survive no-op removal."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import parse_model

from gskit.backends import ort as gsort
from gskit.errors import GskitError
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
