"""Subgraph isolation: the isolated part, run on onnxruntime, reproduces the original's intermediates."""

from __future__ import annotations

import argparse
import json

import numpy as np
import onnx
import pytest

from gskit.backends import ort
from gskit.cli import isolate as isolate_cli
from gskit.errors import GskitError
from gskit.io.model import load, save, to_graph, to_model
from gskit.passes.isolate import isolate
from gskit.passes.shapes import deregister_schemas
from gskit.plugin import PluginRegistry, PluginSpec
from tests.conftest import parse_model

TOL = {"rtol": 1e-6, "atol": 1e-6}


def _init(name: str, array: np.ndarray) -> str:
    dims = ",".join(str(d) for d in array.shape)
    values = ",".join(f"{v:.6f}" for v in array.ravel())
    return f"float[{dims}] {name} = {{{values}}}"


@pytest.fixture
def branchy(rng) -> onnx.ModelProto:
    """Two conv branches joined by Add, a residual, and a second output off one branch."""
    w = {
        "w1": rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
        "b1": rng.standard_normal(8).astype(np.float32),
        "w2": rng.standard_normal((8, 3, 1, 1)).astype(np.float32),
        "w3": rng.standard_normal((8, 8, 3, 3)).astype(np.float32),
        "w4": rng.standard_normal((2, 8, 1, 1)).astype(np.float32),
    }
    inits = ", ".join(_init(k, v) for k, v in w.items())
    return parse_model(f"""
        <ir_version: 8, opset_import: ["" : 17]>
        branchy (float[1,3,8,8] x, float[1,8,8,8] x2) => (float[1,8,8,8] y, float[1,2,8,8] z)
        <{inits}>
        {{
            c1 = Conv<pads = [1,1,1,1]>(x, w1, b1)
            r1 = Relu(c1)
            c2 = Conv(x, w2)
            r2 = Relu(c2)
            s = Add(r1, r2)
            c3 = Conv<pads = [1,1,1,1]>(s, w3)
            t = Add(c3, x2)
            u = Relu(t)
            y = Add(u, s)
            z = Conv(r2, w4)
        }}
    """)


def _feeds(rng) -> dict[str, np.ndarray]:
    return {
        "x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32),
        "x2": rng.standard_normal((1, 8, 8, 8)).astype(np.float32),
    }


def _all_values(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every main-graph tensor's value, from the original model with all node outputs exposed."""
    exposed = onnx.shape_inference.infer_shapes(model)
    known = {v.name: v for v in exposed.graph.value_info}
    outputs = {o.name for o in exposed.graph.output}
    for node in exposed.graph.node:
        exposed.graph.output.extend(known[n] for n in node.output if n not in outputs and n in known)
    return {**feeds, **ort.run(exposed, feeds)}


def _check(model: onnx.ModelProto, inputs: list[str], outputs: list[str], feeds: dict[str, np.ndarray]):
    values = _all_values(model, feeds)
    sub = isolate(to_graph(model), inputs, outputs)
    sub_model = to_model(sub)
    onnx.checker.check_model(sub_model, full_check=True)
    got = ort.run(sub_model, {name: values[name] for name in inputs})
    assert list(got) == outputs
    for name in outputs:
        np.testing.assert_allclose(got[name], values[name], **TOL)
    return sub


def test_single_cut_reproduces_intermediate_output(branchy, rng):
    sub = _check(branchy, ["s", "x2"], ["y"], _feeds(rng))
    assert sorted(n.op for n in sub.nodes) == ["Add", "Add", "Conv", "Relu"]
    assert [(t.name, t.shape) for t in sub.inputs] == [("s", [1, 8, 8, 8]), ("x2", [1, 8, 8, 8])]
    assert all(t.dtype == np.float32 for t in (*sub.inputs, *sub.outputs))


def test_multi_input_multi_output(branchy, rng):
    sub = _check(branchy, ["r1", "r2", "x2"], ["t", "z"], _feeds(rng))
    assert [n.op for n in sub.nodes] == ["Add", "Conv", "Add", "Conv"]
    # Only the weights of the kept convolutions come along.
    used = {t.name for n in sub.nodes for t in n.inputs}
    assert {"w3", "w4"} <= used and not {"w1", "b1", "w2"} & used


def test_original_graph_is_unchanged(branchy):
    graph = to_graph(branchy)
    before = onnx.printer.to_text(to_model(graph))
    isolate(graph, ["s", "x2"], ["y"])
    assert onnx.printer.to_text(to_model(graph)) == before
    assert graph.tensors()["s"].dtype is None  # the copy got the inferred type, not the original


def test_model_input_and_output_kept_as_they_are(branchy, rng):
    sub = _check(branchy, ["x"], ["z"], _feeds(rng))
    assert [n.op for n in sub.nodes] == ["Conv", "Relu", "Conv"]


def test_node_producing_an_input_and_a_needed_tensor():
    model = parse_model("""
        <ir_version: 8, opset_import: ["" : 18]>
        g (float[4,6] x) => (float[4,3] y)
        {
            a, b = Split<axis = 1, num_outputs = 2>(x)
            ra = Relu(a)
            y = Add(ra, b)
        }
    """)
    feeds = {"x": np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)}
    sub = _check(model, ["x", "a"], ["y"], feeds)
    split = next(n for n in sub.nodes if n.op == "Split")
    assert split.outputs[0].name != "a" and split.outputs[1].name == "b"


