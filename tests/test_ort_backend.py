"""onnxruntime backend: plugin nodes run through numpy references (PyOps) or as model-local functions."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from conftest import parse_model

from gskit.backends import ort as ort_backend
from gskit.errors import GskitError
from gskit.io import model as gsmodel
from gskit.plugin import load_plugins

SPEC_PY = """
import numpy as np
from gskit.plugin import Attribute, AttrType, PluginSpec, TensorInfo, same_as_input
from .reference import affine_rows, scaled_tanh, split_halves


def _halves(inputs, attrs):
    x = inputs[0]
    last = x.shape[-1]
    half = last // 2 if isinstance(last, int) else None
    return [TensorInfo(x.dtype, (*x.shape[:-1], half))] * 2


SPECS = [
    PluginSpec(
        name="ScaledTanh", namespace="test.gskit", inputs=("x", "bias?"),
        attributes=(Attribute("alpha", AttrType.FLOAT, 1.0, "scale"),),
        infer=same_as_input(0), reference=scaled_tanh,
    ),
    PluginSpec(
        name="AffineRows", namespace="test.gskit",
        attributes=(
            Attribute("weight", AttrType.TENSOR, tensor_dtype="float32"),
            Attribute("offsets", AttrType.INTS, [0]),
            Attribute("mode", AttrType.STRING, "add"),
        ),
        infer=same_as_input(0), reference=affine_rows,
    ),
    PluginSpec(name="SplitHalves", namespace="test.gskit", outputs=("lo", "hi"), infer=_halves,
               reference=split_halves),
]
"""

REFERENCE_PY = """
import numpy as np


def scaled_tanh(x, bias=None, *, alpha):
    return (np.tanh(x if bias is None else x + bias) * alpha).astype(x.dtype)


def affine_rows(x, *, weight, offsets, mode):
    y = x * weight + np.asarray(offsets, dtype=x.dtype).sum()
    return y if mode == "add" else -y


def split_halves(x):
    half = x.shape[-1] // 2
    return x[..., :half], x[..., half:]
