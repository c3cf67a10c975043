"""Text from models and paths is data, never markup or terminal control; JSON is strict; numbers of any size
end in one line (issue 22).

Node and tensor names that hold rich markup (``[/]``, ``[red]``), emoji codes, escape sequences (clear
screen, colours, window title, OSC 8 links), other C0/C1 controls, DEL and bidi overrides go through every
command that shows names; nothing of them may act on the terminal, in a pipe or with colours forced, and the
JSON output keeps the exact strings. The CLI runs in-process unless the point is a real process.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from hostile_names import renamed, strict_json, unsafe_characters
from onnx import TensorProto, helper

from gskit.cli import main
from gskit.compare.outputs import compare_arrays
from gskit.io.report import dumps, shown, styled
from gskit.io.text import visible

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "gskit" / "data" / "example.onnx"
#: Appended to every node and tensor name of the example: markup, an emoji code, a screen clear, a window
#: title, an OSC 8 link, a bidi override, a colour, an 8-bit CSI, DEL, a tab and a NUL-free line break.
SUFFIX = "[/]\x1b[2J\x1b]0;title\x07\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\\u202e[red]:smile:\x9b\x7f\t\n"


def gskit(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    """``gskit ARGV`` in-process: exit code, stdout, stderr."""
    capsys.readouterr()
    try:
        code = main([str(a) for a in argv])
    except SystemExit as stop:  # argparse's own errors
        code = int(stop.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def gskit_process(*argv: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gskit.cli", *map(str, argv)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        timeout=300,
    )


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The example with hostile names, and the same after ``gskit replace`` (plugin nodes)."""
    folder = tmp_path_factory.mktemp("hostile")
    model = folder / "hostile.onnx"
    onnx.save(renamed(onnx.load(EXAMPLE), lambda name: name + SUFFIX), model)
    replaced = folder / "replaced.onnx"
    assert main(["replace", str(model), "-o", str(replaced)]) == 0
    return model, replaced


def assert_shown_as_data(code: int, text: str, *, colour: bool = False, names: bool = True) -> None:
    """Ran to the end, nothing in ``text`` acts on a terminal, and names (where shown) are there, escaped."""
    assert code in (0, 1), text[-2000:]
    assert "a gskit bug" not in text and "Traceback" not in text, text[-2000:]
    assert unsafe_characters(text, colour=colour) == []
    assert "\U0001f604" not in text  # no emoji from ":smile:"
    if names:  # cut to fit their columns, but their start is there
        assert "[/]\\x1b[2J" in text.replace("\n", "")


COMMANDS = {
    "inspect --nodes": lambda m, r, out: ["inspect", m, "--nodes"],
    "inspect --tensors": lambda m, r, out: ["inspect", m, "--tensors"],
    "inspect": lambda m, r, out: ["inspect", r],
    "replace --explain": lambda m, r, out: ["replace", m, "-o", out / "r.onnx", "--explain"],
    "compare": lambda m, r, out: ["compare", m, r],
    "compare --layerwise": lambda m, r, out: ["compare", m, r, "--layerwise"],
    "compare --per-plugin": lambda m, r, out: ["compare", m, r, "--per-plugin"],
    "check-trt": lambda m, r, out: ["check-trt", m, "--backend", "static"],
    "check-trt plugin nodes": lambda m, r, out: ["check-trt", r, "--backend", "static"],
    "fold": lambda m, r, out: ["fold", m, "-o", out / "f.onnx"],
    "prepare": lambda m, r, out: ["prepare", m, "-o", out / "out", "--skip", "build"],
}


#: Commands whose output names no node or tensor of this model.
NO_NAMES = {"fold", "check-trt plugin nodes"}


#: Each command in a pipe; those with their own styled lines also with colours forced (the seeded fuzz of
#: tests/test_fuzz.py draws both for every command).
RUNS = [(command, False) for command in sorted(COMMANDS) if command != "prepare"] + [
    (command, True) for command in ("compare", "compare --layerwise", "inspect --nodes", "prepare")
]