IF_MODEL = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2,3] x, bool cond) => (float[2,3] y)
    {
        h0 = Relu(x)
        h = Mul(h0, h0)
        r = If(cond) <
            then_branch = then_g () => (float[2,3] o) { o = Neg(h) },
            else_branch = else_g () => (float[2,3] o) { o = Sigmoid(h) }
        >
        y = Add(r, h0)
    }
"""


@pytest.mark.parametrize("cond", [True, False])
def test_if_body_reading_outer_tensor_keeps_its_producer(cond):
    model = parse_model(IF_MODEL)
    feeds = {"x": np.random.default_rng(2).standard_normal((2, 3)).astype(np.float32), "cond": np.array(cond)}
    values = _all_values(model, feeds)
    sub = isolate(to_graph(model), ["h0", "cond"], ["y"])
    assert [n.op for n in sub.nodes] == ["Mul", "If", "Add"]  # Mul feeds only the If bodies
    got = ort.run(to_model(sub), {"h0": values["h0"], "cond": feeds["cond"]})
    np.testing.assert_allclose(got["y"], values["y"], **TOL)


def test_output_not_computable_names_the_missing_tensor(branchy):
    with pytest.raises(GskitError, match=r"output 'y' needs tensor 'x2' \(a model input\).*add it"):
        isolate(to_graph(branchy), ["s"], ["y"])


def test_missing_tensor_without_producer_is_named():
    graph = to_graph(parse_model(IF_MODEL))
    mul = next(n for n in graph.nodes if n.op == "Mul")
    graph.nodes.remove(mul)
    mul.outputs.clear()  # 'h' is now read by the If bodies but produced by nothing
    with pytest.raises(GskitError, match=r"needs tensor 'h' \(no node produces it\)"):
        isolate(graph, ["h0", "cond"], ["y"])


@pytest.mark.parametrize(
    ("inputs", "outputs", "pattern"),
    [
        (["s"], ["yy"], r"unknown output tensor 'yy'.*close names: 'y'"),
        (["r_1"], ["y"], r"unknown input tensor 'r_1'.*'r1'"),
        (["w3", "x2"], ["y"], r"input 'w3' is an initializer"),
        (["s", "s"], ["y"], r"'s' is listed twice"),
        (["s"], [], r"at least one output"),
    ],
)
def test_bad_names(branchy, inputs, outputs, pattern):
    with pytest.raises(GskitError, match=pattern):
        isolate(to_graph(branchy), inputs, outputs)


@pytest.fixture
def plugins(tmp_path):
    """A plugin folder with one spec, passed to every CLI call so the repository's plugins play no part."""
    folder = tmp_path / "plugins" / "swish"
    folder.mkdir(parents=True)
    (folder / "spec.py").write_text(
        "from gskit.plugin import PluginSpec\nSPEC = PluginSpec(name='Swish', namespace='acme')\n"
    )
    return folder.parent


