"""compare --layerwise and --per-plugin on onnxruntime: planted faults are found where they were planted."""

from __future__ import annotations

import argparse
import json
import math
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import parse_model

import gskit
from gskit.backends.trt import full_tensorrt_available
from gskit.compare.layers import compare_layerwise, producers
from gskit.compare.plugins import compare_plugins
from gskit.errors import GskitError
from gskit.io import model as gsmodel
from gskit.passes.fold import fold
from gskit.passes.patterns import replace
from gskit.passes.shapes import infer_graph_shapes
from gskit.plugin import load_plugins

EXAMPLE = Path(gskit.__file__).parent / "data" / "example.onnx"
REPO_PLUGINS = Path(gskit.__file__).parent.parent / "plugins"
EXAMPLE_SHAPES = {"x": (2, 4, 8, 8)}


@pytest.fixture(scope="module")
def registry():
    return load_plugins([REPO_PLUGINS], entry_points=False)


@pytest.fixture(scope="module")
def prepared_example(registry) -> onnx.ModelProto:
    """The bundled example as `gskit replace` + `gskit fold` write it: plugin nodes and folded constants."""
    graph = gsmodel.to_graph(gsmodel.load(EXAMPLE))
    infer_graph_shapes(graph, registry, strict=False)
    report = replace(graph, registry, tensorrt="8.5")  # older than every native form: plugin nodes only
    assert report.replaced >= 2  # ClampSwish x2, LayerNorm
    infer_graph_shapes(graph, registry, strict=False)
    folded, _ = fold(graph, plugins=registry)
    return gsmodel.to_model(folded)


def _plant(model: onnx.ModelProto, initializer: str, index: int, delta: float) -> onnx.ModelProto:
    """A copy of ``model`` with one element of one initializer changed by ``delta``."""
    broken = onnx.ModelProto()
    broken.CopyFrom(model)
    for tensor in broken.graph.initializer:
        if tensor.name == initializer:
            values = onnx.numpy_helper.to_array(tensor).copy()
            values.flat[index] += delta
            tensor.CopyFrom(onnx.numpy_helper.from_array(values, initializer))
            return broken
    raise AssertionError(f"no initializer {initializer}")


def _consumer_output(model: onnx.ModelProto, initializer: str) -> tuple[str, str]:
    """(output tensor, node name) of the one node that reads ``initializer``."""
    users = [n for n in model.graph.node if initializer in n.input]
    assert len(users) == 1
    return users[0].output[0], users[0].name


# -- layerwise ----------------------------------------------------------------------------------


def test_correct_prepared_model_has_no_failing_tensor(prepared_example, registry):
    report = compare_layerwise(EXAMPLE, prepared_example, shapes=EXAMPLE_SHAPES, plugins=registry)
    assert report.passed and report.first_failure is None
    shared = [n for n in producers(prepared_example.graph) if n in producers(gsmodel.load(EXAMPLE).graph)]
    assert [c.tensor.name for c in report.checked] == shared and report.candidates == len(shared)
    assert all(c.tensor.passed for c in report.checked)
    assert report.runs == 1  # default chunk holds all 12
    # the plugin outputs are among the checked tensors, produced by the plugin nodes
    ops = {c.prepared_node.op for c in report.checked}
    assert {"gskit::LayerNorm", "gskit::ClampSwish"} <= ops


@pytest.mark.parametrize(
    ("initializer", "index", "delta"),
    [("fc1.bias", 5, 0.25), ("norm.weight", 3, 0.5), ("conv.weight", 17, -0.3)],
)
def test_planted_fault_is_found_at_the_consuming_node(prepared_example, registry, initializer, index, delta):
    broken = _plant(prepared_example, initializer, index, delta)
    report = compare_layerwise(EXAMPLE, broken, shapes=EXAMPLE_SHAPES, plugins=registry)
    expected_tensor, expected_node = _consumer_output(broken, initializer)
    first = report.first_failure
    assert not report.passed and first is not None
    assert first.tensor.name == expected_tensor and first.prepared_node.name == expected_node
    assert report.checked[-1] is first and all(c.tensor.passed for c in report.checked[:-1])
    # the model outputs differ as well, but only the first failure is reported, and nothing after it
    assert "y" not in [c.tensor.name for c in report.checked]