@pytest.mark.parametrize(
    ("command", "colour"), RUNS, ids=[f"{c}-{'colour' if k else 'pipe'}" for c, k in RUNS]
)
def test_hostile_names_are_shown_as_data(hostile, tmp_path, capsys, monkeypatch, command, colour) -> None:
    if colour:  # rich then draws as for a terminal: its own colours, nothing from the names
        monkeypatch.setenv("FORCE_COLOR", "1")
        monkeypatch.setenv("TERM", "xterm-256color")
    code, out, err = gskit(capsys, *COMMANDS[command](*hostile, tmp_path))
    assert_shown_as_data(code, out + err, colour=colour, names=command not in NO_NAMES)
    if colour:
        assert "\x1b[" in out + err  # the test drew colours: it checks what a terminal would get


def test_markup_in_paths_is_printed_as_written(tmp_path, capsys) -> None:
    out_dir = tmp_path / "o[red]x"
    code, out, err = gskit(capsys, "prepare", EXAMPLE, "-o", out_dir, "--skip", "build")
    assert code == 0, err
    assert f"wrote {out_dir}/model.onnx" in out
    model = tmp_path / "m[/]x.onnx"  # a folder "m[" and a file "]x.onnx"
    model.parent.mkdir()
    model.write_bytes(EXAMPLE.read_bytes())
    code, out, err = gskit(capsys, "check-trt", model, "--backend", "static")
    assert code == 0 and out.startswith("OK for TensorRT") and f"): {model}\n" in out, out + err
    code, out, err = gskit(capsys, "plugin", "new", "neg_relu", "--dir", tmp_path / "p[/]")
    assert code == 0 and f"--plugins {tmp_path}/p[/]" in out, out + err


def test_json_keeps_the_exact_names(hostile, capsys) -> None:
    model, _ = hostile
    code, out, _ = gskit(capsys, "inspect", model, "--tensors", "--json")
    names = {t["name"] for t in strict_json(out)["tensors"]}  # type: ignore[index]
    assert code == 0 and "x" + SUFFIX in names and "y" + SUFFIX in names


def test_the_error_line_shows_controls_escaped(tmp_path, capsys) -> None:
    missing = tmp_path / "m\x1b[2J\x1b]0;t\x07\u202e.onnx"
    code, out, err = gskit(capsys, "inspect", missing)
    assert code == 2 and out == ""
    assert err == f"gskit inspect: error: {visible(str(missing))}: no such model file\n"
    code, _, err = gskit(capsys, "--debug", "inspect", missing)  # the traceback too
    assert code == 2 and "Traceback" in err and unsafe_characters(err) == []
    code, _, err = gskit(capsys, "inspect", "--bogus", missing)  # argparse's own error quotes argv
    assert code == 2 and unsafe_characters(err) == []


def test_an_argument_that_is_not_utf8_is_one_line(tmp_path, capsys) -> None:
    # b"o\xff" in argv reaches Python as "o\udcff" (surrogateescape), which onnx cannot take as a path
    code, out, err = gskit(capsys, "prepare", EXAMPLE, "-o", f"{tmp_path}/o\udcff\x1b[31m")
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "o\\udcff\\x1b[31m: not UTF-8 text" in err and "a gskit bug" not in err
    assert list(tmp_path.iterdir()) == []


def test_log_lines_show_names_as_data(hostile, tmp_path) -> None:
    model, _ = hostile
    node = "/fc1/Gemm" + SUFFIX
    done = gskit_process("-v", "edit", model, "-o", tmp_path / "e.onnx", "--set-attr", f"{node}:alpha=2")
    assert done.returncode == 0, done.stderr
    assert "INFO gskit.passes.edit: node '/fc1/Gemm[/]\\x1b[2J" in done.stderr
    assert unsafe_characters(done.stderr) == []