"""


@pytest.fixture
def plugins(tmp_path: Path):
    folder = tmp_path / "plugins" / "test_ops"
    folder.mkdir(parents=True)
    (folder / "spec.py").write_text(textwrap.dedent(SPEC_PY))
    (folder / "reference.py").write_text(textwrap.dedent(REFERENCE_PY))
    return load_plugins([tmp_path / "plugins"], entry_points=False)


PLUGIN_CHAIN = """
<ir_version: 10, opset_import: ["" : 17, "test.gskit" : 1]>
g (float[N, 6] x, float[6] b) => (float[N, 6] y, float[N, 3] lo, float[N, 3] hi) {
    t = test.gskit.ScaledTanh<alpha = 1.5, plugin_namespace = "test.gskit", plugin_version = "1">(x, b)
    u = test.gskit.ScaledTanh<alpha = 0.5>(t)
    y = Relu(u)
    lo, hi = test.gskit.SplitHalves(y)
}
"""


def test_plugin_nodes_run_through_references(plugins, rng):
    model = parse_model(PLUGIN_CHAIN)
    before = model.SerializeToString()
    x = rng.standard_normal((5, 6)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    out = ort_backend.run(model, {"x": x, "b": b}, plugins=plugins)
    expected = np.maximum(np.tanh(np.tanh(x + b) * 1.5) * 0.5, 0)
    np.testing.assert_allclose(out["y"], expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(out["lo"], expected[:, :3])
    np.testing.assert_array_equal(out["hi"], expected[:, 3:])
    assert model.SerializeToString() == before  # the caller's model is restored after the rewrite


def test_tensor_list_and_string_attributes_reach_the_reference(plugins, rng):
    spec = plugins.get("test.gskit", "AffineRows")
    weight = rng.standard_normal((2, 3)).astype(np.float32)
    x = gs.Variable("x", np.float32, ("N", 2, 3))
    y = gs.Variable("y", np.float32, ("N", 2, 3))
    node = spec.make_node([x], [y], {"weight": weight, "offsets": [1, 2], "mode": "neg"})
    graph = gs.Graph(nodes=[node], inputs=[x], outputs=[y], opset=17)
    proto = gsmodel.to_model(graph)
    attr = {a.name: a for a in proto.graph.node[0].attribute}["weight"]
    assert attr.type == onnx.AttributeProto.TENSOR and list(attr.t.dims) == [2, 3]
    feeds = {"x": rng.standard_normal((4, 2, 3)).astype(np.float32)}
    got = ort_backend.run(graph, feeds, plugins=plugins)["y"]
    np.testing.assert_allclose(got, -(feeds["x"] * weight + 3), rtol=1e-6)


def test_second_session_after_reload_uses_new_reference(plugins, rng, tmp_path):
    model = parse_model(PLUGIN_CHAIN)
    feeds = {"x": rng.standard_normal((2, 6)).astype(np.float32), "b": np.zeros(6, np.float32)}
    first = ort_backend.run(model, feeds, plugins=plugins)["y"]
    ref = tmp_path / "plugins" / "test_ops" / "reference.py"
    ref.write_text(ref.read_text().replace("* alpha).astype", "* alpha * 2).astype"))
    second = ort_backend.run(model, feeds, plugins=load_plugins([tmp_path / "plugins"], entry_points=False))[
        "y"
    ]
    x = feeds["x"]
    np.testing.assert_allclose(first, np.maximum(np.tanh(np.tanh(x) * 1.5) * 0.5, 0), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(second, np.maximum(np.tanh(np.tanh(x) * 3.0) * 1.0, 0), rtol=1e-6, atol=1e-6)


def test_unknown_custom_node_is_an_error_naming_it(rng):
    model = parse_model(PLUGIN_CHAIN)
    with pytest.raises(GskitError, match=r"node '.*' \(test.gskit::ScaledTanh\).*--plugins"):
        ort_backend.session(model)


def test_model_local_function_runs_without_plugins(rng):
    model = parse_model(
        """
        <ir_version: 10, opset_import: ["" : 17, "test.gskit" : 1]>
        g (float[N, 4] x) => (float[N, 4] y) {
            y = test.gskit.ClampSwish<plugin_namespace = "test.gskit">(x)
        }
        <domain: "test.gskit", opset_import: ["" : 17]>
        ClampSwish (x) => (y) {
            s = Sigmoid(x)
            m = Mul(x, s)
            lo = Constant<value = float {-1.0}>()
            hi = Constant<value = float {1.0}>()
            y = Clip(m, lo, hi)
        }
        """
    )
    x = (rng.standard_normal((3, 4)) * 4).astype(np.float32)
    got = ort_backend.run(model, {"x": x})["y"]
    np.testing.assert_allclose(got, np.clip(x / (1 + np.exp(-x)), -1, 1), rtol=1e-6, atol=1e-6)


def test_plugin_model_from_file_with_external_data(plugins, rng, tmp_path):
    model = parse_model(PLUGIN_CHAIN)
    path = gsmodel.save(model, tmp_path / "m" / "chain.onnx", external_data=True)
    feeds = {
        "x": rng.standard_normal((3, 6)).astype(np.float32),
        "b": rng.standard_normal(6).astype(np.float32),
    }
    np.testing.assert_allclose(
        ort_backend.run(path, feeds, plugins=plugins)["y"],
        ort_backend.run(model, feeds, plugins=plugins)["y"],
        rtol=0,
        atol=0,
    )


def test_a_model_with_weights_on_disk_and_plugin_nodes_runs_without_a_copy_of_its_weights(
    plugins, rng, tmp_path
):
    """The session of a rewritten model (plugin nodes as PyOps) reads the weights that stayed on disk from
    their data file, linked beside it: the 2.4 MB weight is not written again (bytes this process writes,
    Linux's /proc/self/io)."""
    io = Path("/proc/self/io")
    if not io.is_file():
        pytest.skip("needs Linux's /proc/self/io")
    model = parse_model(PLUGIN_CHAIN)
    weight = rng.standard_normal((6, 100_000)).astype(np.float32)
    model.graph.initializer.append(onnx.numpy_helper.from_array(weight, "w"))
    model.graph.node.append(onnx.helper.make_node("MatMul", ["y", "w"], ["z"]))
    model.graph.output.append(onnx.helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, ["N", 100_000]))
    path = gsmodel.save(model, tmp_path / "m" / "chain.onnx", external_data=True)
    weightless = gsmodel.load(path, load_weights=False)
    feeds = {
        "x": rng.standard_normal((3, 6)).astype(np.float32),
        "b": rng.standard_normal(6).astype(np.float32),
    }

    def written() -> int:
        return next(int(line.split()[1]) for line in io.read_text().splitlines() if line.startswith("wchar:"))

    before = written()
    got = ort_backend.run(weightless, feeds, plugins=plugins)
    assert written() - before < weight.nbytes / 8
    np.testing.assert_array_equal(got["z"], ort_backend.run(model, feeds, plugins=plugins)["z"])


def test_reference_error_is_reported(plugins, rng):
    model = parse_model(PLUGIN_CHAIN)
    with pytest.raises(GskitError, match="onnxruntime failed to run"):
        ort_backend.run(
            model, {"x": np.zeros((2, 5), np.float32), "b": np.zeros(6, np.float32)}, plugins=plugins
        )


