"""compare: two models on onnxruntime, outputs by name, plugin references, CLI exit codes."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import parse_model, run_subcommand

from gskit.compare.outputs import compare
from gskit.errors import GskitError
from gskit.io import model as gsmodel
from gskit.plugin import load_plugins

ORIGINAL = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[N, 8] x) => (float[N, 8] y, float[N] s) {
    a = Tanh(x)
    k = Constant<value = float {0.75}>()
    y = Mul(a, k)
    axes = Constant<value = int64[1] {1}>()
    s = ReduceSum<keepdims = 0>(y, axes)
}
"""

# The same computation with the tanh-and-scale replaced by a plugin node (domain test.gskit).
PREPARED = """
<ir_version: 10, opset_import: ["" : 17, "test.gskit" : 1]>
g (float[N, 8] x) => (float[N, 8] y, float[N] s) {
    y = test.gskit.ScaledTanh<alpha = 0.75, plugin_namespace = "test.gskit", plugin_version = "1">(x)
    axes = Constant<value = int64[1] {1}>()
    s = ReduceSum<keepdims = 0>(y, axes)
}
"""

SPEC_PY = """
from gskit.plugin import Attribute, AttrType, PluginSpec, same_as_input
from .reference import scaled_tanh

SPEC = PluginSpec(
    name="ScaledTanh", namespace="test.gskit", inputs=("x", "bias?"),
    attributes=(Attribute("alpha", AttrType.FLOAT, 1.0, "scale"),),
    infer=same_as_input(0), reference=scaled_tanh,
)
"""

REFERENCE_PY = """
import numpy as np


def scaled_tanh(x, bias=None, *, alpha):
    return (np.tanh(x if bias is None else x + bias) * alpha).astype(x.dtype)
"""


def _original():
    return parse_model(ORIGINAL)


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "plugins" / "scaled_tanh"
    folder.mkdir(parents=True)
    (folder / "spec.py").write_text(textwrap.dedent(SPEC_PY))
    (folder / "reference.py").write_text(textwrap.dedent(REFERENCE_PY))
    return tmp_path / "plugins"


def test_plugin_model_matches_original(plugin_dir):
    plugins = load_plugins([plugin_dir], entry_points=False)
    report = compare(_original(), parse_model(PREPARED), shapes={"x": (4, 8)}, plugins=plugins, seed=3)
    assert report.passed
    assert [o.name for o in report.outputs] == ["y", "s"]
    assert report.input_shapes == {"x": (4, 8)}
    y = report.outputs[0]
    assert y.shape == (4, 8) and y.dtype == "float32" and y.max_abs_err <= 1e-6


def test_mismatch_is_reported_with_its_error(plugin_dir):
    plugins = load_plugins([plugin_dir], entry_points=False)
    prepared = parse_model(PREPARED.replace("alpha = 0.75", "alpha = 0.8"))
    x = np.linspace(-2, 2, 16, dtype=np.float32).reshape(2, 8)
    report = compare(_original(), prepared, feeds={"x": x}, plugins=plugins)
    assert not report.passed
    y = report.outputs[0]
    expected_err = np.abs(np.tanh(x.astype(np.float64)) * 0.05).max()
    assert not y.passed and y.max_abs_err == pytest.approx(expected_err, rel=1e-5)
    assert y.max_rel_err == pytest.approx(0.05 / 0.75, rel=1e-4)
    # a tolerance above the error passes
    assert compare(_original(), prepared, feeds={"x": x}, plugins=plugins, atol=0.5).passed  # s sums 8 errors


def test_missing_output_is_an_error():
    prepared = parse_model(
        """
        <ir_version: 10, opset_import: ["" : 17]>
        g (float[N, 8] x) => (float[N, 8] y) {
            a = Tanh(x)
            k = Constant<value = float {0.75}>()
            y = Mul(a, k)
        }
        """
    )
    with pytest.raises(GskitError, match=r"lacks output\(s\) \['s'\]"):
        compare(_original(), prepared)


