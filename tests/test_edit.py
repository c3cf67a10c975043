"""Graph editing: each edit is saved (onnx checker) and run on onnxruntime against numpy or the original."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from conftest import parse_model

from gskit.backends import ort
from gskit.cli import main
from gskit.errors import GskitError
from gskit.io import model as gsmodel
from gskit.passes import edit

OPSET = '<ir_version: 8, opset_import: ["" : 17]>'


def _save_and_run(graph: gs.Graph, tmp_path: Path, feeds: dict, name: str = "edited.onnx") -> dict:
    """Save with the checker (gskit.io.model.save), reload from disk, run on onnxruntime."""
    path = gsmodel.save(graph, tmp_path / name)
    return ort.run(path, feeds)


def _all_names(graph: onnx.GraphProto) -> set[str]:
    names = {t.name for t in (*graph.input, *graph.output, *graph.value_info, *graph.initializer)}
    for node in graph.node:
        names.update(node.input)
        names.update(node.output)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                names |= _all_names(attr.g)
    return names


# ---------------------------------------------------------------------------------------------- rename

IF_MODEL = f"""{OPSET}
g (float[2,3] x, bool c) => (float[2,3] y) <float[3] w = {{1.0, -2.0, 3.0}}>
{{
  t = Add(x, w)
  y = If(c) <then_branch = th () => (float[2,3] a) {{ a = Neg(t) }},
             else_branch = el () => (float[2,3] b) {{ b = Abs(t) }}>
}}
"""


@pytest.mark.parametrize("cond", [True, False])
def test_rename_all_places_including_subgraph_references(tmp_path, rng, cond):
    model = onnx.shape_inference.infer_shapes(parse_model(IF_MODEL))  # value_info for t, a, b too
    x = rng.standard_normal((2, 3)).astype(np.float32)
    expected = ort.run(model, {"x": x, "c": np.array(cond)})["y"]
    graph = edit.rename_tensors(gsmodel.to_graph(model), {"x": "inp", "w": "weight", "t": "mid", "y": "out"})
    out = _save_and_run(graph, tmp_path, {"inp": x, "c": np.array(cond)})
    np.testing.assert_array_equal(out["out"], expected)
    names = _all_names(gsmodel.load(tmp_path / "edited.onnx").graph)
    assert {"inp", "weight", "mid", "out"} <= names
    assert not names & {"x", "w", "t", "y"}


def test_rename_swap_is_allowed(tmp_path, rng):
    model = parse_model(f"{OPSET} g (float[2] a, float[2] b) => (float[2] y) {{ y = Sub(a, b) }}")
    graph = edit.rename_tensors(gsmodel.to_graph(model), {"a": "b", "b": "a"})
    a, b = np.array([5.0, 1.0], np.float32), np.array([1.0, 2.0], np.float32)
    np.testing.assert_array_equal(_save_and_run(graph, tmp_path, {"a": a, "b": b})["y"], b - a)


def test_rename_unknown_and_clash_raise_with_the_name():
    graph = gsmodel.to_graph(parse_model(IF_MODEL))
    with pytest.raises(GskitError, match="'nope'"):
        edit.rename_tensors(graph, {"nope": "z"})
    with pytest.raises(GskitError, match="'t'.*already used"):
        edit.rename_tensors(graph, {"x": "t"})
    # A name used only inside a subgraph clashes too.
    with pytest.raises(GskitError, match="'a'"):
        edit.rename_tensors(graph, {"x": "a"})
    with pytest.raises(GskitError, match="several tensors"):
        edit.rename_tensors(graph, {"x": "q", "t": "q"})


# ---------------------------------------------------------------------------------------- insert after


def _conv_transpose_model(rng) -> onnx.ModelProto:
    x = gs.Variable("x", dtype=np.float32, shape=(1, 2, 4, 4))
    w = gs.Constant("w", rng.standard_normal((2, 3, 2, 2)).astype(np.float32))
    y = gs.Variable("y", dtype=np.float32, shape=(1, 3, 5, 5))
    node = gs.Node("ConvTranspose", name="ConvTranspose__9", inputs=[x, w], outputs=[y])
    return gsmodel.to_model(gs.Graph(nodes=[node], inputs=[x], outputs=[y], opset=17))


def test_insert_pad_after_conv_transpose_graph_output(tmp_path, rng):
    model = _conv_transpose_model(rng)
    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    reference = ort.run(model, {"x": x})["y"]
    graph = gsmodel.to_graph(model)
    pads = np.array([0, 0, 0, 0, 0, 0, 1, 0], np.int64)
    node = edit.insert_after(graph, "y", "Pad", attrs={"mode": "reflect"}, extra_inputs=[pads])
    assert node.op == "Pad" and node.outputs[0].name == "y"
    assert [t.name for t in graph.outputs] == ["y"] and graph.outputs[0].shape == [1, 3, 6, 5]
    out = _save_and_run(graph, tmp_path, {"x": x})["y"]
    np.testing.assert_allclose(
        out, np.pad(reference, [(0, 0), (0, 0), (0, 1), (0, 0)], mode="reflect"), rtol=0, atol=0
    )


def test_insert_after_graph_input_keeps_input_name(tmp_path):
    model = parse_model(f"{OPSET} g (float[4] x) => (float[4] y) {{ y = Neg(x) }}")
    graph = gsmodel.to_graph(model)
    node = edit.insert_after(graph, "x", "Relu")
    assert [t.name for t in graph.inputs] == ["x"] and node.outputs[0].name != "x"
    x = np.array([-1.0, 2.0, -3.0, 4.0], np.float32)
    np.testing.assert_array_equal(_save_and_run(graph, tmp_path, {"x": x})["y"], -np.maximum(x, 0))


def test_insert_after_intermediate_with_tensor_extra_input_and_coerced_attr(tmp_path):
    model = parse_model(
        f"{OPSET} g (float[2,3] x, float[2,3] z) => (float[2,3] y) {{ t = Relu(x)  y = Neg(t) }}"
    )
    graph = gsmodel.to_graph(model)
    edit.insert_after(graph, "t", "Add", extra_inputs=["z"])
    edit.insert_after(graph, "t", "LeakyRelu", attrs={"alpha": "2"})  # string -> FLOAT from the schema
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    z = np.full((2, 3), -10.0, np.float32)
    added = np.maximum(x, 0) + z
    expected = -np.where(added < 0, 2.0 * added, added)
    np.testing.assert_allclose(_save_and_run(graph, tmp_path, {"x": x, "z": z})["y"], expected, rtol=1e-6)


def test_insert_after_cycle_names_a_node_on_it():
    model = parse_model(f"{OPSET} g (float[2] x) => (float[2] y) {{ a = Relu(x)  b = Neg(a)  y = Abs(b) }}")
    graph = gsmodel.to_graph(model)
    with pytest.raises(GskitError, match="cycle through node '(a_Add|.*)'") as info:
        edit.insert_after(graph, "a", "Add", extra_inputs=["b"])
    assert "a_Add" in str(info.value) and "\n" not in str(info.value)


def test_insert_after_errors_name_the_tensor():
    graph = gsmodel.to_graph(parse_model(f"{OPSET} g (float[2] x) => (float[2] y) {{ y = Neg(x) }}"))
    with pytest.raises(GskitError, match="'nope'"):
        edit.insert_after(graph, "nope", "Relu")
    with pytest.raises(GskitError, match="extra input 'ghost'"):
        edit.insert_after(graph, "x", "Add", extra_inputs=["ghost"])
    with pytest.raises(GskitError, match="no attribute 'bogus'"):
        edit.insert_after(graph, "y", "Relu", attrs={"bogus": 1})
    assert [n.op for n in graph.nodes] == ["Neg"] and graph.nodes[0].outputs[0].name == "y"  # left untouched


def test_unknown_tensor_errors_suggest_close_names_as_isolate_does():
    # edit said only "check the name"; isolate already offered close names and where to list them.
    text = f"{OPSET} g (float[2] x) => (float[2] y) {{ hidden_1 = Neg(x)  y = Abs(hidden_1) }}"
    graph = gsmodel.to_graph(parse_model(text))
    for call in (
        lambda: edit.expose_tensors(graph, ["hiden_1"]),
        lambda: edit.rename_tensors(graph, {"hiden_1": "h"}),
        lambda: edit.insert_after(graph, "hiden_1", "Relu"),
    ):
        with pytest.raises(GskitError, match=r"'hiden_1'.*close names: 'hidden_1'.*gskit inspect --tensors"):
            call()


def test_removing_an_absent_attribute_says_remove_and_lists_the_node_s_attributes():
    # It said "set attributes: ... has no attribute" for --remove-attr, and not which ones the node has.
    text = f"{OPSET} g (float[2] x) => (float[2] y) {{ y = LeakyRelu<alpha=0.1>(x) }}"
    graph = gsmodel.to_graph(parse_model(text))
    expected = r"remove attribute: node .* has no attribute 'beta' \(it has: alpha\)"
    with pytest.raises(GskitError, match=expected):
        edit.set_attributes(graph, graph.nodes[0].name, remove=["beta"])


def test_insert_after_unknown_op_is_named_before_anything_changes():
    # A misspelled op used to be inserted and then fail onnx's checker ("Field 'shape' of 'type' is
    # required"), naming neither the op nor the node.
    graph = gsmodel.to_graph(parse_model(f"{OPSET} g (float[2] x) => (float[2] y) {{ y = Neg(x) }}"))
    with pytest.raises(GskitError, match="'Rleu' is not an ONNX op") as info:
        edit.insert_after(graph, "y", "Rleu")
    assert "--force" in str(info.value) and "\n" not in str(info.value)
    assert [n.op for n in graph.nodes] == ["Neg"] and graph.nodes[0].outputs[0].name == "y"  # left untouched
    node = edit.insert_after(graph, "x", "MyOp", force=True)  # a custom op on purpose
    assert node.op == "MyOp"


# ----------------------------------------------------------------------------------------- remove node

REMOVE_MODEL = f"""{OPSET}
g (float[2,3] x) => (float[2,3] y) {{
  a = Cast <to = 1> (x)
  b = Relu(a)
  y = Identity(b)
}}
"""


@pytest.mark.parametrize("node_index", [0, 2], ids=["cast-middle", "identity-graph-output"])
def test_remove_node_keeps_outputs(tmp_path, rng, node_index):
    model = parse_model(REMOVE_MODEL)
    names = [f"n{i}" for i in range(3)]
    for node, name in zip(model.graph.node, names, strict=True):
        node.name = name
    x = rng.standard_normal((2, 3)).astype(np.float32)
    graph = edit.remove_node(gsmodel.to_graph(model), names[node_index])
    assert names[node_index] not in [n.name for n in graph.nodes] and len(graph.nodes) == 2
    assert [t.name for t in graph.outputs] == ["y"]
    np.testing.assert_array_equal(_save_and_run(graph, tmp_path, {"x": x})["y"], np.maximum(x, 0))


def test_remove_node_errors():
    model = parse_model(f"{OPSET} g (float[2] x, float[2] z) => (float[2] y) {{ y = Add(x, z) }}")
    model.graph.node[0].name = "add"
    graph = gsmodel.to_graph(model)
    with pytest.raises(GskitError, match="'add'.*2 data inputs"):
        edit.remove_node(graph, "add")
    with pytest.raises(GskitError, match="node 'nope'"):
        edit.remove_node(graph, "nope")
    passthrough = parse_model(f"{OPSET} g (float[2] x) => (float[2] y) {{ y = Identity(x) }}")
    passthrough.graph.node[0].name = "id"
    with pytest.raises(GskitError, match="'id'"):
        edit.remove_node(gsmodel.to_graph(passthrough), "id")


# ------------------------------------------------------------------------------------ input shape/dtype

SHAPE_MODEL = f"""{OPSET}
g (float[1,3] x) => (float[1,3] y) <float[3] w = {{1.0, 2.0, 3.0}}> {{ t = Relu(x)  y = Mul(t, w) }}
"""


def test_set_input_shape_symbolic_then_run_with_that_shape(tmp_path, rng):
    model = onnx.shape_inference.infer_shapes(parse_model(SHAPE_MODEL))  # value_info for t: [1,3], now stale
    graph = edit.set_input_shape(gsmodel.to_graph(model), "x", ["batch", 3])
    x = rng.standard_normal((4, 3)).astype(np.float32)
    path = gsmodel.save(graph, tmp_path / "shape.onnx")
    session = ort.session(path)
    assert session.get_inputs()[0].shape == ["batch", 3]
    out = ort.run(session, {"x": x})["y"]
    np.testing.assert_allclose(out, np.maximum(x, 0) * np.array([1, 2, 3], np.float32), rtol=1e-6)


def test_set_input_shape_dynamic_and_invalid():
    graph = gsmodel.to_graph(parse_model(SHAPE_MODEL))
    edit.set_input_shape(graph, "x", [-1, None])
    dims = gsmodel.to_model(graph).graph.input[0].type.tensor_type.shape.dim
    assert len(dims) == 2 and not any(d.HasField("dim_value") or d.HasField("dim_param") for d in dims)
    with pytest.raises(GskitError, match="'x'.*invalid dim -2"):
        edit.set_input_shape(graph, "x", [-2, 3])
    with pytest.raises(GskitError, match="'w' is not a graph input"):
        edit.set_input_shape(graph, "w", [3])


GATHER_MODEL = f"""{OPSET}
g (int64[2,3] ids) => (float[2,3,2] y) <float[5,2]
  table = {{0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0}}>
{{ y = Gather <axis = 0> (table, ids) }}
"""


def test_set_input_dtype_int64_to_int32_runs_with_int32_feeds(tmp_path):
    graph = edit.set_input_dtype(gsmodel.to_graph(parse_model(GATHER_MODEL)), "ids", "int32")
    assert [n.op for n in graph.nodes] == ["Cast", "Gather"]
    ids = np.array([[0, 4, 2], [1, 3, 0]], np.int32)
    path = gsmodel.save(graph, tmp_path / "int32.onnx")
    session = ort.session(path)
    assert session.get_inputs()[0].name == "ids" and session.get_inputs()[0].type == "tensor(int32)"
    table = np.arange(10, dtype=np.float32).reshape(5, 2)
    np.testing.assert_array_equal(ort.run(session, {"ids": ids})["y"], np.take(table, ids, axis=0))


def test_set_input_dtype_without_cast_and_errors():
    graph = edit.set_input_dtype(gsmodel.to_graph(parse_model(GATHER_MODEL)), "ids", np.int32, cast=False)
    assert [n.op for n in graph.nodes] == ["Gather"] and graph.inputs[0].dtype == np.int32
    with pytest.raises(GskitError, match="unknown dtype 'int33'"):
        edit.set_input_dtype(graph, "ids", "int33")
    with pytest.raises(GskitError, match="'y' is not a graph input"):
        edit.set_input_dtype(graph, "y", "int32")


# ------------------------------------------------------------------------------------------ attributes

ATTR_MODEL = f"{OPSET} g (float[4] x) => (float[4] y) {{ y = LeakyRelu <alpha = 0.5> (x) }}"


def test_custom_attribute_passes_checker_and_survives_save_load(tmp_path):
    model = parse_model(ATTR_MODEL)
    model.graph.node[0].name = "lrelu"
    graph = edit.set_attributes(gsmodel.to_graph(model), "lrelu", {"__plugin_hint": "fast", "__tile": 8})
    x = np.array([-2.0, -1.0, 1.0, 2.0], np.float32)
    out = _save_and_run(graph, tmp_path, {"x": x})["y"]
    np.testing.assert_allclose(out, np.where(x < 0, 0.5 * x, x))
    attrs = {
        a.name: onnx.helper.get_attribute_value(a)
        for a in gsmodel.load(tmp_path / "edited.onnx").graph.node[0].attribute
    }
    assert attrs["__plugin_hint"] == b"fast" and attrs["__tile"] == 8 and attrs["alpha"] == 0.5


def test_set_and_remove_standard_attribute(tmp_path):
    model = parse_model(ATTR_MODEL)
    model.graph.node[0].name = "lrelu"
    x = np.array([-2.0, -1.0, 1.0, 2.0], np.float32)
    graph = edit.set_attributes(gsmodel.to_graph(model), "lrelu", {"alpha": 3})  # int -> FLOAT
    assert isinstance(graph.nodes[0].attrs["alpha"], float)
    np.testing.assert_allclose(_save_and_run(graph, tmp_path, {"x": x})["y"], np.where(x < 0, 3 * x, x))
    graph = edit.set_attributes(graph, "lrelu", remove=["alpha"])  # back to the default 0.01
    np.testing.assert_allclose(
        _save_and_run(graph, tmp_path, {"x": x}, "r.onnx")["y"], np.where(x < 0, 0.01 * x, x), rtol=1e-6
    )


def test_attribute_errors():
    model = parse_model(ATTR_MODEL)
    model.graph.node[0].name = "lrelu"
    graph = gsmodel.to_graph(model)
    with pytest.raises(GskitError, match="LeakyRelu.*no attribute 'beta'.*'lrelu'"):
        edit.set_attributes(graph, "lrelu", {"beta": 1.0})
    with pytest.raises(GskitError, match="not a valid INT|not a valid FLOAT"):
        edit.set_attributes(graph, "lrelu", {"alpha": "big"})
    with pytest.raises(GskitError, match="no attribute 'gamma'"):
        edit.set_attributes(graph, "lrelu", remove=["gamma"])
    with pytest.raises(GskitError, match="node 'other'"):
        edit.set_attributes(graph, "other", {"alpha": 1.0})
    edit.set_attributes(graph, "lrelu", {"beta": 1.0}, force=True)
    assert graph.nodes[0].attrs["beta"] == 1.0


# ---------------------------------------------------------------------------------------------- expose


def test_expose_intermediate_equals_numpy(tmp_path, rng):
    w_value = rng.standard_normal((64, 512)).astype(np.float32)  # 128 KiB: given to inference by type only
    x = gs.Variable("x", dtype=np.float32, shape=("n", 512))
    w = gs.Constant("w", np.ascontiguousarray(w_value.T))
    t, u, y = gs.Variable("t"), gs.Variable("u"), gs.Variable("y", dtype=np.float32, shape=("n", 64))
    nodes = [
        gs.Node("MatMul", inputs=[x, w], outputs=[t]),
        gs.Node("Relu", inputs=[t], outputs=[u]),
        gs.Node("Sum", inputs=[u], outputs=[y]),
    ]
    src = gsmodel.save(
        gs.Graph(nodes=nodes, inputs=[x], outputs=[y], opset=17), tmp_path / "w.onnx", external_data=True
    )
    graph = gsmodel.to_graph(gsmodel.load(src, load_weights=False))
    edit.expose_tensors(graph, ["t", "u", "y"])
    assert isinstance(graph.tensors()["w"]._values, gs.ir.tensor.LazyValues)  # weights never read
    assert [o.name for o in graph.outputs] == ["y", "t", "u"]
    assert graph.outputs[1].dtype == np.float32 and graph.outputs[1].shape == ["n", 64]
    xv = rng.standard_normal((3, 512)).astype(np.float32)
    out = _save_and_run(graph, tmp_path, {"x": xv})
    np.testing.assert_allclose(out["t"], xv @ w_value.T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out["u"], np.maximum(xv @ w_value.T, 0), rtol=1e-4, atol=1e-4)


def test_expose_errors():
    graph = gsmodel.to_graph(parse_model(SHAPE_MODEL))
    with pytest.raises(GskitError, match="'nope'"):
        edit.expose_tensors(graph, ["nope"])
    with pytest.raises(GskitError, match="'w' is a constant"):
        edit.expose_tensors(graph, ["w"])


# ------------------------------------------------------------------------------------------- constants

CONSTANTS_MODEL = f"""{OPSET}
g (float[3] x) => (float[3] y) {{
  a = Constant <value_floats = [1.0, 2.0, 3.0]> ()
  b = Constant <value_float = 0.5> ()
  s = Constant <value_ints = [3]> ()
  k = Constant <value = float[3] {{4.0, 5.0, 6.0}}> ()
  t = Add(x, a)
  u = Mul(t, b)
  v = Reshape(u, s)
  y = Sub(v, k)
}}
"""


def test_constants_round_trip(tmp_path):
    model = parse_model(CONSTANTS_MODEL)
    x = np.array([1.0, -1.0, 0.25], np.float32)
    expected = (x + [1, 2, 3]) * 0.5 - np.array([4, 5, 6], np.float32)
    graph = edit.constants_to_initializers(gsmodel.to_graph(model))
    assert [n.op for n in graph.nodes] == ["Add", "Mul", "Reshape", "Sub"]
    np.testing.assert_allclose(_save_and_run(graph, tmp_path, {"x": x})["y"], expected, rtol=1e-6)
    assert {i.name for i in gsmodel.load(tmp_path / "edited.onnx").graph.initializer} == {"a", "b", "s", "k"}

    graph = edit.initializers_to_constants(graph)
    assert sorted(n.op for n in graph.nodes).count("Constant") == 4
    np.testing.assert_allclose(
        _save_and_run(graph, tmp_path, {"x": x}, "back.onnx")["y"], expected, rtol=1e-6
    )
    assert not gsmodel.load(tmp_path / "back.onnx").graph.initializer
    with pytest.raises(GskitError, match="'x' is not an initializer"):
        edit.initializers_to_constants(graph, ["x"])


def test_drop_initializer_inputs_library_and_cli(tmp_path):
    text = (
        f"{OPSET} g (float[3] x, float[3] w) => (float[3] y) "
        "<float[3] w = {1.0, 2.0, 3.0}> { y = Add(x, w) }"
    )
    src = gsmodel.save(parse_model(text), tmp_path / "src.onnx")
    x = np.zeros(3, np.float32)
    kept, dropped = tmp_path / "kept.onnx", tmp_path / "dropped.onnx"
    assert main(["edit", str(src), "-o", str(kept)]) == 0  # listing preserved unless asked
    assert [i.name for i in gsmodel.load(kept).graph.input] == ["x", "w"]
    np.testing.assert_array_equal(ort.run(kept, {"x": x, "w": x + 7})["y"], x + 7)  # still overridable
    assert main(["edit", str(src), "-o", str(dropped), "--drop-initializer-inputs"]) == 0
    assert [i.name for i in gsmodel.load(dropped).graph.input] == ["x"]
    session = ort.session(dropped)
    np.testing.assert_array_equal(ort.run(session, {"x": x})["y"], [1, 2, 3])
    with pytest.raises(GskitError):
        ort.run(session, {"x": x, "w": x})

    graph = gsmodel.to_graph(parse_model(text))
    graph.inputs.append(graph.tensors()["w"])
    assert [t.name for t in edit.drop_initializer_inputs(graph).inputs] == ["x"]


# ------------------------------------------------------------------------------------------------- CLI


def test_cli_edit_chain(tmp_path, rng, capsys):
    src = gsmodel.save(_conv_transpose_model(rng), tmp_path / "ct.onnx")
    out = tmp_path / "out.onnx"
    rc = main(
        [
            "edit",
            str(src),
            "-o",
            str(out),
            "--rename",
            "x=image",
            "--insert-after",
            "y:Pad:mode=reflect,@pads=0,0,0,0,0,0,1,0",
            "--set-attr",
            "ConvTranspose__9:__note=hello",
            "ConvTranspose__9:strides=1,1",
            "--expose",
            "y_before_pad",
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "rename" in printed and "Pad" in printed
    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    reference = ort.run(src, {"x": x})["y"]
    result = ort.run(out, {"image": x})
    np.testing.assert_array_equal(result["y_before_pad"], reference)
    np.testing.assert_array_equal(
        result["y"], np.pad(reference, [(0, 0), (0, 0), (0, 1), (0, 0)], mode="reflect")
    )
    node = next(n for n in gsmodel.load(out).graph.node if n.name == "ConvTranspose__9")
    assert {a.name for a in node.attribute} >= {"__note", "strides"}


def test_cli_input_shape_and_dtype(tmp_path):
    src = gsmodel.save(parse_model(GATHER_MODEL), tmp_path / "g.onnx")
    out = tmp_path / "o.onnx"
    assert (
        main(
            [
                "edit",
                str(src),
                "-o",
                str(out),
                "--input-shape",
                "ids:batch,-1",
                "--input-dtype",
                "ids:int32",
                "--json",
            ]
        )
        == 0
    )
    info = ort.session(out).get_inputs()[0]
    assert info.type == "tensor(int32)" and info.shape[0] == "batch"
    ids = np.array([[1, 2, 3, 4]], np.int32)
    table = np.arange(10, dtype=np.float32).reshape(5, 2)
    np.testing.assert_array_equal(ort.run(out, {"ids": ids})["y"], np.take(table, ids, axis=0))


def test_cli_errors_exit_2_with_one_line(tmp_path, capsys):
    src = gsmodel.save(parse_model(ATTR_MODEL), tmp_path / "m.onnx")
    out = tmp_path / "o.onnx"
    assert main(["edit", str(src), "-o", str(out), "--remove-node", "ghost_node"]) == 2
    err = capsys.readouterr().err
    assert "ghost_node" in err and err.count("\n") == 1 and not out.exists()
    assert main(["edit", str(src), "-o", str(src)]) == 2
    assert "--in-place" in capsys.readouterr().err
    assert main(["edit", str(src), "-o", str(out), "--rename", "x"]) == 2
    assert "OLD=NEW" in capsys.readouterr().err
    # Both: one of them would be ignored (it used to be --in-place, silently), so neither is guessed.
    before = src.read_bytes()
    assert main(["edit", str(src), "-o", str(out), "--in-place", "--rename", "x=x2"]) == 2
    assert "not both" in capsys.readouterr().err and not out.exists() and src.read_bytes() == before


# ------------------------------------------------------------------------------- one options dataclass


def test_cli_flags_and_recipe_step_make_the_same_edit_options():
    """`gskit edit`'s flags and the recipe's `edit:` mapping are two spellings of one EditOptions; repeated
    flags add up (a later rename of the same tensor wins, attribute edits of one node combine)."""
    from gskit.cli import build_parser
    from gskit.cli.options import options_from_args
    from gskit.pipeline.recipe import parse_recipe

    argv = [
        "edit", "m.onnx", "-o", "o.onnx",
        "--rename", "a=b", "c=d", "--rename", "a=e",
        "--input-shape", "x:batch,3,-1", "--input-dtype", "ids:int32",
        "--insert-after", "y:Pad:mode=reflect,@pads=p", "--insert-after", "z:Relu",
        "--remove-node", "n1", "--remove-node", "n2",
        "--set-attr", "conv:__note=hi", "--set-attr", "conv:strides=1,2", "pool:k=3",
        "--remove-attr", "conv:group", "conv:dilations",
        "--expose", "t", "--constants-to-initializers", "--force",
    ]  # fmt: skip
    from_cli = options_from_args(build_parser().parse_args(argv), edit.EditOptions)
    recipe = parse_recipe(
        """steps:
  - edit:
      rename: {a: e, c: d}
      input_shapes: {x: [batch, 3, null]}
      input_dtypes: {ids: int32}
      insert_after:
        - {tensor: y, op: Pad, attrs: {mode: reflect}, inputs: [p]}
        - {tensor: z, op: Relu, attrs: {}, inputs: []}
      remove_nodes: [n1, n2]
      set_attrs: {conv: {__note: hi, strides: [1, 2]}, pool: {k: 3}}
      remove_attrs: {conv: [group, dilations]}
      expose: [t]
      constants_to_initializers: true
      force: true
