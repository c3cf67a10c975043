"""gskit.passes.convert: fp16 with clamping and fp32 boundaries, opset conversion, int64 -> int32."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import parse_model

from gskit.backends import ort as gsort
from gskit.errors import GskitError
from gskit.io import model as gsmodel
from gskit.passes.convert import clamp_to_fp16, convert_opset, int64_to_int32, to_fp16


def test_clamp_values_as_specified():
    values = np.array([1e-9, -1e-9, -3e5, 3e5, 0.0, np.nan, np.inf, -np.inf, 0.5], dtype=np.float32)
    out, clamped = clamp_to_fp16(values)
    assert out.dtype == np.float16 and clamped == 4
    np.testing.assert_array_equal(out[:4], np.array([1e-7, -1e-7, -1e4, 1e4], dtype=np.float16))
    assert out[4] == 0 and np.isnan(out[5]) and out[6] == np.inf and out[7] == -np.inf and out[8] == 0.5


MLP = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3] x) => (float[2,3] y) <float[3] w = {1e-9, -3e5, 0.5}, float[3] b = {1, 2, 3}> {
  a = Mul(x, w)
  r = Relu(a)
  y = Add(r, b)
}
"""


def test_fp16_keeps_io_fp32_with_casts_and_clamps_constants(rng):
    model = parse_model(MLP)
    out, report = to_fp16(model, keep_io_types=True)
    onnx.checker.check_model(out)
    assert out.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert out.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in out.graph.initializer}
    w16 = next(v for k, v in inits.items() if k.startswith("w"))
    assert w16.dtype == np.float16 and w16[1] == np.float16(-1e4)
    assert report.casts_inserted == 2 and report.values_clamped == 2
    x = rng.standard_normal((2, 3)).astype(np.float32)
    got = gsort.run(out, {"x": x})["y"]
    want = np.maximum(x * np.array([1e-7, -1e4, 0.5], np.float32), 0) + np.array([1, 2, 3], np.float32)
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)


def test_block_op_stays_fp32():
    out, report = to_fp16(parse_model(MLP), block_ops=("Relu",))
    relu = next(n for n in out.graph.node if n.op_type == "Relu")
    assert report.fp32_nodes == {"Relu": 1}
    producers = {o: n for n in out.graph.node for o in n.output}
    assert producers[relu.input[0]].op_type == "Cast"


@pytest.mark.torch
def test_exported_cnn_in_fp16_matches_fp32(tmp_path, rng):
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 4, 3),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 2 * 2, 5),
    ).eval()
    path = tmp_path / "cnn.onnx"
    x = torch.randn(1, 3, 8, 8)
    torch.onnx.export(net, (x,), str(path), dynamo=False, opset_version=17)
    model = gsmodel.load(path)
    out, _ = to_fp16(model)
    name = model.graph.input[0].name
    want = gsort.run(model, {name: x.numpy()})
    got = gsort.run(out, {name: x.numpy()})
    for key in want:  # stated tolerance: fp16 has ~3 decimal digits
        np.testing.assert_allclose(got[key], want[key], rtol=1e-2, atol=1e-2)


def test_convert_opset_and_its_error():
    model = parse_model(MLP.replace('"" : 17', '"" : 13'))
    out = convert_opset(model, 17)
    assert out.opset_import[0].version == 17
    onnx.checker.check_model(out)
    with pytest.raises(GskitError, match=r"op Mul"):  # onnx has no Mul 14 -> 13 adapter
        convert_opset(out, 13)
    with pytest.raises(GskitError, match="opset 999"):
        convert_opset(model, 999)


