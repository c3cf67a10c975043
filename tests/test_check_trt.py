"""gskit check-trt: the real TensorRT-RTX parser (in a child process), the static table, and plugin nodes."""

from __future__ import annotations

import argparse
import importlib.util
import json

import onnx
import pytest
from conftest import LIGHT_MODELS, parse_model

from gskit.backends.trt import run_worker
from gskit.backends.trt_check import NEEDS_PLUGIN, PLUGIN_PROBLEM, UNSUPPORTED, check_trt
from gskit.backends.trt_support import RESTRICTED, supports_operator
from gskit.cli import check_trt as check_trt_cli
from gskit.errors import GskitError
from gskit.plugin.ops import ONNX_DOMAINS

rtx = pytest.mark.skipif(importlib.util.find_spec("tensorrt_rtx") is None, reason="needs tensorrt-rtx-cu13")

#: The full TensorRT release whose parser TensorRT-RTX 1.7's matches (Swish and the TRT_* custom ops: 11.0 or
#: later; no DFT: before 11.2), and the standard ops where that release's table and TensorRT-RTX's
#: supports_operator differ, and why.
RTX_LIKE = "11.1"
TABLE_VS_RTX_EXCEPTIONS = {
    "DeformConv": "full TensorRT imports it (1D/2D, symmetric pads); TensorRT-RTX 1.7 has no importer",
    "CausalConvWithState": "TensorRT-RTX 1.7 imports it; onnx-tensorrt's 11.1 table does not list it",
    "LinearAttention": "TensorRT-RTX 1.7 imports it; onnx-tensorrt's 11.1 table does not list it",
}

PLUGIN_AND_UNIQUE = """
<ir_version: 10, opset_import: ["" : 17, "my.ns" : 1]>
g (float[N,4] x) => (float[N,4] y, float[M] u) <float[N,4] p> {
  a = Relu(x)
  p = my.ns.Swish<plugin_namespace: string = "my.ns", plugin_version: string = "2", beta: float = 1.5>(a)
  y = Sigmoid(p)
  u = Unique(a)
}
"""


def _save(tmp_path, text: str, name: str = "model.onnx"):
    path = tmp_path / name
    onnx.save(parse_model(text), path)
    return path


@rtx
@pytest.mark.parametrize("path", LIGHT_MODELS, ids=[p.stem for p in LIGHT_MODELS])
def test_light_models_have_no_unsupported_node(path):
    report = check_trt(path, plugins=[], backend="tensorrt_rtx")
    assert report.source.startswith("tensorrt_rtx 1.")
    assert report.ok, report.issues
    assert not report.issues
    covered = sorted(name for p in report.partitions for name in p.nodes)
    assert len(covered) == report.node_count  # every node is in a parsed partition


@rtx
def test_rtx_reports_exactly_the_plugin_and_the_unsupported_node(tmp_path):
    report = check_trt(_save(tmp_path, PLUGIN_AND_UNIQUE), plugins=[], backend="tensorrt_rtx")
    assert [(i.op_type, i.status) for i in report.issues] == [
        ("Swish", NEEDS_PLUGIN),
        ("Unique", UNSUPPORTED),
    ]
    assert report.issues[0].reason.startswith("needs plugin my.ns::Swish v2")
    assert "checkUnique" in report.issues[1].reason
    assert not report.ok
    # The plugin was cut out, its output fed as an input: Sigmoid after it was parsed.
    assert any("#2 Sigmoid" in p.nodes for p in report.partitions)
    assert all("#1 Swish" not in p.nodes for p in report.partitions)
    assert any("cut out" in note for note in report.notes)


@rtx
def test_rtx_leaves_plugin_nodes_of_unknown_type_in_place(tmp_path):
    text = PLUGIN_AND_UNIQUE.replace("<float[N,4] p>", "").replace("u = Unique(a)", "u = Relu(x)")
    text = text.replace("float[M] u", "float[N,4] u")
    report = check_trt(_save(tmp_path, text), plugins=[], backend="tensorrt_rtx")
    assert [(i.op_type, i.status) for i in report.issues] == [("Swish", NEEDS_PLUGIN)]
    assert any("left in place" in note for note in report.notes)


def test_static_table_reports_the_same_nodes(tmp_path):
    report = check_trt(_save(tmp_path, PLUGIN_AND_UNIQUE), plugins=[], backend="static")
    assert report.source == "static table"
    assert [(i.op_type, i.status) for i in report.issues] == [
        ("Swish", NEEDS_PLUGIN),
        ("Unique", UNSUPPORTED),
    ]