def test_bias_fault_error_is_the_planted_delta(prepared_example, registry):
    # A Gemm bias element changed by 0.25 shifts one output column by exactly 0.25: an independent check
    # of the error the report gives.
    broken = _plant(prepared_example, "fc1.bias", 5, 0.25)
    first = compare_layerwise(EXAMPLE, broken, shapes=EXAMPLE_SHAPES, plugins=registry).first_failure
    assert first.tensor.max_abs_err == pytest.approx(0.25, abs=1e-6)
    assert first.original_node.op == "Gemm" and first.tensor.shape == (2, 32)


@pytest.mark.parametrize("chunk", [1, 2, 5])
def test_small_chunks_scan_in_order_and_stop_at_the_failing_chunk(prepared_example, registry, chunk):
    broken = _plant(prepared_example, "norm.weight", 3, 0.5)
    report = compare_layerwise(EXAMPLE, broken, shapes=EXAMPLE_SHAPES, plugins=registry, chunk=chunk)
    order = list(producers(broken.graph))
    position = order.index("/norm/Add_1_output_0")
    shared_before = [n for n in order[: position + 1] if n in producers(gsmodel.load(EXAMPLE).graph)]
    assert [c.tensor.name for c in report.checked] == shared_before
    assert report.first_failure.prepared_node.op == "gskit::LayerNorm"
    assert report.runs == math.ceil(len(shared_before) / chunk)
    assert report.chunk == chunk


def test_small_chunks_on_a_correct_model_check_everything(prepared_example, registry):
    report = compare_layerwise(EXAMPLE, prepared_example, shapes=EXAMPLE_SHAPES, plugins=registry, chunk=2)
    assert report.passed and len(report.checked) == report.candidates
    assert report.runs == math.ceil(report.candidates / 2)


def test_caller_models_are_left_unchanged(prepared_example, registry):
    before = prepared_example.SerializeToString()
    compare_layerwise(EXAMPLE, prepared_example, shapes=EXAMPLE_SHAPES, plugins=registry, chunk=3)
    assert prepared_example.SerializeToString() == before


def test_chunk_must_be_positive(prepared_example):
    with pytest.raises(GskitError, match="--chunk"):
        compare_layerwise(EXAMPLE, prepared_example, chunk=0)


@pytest.mark.skipif(full_tensorrt_available(), reason="TensorRT is installed here")
def test_trt_backend_without_tensorrt_says_where_to_run(prepared_example, registry):
    with pytest.raises(GskitError, match=r"--backend trt needs TensorRT and a GPU.*docker/"):
        compare_layerwise(EXAMPLE, prepared_example, plugins=registry, backend="trt")
    with pytest.raises(GskitError, match=r"--backend trt needs TensorRT and a GPU"):
        compare_plugins(EXAMPLE, prepared_example, plugins=registry, backend="trt")


# -- per plugin ----------------------------------------------------------------------------------

ORIGINAL = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[N, 8] x) => (float[N] z) {
    a = Tanh(x)
    k = Constant<value = float {0.75}>()
    y = Mul(a, k)
    s = Mul(y, y)
    axes = Constant<value = int64[1] {1}>()
    z = ReduceSum<keepdims = 0>(s, axes)
}
"""

PREPARED = """
<ir_version: 10, opset_import: ["" : 17, "test.gskit" : 1]>
g (float[N, 8] x) => (float[N] z) {
    y = test.gskit.ScaledTanh<alpha = 0.75, plugin_namespace = "test.gskit", plugin_version = "1">(x)
    s = test.gskit.Square<plugin_namespace = "test.gskit", plugin_version = "1">(y)
    axes = Constant<value = int64[1] {1}>()
    z = ReduceSum<keepdims = 0>(s, axes)
}
"""

SCALED_TANH = """
import numpy as np
from gskit.plugin import Attribute, AttrType, PluginSpec, same_as_input