def test_convert_opset_keeps_local_functions(rng):
    """onnx's version converter drops model-local functions; the converted model keeps them (their own
    opset imports) and still runs. It used to lose them: a call without its function, a model onnxruntime
    refused."""
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17, "local" : 1]>
        g (float[2,3] x) => (float[2,3] y) { y = local.F(x) }
        <domain: "local", opset_import: ["" : 17]>
        F (a) => (b) { r = Relu(a)  b = Neg(r) }
        """
    )
    out = convert_opset(model, 23)
    assert [f.name for f in out.functions] == ["F"] and out.opset_import[0].version == 23
    onnx.checker.check_model(out, full_check=True)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_array_equal(gsort.run(out, {"x": x})["y"], -np.maximum(x, 0))


def test_int64_inputs_and_indices_to_int32(rng):
    model = parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[4,2] x, int64[3] i) => (float[3,2] y, float[2,2] z) <int64[2] j = {0, 3}> {
      y = Gather(x, i)
      z = Gather(x, j)
    }""")
    out, report = int64_to_int32(model)
    assert report.inputs == ["i"] and report.constants == ["j"]
    assert out.graph.input[1].type.tensor_type.elem_type == onnx.TensorProto.INT32
    x = rng.standard_normal((4, 2)).astype(np.float32)
    got = gsort.run(out, {"x": x, "i": np.array([3, 0, 1], np.int32)})
    np.testing.assert_array_equal(got["y"], x[[3, 0, 1]])
    bad = parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[4,2] x) => (float[1,2] y) <int64[1] j = {5000000000}> { y = Gather(x, j) }""")
    with pytest.raises(GskitError, match="5000000000"):
        int64_to_int32(bad)


def test_fp16_converts_constant_nodes_of_an_exported_model() -> None:
    """The bundled export reads Clip bounds and Pow/Add operands from Constant nodes: all turn fp16."""
    from pathlib import Path

    example = Path(__file__).resolve().parents[1] / "gskit" / "data" / "example.onnx"
    original = gsmodel.load(example)
    assert any(n.op_type == "Constant" for n in original.graph.node)
    converted, report = to_fp16(original)
    constant_types = {
        onnx.helper.get_attribute_value(a).data_type
        for n in converted.graph.node
        if n.op_type == "Constant"
        for a in n.attribute
        if a.name == "value"
    }
    assert onnx.TensorProto.FLOAT16 in constant_types and onnx.TensorProto.FLOAT not in constant_types
    x = np.random.default_rng(0).standard_normal((3, 4, 8, 8)).astype(np.float32)
    want = gsort.run(original, {"x": x})["y"]
    got = gsort.run(converted, {"x": x})["y"]
    assert got.dtype == np.float32  # inputs and outputs kept in fp32
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)  # fp16 arithmetic


def test_fp16_value_float_constant_becomes_fp16_tensor() -> None:
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[3] x) => (float[3] y) {
            c = Constant <value_float = 2.5> ()
            y = Mul (x, c)
        }
        """
    )
    converted, _ = to_fp16(model)
    (constant,) = [n for n in converted.graph.node if n.op_type == "Constant"]
    assert [a.name for a in constant.attribute] == ["value"]
    assert onnx.helper.get_attribute_value(constant.attribute[0]).data_type == onnx.TensorProto.FLOAT16
    x = np.array([1.0, -2.0, 4.0], dtype=np.float32)
    np.testing.assert_array_equal(gsort.run(converted, {"x": x})["y"], x * 2.5)


@pytest.mark.parametrize(
    ("flags", "io_type"), [((), onnx.TensorProto.FLOAT), (("--no-keep-io-fp32",), onnx.TensorProto.FLOAT16)]
)
def test_cli_fp16_keeps_io_fp32_like_the_library_and_the_recipe(tmp_path, flags, io_type) -> None:
    """One default for all three faces (the CLI used to make inputs and outputs float16 unless told)."""
    from gskit.cli import main

    source, out = tmp_path / "mlp.onnx", tmp_path / "out.onnx"
    gsmodel.save(parse_model(MLP), source)
    assert main(["convert", str(source), "-o", str(out), "--fp16", *flags]) == 0
    graph = onnx.load(out).graph
    assert {t.type.tensor_type.elem_type for t in (*graph.input, *graph.output)} == {io_type}


def test_misspelled_block_op_is_an_error_not_a_silent_no_op():
    # --block-op Softmx kept nothing in float32 and said nothing; an op type onnx does not know and no node
    # of the model has can only be a typo. A real op the model lacks stays fine (a recipe shared by models).
    text = '<ir_version: 8, opset_import: ["" : 17]> g (float[2] x) => (float[2] y) { y = Neg(x) }'
    model = parse_model(text)
    with pytest.raises(GskitError, match=r"block_ops names \['Softmx'\].*onnx op"):
        to_fp16(model, block_ops=["Softmx"])
    to_fp16(model, block_ops=["Softmax"])