def test_shape_mismatch_fails():
    prepared = parse_model(
        """
        <ir_version: 10, opset_import: ["" : 17]>
        g (float[N, 8] x) => (float[N, 8] y, float[N, 1] s) {
            a = Tanh(x)
            k = Constant<value = float {0.75}>()
            y = Mul(a, k)
            axes = Constant<value = int64[1] {1}>()
            s = ReduceSum<keepdims = 1>(y, axes)
        }
        """
    )
    report = compare(_original(), prepared)
    s = report.outputs[1]
    assert not report.passed and not s.passed and s.shape_under_test == (2, 1)


def test_plugin_model_without_plugins_says_what_to_do():
    with pytest.raises(GskitError, match="--plugins"):
        compare(_original(), parse_model(PREPARED))


def _cli(*argv: str) -> int:
    from gskit.cli import compare as command

    return run_subcommand(command, *argv)


def test_cli_exit_codes_and_json(plugin_dir, tmp_path, capsys):
    original = gsmodel.save(_original(), tmp_path / "original.onnx")
    good = gsmodel.save(parse_model(PREPARED), tmp_path / "good.onnx")
    bad = gsmodel.save(parse_model(PREPARED.replace("alpha = 0.75", "alpha = 0.9")), tmp_path / "bad.onnx")
    inputs = tmp_path / "inputs.npz"
    np.savez(inputs, x=np.full((3, 8), 0.5, np.float32))
    common = ("--plugins", str(plugin_dir))
    assert _cli("compare", str(original), str(good), *common, "--shape", "x:5x8") == 0
    assert "all outputs match" in capsys.readouterr().out
    assert _cli("compare", str(original), str(bad), *common, "--inputs", str(inputs), "--json") == 1
    data = json.loads(capsys.readouterr().out)
    assert data["passed"] is False and data["input_shapes"] == {"x": [3, 8]}
    assert data["outputs"][0]["max_abs_err"] == pytest.approx(np.tanh(0.5) * 0.15, rel=1e-5)
    (tmp_path / "no_plugins").mkdir()
    assert _cli("compare", str(original), str(good), "--plugins", str(tmp_path / "no_plugins")) == 2


def test_inputs_that_do_not_fit_the_model_are_named():
    model = _original()
    with pytest.raises(GskitError, match=r"missing \['x'\], unknown \['z'\]"):
        compare(model, model, feeds={"z": np.zeros((2, 8), np.float32)})


def test_model_without_outputs_is_an_error():
    model = _original()
    del model.graph.output[:]
    with pytest.raises(GskitError, match="no graph outputs"):
        compare(model, model)


def test_runner_failure_is_one_line_without_polygraphy_chatter(tmp_path, capsys):
    """Polygraphy's own '[!] ...' lines stay hidden; its failure arrives once, as gskit's error."""
    from gskit.backends.ort import runner
    from gskit.compare.outputs import compare_runners

    path = tmp_path / "m.onnx"
    gsmodel.save(parse_model(ORIGINAL), path)
    runner_a, runner_b = runner(path, None, "a"), runner(path, None, "b")
    with pytest.raises(GskitError, match="the a model cannot run on the inputs .*incompatible shape"):
        compare_runners(runner_a, runner_b, {"x": np.zeros((2, 3, 5), np.float32)})
    captured = capsys.readouterr()
    assert "[!]" not in captured.out + captured.err