def test_debug_keeps_polygraphy_off_stdout(hostile) -> None:
    """--debug raises Polygraphy's verbosity while comparing: its lines (which quote tensor names) go through
    Python's logging now; they were printed to stdout, raw, in the middle of --json."""
    model, _ = hostile
    done = gskit_process("--debug", "compare", model, model, "--json")
    assert done.returncode == 0 and strict_json(done.stdout)["passed"] is True  # type: ignore[index]
    assert "DEBUG Polygraphy: [V]" in done.stderr and unsafe_characters(done.stdout + done.stderr) == []


def test_prepare_step_lines_report_html_and_json_show_names_as_data(hostile, tmp_path, capsys) -> None:
    model, _ = hostile
    code, out, err = gskit(capsys, "prepare", model, "-o", tmp_path / "o[/]x", "--skip", "build")
    assert_shown_as_data(code, out + err)
    assert code == 0 and "ok validate" in err
    assert "(inputs x[/]\\x1b[2J" in err.replace("\n", "")  # validate's step line names the input it fed
    page = (tmp_path / "o[/]x" / "report.html").read_text()
    assert unsafe_characters(page) == []
    assert "x[/]\\x1b[2J\\x1b]0;title\\x07" in page and "\\u202e[red]:smile:\\x9b\\x7f\\t\\n" in page
    assert "<svg" in page or "install Graphviz" in page  # the drawings' labels went through the same escape
    report = strict_json((tmp_path / "o[/]x" / "report.json").read_text())
    assert report["comparison"]["outputs"][0]["name"] == "y" + SUFFIX  # type: ignore[index]


def test_shown_keeps_styles_and_line_breaks() -> None:
    text = styled(("ok", "green"), " a\x1bb\n", ("c\u202e", "red"))
    assert text.plain == "ok a\\x1bb\\nc\\u202e"
    assert [(text.plain[s.start : s.end], str(s.style)) for s in text.spans] == [
        ("ok", "green"),
        ("c\\u202e", "red"),
    ]
    from rich.text import Text

    built = Text("a\nb\x1b", style="bold")
    built.stylize("red", 2, 4)
    safe = shown(built)
    assert safe.plain == "a\nb\\x1b" and [
        (safe.plain[s.start : s.end], str(s.style)) for s in safe.spans
    ] == [("b\\x1b", "red")]


@pytest.mark.parametrize(
    ("raw", "seen"),
    [
        ("plain é中 [/]", "plain é中 [/]"),
        ("\x1b[2J", "\\x1b[2J"),
        ("a\nb\tc\rd", "a\\nb\\tc\\rd"),
        ("\x00\x7f\x85\x9b\x9f", "\\x00\\x7f\\x85\\x9b\\x9f"),
        (
            "\u202a\u202e\u2066\u2069\u200e\u200f\u061c\u2028\u2029",
            "\\u202a\\u202e\\u2066\\u2069\\u200e\\u200f\\u061c\\u2028\\u2029",
        ),
        ("o\udcff", "o\\udcff"),
    ],
)
def test_visible_escapes_what_a_terminal_would_act_on(raw: str, seen: str) -> None:
    assert visible(raw) == seen
    assert visible(raw, keep="\n") == seen.replace("\\n", "\n")


# ---- JSON: strict, non-finite floats as strings ------------------------------------------------------------


def _model(path: Path, nodes: list[onnx.NodeProto]) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["one"], value_float=1.0), *nodes],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def _outputs(tmp_path: Path) -> dict[str, Path]:
    """y = nan, inf, -inf or 0 everywhere, whatever x."""
    zero = helper.make_node("Sub", ["x", "x"], ["z"])
    return {
        "nan": _model(tmp_path / "nan.onnx", [zero, helper.make_node("Div", ["z", "z"], ["y"])]),
        "inf": _model(tmp_path / "inf.onnx", [zero, helper.make_node("Div", ["one", "z"], ["y"])]),
        "-inf": _model(
            tmp_path / "ninf.onnx",
            [zero, helper.make_node("Neg", ["one"], ["m"]), helper.make_node("Div", ["m", "z"], ["y"])],
        ),
        "0": _model(tmp_path / "zero.onnx", [helper.make_node("Sub", ["x", "x"], ["y"])]),
    }