def test_static_table_looks_into_subgraphs_and_attributes(tmp_path):
    text = """
    <ir_version: 10, opset_import: ["" : 17]>
    g (float[2,2] x, bool c, int64[1,1] i, float[1,2] u) => (float y, float[2,2] r) {
      y = If(c) <then_branch = t () => (float d) { d = Det(x) },
                 else_branch = e () => (float d2) { d2 = ReduceSum<keepdims: int = 0>(x) }>
      r = ScatterND<reduction: string = "add">(x, i, u)
    }
    """
    path = tmp_path / "m.onnx"
    onnx.save(onnx.parser.parse_model(text), path)
    report = check_trt(path, plugins=[], backend="static")
    by_op = {i.op_type: i for i in report.issues}
    assert by_op["If"].status == UNSUPPORTED and "Det" in by_op["If"].reason
    assert by_op["ScatterND"].status == UNSUPPORTED and "reduction 'add'" in by_op["ScatterND"].reason


def test_static_restriction_is_a_warning_not_a_failure_and_ends_where_the_target_lifts_it(tmp_path):
    text = """
    <ir_version: 10, opset_import: ["" : 17]>
    g (float[1,1,4,4] x) => (float[1,1,2,2] y) {
      y = GridSample(x, x)
    }
    """
    path = _save(tmp_path, text)
    report = check_trt(path, plugins=[], backend="static", target="10.15")
    assert [(i.op_type, i.status) for i in report.issues] == [("GridSample", RESTRICTED)]
    assert report.ok
    # TensorRT 11.2 takes 5-D GridSample too: no restriction left to state (NVIDIA/TensorRT CHANGELOG 11.2).
    assert check_trt(path, plugins=[], backend="static", target="11.2").issues == ()


def test_plugin_attribute_that_tensorrt_cannot_pass(tmp_path):
    text = """
    <ir_version: 10, opset_import: ["" : 17, "my.ns" : 1]>
    g (float[4] x) => (float[4] y) {
      y = my.ns.Scale<plugin_namespace: string = "my.ns", big: int = 5000000000>(x)
    }
    """
    report = check_trt(_save(tmp_path, text), plugins=[], backend="static")
    (issue,) = report.issues
    assert issue.status == PLUGIN_PROBLEM and "int32" in issue.reason
    assert not report.ok


def test_custom_domain_standard_op_is_taken_as_the_builtin(tmp_path):
    # The parser ignores the domain: my.ns::Relu is a TensorRT activation, my.ns::Det is Det.
    text = """
    <ir_version: 10, opset_import: ["" : 17, "my.ns" : 1]>
    g (float[2,2] x) => (float[2,2] y, float d) {
      y = my.ns.Relu(x)
      d = my.ns.Det(x)
    }
    """
    path = tmp_path / "m.onnx"
    onnx.save(onnx.parser.parse_model(text), path)
    report = check_trt(path, plugins=[], backend="static")
    assert [(i.op_type, i.status) for i in report.issues] == [("Det", UNSUPPORTED)]


@rtx
def test_static_table_agrees_with_the_rtx_parser_op_by_op():
    # Only ONNX's own schemas: plugin schemas that earlier tests registered in this process are not ops
    # TensorRT knows.
    ops = sorted({s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain in ONNX_DOMAINS})
    answer = run_worker("ops", "tensorrt_rtx", {"ops": ops})
    differ = {op for op in ops if answer["supports"][op] != supports_operator(op, RTX_LIKE)}
    assert differ == set(TABLE_VS_RTX_EXCEPTIONS)