def _cli(plugins, *argv: str) -> int:
    # Only this subcommand's parser, so the test does not depend on the other subcommands.
    parser = argparse.ArgumentParser(prog="gskit")
    isolate_cli.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args([*argv, "--plugins", str(plugins)])
    return args.func(args)


def test_cli_with_weights_on_disk(branchy, rng, tmp_path, capsys, plugins):
    src = save(branchy, tmp_path / "m.onnx", external_data=True)
    assert (tmp_path / "m.onnx.data").stat().st_size > 2000  # w3 lives there
    out = tmp_path / "sub.onnx"
    assert (
        _cli(plugins, "isolate", str(src), "--inputs", "s,x2", "--outputs", "y", "-o", str(out), "--json")
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["nodes_before"] == 10 and report["nodes_after"] == 4
    assert report["inputs"] == [
        {"name": "s", "dtype": "float32", "shape": [1, 8, 8, 8]},
        {"name": "x2", "dtype": "float32", "shape": [1, 8, 8, 8]},
    ]
    assert [o["name"] for o in report["outputs"]] == ["y"]

    assert (tmp_path / "sub.onnx.data").is_file()  # weights streamed into the subgraph's own data file
    values = _all_values(branchy, _feeds(rng))
    got = ort.run(out, {"s": values["s"], "x2": values["x2"]})
    np.testing.assert_allclose(got["y"], values["y"], **TOL)

    assert _cli(plugins, "isolate", str(src), "--inputs", "r1,r2,x2", "--outputs", "t,z", "-o", str(out)) == 0
    table = capsys.readouterr().out
    assert "r2" in table and "nodes (main graph): 10 -> 4" in table
    assert {o.name for o in load(out).graph.output} == {"t", "z"}


def test_cli_refuses_to_overwrite_the_model(branchy, tmp_path, plugins):
    src = save(branchy, tmp_path / "m.onnx")
    with pytest.raises(GskitError, match="overwrite the input"):
        _cli(plugins, "isolate", str(src), "--inputs", "s,x2", "--outputs", "y", "-o", str(src))


PLUGIN_MODEL = """
    <ir_version: 8, opset_import: ["" : 17, "acme" : 1]>
    g (float[2,5] x) => (float[2,5] y)
    {
        h = Relu(x)
        s = acme.Swish(h)
        y = Relu(s)
    }
"""


def test_plugin_output_typed_through_registry():
    # onnx's schema registry is process-wide and keeps schemas of registries used by earlier tests.
    deregister_schemas()
    model = parse_model(PLUGIN_MODEL)
    with pytest.raises(GskitError, match=r"tensor 's' has no known dtype"):
        isolate(to_graph(model), ["s"], ["y"])
    registry = PluginRegistry([PluginSpec(name="Swish", namespace="acme")])
    sub = isolate(to_graph(model), ["s"], ["y"], registry=registry)
    assert [(t.name, t.dtype, t.shape) for t in sub.inputs] == [("s", np.float32, [2, 5])]


def test_cli_types_plugin_outputs_from_plugin_folder(tmp_path, capsys, plugins):
    src = save(parse_model(PLUGIN_MODEL), tmp_path / "p.onnx")
    out = tmp_path / "sub.onnx"
    assert (
        _cli(plugins, "isolate", str(src), "--inputs", "s", "--outputs", "y", "-o", str(out), "--json") == 0
    )
    assert json.loads(capsys.readouterr().out)["inputs"] == [
        {"name": "s", "dtype": "float32", "shape": [2, 5]}
    ]
    x = np.linspace(-2, 2, 10, dtype=np.float32).reshape(2, 5)
    np.testing.assert_array_equal(ort.run(out, {"s": x})["y"], np.maximum(x, 0))
