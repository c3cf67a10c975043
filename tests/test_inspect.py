"""gskit.passes.inspect and ``gskit inspect``: summaries checked against counts made directly from the
protobuf."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from gskit import cli
from gskit.io.model import load, save
from gskit.passes.inspect import (
    CustomNode,
    FunctionSummary,
    InitializerSummary,
    TensorSummary,
    summarize,
    summarize_file,
)
from tests.conftest import LIGHT_MODELS, parse_model

# Main graph: Add, Relu, If (nested If inside its then-branch), two custom-domain nodes, one call to a
# local function. W is an initializer and also a graph input; X has a symbolic and an unknown dim.
RICH_MODEL = """
<ir_version: 8, opset_import: ["" : 18, "my.plugins" : 1, "local" : 1]>
main (float[N, ?, 4] X, bool C, float[4] W) => (float[N, ?, 4] Y, float[4] Z, float P, float[N, ?, 4] F)
<float[4] W = {1.0, 2.0, 3.0, 4.0}, int64[1] K = {4}>
{
    A = Add(X, W)
    Y = Relu(A)
    Z = If(C) <
        then_branch = then_g () => (float[4] t_out) {
            t1 = Mul(W, W)
            t_out = If(C) <
                then_branch = inner_then () => (float[4] it) { it = Neg(t1) },
                else_branch = inner_else () => (float[4] ie) { ie = Abs(t1) }
            >
        },
        else_branch = else_g () => (float[4] e_out) { e_out = Sub(W, W) }
    >
    Q = my.plugins.Other(Y)
    P = my.plugins.MyPlugin <plugin_namespace: string = "gskit", plugin_version: string = "2"> (Q)
    F = local.AddTwice(A)
}
<domain: "local", opset_import: ["" : 18]>
AddTwice (x) => (y) {
    t = Add(x, x)
    y = Add(t, x)
}
"""


def _rich_model() -> onnx.ModelProto:
    model = parse_model(RICH_MODEL)
    for node in model.graph.node:
        node.name = f"{node.op_type.lower()}_node"
    return model


def _direct_histogram(graph: onnx.GraphProto) -> Counter[str]:
    """Count main graph and subgraph nodes by walking the protobuf recursively (independent of gskit)."""
    counts: Counter[str] = Counter()
    for node in graph.node:
        counts[f"{node.domain or 'ai.onnx'}::{node.op_type}"] += 1
        for attr in node.attribute:
            subgraphs = [attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs)
            for sub in subgraphs:
                counts += _direct_histogram(sub)
    return counts


@pytest.mark.parametrize("path", LIGHT_MODELS, ids=[p.stem for p in LIGHT_MODELS])
def test_light_models_histogram_matches_protobuf(path: Path) -> None:
    model = onnx.load(str(path))
    summary = summarize_file(path)

    assert len(LIGHT_MODELS) == 9
    assert summary.ops == dict(_direct_histogram(model.graph))
    assert list(summary.ops.values()) == sorted(summary.ops.values(), reverse=True)
    assert summary.node_count == len(model.graph.node)
    assert summary.subgraph_node_count == 0 and summary.function_node_count == 0
    assert summary.opsets == {(o.domain or "ai.onnx"): o.version for o in model.opset_import}
    assert summary.initializers.count == len(model.graph.initializer)
    assert summary.initializers.nbytes == sum(
        numpy_helper.to_array(t).nbytes for t in model.graph.initializer
    )
    init_names = {t.name for t in model.graph.initializer}
    assert [t.name for t in summary.inputs] == [v.name for v in model.graph.input if v.name not in init_names]
    assert [t.name for t in summary.outputs] == [v.name for v in model.graph.output]
    assert summary.custom_nodes == () and summary.functions == ()
    assert summary.shape_inference_error is None


def test_rich_model_every_field() -> None:
    model = _rich_model()
    before = model.SerializeToString()
    summary = summarize(model, path="rich.onnx")
    assert model.SerializeToString() == before, "summarize must not modify the model"

    assert summary.path == "rich.onnx"
    assert summary.ir_version == 8
    assert summary.opsets == {"ai.onnx": 18, "my.plugins": 1, "local": 1}
    assert summary.node_count == 6
    assert summary.subgraph_node_count == 5  # Mul, If, Neg, Abs, Sub
    assert summary.function_node_count == 2
    assert summary.ops == {
        "ai.onnx::If": 2,
        "ai.onnx::Abs": 1,
        "ai.onnx::Add": 1,
        "ai.onnx::Mul": 1,
        "ai.onnx::Neg": 1,
        "ai.onnx::Relu": 1,
        "ai.onnx::Sub": 1,
        "local::AddTwice": 1,
        "my.plugins::MyPlugin": 1,
        "my.plugins::Other": 1,
    }
    assert summary.ops == dict(_direct_histogram(model.graph))
    assert summary.ops_by_scope["function"] == {"ai.onnx::Add": 2}
    assert summary.ops_by_scope["subgraph"] == {
        "ai.onnx::Abs": 1,
        "ai.onnx::If": 1,
        "ai.onnx::Mul": 1,
        "ai.onnx::Neg": 1,
        "ai.onnx::Sub": 1,
    }

    assert summary.inputs == (TensorSummary("X", "float", ("N", None, 4)), TensorSummary("C", "bool", ()))
    assert summary.inputs[0].shape_text() == "[N, ?, 4]" and summary.inputs[0].is_dynamic
    assert not summary.inputs[1].is_dynamic
    assert summary.outputs[2] == TensorSummary("P", "float", ())
    assert summary.outputs[1] == TensorSummary("Z", "float", (4,))

    assert summary.initializers == InitializerSummary(
        count=2, nbytes=16 + 8, external_count=0, listed_as_inputs=("W",)
    )

    assert summary.custom_nodes == (
        CustomNode("other_node", "my.plugins", "Other", "main"),
        CustomNode(
            "myplugin_node", "my.plugins", "MyPlugin", "main", plugin_namespace="gskit", plugin_version="2"
        ),
        CustomNode("addtwice_node", "local", "AddTwice", "main", calls_function=True),
    )
    assert summary.functions == (FunctionSummary("local", "AddTwice", "", node_count=2, call_count=1),)
    assert summary.functions[0].key == "local::AddTwice"

    # Shape inference (custom ops have no schema) leaves Q without a rank.
    assert summary.missing_shapes == ("Q",)
    assert summary.shape_inference_error is None
    assert summary.tensorrt is None


def test_without_inference_uses_value_info_only() -> None:
    summary = summarize(_rich_model(), infer_shapes=False)
    assert summary.missing_shapes == ("A", "Q")  # Y, Z, P, F are typed graph outputs


def test_unknown_rank_and_missing_type() -> None:
    model = _rich_model()
    model.graph.output[2].type.tensor_type.ClearField("shape")  # P: dtype known, rank unknown
    model.graph.output[3].ClearField("type")  # F: nothing known (not a valid model; inspect still reports)
    summary = summarize(model, infer_shapes=False)
    assert summary.outputs[2] == TensorSummary("P", "float", None)
    assert summary.outputs[2].shape_text() == "?" and summary.outputs[2].is_dynamic
    assert summary.outputs[3] == TensorSummary("F", "?", None)
    assert summary.missing_shapes == ("A", "Q", "P", "F")


def test_custom_nodes_in_subgraphs_and_functions() -> None:
    model = parse_model("""
        <ir_version: 8, opset_import: ["" : 18, "my.plugins" : 1, "local" : 1]>
        g (float[2] X, bool C) => (float[2] Y, float[2] F) {
            Y = If(C) <
                then_branch = t () => (float[2] a) {
                    a = my.plugins.Inside <plugin_version: string = "3"> (X)
                },
                else_branch = e () => (float[2] b) { b = Neg(X) }
            >
            F = local.Fn(X)
        }
        <domain: "local", opset_import: ["" : 18, "my.plugins" : 1]>
        Fn (x) => (y) { y = my.plugins.InFunction(x) }
    """)
    summary = summarize(model, infer_shapes=False)
    assert [(n.op_type, n.scope, n.plugin_version) for n in summary.custom_nodes] == [
        ("Inside", "subgraph", "3"),
        ("Fn", "main", None),
        ("InFunction", "function local::Fn", None),
    ]
    assert summary.ops["my.plugins::Inside"] == 1
    assert "my.plugins::InFunction" not in summary.ops
    assert summary.ops_by_scope["function"] == {"my.plugins::InFunction": 1}


def test_external_weights_are_never_read(tmp_path: Path, rng: np.random.Generator) -> None:
    weight = rng.standard_normal((64, 32)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["M"]), helper.make_node("Relu", ["M"], ["Y"])],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", "n"])],
        [numpy_helper.from_array(weight, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    path = save(model, tmp_path / "m.onnx", external_data=True)
    lazy = load(path, load_weights=False)
    (tmp_path / "m.onnx.data").unlink()  # any read of the weights would now fail

    summary = summarize(lazy, path=str(path))
    assert summary.initializers == InitializerSummary(1, weight.nbytes, 1, ())
    assert summary.inputs == (TensorSummary("X", "float", ("batch", 64)),)
    assert summary.outputs == (TensorSummary("Y", "float", ("batch", "n")),)
    # The weight became a typed input for inference, so M gets its shape: nothing is missing.
    assert summary.missing_shapes == ()
    assert summary.shape_inference_error is None


def test_missing_external_data_is_noted_not_an_error(tmp_path: Path, capsys) -> None:
    """inspect never reads weights: a data file that is not there is said, exit 0 (issue 22)."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"], name="mm")],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 32])],
        [numpy_helper.from_array(np.ones((64, 32), np.float32), "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    path = save(model, tmp_path / "m.onnx", external_data=True)
    (tmp_path / "m.onnx.data").unlink()
    assert cli.main(["inspect", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["missing_data_files"] == ["m.onnx.data"] and data["initializers"]["external_count"] == 1
    assert cli.main(["inspect", str(path)]) == 0
    assert "external data missing" in capsys.readouterr().out
    assert cli.main(["inspect", str(path), "--tensors", "--nodes"]) == 0
    assert "mm" in capsys.readouterr().out
    # commands that read weights still refuse, and a location out of the folder stays refused everywhere
    assert cli.main(["fold", str(path), "-o", str(tmp_path / "f.onnx")]) == 2
    assert "m.onnx.data' for tensor 'W' is missing" in capsys.readouterr().err
    outside = onnx.load(str(path), load_external_data=False)
    outside.graph.initializer[0].external_data[0].value = "../m.onnx.data"
    (tmp_path / "out.onnx").write_bytes(outside.SerializeToString())
    assert cli.main(["inspect", str(tmp_path / "out.onnx")]) == 2
    assert "invalid external data location" in capsys.readouterr().err


def test_to_json_keys_and_values() -> None:
    data = summarize(_rich_model()).to_json()
    for key in (
        "opsets",
        "node_count",
        "ops",
        "inputs",
        "outputs",
        "initializers",
        "custom_nodes",
        "functions",
    ):
        assert key in data
    json.dumps(data)  # plain JSON values only
    assert data["inputs"][0] == {"name": "X", "dtype": "float", "shape": ["N", None, 4]}
    assert data["outputs"][2]["shape"] == []
    assert data["functions"][0]["key"] == "local::AddTwice"
    assert data["custom_nodes"][1]["plugin_namespace"] == "gskit"


def test_cli_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "rich.onnx"
    save(_rich_model(), path)
    assert cli.main(["inspect", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["node_count"] == 6
    assert data["ops"]["my.plugins::MyPlugin"] == 1
    assert data["initializers"]["listed_as_inputs"] == ["W"]
    assert data["missing_shapes"] == ["Q"]


def test_cli_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    path = tmp_path / "rich.onnx"
    save(_rich_model(), path)
    assert cli.main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    for text in (
        "ai.onnx::Relu",
        "ai.onnx::If",
        "my.plugins::MyPlugin",
        "local::AddTwice",
        "[N, ?, 4]",
        "gskit",
    ):
        assert text in out
    # The histogram table lists ops by count, most frequent first.
    assert out.index("ai.onnx::If") < out.index("ai.onnx::Relu")


def test_cli_light_model_tables(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    path = LIGHT_MODELS[0]
    assert cli.main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    for op in _direct_histogram(onnx.load(str(path)).graph):
        assert op in out


def test_loop_body_counted_as_subgraph() -> None:
    model = parse_model("""
        <ir_version: 8, opset_import: ["" : 18]>
        g (int64 M, bool cond, float[2] X) => (float[2] Y) {
            Y = Loop(M, cond, X) <body = body (int64 i, bool c, float[2] x) => (bool c_out, float[2] x_out) {
                c_out = Identity(c)
                x_out = Add(x, x)
            }>
        }
    """)
    summary = summarize(model)
    assert summary.node_count == 1 and summary.subgraph_node_count == 2
    assert summary.ops == {"ai.onnx::Add": 1, "ai.onnx::Identity": 1, "ai.onnx::Loop": 1}
    assert summary.ops_by_scope["main"] == {"ai.onnx::Loop": 1}
    assert summary.missing_shapes == ()


def test_cli_table_shows_lowercase_symbolic_dims(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """rich would take ``[batch, 4, 8, 8]`` for a style tag and print nothing; tables must show it as text."""
    monkeypatch.setenv("COLUMNS", "200")
    example = Path(__file__).resolve().parents[1] / "gskit" / "data" / "example.onnx"
    assert cli.main(["inspect", str(example)]) == 0
    out = capsys.readouterr().out
    assert "[batch, 4, 8, 8]" in out and "[batch, 10]" in out


def _small_model(tmp_path: Path) -> Path:
    """x -> Add(b) -> a -> Relu -> y, and a custom node reading a; every node named."""
    nodes = [
        helper.make_node("Add", ["x", "b"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["y"], name="relu"),
        helper.make_node("Swish", ["a"], ["s"], name="swish", domain="my.ns"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("s", TensorProto.FLOAT, None),
        ],
        [numpy_helper.from_array(np.ones(4, np.float32), "b")],
    )
    path = tmp_path / "small.onnx"
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("my.ns", 1)]
    )
    onnx.save(model, path)
    return path


def test_cli_tensors_and_nodes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _small_model(tmp_path)
    assert cli.main(["inspect", str(path), "--tensors", "--nodes", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    tensors = {t["name"]: t for t in data["tensors"]}
    assert list(tensors) == ["x", "b", "a", "y", "s"]
    assert tensors["x"] == {
        "name": "x",
        "dtype": "float",
        "shape": ["N", 4],
        "kind": "input",
        "producer": None,
        "consumers": 1,
        "is_output": False,
    }
    assert (tensors["b"]["kind"], tensors["b"]["shape"]) == ("initializer", [4])
    # an intermediate tensor, with its shape from inference, its producer and both readers
    assert (tensors["a"]["shape"], tensors["a"]["producer"], tensors["a"]["consumers"]) == (
        ["N", 4],
        "add",
        2,
    )
    assert (tensors["y"]["is_output"], tensors["y"]["consumers"]) == (True, 0)
    assert data["nodes"][2] == {"name": "swish", "op": "my.ns::Swish", "inputs": ["a"], "outputs": ["s"]}
    assert [n["op"] for n in data["nodes"]] == ["ai.onnx::Add", "ai.onnx::Relu", "my.ns::Swish"]


def test_cli_tensors_table_and_the_hints_that_point_to_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    path = _small_model(tmp_path)
    assert cli.main(["inspect", str(path), "--tensors"]) == 0
    out = capsys.readouterr().out
    assert "Tensors (5)" in out and "activation" in out and "[N, 4]" in out and "add" in out
    assert "Model" not in out  # the listing replaces the summary
    # isolate's and edit's hints name the listing that shows what they could not find
    assert (
        cli.main(["isolate", str(path), "-o", str(tmp_path / "i.onnx"), "--inputs", "aa", "--outputs", "y"])
        == 2
    )
    assert "`gskit inspect --tensors` lists the model's tensors" in capsys.readouterr().err
    edited = str(tmp_path / "e.onnx")
    assert cli.main(["edit", str(path), "-o", edited, "--remove-node", "nope"]) == 2
    assert "gskit inspect --nodes lists them" in capsys.readouterr().err