#: One-node models: (inputs => outputs, initializers, body, what the static table says).
RESTRICTION_CASES = {
    "scatternd_add": (
        "float[4,4] x, int64[2,1] i, float[2,4] u => float[4,4] y",
        "",
        'y = ScatterND<reduction: string = "add">(x, i, u)',
        UNSUPPORTED,
    ),
    "reduce_runtime_axes": (
        "float[4,4] x, int64[1] a => float[4] y",
        "",
        "y = ReduceSum<keepdims: int = 0>(x, a)",
        UNSUPPORTED,
    ),
    "qdq_zero_point": (
        "float[4] x => float[4] y",
        "float s = {0.1}, int8 z = {3}",
        "q = QuantizeLinear(x, s, z)\n y = DequantizeLinear(q, s, z)",
        UNSUPPORTED,
    ),
    "lstm_input_forget": (
        "float[2,1,3] x, float[1,16,3] w, float[1,16,4] r => float[2,1,1,4] y",
        "",
        "y = LSTM<hidden_size: int = 4, input_forget: int = 1>(x, w, r)",
        UNSUPPORTED,
    ),
    "reduce_constant_axes": (
        "float[4,4] x => float[4] y",
        "int64[1] a = {1}",
        "y = ReduceSum<keepdims: int = 0>(x, a)",
        RESTRICTED,
    ),
    "topk_unsorted": (
        "float[1,8] x => float[1,2] v, int64[1,2] i",
        "int64[1] k = {2}",
        "v, i = TopK<sorted: int = 0>(x, k)",
        RESTRICTED,
    ),
    "resize_cubic": (
        "float[1,1,4,4] x => float[1,1,8,8] y",
        "float[4] s = {1.0, 1.0, 2.0, 2.0}",
        'y = Resize<mode: string = "cubic">(x, , s)',
        None,
    ),
    "maxpool_1d": (
        "float[1,1,8] x => float[1,1,4] y",
        "",
        "y = MaxPool<kernel_shape: ints = [2], strides: ints = [2]>(x)",
        None,
    ),
}


@rtx
@pytest.mark.parametrize("case", sorted(RESTRICTION_CASES))
def test_static_restriction_checks_agree_with_the_rtx_parser(tmp_path, case):
    signature, initializers, body, expected = RESTRICTION_CASES[case]
    inputs, outputs = signature.split(" => ")
    text = f"""
    <ir_version: 10, opset_import: ["" : 17]>
    g ({inputs}) => ({outputs}) <{initializers}> {{
      {body}
    }}
    """.replace("<>", "")
    path = _save(tmp_path, text)
    static = {i.status for i in check_trt(path, plugins=[], backend="static").issues}
    real = {i.status for i in check_trt(path, plugins=[], backend="tensorrt_rtx").issues}
    assert static == ({expected} if expected else set())
    assert (UNSUPPORTED in real) == (UNSUPPORTED in static)


def test_unknown_backend_is_an_error(tmp_path):
    with pytest.raises(GskitError, match="unknown TensorRT backend"):
        check_trt(_save(tmp_path, PLUGIN_AND_UNIQUE), plugins=[], backend="onnxruntime")


def test_missing_plugin_folder_is_an_error(tmp_path):
    with pytest.raises(GskitError, match="no such file or folder"):
        check_trt(_save(tmp_path, PLUGIN_AND_UNIQUE), plugins=[tmp_path / "nope"], backend="static")