@pytest.mark.parametrize(
    ("original", "prepared", "passed", "error"),
    [
        ("inf", "inf", True, 0.0),
        ("-inf", "-inf", True, 0.0),
        ("nan", "nan", True, 0.0),
        ("inf", "0", False, "inf"),
        ("0", "inf", False, "inf"),
        ("inf", "-inf", False, "inf"),
        ("nan", "0", False, "inf"),
        ("0", "nan", False, "inf"),
        ("nan", "inf", False, "inf"),
    ],
)
def test_non_finite_outputs_compare_by_the_stated_rule_in_strict_json(
    tmp_path, capsys, original, prepared, passed, error
) -> None:
    models = _outputs(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's RuntimeWarning (inf - inf) would be an error here
        code, out, err = gskit(capsys, "compare", models[original], models[prepared], "--json")
    assert code == (0 if passed else 1) and err == "", err
    (row,) = strict_json(out)["outputs"]  # type: ignore[index]
    assert row["passed"] is passed and row["max_abs_err"] == error and row["max_rel_err"] == error


def test_compare_arrays_judges_each_element_and_never_warns() -> None:
    ref = np.array([np.inf, -np.inf, np.nan, 1.0, 2.0], dtype=np.float32)
    largest = np.finfo(np.float32).max
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (same,) = compare_arrays({"y": ref}, {"y": ref.copy()}, ["y"])
        (near,) = compare_arrays({"y": ref}, {"y": ref + np.float32(1e-6)}, ["y"], atol=1e-5)
        (off,) = compare_arrays({"y": ref}, {"y": np.where(np.arange(5) == 4, 3, ref)}, ["y"], atol=1e-5)
        (capped,) = compare_arrays({"y": ref}, {"y": np.clip(ref, -largest, largest)}, ["y"], atol=1e30)
    assert same.passed and near.passed and same.max_abs_err == 0 == near.max_rel_err * 0
    assert not off.passed and off.max_abs_err == 1.0  # the finite elements are still judged
    assert not capped.passed and capped.max_abs_err == float("inf")  # inf is not "close" to the largest float


def test_report_json_and_stdout_are_strict_json_with_non_finite_errors(tmp_path, capsys) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text('steps:\n  - edit: {set_attrs: {/fc1/Gemm: {alpha: "1e400"}}}\n  - validate\n')
    code, out, err = gskit(capsys, "prepare", EXAMPLE, "-o", tmp_path / "out", "--recipe", recipe, "--json")
    assert code == 1, err
    written = strict_json((tmp_path / "out" / "report.json").read_text())
    assert written == strict_json(out)
    (row,) = written["comparison"]["outputs"]  # type: ignore[index]
    assert row["passed"] is False and row["max_abs_err"] == "inf"


#: Every command that prints JSON, on the model whose output is inf (MODEL) or on the example (EXAMPLE).
JSON_COMMANDS = {
    "prepare": ["prepare", "MODEL", "-o", "OUT/p", "--skip", "build"],
    "inspect": ["inspect", "MODEL"],
    "inspect --tensors": ["inspect", "MODEL", "--tensors"],
    "inspect --nodes": ["inspect", "MODEL", "--nodes"],
    "edit": ["edit", "MODEL", "-o", "OUT/e.onnx", "--rename", "y=out"],
    "isolate": ["isolate", "MODEL", "--inputs", "x", "--outputs", "y", "-o", "OUT/i.onnx"],
    "infer-shapes": ["infer-shapes", "MODEL", "-o", "OUT/s.onnx"],
    "compare": ["compare", "MODEL", "ZERO"],
    "compare --layerwise": ["compare", "MODEL", "ZERO", "--layerwise"],
    "replace": ["replace", "EXAMPLE", "-o", "OUT/r.onnx"],
    "compare --per-plugin": ["compare", "EXAMPLE", "OUT/r.onnx", "--per-plugin"],
    "plugin list": ["plugin", "list"],
    "plugin new": ["plugin", "new", "neg_relu", "--dir", "OUT/plugins"],
    "check-trt": ["check-trt", "MODEL", "--backend", "static"],
    "fold": ["fold", "MODEL", "-o", "OUT/f.onnx"],
    "sanitize": ["sanitize", "MODEL", "-o", "OUT/c.onnx"],
    "convert": ["convert", "MODEL", "-o", "OUT/v.onnx", "--fp16"],
}


def test_every_json_output_is_strict(tmp_path, capsys) -> None:
    """Each command's --json on a model whose outputs are not finite, parsed as parsers outside Python do."""
    models = _outputs(tmp_path)
    places = {"MODEL": str(models["inf"]), "ZERO": str(models["0"]), "EXAMPLE": str(EXAMPLE)}
    for name, argv in JSON_COMMANDS.items():
        argv = [places.get(a, a.replace("OUT", str(tmp_path))) for a in argv]
        code, out, err = gskit(capsys, *argv, "--json")
        assert code in (0, 1), f"{name}: {err}"
        strict_json(out)  # raises on NaN/Infinity tokens
    report = (tmp_path / "p" / "report.json").read_text()
    assert strict_json(report)["comparison"]["outputs"][0]["passed"] is True  # type: ignore[index]


def test_dumps_writes_non_finite_floats_as_strings() -> None:
    data = {"a": float("inf"), "b": [float("-inf"), np.float32("nan")], "c": np.float64(1.5), "d": 2**70}
    text = dumps(data)
    assert strict_json(text) == {"a": "inf", "b": ["-inf", "nan"], "c": 1.5, "d": 2**70}
    assert float(strict_json(text)["a"]) == float("inf")  # type: ignore[index]


# ---- numbers of any size: one line naming the option ------------------------------------------------------

BIG = "9" * 400


@pytest.mark.parametrize(
    ("step", "words"),
    [
        (
            f"validate: {{atol: {BIG}}}",
            "r.yaml:2: validate.atol: 9999999999...999999 (400 digits) is out of range",
        ),
        (f"validate: {{seed: {BIG}}}", "validate.seed"),
        (f"fold: {{max_passes: {BIG}}}", "fold.max_passes"),
        (f"validate: {{shapes: {{x: [{BIG}, 4, 8, 8]}}}}", "validate.shapes"),
        (f"edit: {{input_shapes: {{x: [{BIG}, 4, 8, 8]}}}}", "edit.input_shapes"),
        (f"edit: {{set_attrs: {{/fc1/Gemm: {{alpha: {BIG}}}}}}}", "edit.set_attrs"),
        (f"convert: {{fp16: true, clamp_max: -{BIG}}}", "convert.clamp_max"),
        (f"edit: {{insert_after: [{{tensor: y, op: Pad, inputs: [[{BIG}]]}}]}}", "edit.insert_after"),
    ],
)
def test_a_huge_recipe_number_is_one_line_naming_the_option(tmp_path, capsys, step, words) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"steps:\n  - {step}\n  - validate\n")
    code, out, err = gskit(capsys, "prepare", EXAMPLE, "-o", tmp_path / "out", "--recipe", recipe)
    assert code == 2 and out == "" and err.count("\n") == 1 and "a gskit bug" not in err, err
    assert words in err and len(err) < 300, err
    assert not (tmp_path / "out").exists()  # refused when the recipe is read