def test_tolerance_follows_the_output_dtype():
    """One float16 unit of difference passes on a float16 output; the same change fails in float32."""
    text = """
        <ir_version: 10, opset_import: ["" : 17]>
        g ({t}[2, 4] x) => ({t}[2, 4] y) {{
            f = Constant<value = float {{{k}}}>()
            c = Cast<to = {to}>(f)
            y = Mul(x, c)
        }}
    """
    one_ulp = 1 + 2**-10  # the float16 number right after 1.0
    feeds = {"x": np.full((2, 4), 1.0, dtype=np.float16)}
    half = compare(
        parse_model(text.format(t="float16", to=10, k=1.0)),
        parse_model(text.format(t="float16", to=10, k=one_ulp)),
        feeds=feeds,
    )
    assert half.passed and half.outputs[0].atol == 4e-3 and half.outputs[0].rtol == 4e-3
    assert half.atol == 1e-5  # the given tolerance is still what float32 outputs get
    feeds = {"x": feeds["x"].astype(np.float32)}
    single = compare(
        parse_model(text.format(t="float", to=1, k=1.0)),
        parse_model(text.format(t="float", to=1, k=one_ulp)),
        feeds=feeds,
    )
    assert not single.passed and single.outputs[0].atol == 1e-5
    wrong = compare(
        parse_model(text.format(t="float16", to=10, k=1.0)),
        parse_model(text.format(t="float16", to=10, k=1.01)),
        feeds={"x": np.full((2, 4), 1.0, dtype=np.float16)},
    )
    assert not wrong.passed


def test_original_failing_on_generated_inputs_names_node_and_fix(tmp_path):
    """The ORIGINAL failing is told apart from the prepared one failing, with the node and the fix."""
    from gskit.compare.outputs import ReferenceRunError

    model = parse_model(
        """
        <ir_version: 10, opset_import: ["" : 17]>
        g (float[N] x) => (float[10, 100] y) {
          shape = Constant<value = int64[2] {10, 100}>()
          y = Reshape<allowzero = 0>(x, shape)
        }
        """
    )
    model.graph.node[1].name = "the_reshape"
    with pytest.raises(ReferenceRunError) as caught:
        compare(model, model)
    message = str(caught.value)
    assert message.startswith("the original model cannot run on the inputs {x float32[2]}")
    assert "the_reshape" in message and "--shape NAME:DIMS" in message and "\n" not in message
    assert caught.value.input_shapes == {"x": (2,)}
    # With the caller's own inputs there is no shape to suggest, only the failure.
    with pytest.raises(ReferenceRunError) as caught:
        compare(model, model, feeds={"x": np.zeros(7, np.float32)})
    assert "--shape" not in str(caught.value)


def test_failing_node_follows_producers_and_branch_reads():
    from gskit.compare.outputs import failing_node

    model = parse_model(
        """
        <ir_version: 10, opset_import: ["" : 17]>
        g (float[N] x, int64 sr, float[N] unused) => (float[N] y) {
          rate = Constant<value = int64 {16000}>()
          c = Equal(sr, rate)
          y = If(c) <
            then_branch = t () => (float[N] a) { a = Relu(x) },
            else_branch = e () => (float[N] b) { b = Neg(x) }
          >
        }
        """
    )
    model.graph.node[2].name = "the_if"
    message = (
        "Non-zero status code returned while running If node. Name:'the_if' Status Message: ... Name:'inner'"
    )
    # The If reads sr through the Equal and x inside its branches; 'unused' is not upstream.
    assert failing_node(model, message) == ("the_if (If)", ["x", "sr"])
    assert failing_node(model, "no node named here") is None


# ---- what a comparison may not let pass (issue 22: validation judges the written model) --------------------

INT_MODEL = """
<ir_version: 10, opset_import: ["" : 17]>
g (int64[4] x) => (int64[4] y) {{
    c = Constant<value = int64[1] {{{c}}}>()
    y = Add(x, c)
}}
"""


def test_integer_outputs_are_compared_exactly():
    """float64 cannot tell 2**60 from 2**60 + 100: integers are compared as integers, with no tolerance."""
    report = compare(
        parse_model(INT_MODEL.format(c=2**60)), parse_model(INT_MODEL.format(c=2**60 + 100)), atol=1, rtol=1
    )
    (y,) = report.outputs
    assert not report.passed and y.max_abs_err == 100 and (y.atol, y.rtol) == (0, 0)
    same = compare(parse_model(INT_MODEL.format(c=2**62)), parse_model(INT_MODEL.format(c=2**62)))
    assert same.passed and same.outputs[0].max_abs_err == 0
    # the extremes of int64: their difference (2**64 - 1) is taken without overflow
    big = compare(
        parse_model(INT_MODEL.format(c=2**63 - 1)),
        parse_model(INT_MODEL.format(c=-(2**63))),
        feeds={"x": np.zeros(4, np.int64)},
    )
    assert not big.passed and big.outputs[0].max_abs_err == float(2**64 - 1)