def _cli(argv):
    parser = argparse.ArgumentParser()
    check_trt_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_json_and_exit_code(tmp_path, capsys):
    path = _save(tmp_path, PLUGIN_AND_UNIQUE)
    assert _cli(["check-trt", str(path), "--plugins", str(tmp_path), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert [i["status"] for i in data["issues"]] == [NEEDS_PLUGIN, UNSUPPORTED]
    assert data["source"]


@rtx
def test_cli_table_for_a_supported_model(capsys):
    assert _cli(["check-trt", str(LIGHT_MODELS[0]), "--plugins", str(LIGHT_MODELS[0].parent)]) == 0
    out = capsys.readouterr().out
    assert "OK for TensorRT" in out and "tensorrt_rtx 1." in out


SPEC_PY = """
from gskit.plugin import Attribute, AttrType, PluginSpec, same_as_input

SPEC = PluginSpec(
    name="Swish",
    namespace="my.ns",
    version="2",
    attributes=(Attribute("beta", AttrType.FLOAT, 1.0),),
    infer=same_as_input(0),
    reference=lambda x, beta: x / (1 + __import__("numpy").exp(-beta * x)),
)
"""


@pytest.fixture
def swish_plugin_dir(tmp_path):
    folder = tmp_path / "plugins" / "swish"
    folder.mkdir(parents=True)
    (folder / "spec.py").write_text(SPEC_PY)
    return folder.parent


@pytest.mark.parametrize("backend", ["static", pytest.param("tensorrt_rtx", marks=rtx)])
def test_plugin_node_checked_against_its_gskit_spec(tmp_path, swish_plugin_dir, backend):
    report = check_trt(_save(tmp_path, PLUGIN_AND_UNIQUE), plugins=[swish_plugin_dir], backend=backend)
    swish = report.issues[0]
    assert swish.status == NEEDS_PLUGIN and "gskit plugin from" in swish.reason
    bad = PLUGIN_AND_UNIQUE.replace("beta: float = 1.5", "gamma: float = 1.5")
    report = check_trt(_save(tmp_path, bad, "bad.onnx"), plugins=[swish_plugin_dir], backend=backend)
    assert report.issues[0].status == PLUGIN_PROBLEM and "gamma" in report.issues[0].reason


def test_a_plugins_stub_parts_are_read_once_for_all_its_nodes(tmp_path, swish_plugin_dir, monkeypatch):
    """Two nodes of one plugin: its files are read for stubs once, and each node says the same as alone."""
    from gskit.backends import trt_check

    swish = 'my.ns.Swish<plugin_namespace: string = "my.ns", plugin_version: string = "2", beta: float = 1.5>'
    two = PLUGIN_AND_UNIQUE.replace("y = Sigmoid(p)", f"q = {swish}(p)\n  y = Sigmoid(q)")
    alone = check_trt(_save(tmp_path, PLUGIN_AND_UNIQUE), plugins=[swish_plugin_dir], backend="static")
    read: list[object] = []
    stub_parts = trt_check.stub_parts
    monkeypatch.setattr(trt_check, "stub_parts", lambda spec: read.append(spec) or stub_parts(spec))
    report = check_trt(_save(tmp_path, two, "two.onnx"), plugins=[swish_plugin_dir], backend="static")
    swishes = [issue for issue in report.issues if issue.op_type == "Swish"]
    assert len(swishes) == 2 and len(read) == 1
    assert {issue.reason for issue in swishes} == {alone.issues[0].reason}


@rtx
def test_rtx_cuts_plugin_nodes_typed_by_their_spec(tmp_path, swish_plugin_dir):
    # No value_info for the plugin output: the spec's shape rule gives it, so the node can be cut out.
    text = PLUGIN_AND_UNIQUE.replace("<float[N,4] p>", "")
    report = check_trt(_save(tmp_path, text), plugins=[swish_plugin_dir], backend="tensorrt_rtx")
    assert [(i.op_type, i.status) for i in report.issues] == [
        ("Swish", NEEDS_PLUGIN),
        ("Unique", UNSUPPORTED),
    ]
    assert any("cut out" in note for note in report.notes)
    assert any("#2 Sigmoid" in p.nodes for p in report.partitions)


def test_cli_plugins_option_repeats_like_the_other_commands(tmp_path, capsys):
    """`--plugins A --plugins B` (as in replace/compare/prepare); each folder is checked to exist."""
    path = _save(tmp_path, PLUGIN_AND_UNIQUE)
    other = tmp_path / "other"
    other.mkdir()
    argv = ["check-trt", str(path), "--plugins", str(tmp_path), "--plugins", str(other)]
    argv += ["--backend", "static"]
    assert _cli([*argv, "--json"]) == 1
    capsys.readouterr()
    with pytest.raises(GskitError, match="no such file or folder: .*missing"):
        _cli([*argv, "--plugins", str(tmp_path / "missing")])


#: Every graph output comes straight from a plugin node, as in an encoder export that ends in a norm.
PLUGIN_OUTPUTS_ONLY = """
<ir_version: 10, opset_import: ["" : 17, "my.ns" : 1]>
g (float[N,4] x) => (float[M] y) {
  a = Relu(x)
  u = Unique(a)
  y = my.ns.Swish<plugin_namespace: string = "my.ns", plugin_version: string = "2", beta: float = 1.5>(u)
}
"""


@rtx
def test_rtx_checks_up_to_the_plugin_inputs_when_every_output_is_a_plugins(tmp_path, swish_plugin_dir):
    # Before: "nothing left to check" and an error. Now the plugin's input is checked in its place, so the
    # parser still sees (and rejects) the Unique feeding the plugin and takes the Relu before it.
    report = check_trt(
        _save(tmp_path, PLUGIN_OUTPUTS_ONLY), plugins=[swish_plugin_dir], backend="tensorrt_rtx"
    )
    assert [(i.op_type, i.status) for i in report.issues] == [
        ("Unique", UNSUPPORTED),
        ("Swish", NEEDS_PLUGIN),
    ]
    assert any("cut out" in note for note in report.notes)


@rtx
def test_rtx_model_of_only_plugin_nodes_is_reported_not_an_error(tmp_path, swish_plugin_dir):
    text = PLUGIN_OUTPUTS_ONLY.replace("  a = Relu(x)\n  u = Unique(a)\n", "").replace(">(u)", ">(x)")
    text = text.replace("float[M] y", "float[N,4] y")
    report = check_trt(_save(tmp_path, text), plugins=[swish_plugin_dir], backend="tensorrt_rtx")
    assert [(i.op_type, i.status) for i in report.issues] == [("Swish", NEEDS_PLUGIN)]
    assert any("nothing for TensorRT-RTX's parser to check" in n for n in report.notes)


def _external_model(tmp_path, plugin: bool):
    """A model whose weights (8 MB) and a small constant (the Slice steps it checks) lie in a data file."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    weights = numpy_helper.from_array(np.random.default_rng(0).random((64, 32768), dtype=np.float32), "w")
    steps = numpy_helper.from_array(np.array([-1], np.int64), "steps")
    bounds = [numpy_helper.from_array(np.array([v], np.int64), n) for n, v in (("s", -1), ("e", -70000))]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"])]
    if plugin:
        nodes.append(
            helper.make_node(
                "ClampSwish", ["h"], ["c"], domain="gskit", plugin_namespace="gskit", plugin_version="1"
            )
        )
    nodes.append(helper.make_node("Slice", ["c" if plugin else "h", "s", "e", "", "steps"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32768])],
        initializer=[weights, steps, *bounds],
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("gskit", 1)]
    path = tmp_path / f"ext{int(plugin)}" / "m.onnx"
    path.parent.mkdir()
    model = helper.make_model(graph, opset_imports=opsets)
    inline = tmp_path / f"inline{int(plugin)}.onnx"
    onnx.save_model(model, str(inline))  # first: saving with external data moves the model's weights out
    onnx.save_model(model, str(path), save_as_external_data=True, location="m.data", size_threshold=0)
    return path, inline


@pytest.mark.parametrize("backend", ["static", pytest.param("tensorrt_rtx", marks=rtx)])
@pytest.mark.parametrize("plugin", [False, True], ids=["nothing-cut", "plugin-cut"])
def test_weights_on_disk_are_checked_where_they_lie(tmp_path, backend: str, plugin: bool) -> None:
    """check_trt reads no weights: the parser gets the file itself, or a cut copy beside links to its data
    (a 2.2 GB model was loaded, then saved again, for a parse of 0.2 s). The answer is the same as for the
    model with its weights inside, constants read from the data file included."""
    external, inline = _external_model(tmp_path, plugin)
    got, want = check_trt(external, backend=backend), check_trt(inline, backend=backend)
    assert [(i.op_type, i.status, i.reason) for i in got.issues] == [
        (i.op_type, i.status, i.reason) for i in want.issues
    ]
    assert sorted(p.name for p in external.parent.iterdir()) == ["m.data", "m.onnx"]  # nothing written beside


def test_check_trt_reads_versions_and_plugins_once(tmp_path, monkeypatch) -> None:
    """check_trt loaded every plugin file again after prepare had (given ``registry`` it does not), and read
    package versions through ``packages_distributions``, which parses every installed distribution's metadata
    and file list (0.3-0.6 s a call, four calls a check)."""
    import importlib.metadata

    from gskit.backends import trt_check
    from gskit.plugin.discovery import load_plugins
    from gskit.plugin.target import installed_version

    registry = load_plugins(None)
    model = _save(
        tmp_path, PLUGIN_AND_UNIQUE.replace("  u = Unique(a)", "  u = Relu(x)").replace("[M] u", "[N,4] u")
    )

    def refused(*args, **kwargs):
        raise AssertionError("called again")

    installed_version.cache_clear()
    monkeypatch.setattr(importlib.metadata, "packages_distributions", refused)
    monkeypatch.setattr(trt_check, "load_plugins", refused)
    report = check_trt(model, backend="static", registry=registry)
    assert [i.op_type for i in report.issues] == ["Swish"]  # my.ns::Swish: no spec of it among the plugins
    assert installed_version("onnx") == importlib.metadata.version("onnx")
    assert installed_version("yaml") == importlib.metadata.version("PyYAML")  # not the module's name
    assert installed_version("no_such_module_anywhere") is None
    if importlib.util.find_spec("tensorrt_rtx") is not None:  # found among the names that start like it
        rtx = next(d for d in importlib.metadata.distributions() if d.metadata["Name"].startswith("tensorrt"))
        assert installed_version("tensorrt_rtx") == rtx.version


@rtx
def test_a_started_worker_takes_the_next_task_of_its_flavour_and_answers_like_a_new_one():
    from gskit.backends import trt

    ops = ["Relu", "DeformConv", "NoSuchOp"]
    fresh = run_worker("ops", "tensorrt_rtx", {"ops": ops})
    with trt.started_worker("tensorrt_rtx"):
        waiting = trt._WAITING["tensorrt_rtx"]
        assert waiting.process is not None and waiting.process.poll() is None  # loading, then waiting
        assert run_worker("ops", "tensorrt_rtx", {"ops": ops}) == fresh
        # it ran the task and ends cleanly (reaped after the answer came: its exit is not waited for)
        assert waiting.process.wait(timeout=60) == 0 and "tensorrt_rtx" not in trt._WAITING
        assert waiting.process.stdout.closed and waiting.process.stderr.closed
        assert run_worker("ops", "tensorrt_rtx", {"ops": ops}) == fresh  # the next one: a new worker


@rtx
@pytest.mark.parametrize("started", [False, True])
def test_a_worker_past_its_time_is_stopped_and_said_in_one_line(tmp_path, started):
    """The answer is read from the worker's output without waiting for its exit; a worker that does not
    answer in time is killed and reaped, and the call fails with the usual line (a new or a started one)."""
    from contextlib import nullcontext

    from gskit.backends import trt

    slow = tmp_path / "slow_plugin.py"
    slow.write_text("import time\ntime.sleep(60)\n")
    started_one = trt.started_worker("tensorrt_rtx") if started else nullcontext()
    with started_one:
        waiting = trt._WAITING.get("tensorrt_rtx")
        with pytest.raises(GskitError, match="tensorrt_rtx ops did not finish in 3 s"):
            run_worker("ops", "tensorrt_rtx", {"ops": [], "plugin_modules": [str(slow)]}, timeout_s=3)
        if waiting is not None:
            assert waiting.process.returncode is not None and waiting.process.stdin.closed


@rtx
def test_a_started_worker_no_task_took_is_stopped_on_the_way_out():
    from gskit.backends import trt

    with trt.started_worker("tensorrt_rtx"):
        process = trt._WAITING["tensorrt_rtx"].process
        with trt.started_worker("tensorrt_rtx"):  # one waits already: no second one
            assert trt._WAITING["tensorrt_rtx"].process is process
        assert "tensorrt_rtx" in trt._WAITING  # the inner block did not stop the outer one's worker
    assert process is not None and process.returncode is not None and "tensorrt_rtx" not in trt._WAITING
    with trt.started_worker("static"):  # no parser: nothing started
        assert "static" not in trt._WAITING


@rtx
def test_a_worker_interrupted_as_it_starts_is_stopped(monkeypatch):
    """Ctrl-C while the worker is being spawned (the command line spawns it while it imports): the interrupt
    takes effect once the child is gskit's to stop, and it is stopped and reaped; inside Popen it used to
    leave a child that nothing stopped."""
    import signal
    import subprocess

    from gskit.backends import trt

    spawned = []
    real = subprocess.Popen

    def interrupted(*args, **kwargs):
        spawned.append(real(*args, **kwargs))
        signal.raise_signal(signal.SIGINT)  # arrives after the fork, before Popen returns
        return spawned[-1]

    monkeypatch.setattr(subprocess, "Popen", interrupted)
    with pytest.raises(KeyboardInterrupt):
        with trt.started_worker("tensorrt_rtx"):
            pytest.fail("the block ran though the start was interrupted")
    assert len(spawned) == 1 and spawned[0].returncode is not None and "tensorrt_rtx" not in trt._WAITING


@rtx
def test_check_trt_through_a_worker_started_before_it_reports_as_without(tmp_path):
    from gskit.backends import trt

    path = _save(tmp_path, PLUGIN_AND_UNIQUE)
    alone = check_trt(path, plugins=[])
    with trt.started_worker("tensorrt_rtx"):
        waiting = trt._WAITING["tensorrt_rtx"]
        assert check_trt(path, plugins=[]) == alone
        assert waiting.process is not None and waiting.process.wait(timeout=60) == 0