EDIT = ("edit", EXAMPLE, "-o", "{out}")


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        ((*EDIT, "--input-shape", f"x:{BIG},4,8,8"), "--input-shape 'x:999"),
        ((*EDIT, "--set-attr", f"/fc1/Gemm:transB={BIG}"), "attribute 'transB' of node '/fc1/Gemm': 9999"),
        (
            (*EDIT, "--set-attr", f"/fc1/Gemm:alpha={BIG}"),
            "attribute 'alpha' of node '/fc1/Gemm': value 9999",
        ),
        ((*EDIT, "--insert-after", f"/fc1/Gemm_output_0:Pad:@pads={BIG}"), "--insert-after input @999"),
        ((*EDIT, "--insert-after", "/fc1/Gemm_output_0:Pad:@pads=1e39"), "1e+39 is beyond float32"),
        (
            (*EDIT, "--insert-after", "/fc1/Gemm_output_0:Loop:body=1"),
            "a GRAPH attribute cannot be given as 1",
        ),
        (
            ("compare", EXAMPLE, EXAMPLE, "--shape", f"x:{BIG}x4x8x8"),
            "dim 0: 9999999999...999999 (400 digits)",
        ),
        (
            ("compare", EXAMPLE, EXAMPLE, "--seed", BIG),
            "seed: 9999999999...999999 (400 digits) is out of range",
        ),
        (
            ("build", EXAMPLE, "-o", "{out}", "--shape", f"x:1x4x8x8,2x4x8x8,{BIG}x4x8x8"),
            "--shape 'x:1x4x8x8",
        ),
    ],
)
def test_a_huge_number_on_the_command_line_is_one_line(tmp_path, capsys, argv, words) -> None:
    argv = [str(a).replace("{out}", str(tmp_path / "out")) for a in argv]
    code, out, err = gskit(capsys, *argv)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "a gskit bug" not in err and words in err and len(err) < 300, err