def test_bool_outputs_are_compared_exactly():
    text = """
        <ir_version: 10, opset_import: ["" : 17]>
        g (float[4] x) => (bool[4] y) {{
            c = Constant<value = float[1] {{{c}}}>()
            y = Greater(x, c)
        }}
    """
    feeds = {"x": np.array([0.0, 0.5, 1.0, 1.5], np.float32)}
    report = compare(parse_model(text.format(c=0.7)), parse_model(text.format(c=0.2)), feeds=feeds, atol=1)
    assert not report.passed and report.outputs[0].max_abs_err == 1


CAST_OUTPUT = """
<ir_version: 10, opset_import: ["" : 17]>
g ({src}[4] x) => ({dst}[4] y) {{
    r = Abs(x)
    y = Cast<to = {to}>(r)
}}
"""
SAME_OUTPUT = """
<ir_version: 10, opset_import: ["" : 17]>
g ({src}[4] x) => ({src}[4] y) {{
    y = Abs(x)
}}
"""


@pytest.mark.parametrize(
    ("src", "dst", "to", "before", "after"),
    [
        ("int64", "float", 1, "int64", "float32"),
        ("float", "double", 11, "float32", "float64"),
        ("float", "float16", 10, "float32", "float16"),
    ],
)
def test_an_output_whose_dtype_changed_fails_with_its_own_note(src, dst, to, before, after):
    original = parse_model(SAME_OUTPUT.format(src=src))
    changed = parse_model(CAST_OUTPUT.format(src=src, dst=dst, to=to))
    report = compare(original, changed, atol=1, rtol=1)  # values equal within any tolerance
    (y,) = report.outputs
    assert not report.passed and not y.passed
    assert (y.dtype, y.dtype_under_test, y.dtypes) == (before, after, f"{before} -> {after}")
    assert y.note == f"dtype changed {before} -> {after}: an output must keep its dtype"
    from gskit.compare.outputs import DtypeChange

    expected = DtypeChange(before, after, by="the recipe's convert step")
    allowed = compare(original, changed, atol=1e-2, rtol=1e-2, dtype_changes=[expected])
    assert allowed.passed and "made by the recipe's convert step" in allowed.outputs[0].note
    other = DtypeChange(before, "bfloat16", by="something else")
    assert not compare(original, changed, atol=1, rtol=1, dtype_changes=[other]).passed


def test_bool_output_that_became_uint8_fails(tmp_path, capsys):
    text = """
        <ir_version: 10, opset_import: ["" : 17]>
        g (float[4] x) => ({dst}[4] y) {{
            z = Constant<value = float[1] {{0.0}}>()
            b = Greater(x, z)
            y = {tail}
        }}
    """
    original = gsmodel.save(parse_model(text.format(dst="bool", tail="Identity(b)")), tmp_path / "a.onnx")
    prepared = gsmodel.save(
        parse_model(text.format(dst="uint8", tail="Cast<to = 2>(b)")), tmp_path / "b.onnx"
    )
    assert _cli("compare", str(original), str(prepared)) == 1
    out = capsys.readouterr().out
    assert "bool -> uint8" in out and "output 'y': dtype changed bool -> uint8" in out
    assert _cli("compare", str(original), str(prepared), "--allow-dtype-change", "bool:uint8") == 0
    assert _cli("compare", str(original), str(prepared), "--allow-dtype-change", "bool") == 2