"""
    )
    assert from_cli == recipe.steps[0].options


def test_cli_edit_flags_are_the_edit_options_fields(capsys):
    """Each EditOptions field is one `gskit edit` flag, with the field's help: nothing is declared twice."""
    from gskit.cli.options import cli_fields, flag_of

    with pytest.raises(SystemExit):
        main(["edit", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for field in cli_fields(edit.EditOptions):
        assert flag_of(field) in text and " ".join(field.metadata["help"].split()) in text
    assert len(cli_fields(edit.EditOptions)) == 11


def test_cli_edit_types_a_plugin_output_it_exposes(tmp_path: Path) -> None:
    """``gskit edit`` on a prepared model: the shipped plugins type a plugin node's output (no value_info
    left for it), so --expose gives it ClampSwish's float output instead of refusing."""
    example = Path(__file__).resolve().parents[1] / "gskit" / "data" / "example.onnx"
    replaced = tmp_path / "replaced.onnx"
    assert main(["replace", str(example), "-o", str(replaced), "--tensorrt", "8.6", "--json"]) == 0
    model = onnx.load(replaced)
    plugin = next(n for n in model.graph.node if n.domain == "gskit" and n.op_type == "ClampSwish")
    del model.graph.value_info[:]  # what an exporter or another tool may leave: no types inside
    bare = tmp_path / "bare.onnx"
    onnx.save(model, bare)
    out = tmp_path / "exposed.onnx"
    assert main(["edit", str(bare), "-o", str(out), "--expose", plugin.output[0], "--json"]) == 0
    exposed = {o.name: o.type.tensor_type.elem_type for o in onnx.load(out).graph.output}
    assert exposed[plugin.output[0]] == onnx.TensorProto.FLOAT