def test_float16_plugin_sees_float16(plugins, rng):
    """The PyOp API has no float16 (it aborts the process); gskit widens around it and narrows back."""
    model = parse_model(
        """
        <ir_version: 10, opset_import: ["" : 17, "test.gskit" : 1]>
        g (float16[N, 6] x) => (float16[N, 6] y, float16[N, 3] lo, float16[N, 3] hi) {
            y = test.gskit.ScaledTanh<alpha = 3.0>(x)
            lo, hi = test.gskit.SplitHalves(y)
        }
        """
    )
    x = rng.standard_normal((4, 6)).astype(np.float16)
    out = ort_backend.run(model, {"x": x}, plugins=plugins)
    expected = (np.tanh(x) * 3.0).astype(np.float16)  # the reference computes in float16
    assert out["y"].dtype == np.float16
    np.testing.assert_array_equal(out["y"], expected)
    np.testing.assert_array_equal(out["hi"], expected[:, 3:])


def test_onnxruntime_warnings_hidden_unless_verbose(tmp_path, capfd) -> None:
    """graphsurgeon's folding makes its own sessions; onnxruntime's optimizer warnings there stay hidden."""
    import onnx

    from gskit.cli import main

    # An initializer both unsqueezed and used as is: onnxruntime's UnsqueezeElimination warns about it.
    model = parse_model(
        """
        <ir_version: 10, opset_import: ["" : 17]>
        g (float[1, 3] x) => (float[1, 3] y, float[1, 3] z) <float[3] w = {1., 2., 3.}, int64[1] ax = {0}> {
          u = Unsqueeze(w, ax)
          y = Add(x, u)
          z = Mul(x, w)
        }
        """
    )
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    assert main(["fold", str(path), "-o", str(tmp_path / "a.onnx")]) == 0
    assert "UnsqueezeElimination" not in capfd.readouterr().err
    assert main(["-v", "fold", str(path), "-o", str(tmp_path / "b.onnx")]) == 0
    assert "UnsqueezeElimination" in capfd.readouterr().err
    assert main(["fold", str(path), "-o", str(tmp_path / "c.onnx")]) == 0
    assert "UnsqueezeElimination" not in capfd.readouterr().err


def test_a_model_that_types_every_tensor_runs_its_plugin_nodes_without_inference(plugins, rng, monkeypatch):
    """The PyOps' dtypes come from the model where it types every tensor (what gskit writes after its
    infer_shapes step): no inference, so no schema registration either; a model that leaves a tensor
    untyped is inferred as before."""
    from gskit.passes import shapes

    untyped = parse_model(PLUGIN_CHAIN)
    typed = shapes.infer_shapes(untyped, plugins)
    assert not shapes.missing_shapes(typed) and shapes.missing_shapes(untyped)
    feeds = {
        "x": rng.standard_normal((5, 6)).astype(np.float32),
        "b": rng.standard_normal(6).astype(np.float32),
    }
    expected = ort_backend.run(untyped, feeds, plugins=plugins)
    inferred = []
    real = shapes.infer_shapes

    def counted(model, registry, *, strict=True):
        inferred.append(model)
        return real(model, registry, strict=strict)

    monkeypatch.setattr(shapes, "infer_shapes", counted)
    got = ort_backend.run(typed, feeds, plugins=plugins)
    assert inferred == []
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value)
    # one node output without a shape: inferred (and its warning about untyped tensors kept)
    del typed.graph.value_info[0]
    got = ort_backend.run(typed, feeds, plugins=plugins)
    assert len(inferred) == 1
    np.testing.assert_array_equal(got["y"], expected["y"])


def test_sessions_do_not_spin_and_give_the_outputs_of_a_spinning_session(rng):
    """gskit's sessions keep their idle worker threads from spinning (CPU taken from the run on shared
    cores, and a slow free); the outputs are those of a session with onnxruntime's default threads, bit
    for bit."""
    import onnxruntime as ort

    example = Path(__file__).resolve().parents[1] / "gskit" / "data" / "example.onnx"
    session = ort_backend.session(example)
    assert session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == "0"
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    spinning = ort.InferenceSession(str(example), options, providers=["CPUExecutionProvider"])
    feeds = {"x": rng.standard_normal((2, 4, 8, 8)).astype(np.float32)}
    np.testing.assert_array_equal(ort_backend.run(session, feeds)["y"], spinning.run(["y"], feeds)[0])


def test_folds_session_does_not_spin_nor_prepack_and_gives_the_default_sessions_outputs(rng):
    """fold's evaluation session (``default_session``, graphsurgeon's defaults otherwise) has the same two
    options as gskit's other sessions; its outputs are a default session's, bit for bit."""
    import onnxruntime as ort

    example = Path(__file__).resolve().parents[1] / "gskit" / "data" / "example.onnx"
    payload = example.read_bytes()
    session = ort_backend.default_session(payload)
    options = session.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert options.get_session_config_entry("session.disable_prepacking") == "1"
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL  # as graphsurgeon's
    default = ort.InferenceSession(payload, providers=["CPUExecutionProvider"])
    feeds = {"x": rng.standard_normal((2, 4, 8, 8)).astype(np.float32)}
    np.testing.assert_array_equal(session.run(["y"], feeds)[0], default.run(["y"], feeds)[0])