@pytest.mark.parametrize(
    ("prepared", "named"),
    [
        ("g (float[batch, 16] x) => (float[batch, 16] y) { y = Relu(x) }", "'x' is float32[2x4x8x8]"),
        ("g (float[2, 4, 8, 9] x) => (float[2, 4, 8, 9] y) { y = Relu(x) }", "float32[2x4x8x9]"),
        ("g (float[2, 4, 8, 8] x2) => (float[2, 4, 8, 8] y) { y = Relu(x2) }", "'x2' only in"),
        (
            "g (int64[2, 4, 8, 8] x) => (float[2, 4, 8, 8] y) { f = Cast<to = 1>(x)\n y = Relu(f) }",
            "int64[2x4x8x8]",
        ),
    ],
    ids=["rank", "dim", "name", "dtype"],
)
def test_models_whose_inputs_differ_are_refused_in_one_line(prepared, named):
    original = parse_model(
        '<ir_version: 10, opset_import: ["" : 17]>\n'
        "g (float[2, 4, 8, 8] x) => (float[2, 4, 8, 8] y) { y = Relu(x) }"
    )
    other = parse_model('<ir_version: 10, opset_import: ["" : 17]>\n' + prepared)
    with pytest.raises(GskitError, match="the models' inputs differ") as caught:
        compare(original, other)
    assert named in str(caught.value) and "\n" not in str(caught.value)


def test_inputs_narrowed_within_their_kind_still_compare():
    """convert --fp16 --no-keep-io-fp32 and --int32 change input dtypes within a kind: the same values fit."""
    original = parse_model(SAME_OUTPUT.format(src="float"))
    half_in = parse_model(
        '<ir_version: 10, opset_import: ["" : 17]>\n'
        "g (float16[4] x) => (float[4] y) { a = Abs(x)\n y = Cast<to = 1>(a) }"
    )
    assert compare(original, half_in, atol=1e-3, rtol=1e-3).passed


def test_original_that_onnxruntime_cannot_load_is_said_once(tmp_path):
    """DeformConv exists from opset 19: at opset 18 no input shape can help, so none is suggested."""
    from gskit.errors import ModelLoadError

    model = parse_model(
        """
        <ir_version: 9, opset_import: ["" : 19]>
        g (float[1, 1, 4, 4] x, float[1, 1, 3, 3] w, float[1, 18, 2, 2] off) => (float[1, 1, 2, 2] y) {
            y = DeformConv(x, w, off)
        }
        """
    )
    model.opset_import[0].version = 18
    with pytest.raises(ModelLoadError) as caught:
        compare(model, model)
    message = str(caught.value)
    assert message.startswith("the original model does not load on onnxruntime")
    assert "DeformConv" in message and "--shape" not in message and "\n" not in message


def test_each_model_file_is_read_once(plugin_dir, tmp_path: Path, model_reads: list[str]) -> None:
    """compare read each file three or four times: for itself, then for each session once more to look for
    plugin nodes and once more to rewrite them (each read parses the whole graph)."""
    original = gsmodel.save(_original(), tmp_path / "original.onnx")
    prepared = gsmodel.save(parse_model(PREPARED), tmp_path / "prepared.onnx")
    plugins = load_plugins([plugin_dir], entry_points=False)
    model_reads.clear()
    assert compare(original, prepared, plugins=plugins, shapes={"x": (2, 8)}).passed
    assert sorted(model_reads) == ["original.onnx", "prepared.onnx"]


def _polygraphy_verdict(expected: np.ndarray, actual: np.ndarray, atol: float, rtol: float) -> bool:
    """Polygraphy's ``SimpleCompareFunc`` on one output (what compare judged with before its own rule)."""
    from polygraphy.comparator import SimpleCompareFunc
    from polygraphy.comparator.struct import IterationResult

    from gskit.compare.outputs import quiet_polygraphy

    with quiet_polygraphy(), np.errstate(over="ignore"):  # its statistics square values near float max
        verdicts = SimpleCompareFunc(atol=atol, rtol=rtol, check_shapes=True)(
            IterationResult({"y": expected}, runner_name="a"), IterationResult({"y": actual}, runner_name="b")
        )
    return bool(verdicts["y"])