def test_a_recipe_insertion_of_a_loop_with_a_number_as_body_is_one_line(tmp_path, capsys) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "steps:\n  - edit: {insert_after: [{tensor: /fc1/Gemm_output_0, op: Loop, attrs: {body: 1}}]}\n"
    )
    code, _, err = gskit(capsys, "prepare", EXAMPLE, "-o", tmp_path / "out", "--recipe", recipe)
    assert code == 2 and "a gskit bug" not in err
    assert re.search(r"attribute 'body' of node '[^']+': a GRAPH attribute cannot be given as 1", err), err


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ([1, "a"], "[1, 'a'] is no attribute value"),
        ({"a": 1}, "dict is no attribute value"),
        (None, "NoneType is no attribute value"),
        ([], "[] is no attribute value"),
        (2**64, "18446744073709551616 is out of range"),
    ],
)
def test_an_attribute_value_onnx_cannot_store_is_refused_by_name(value, words) -> None:
    import gskit
    from gskit.errors import GskitError
    from gskit.passes.edit import set_attributes

    graph = gskit.to_graph(onnx.load(EXAMPLE))
    with pytest.raises(GskitError, match=re.escape(f"attribute '__x' of node '/fc1/Gemm': {words}")):
        set_attributes(graph, "/fc1/Gemm", {"__x": value})


# ---- a failed run's report ---------------------------------------------------------------------------------


def test_a_failed_run_says_so_and_keeps_what_the_steps_did(tmp_path, capsys) -> None:
    out = tmp_path / "out"
    code, _, err = gskit(capsys, "prepare", EXAMPLE, "-o", out, "--shape", "x:2x5x8x8")  # validate cannot run
    assert code == 2 and "step 'validate' (recipe line 9) failed" in err  # the default recipe's line
    report = strict_json((out / "report.json").read_text())
    assert report["passed"] is False and report["prepared_model"] is None  # type: ignore[index]
    assert report["plugins_inserted"] == {"gskit::ClampSwish v1": 2}  # type: ignore[index]
    assert report["native_inserted"] == {"LayerNormalization": 1}  # type: ignore[index]
    assert len(report["regions"]) == 3 and report["tensorrt"] is not None  # type: ignore[index]
    page = (out / "report.html").read_text()
    assert 'id="verdict">Run FAILED, no model written: step &#x27;validate&#x27; (recipe line 9)' in page
    assert "Validation FAILED" not in page and "Replaced regions (3)" in page
    assert "TensorRT check</td><td>not run" not in page