def scaled_tanh(x, *, alpha):
    return (np.tanh(x) * alpha).astype(x.dtype)


SPEC = PluginSpec(
    name="ScaledTanh", namespace="test.gskit", inputs=("x",),
    attributes=(Attribute("alpha", AttrType.FLOAT, 1.0, "scale"),),
    infer=same_as_input(0), reference=scaled_tanh,
)
"""

SQUARE = """
import numpy as np
from gskit.plugin import PluginSpec, same_as_input


def square(x):
    return (x * x * FACTOR).astype(x.dtype)


SPEC = PluginSpec(
    name="Square", namespace="test.gskit", inputs=("x",), infer=same_as_input(0), reference=square
)
"""


def _plugins(tmp_path: Path, factor: float) -> Path:
    root = tmp_path / f"plugins_{factor}"
    for name, text in (("scaled_tanh", SCALED_TANH), ("square", SQUARE.replace("FACTOR", repr(factor)))):
        (root / name).mkdir(parents=True)
        (root / name / "spec.py").write_text(textwrap.dedent(text))
    return root


def test_broken_plugin_reference_is_named(tmp_path):
    plugins = load_plugins([_plugins(tmp_path, 1.5)], entry_points=False)
    x = np.linspace(-2, 2, 24, dtype=np.float32).reshape(3, 8)
    report = compare_plugins(parse_model(ORIGINAL), parse_model(PREPARED), feeds={"x": x}, plugins=plugins)
    assert not report.passed
    by_op = {p.op: p for p in report.plugins}
    assert list(by_op) == ["test.gskit::ScaledTanh", "test.gskit::Square"]
    good, bad = by_op["test.gskit::ScaledTanh"], by_op["test.gskit::Square"]
    assert good.passed and good.inputs == {"x": (3, 8)} and good.original_nodes == ("Tanh", "Mul")
    assert [p.node for p in report.failed] == [bad.node]
    assert not bad.passed and bad.inputs == {"y": (3, 8)} and bad.original_nodes == ("Mul",)
    y = np.tanh(x.astype(np.float64)) * 0.75  # independent: the plugin computes 1.5 y^2, the region y^2
    assert bad.max_abs_err == pytest.approx(np.abs(0.5 * y * y).max(), rel=1e-5)
    assert bad.max_rel_err == pytest.approx(0.5, rel=1e-4)
    # the layerwise scan finds the same place: the first tensor that differs is the Square plugin's output
    layers = compare_layerwise(parse_model(ORIGINAL), parse_model(PREPARED), feeds={"x": x}, plugins=plugins)
    assert layers.first_failure.tensor.name == "s"
    assert layers.first_failure.prepared_node.op == "test.gskit::Square"


def test_correct_plugin_references_pass(tmp_path):
    plugins = load_plugins([_plugins(tmp_path, 1.0)], entry_points=False)
    report = compare_plugins(
        parse_model(ORIGINAL), parse_model(PREPARED), shapes={"x": (5, 8)}, plugins=plugins
    )
    assert report.passed and len(report.plugins) == 2
    assert all(p.max_abs_err <= 1e-6 and p.note == "" for p in report.plugins)


def test_per_plugin_on_the_prepared_example(prepared_example, registry):
    report = compare_plugins(EXAMPLE, prepared_example, shapes=EXAMPLE_SHAPES, plugins=registry)
    assert report.passed
    assert sorted(p.op for p in report.plugins) == [
        "gskit::ClampSwish",
        "gskit::ClampSwish",
        "gskit::LayerNorm",
    ]
    layer_norm = next(p for p in report.plugins if p.op == "gskit::LayerNorm")
    assert layer_norm.inputs == {"/fc1/Gemm_output_0": (2, 32)}
    assert "/norm/ReduceMean" in layer_norm.original_nodes and len(layer_norm.original_nodes) >= 9


def test_per_plugin_needs_a_plugin_node():
    with pytest.raises(GskitError, match="no plugin node"):
        compare_plugins(parse_model(ORIGINAL), parse_model(ORIGINAL))


# -- CLI ----------------------------------------------------------------------------------


def _cli(*argv: str) -> int:
    from gskit.cli import compare as command

    parser = argparse.ArgumentParser(prog="gskit")
    command.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_layerwise_and_per_plugin(tmp_path, capsys, prepared_example):
    original = str(EXAMPLE)
    good = str(gsmodel.save(prepared_example, tmp_path / "good.onnx"))
    bad = str(gsmodel.save(_plant(prepared_example, "fc1.bias", 0, 1.0), tmp_path / "bad.onnx"))
    common = ("--plugins", str(REPO_PLUGINS), "--shape", "x:2x4x8x8")
    assert _cli("compare", original, good, *common, "--layerwise", "--chunk", "4") == 0
    assert "all 12 shared tensors match" in capsys.readouterr().out
    assert _cli("compare", original, bad, *common, "--layerwise", "--chunk", "2", "--json") == 1
    data = json.loads(capsys.readouterr().out)
    assert data["passed"] is False and data["first_failure"]["tensor"]["name"] == "/fc1/Gemm_output_0"
    assert data["first_failure"]["prepared_node"] == {"name": "/fc1/Gemm", "op": "Gemm"}
    assert data["checked"][-1] == data["first_failure"]
    assert _cli("compare", original, bad, *common, "--layerwise") == 1
    assert "first mismatch: tensor '/fc1/Gemm_output_0'" in capsys.readouterr().out
    assert _cli("compare", original, good, *common, "--per-plugin") == 0
    assert "all 3 replaced nodes match" in capsys.readouterr().out
    assert _cli("compare", original, good, *common, "--per-plugin", "--json") == 0
    assert len(json.loads(capsys.readouterr().out)["plugins"]) == 3


def test_cli_argument_errors(tmp_path, prepared_example):
    good = str(gsmodel.save(prepared_example, tmp_path / "good.onnx"))
    with pytest.raises(GskitError, match="PREPARED"):
        _cli("compare", str(EXAMPLE))
    with pytest.raises(GskitError, match="--engine"):
        _cli("compare", str(EXAMPLE), good, "--engine", good, "--layerwise")
    with pytest.raises(SystemExit):  # argparse: the two modes exclude each other
        _cli("compare", str(EXAMPLE), good, "--layerwise", "--per-plugin")


@pytest.mark.skipif(full_tensorrt_available(), reason="TensorRT is installed here")
def test_cli_trt_backend_without_tensorrt(tmp_path, prepared_example):
    good = str(gsmodel.save(prepared_example, tmp_path / "good.onnx"))
    for extra in ((), ("--layerwise",), ("--per-plugin",)):
        with pytest.raises(GskitError, match=r"--backend trt needs TensorRT and a GPU.*docker/"):
            _cli("compare", str(EXAMPLE), good, "--backend", "trt", "--plugins", str(REPO_PLUGINS), *extra)
    with pytest.raises(GskitError, match=r"needs TensorRT and a GPU"):
        _cli("compare", str(EXAMPLE), "--engine", good)


@pytest.mark.filterwarnings("error::RuntimeWarning")  # Polygraphy's 0/0 relative error printed no warning
def test_layerwise_on_an_fp16_model_feeds_and_reads_like_plain_compare(registry):
    """gskit convert --fp16 makes the inputs float16: layerwise casts the float32 feeds as compare does."""
    from gskit.compare.outputs import DtypeChange, compare
    from gskit.passes.convert import to_fp16

    half, _ = to_fp16(gsmodel.load(EXAMPLE), keep_io_types=False)  # gskit convert --fp16 --no-keep-io-fp32
    assert half.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    expected = [DtypeChange("float32", "float16", by="convert --fp16 --no-keep-io-fp32")]  # else a failure
    plain = compare(
        EXAMPLE, half, shapes=EXAMPLE_SHAPES, plugins=registry, atol=1e-2, rtol=1e-1, dtype_changes=expected
    )
    report = compare_layerwise(EXAMPLE, half, shapes=EXAMPLE_SHAPES, plugins=registry, atol=1e-2, rtol=1e-1)
    assert plain.passed and report.passed and report.checked[-1].tensor.name == "y"
    last = report.checked[-1].tensor
    # the same fp16 rounding (not equal: exposing tensors as outputs changes onnxruntime's fusions)
    assert last.dtype == "float32"
    assert last.max_abs_err == pytest.approx(plain.outputs[0].max_abs_err, rel=0.5)
    strict = compare_layerwise(EXAMPLE, half, shapes=EXAMPLE_SHAPES, plugins=registry)
    assert not strict.passed  # float32 tolerances: fp16 rounding shows at the first tensor it touches


def test_the_cli_prints_its_tables_as_rich_does(prepared_example, registry, capsys, monkeypatch) -> None:
    """gskit compare writes its tables to a pipe without rich (gskit.io.text.plain_table): the same text as
    rich's, for the output, layerwise and per-plugin reports, passing and failing."""
    import gskit.cli.compare as cli_compare
    from gskit.compare.outputs import compare

    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "COLUMNS", "NO_COLOR"):
        monkeypatch.delenv(name, raising=False)
    broken = _plant(prepared_example, prepared_example.graph.initializer[0].name, 0, 0.5)
    common = dict(shapes=EXAMPLE_SHAPES, plugins=registry)
    printed = [
        (cli_compare.print_report, compare(EXAMPLE, prepared_example, **common)),
        (cli_compare.print_report, compare(EXAMPLE, broken, **common, atol=0.0, rtol=0.0)),
        (cli_compare.print_layerwise, compare_layerwise(EXAMPLE, prepared_example, **common)),
        (cli_compare.print_layerwise, compare_layerwise(EXAMPLE, broken, **common)),
        (cli_compare.print_plugins, compare_plugins(EXAMPLE, prepared_example, **common)),
        (cli_compare.print_plugins, compare_plugins(EXAMPLE, broken, **common, atol=0.0, rtol=0.0)),
    ]
    plain, through_rich, answered = [], [], []
    written_plain = cli_compare._plain

    def recorded(*args):
        answered.append(written_plain(*args))
        return answered[-1]

    monkeypatch.setattr(cli_compare, "_plain", recorded)
    for show, result in printed:
        capsys.readouterr()
        show(result, as_json=False)
        plain.append(capsys.readouterr().out)
    monkeypatch.setattr(cli_compare, "_plain", lambda *args: None)
    for show, result in printed:
        show(result, as_json=False)
        through_rich.append(capsys.readouterr().out)
    assert None not in answered and len(answered) == len(printed)
    assert plain == through_rich
    assert any("FAIL" in text for text in plain) and all("┏" in text for text in plain)


def test_an_empty_cell_prints_as_rich_prints_it(capsys, monkeypatch) -> None:
    """A cell with no value (None) is empty in rich's table (gskit.io.report.data); plain text said "None"."""
    import gskit.cli.compare as cli_compare

    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "COLUMNS", "NO_COLOR"):
        monkeypatch.delenv(name, raising=False)
    rows = [["y", None, cli_compare.Verdict(True)]]
    written_plain = cli_compare._plain
    answered = []
    monkeypatch.setattr(
        cli_compare, "_plain", lambda *args: answered.append(written_plain(*args)) or answered[-1]
    )
    cli_compare._show("t", ("output", "note", "result"), rows, [])
    plain = capsys.readouterr().out
    monkeypatch.setattr(cli_compare, "_plain", lambda *args: None)
    cli_compare._show("t", ("output", "note", "result"), rows, [])
    assert answered[0] is not None and plain == capsys.readouterr().out
    assert "None" not in plain