def test_the_tolerance_rule_gives_polygraphys_verdicts() -> None:
    """compare judges outputs with its own numpy rule (no Polygraphy import on the plain path): the same
    verdict as Polygraphy's SimpleCompareFunc on borderline, zero, NaN, inf, float16, mixed-dtype, integer and
    bool outputs, for several tolerances."""
    from gskit.compare.outputs import within_tolerance

    rng = np.random.default_rng(7)
    base = rng.uniform(-2, 2, 64).astype(np.float32)
    base[:6] = [0, 0, 1e-30, -1e-30, 1e5, -1e5]
    cases = []
    for scale in (0, 1e-7, 1e-6, 9e-6, 1e-5, 1.1e-5, 1e-4, 1e-2, 1):
        noise = rng.standard_normal(64).astype(np.float32) * np.float32(scale)
        cases.append((base, base + noise))
        cases.append((base, base * (1 + noise)))
        with np.errstate(over="ignore"):  # 1e5 is inf in float16: a case of its own
            cases.append((base.astype(np.float16), (base + noise).astype(np.float16)))
            cases.append((base, (base + noise).astype(np.float16)))
        cases.append((base.astype(np.float64), base.astype(np.float64) + noise))
    special = base.copy()
    special[[7, 8, 9]] = [np.nan, np.inf, -np.inf]
    cases += [(special, special), (special, base), (base, special), (base, np.zeros_like(base))]
    cases += [
        (np.zeros(4, np.float32), np.zeros(4, np.float32)),
        (np.zeros(4, np.float32), np.ones(4, np.float32)),
    ]
    ints = rng.integers(-5, 5, 32)
    for dtype in (np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint32):
        cases.append((ints.astype(dtype), (ints + (ints > 3)).astype(dtype)))
    cases.append((ints > 0, ints > 1))
    cases.append((base, base[:32]))  # shapes differ
    checked = 0
    for expected, actual in cases:
        for atol, rtol in ((1e-5, 1e-5), (0.0, 1e-5), (1e-5, 0.0), (4e-3, 4e-3), (0.0, 0.0), (1e-2, 1e-3)):
            ours = within_tolerance(expected, actual, atol, rtol)
            assert ours == _polygraphy_verdict(expected, actual, atol, rtol), (expected, actual, atol, rtol)
            checked += ours
    assert 0 < checked < len(cases) * 6  # both verdicts occur


def test_a_plain_compare_imports_neither_polygraphy_nor_rich() -> None:
    """Two models on onnxruntime are run and judged without Polygraphy (its import and its per-run
    bookkeeping were a third of a small model's compare), and printed to a pipe without rich (no progress
    bars there; the table as rich draws it); --debug still shows Polygraphy's lines."""
    import subprocess
    import sys

    example = str(Path(gsmodel.__file__).parents[1] / "data" / "example.onnx")
    code = (
        "import sys; from gskit.cli import main; code = main(sys.argv[1:]); "
        "print(code, sorted({m.split('.')[0] for m in sys.modules} & {'polygraphy', 'rich', 'torch'}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "compare", example, example], capture_output=True, text=True, timeout=300
    )
    assert done.stdout.strip().splitlines()[-1] == "0 []", done.stderr[-500:]
    done = subprocess.run(
        [sys.executable, "-c", code, "--debug", "compare", example, example],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.stdout.strip().splitlines()[-1] == "0 ['polygraphy']", done.stderr[-500:]
    assert "Polygraphy: [V]" in done.stderr


def test_inputs_that_need_reshaping_still_go_through_polygraphy(tmp_path) -> None:
    """Inputs that do not fit the session as they are (another shape) are handed to Polygraphy's runner as
    before, which refuses them with its own message; another dtype is cast to the input's, as it did."""
    path = tmp_path / "m.onnx"
    gsmodel.save(parse_model(ORIGINAL), path)
    with pytest.raises(GskitError, match="the original model cannot run on the inputs .*incompatible shape"):
        compare(path, path, feeds={"x": np.zeros((2, 3, 5), np.float32)})
    wide = np.random.default_rng(0).uniform(-1, 1, (2, 8)).astype(np.float64)
    cast = compare(path, path, feeds={"x": wide})
    assert cast.passed and cast.input_shapes == {"x": (2, 8)}
