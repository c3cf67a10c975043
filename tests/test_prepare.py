"""End-to-end tests of ``gskit prepare``: default and custom recipes, reports, interruption, the HTML page."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

from gskit.backends import ort as ortb
from gskit.cli import main
from gskit.io import model as gsmodel
from gskit.pipeline.recipe import parse_recipe
from gskit.pipeline.steps import DEFAULT_STEPS
from gskit.plugin import load_plugins

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "gskit" / "data" / "example.onnx"
#: ops that must not survive a replacement of the example's patterns (ClampSwish: Exp; LayerNorm: Sqrt...)
PATTERN_OPS = {"Exp", "Sqrt", "ReduceMean", "Pow"}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _ops(path: Path) -> Counter:
    model = onnx.load(str(path))
    return Counter((n.domain or "ai.onnx", n.op_type) for n in model.graph.node)


def _export_example(path: Path, dynamo: bool) -> Path:
    """ExampleNet of scripts/make_example_model.py exported with the chosen exporter."""
    import torch

    spec = importlib.util.spec_from_file_location(
        "make_example_model", REPO / "scripts" / "make_example_model.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    net = module.ExampleNet().eval()
    x = torch.randn(2, 4, 8, 8)
    kwargs = (
        {"dynamic_axes": {"x": {0: "batch"}, "y": {0: "batch"}}}
        if not dynamo
        else {"dynamic_shapes": ({0: torch.export.Dim("batch", min=1, max=64)},)}
    )
    torch.onnx.export(
        net,
        (x,),
        str(path),
        dynamo=dynamo,
        opset_version=17 if not dynamo else 18,
        input_names=["x"],
        output_names=["y"],
        **kwargs,
    )
    return path


def _check_prepared(
    out: Path, original: Path, expect: dict[str, int], native: dict[str, int] | None = None
) -> dict:
    """The prepared model has ``expect`` plugin nodes and ``native`` ONNX ops written for the target, says so
    in report.json, and computes what the original does."""
    report = json.loads((out / "report.json").read_text())
    prepared = out / "model.onnx"
    assert report["passed"] is True
    assert Path(report["prepared_model"]) == prepared.resolve()
    ops = _ops(prepared)
    for plugin, count in expect.items():
        assert ops[("gskit", plugin)] == count, ops
        assert report["plugins_inserted"][f"gskit::{plugin} v1"] == count
    for op, count in (native or {}).items():
        assert ops[("ai.onnx", op)] == count, ops
        assert report["native_inserted"][op] == count
    assert sum(r["form"] == "native" for r in report["regions"]) == sum((native or {}).values())
    # report.json agrees with the model written
    plugin_nodes = sum(v for (domain, _), v in ops.items() if domain == "gskit")
    assert plugin_nodes == sum(report["plugins_inserted"].values())
    assert all(o["passed"] and o["max_abs_err"] <= 1e-5 for o in report["comparison"]["outputs"])
    # Independent check: plain onnxruntime on the original, reference-backed run of the prepared model.
    x = np.random.default_rng(7).standard_normal((5, 4, 8, 8)).astype(np.float32)
    want = ortb.run(original, {"x": x})["y"]
    prepared_batch = onnx.load(str(prepared)).graph.input[0].type.tensor_type.shape.dim[0]
    if prepared_batch.HasField("dim_value"):
        x = x[: prepared_batch.dim_value]
        want = want[: prepared_batch.dim_value]
    got = ortb.run(prepared, {"x": x}, plugins=load_plugins())["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    return report


#: A TensorRT older than every native form (LayerNormalization 8.6, DeformConv 10.1, RMSNormalization 10.15):
#: every matched region becomes its plugin node.
PLUGIN_TARGET = "8.5"


def test_default_recipe_on_example(tmp_path: Path) -> None:
    """The README's first command: no TensorRT installed here, so the target is the newest gskit knows, which
    runs LayerNormalization natively; ClampSwish has no native form and stays a plugin node."""
    before = _sha(EXAMPLE)
    out = tmp_path / "out"
    assert main(["prepare", str(EXAMPLE), "-o", str(out)]) == 0
    report = _check_prepared(out, EXAMPLE, {"ClampSwish": 2}, native={"LayerNormalization": 1})
    assert (
        report["target"]["tensorrt"] == "11.5" and "no full TensorRT installed" in report["target"]["source"]
    )
    assert [s["name"] for s in report["steps"]] == list(DEFAULT_STEPS)
    assert not PATTERN_OPS & {op for _, op in _ops(out / "model.onnx")}
    fold = next(s for s in report["steps"] if s["name"] == "fold")
    assert fold["nodes_after"] < fold["nodes_before"]
    assert _sha(EXAMPLE) == before  # the input is only read
    assert not list(out.glob(".gskit-work-*")) and not list(out.glob(".*.tmp*"))


def test_an_old_target_gets_plugin_nodes_for_every_pattern(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["prepare", str(EXAMPLE), "-o", str(out), "--tensorrt", PLUGIN_TARGET]) == 0
    report = _check_prepared(out, EXAMPLE, {"ClampSwish": 2, "LayerNorm": 1})
    assert report["target"] == {"tensorrt": "8.5", "source": "--tensorrt 8.5"}
    layer_norm = next(r for r in report["regions"] if r["plugin"] == "gskit::LayerNorm v1")
    assert layer_norm["form"] == "plugin" and "TensorRT 8.5 < 8.6" in layer_norm["why"]


@pytest.mark.torch
@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_default_recipe_on_both_exporters(tmp_path: Path, dynamo: bool) -> None:
    original = _export_example(tmp_path / "net.onnx", dynamo)
    out = tmp_path / "out"
    assert main(["prepare", str(original), "-o", str(out), "--tensorrt", PLUGIN_TARGET]) == 0
    _check_prepared(out, original, {"ClampSwish": 2, "LayerNorm": 1})
    nodes_before = len(onnx.load(str(original)).graph.node)
    assert len(onnx.load(str(out / "model.onnx")).graph.node) < nodes_before


def test_custom_recipe(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        'target: {tensorrt: "8.5"}\n'
        "steps:\n"
        "  - edit: {input_shapes: {x: [4, 4, 8, 8]}}\n"
        "  - replace: {only: [LayerNorm]}\n"
        "  - infer_shapes\n"
        "  - fold: {max_passes: 3}\n"
        "  - validate: {atol: 1.0e-5, rtol: 1.0e-5, seed: 3, shapes: {x: [4, 4, 8, 8]}}\n"
    )
    out = tmp_path / "out"
    assert main(["prepare", str(EXAMPLE), "-o", str(out), "--recipe", str(recipe)]) == 0
    report = _check_prepared(out, EXAMPLE, {"LayerNorm": 1})
    ops = {op for _, op in _ops(out / "model.onnx")}
    assert "ClampSwish" not in ops and "Exp" in ops  # not asked for: left alone
    assert "Shape" not in ops  # static shapes: the view(x.size(0), -1) chain folds into a constant
    assert [s["name"] for s in report["steps"]] == ["edit", "replace", "infer_shapes", "fold", "validate"]
    assert report["comparison"]["input_shapes"]["x"] == [4, 4, 8, 8]
    assert report["target"] == {"tensorrt": "8.5", "source": f"target of {recipe} 8.5"}


def test_validation_failure_exits_1(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("steps:\n  - replace\n  - validate: {atol: 0.0, rtol: 0.0}\n")
    out = tmp_path / "out"
    assert main(["prepare", str(EXAMPLE), "-o", str(out), "--recipe", str(recipe)]) == 1
    report = json.loads((out / "report.json").read_text())
    assert report["passed"] is False
    assert report["steps"][-1]["status"] == "failed"


def test_bad_recipe_names_the_line_and_runs_nothing(tmp_path: Path, capsys) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("steps:\n  - replace\n  - fold: {max_pass: 3}\n")
    out = tmp_path / "out"
    assert main(["prepare", str(EXAMPLE), "-o", str(out), "--recipe", str(recipe)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{recipe}:3" in err[0] and "max_pass" in err[0]
    assert not out.exists()


def test_shape_for_an_unknown_input_fails_before_any_step(tmp_path: Path, capsys) -> None:
    # It used to fail only at validate, after replace, fold and the TensorRT check had run (minutes on a
    # large model); validate compares with the original, whose inputs are known from the start.
    out = tmp_path / "out"
    assert main(["prepare", str(EXAMPLE), "-o", str(out), "--shape", "y:1x4x8x8", "--skip", "build"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "unknown input(s) ['y']; model inputs are ['x']" in err[0]
    assert "sanitize" not in captured.out + captured.err and not out.exists()


def test_output_over_input_is_refused(tmp_path: Path, capsys) -> None:
    model = tmp_path / "model.onnx"
    shutil.copy(EXAMPLE, model)
    before = _sha(model)
    assert main(["prepare", str(model), "-o", str(tmp_path)]) == 2
    assert "input model" in capsys.readouterr().err
    assert _sha(model) == before


def test_print_default_recipe_round_trips(capsys) -> None:
    assert main(["prepare", "--print-default-recipe"]) == 0
    recipe = parse_recipe(capsys.readouterr().out)
    assert tuple(s.name for s in recipe.steps) == DEFAULT_STEPS


def _start(out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "gskit.cli", "prepare", str(EXAMPLE), "-o", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _assert_final_files_whole(out: Path) -> None:
    """Whatever final names exist hold complete files."""
    if (out / "model.onnx").exists():
        gsmodel.check_file(out / "model.onnx")
    for name in ("report.json",):
        if (out / name).exists():
            json.loads((out / name).read_text())
    if (out / "report.html").exists():
        assert (out / "report.html").read_text().rstrip().endswith("</html>")


@pytest.mark.parametrize("delay", [0.5, 1.5, 3.0, 5.0])
def test_sigkill_leaves_no_partial_final_file(tmp_path: Path, delay: float) -> None:
    out = tmp_path / "out"
    proc = _start(out)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    _assert_final_files_whole(out)


def test_sigint_stops_cleanly(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _start(out)
    # Wait until the run is under way (its work folder exists), then interrupt it.
    deadline = time.time() + 60
    while time.time() < deadline and not list(out.glob(".gskit-work-*")):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    if proc.returncode == 0:
        pytest.skip("the run finished before the signal arrived")
    assert proc.returncode == 130, err
    assert b"interrupted" in err
    _assert_final_files_whole(out)
    assert not list(out.glob(".gskit-work-*"))  # temp folder removed on the way out


@pytest.mark.skipif(
    shutil.which("chromium") is None, reason="needs Chromium (scripts/install-system-deps.sh)"
)
@pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz (scripts/install-system-deps.sh)")
def test_report_html_renders_in_chromium(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["prepare", str(EXAMPLE), "-o", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    page = out / "report.html"
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'chromium'}",
    ]
    dom = subprocess.run(
        ["chromium", *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120
    ).stdout
    from html.parser import HTMLParser

    class Collect(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.tags: Counter = Counter()
            self.ids: dict[str, str] = {}
            self._open: str | None = None

        def handle_starttag(self, tag, attrs):
            self.tags[tag] += 1
            ident = dict(attrs).get("id")
            if ident == "verdict":
                self._open = ident

        def handle_data(self, data):
            if self._open:
                self.ids[self._open] = data
                self._open = None

    parsed = Collect()
    parsed.feed(dom)
    regions = len(report["regions"])
    assert regions == 3
    assert parsed.tags["svg"] == 2 * regions  # before and after per replaced region
    assert parsed.ids["verdict"] == "Validation PASSED"
    assert parsed.tags["section"] == regions
    # "before"/"after" once per drawing (the figure caption; the drawing itself has no title)
    assert dom.count(">before<") == dom.count(">after<") == regions
    shot = tmp_path / "shot.png"
    subprocess.run(
        ["chromium", *flags, f"--screenshot={shot}", "--window-size=1200,2400", page.as_uri()],
        capture_output=True,
        timeout=120,
    )
    assert shot.stat().st_size > 20_000  # a page with drawings, not a blank one
    assert os.access(page, os.R_OK)


# Edge cases: one-line errors, reports on failure, state between steps ------------------------------------


def _one_line_error(capsys, *fragments: str) -> str:
    """The error as the one last line of stderr (progress lines of the steps that ran come before it)."""
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert "Traceback" not in err and lines[-1].startswith("gskit prepare: error: "), err
    assert sum(line.startswith("gskit prepare:") for line in lines) == 1, err
    for fragment in fragments:
        assert fragment in lines[-1], lines[-1]
    return lines[-1]


def _recipe(tmp_path: Path, text: str) -> str:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return str(path)


def test_outdir_that_is_a_file_is_refused(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    out.write_text("a file")
    assert main(["prepare", str(EXAMPLE), "-o", str(out)]) == 2
    _one_line_error(capsys, str(out), "is a file")
    assert main(["prepare", str(EXAMPLE), "-o", str(out / "sub")]) == 2
    _one_line_error(capsys, str(out / "sub"), "cannot create OUTDIR")
    assert out.read_text() == "a file"


def test_model_without_outputs_is_refused(tmp_path: Path, capsys) -> None:
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["y"])],
        "no_outputs",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [],
    )
    model = gsmodel.save(
        onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)]), tmp_path / "m.onnx"
    )
    out = tmp_path / "out"
    assert (
        main(["prepare", str(model), "-o", str(out), "--recipe", _recipe(tmp_path, "steps: [validate]")]) == 2
    )
    _one_line_error(capsys, "m.onnx", "no graph outputs")
    assert not out.exists()


@pytest.mark.parametrize("kind", ["absent", "pipe", "folder"])
def test_an_inputs_file_that_cannot_be_read_fails_before_any_step(tmp_path: Path, capsys, kind: str) -> None:
    """A missing inputs file, or a pipe or folder in its place, is said before the steps run (it failed the
    validate step at the end of the run; a pipe was opened, and waited on by a reader that checks later)."""
    import os

    given = tmp_path / "feeds.npz"
    if kind == "pipe":
        os.mkfifo(given)
    elif kind == "folder":
        given.mkdir()
    out = tmp_path / "out"
    assert main(["prepare", str(EXAMPLE), "-o", str(out), "--inputs", str(given)]) == 2
    expected = {"absent": "no such .npz inputs file", "pipe": "not a regular file", "folder": "is a folder"}
    _one_line_error(capsys, "feeds.npz", expected[kind])
    assert not out.exists()


@pytest.mark.parametrize(
    ("step", "fragment"),
    [
        ("validate: {inputs: one.npy}", "one.npy: holds one unnamed array (.npy)"),
        ("validate: {inputs: broken.npz}", "broken.npz: cannot read inputs"),
        ("isolate: {inputs: [nope], outputs: [y]}", "'nope'"),
    ],
)
def test_failing_step_is_one_line_and_reported(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch, step: str, fragment: str
) -> None:
    monkeypatch.chdir(tmp_path)
    np.save(tmp_path / "one.npy", np.zeros((2, 4, 8, 8), np.float32))
    (tmp_path / "broken.npz").write_bytes(b"PK\x03\x04 cut short")
    recipe = _recipe(tmp_path, f"steps:\n  - sanitize\n  - {step}\n")
    out = tmp_path / "out"
    assert main(["prepare", str(EXAMPLE), "-o", str(out), "--recipe", recipe]) == 2
    line = _one_line_error(capsys, "(recipe line 3)", fragment)
    report = json.loads((out / "report.json").read_text())
    assert report["error"] in line and report["passed"] is False
    assert [s["status"] for s in report["steps"]] == ["ok", "failed"]
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "report.json"]  # no model, no work folder


def _matmul_model(path: Path, rng: np.random.Generator) -> Path:
    """y = x @ w + b with 2 KiB of weights (external data when saved with it)."""
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["x", "w"], ["m"]), onnx.helper.make_node("Add", ["m", "b"], ["y"])],
        "mm",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 64])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 8])],
        [
            onnx.numpy_helper.from_array(rng.standard_normal((64, 8)).astype(np.float32), "w"),
            onnx.numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b"),
        ],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)])
    return gsmodel.save(model, path, external_data=True)


def test_check_steps_see_every_transform(tmp_path: Path, rng: np.random.Generator) -> None:
    """A check step after a transform that replaces the graph must not reuse the earlier snapshot."""
    model = _matmul_model(tmp_path / "mm.onnx", rng)
    recipe = _recipe(
        tmp_path,
        "steps:\n"
        "  - validate: {atol: 0.0, rtol: 0.0}\n"
        "  - convert: {fp16: true}\n"
        "  - validate: {atol: 0.0, rtol: 0.0}\n"
        "  - fold\n"
        "  - validate: {atol: 0.1, rtol: 0.1}\n",
    )
    out = tmp_path / "out"
    assert main(["prepare", str(model), "-o", str(out), "--recipe", recipe]) == 1
    report = json.loads((out / "report.json").read_text())
    assert [s["status"] for s in report["steps"]] == ["ok", "ok", "failed", "ok", "ok"]
    assert "max abs err 0:" in report["steps"][0]["summary"]  # fp32 as loaded: bit-identical
    assert "FAILED" in report["steps"][2]["summary"]  # fp16: the snapshot was taken again
    assert 0 < report["comparison"]["outputs"][0]["max_abs_err"] <= 0.1  # the last check saw fp16 too
    assert report["passed"] is False
    fp16 = onnx.TensorProto.FLOAT16
    assert {t.data_type for t in onnx.load(str(out / "model.onnx")).graph.initializer} == {fp16}


def _bytes_written() -> int:
    """Bytes this process has written so far (``write`` and ``copy_file_range`` alike: Linux's ``wchar``)."""
    text = Path("/proc/self/io").read_text()
    return next(int(line.split()[1]) for line in text.splitlines() if line.startswith("wchar:"))


def test_no_step_writes_the_weights_again(tmp_path: Path, rng: np.random.Generator) -> None:
    """On a model with external data, the default recipe's steps write nothing of its 8 MB of weights (the
    checks read a snapshot beside a link to the original's data; sanitize, check_trt and validate write no
    copy): the weights are written once, into the output. Watched per step through the bytes the process
    writes and the files in the run's work folder."""
    if not Path("/proc/self/io").is_file():
        pytest.skip("needs Linux's /proc/self/io")
    from gskit.pipeline.prepare import prepare

    weights = [rng.standard_normal((1024, 1024)).astype(np.float32) for _ in range(2)]
    graph = onnx.helper.make_graph(
        [
            onnx.helper.make_node("MatMul", ["x", "w1"], ["h"]),
            onnx.helper.make_node("MatMul", ["h", "w2"], ["y"]),
        ],
        "two_matmuls",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 1024])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 1024])],
        [onnx.numpy_helper.from_array(w, f"w{i + 1}") for i, w in enumerate(weights)],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    path = gsmodel.save(model, tmp_path / "in" / "m.onnx", external_data=True)
    data = path.with_name("m.onnx.data")
    out = tmp_path / "out"
    steps: list[tuple[str, int, int]] = []

    class Watch:
        def started(self, name: str, index: int, total: int) -> None:
            self.before = _bytes_written()

        def finished(self, result) -> None:
            files = [f for f in out.glob(".gskit-work-*/**/*") if f.is_file() and not f.samefile(data)]
            steps.append((result.name, _bytes_written() - self.before, sum(f.stat().st_size for f in files)))

    report = prepare(path, out, listener=Watch())
    assert report.passed is True
    assert [name for name, _, _ in steps] == list(DEFAULT_STEPS)
    weight_bytes = sum(w.nbytes for w in weights)
    for name, wrote, in_work_folder in steps:
        assert wrote < weight_bytes / 8, (name, wrote)
        assert in_work_folder < weight_bytes / 8, (name, in_work_folder)
    written = onnx.load(str(out / "model.onnx"))  # the output holds the weights, bit for bit
    assert [onnx.numpy_helper.to_array(t).tobytes() for t in written.graph.initializer] == [
        w.tobytes() for w in weights
    ]
    assert data.stat().st_nlink == 1  # the snapshot's link went with the work folder


def test_outdir_name_the_input_reads_is_refused_before_running(tmp_path: Path, capsys) -> None:
    """The input's weights live in OUTDIR/model.onnx.data: saving the result there would destroy them, so
    the run is refused before its steps, and OUTDIR is left as it was."""
    _matmul_model(tmp_path / "model.onnx", np.random.default_rng(0))
    source = tmp_path / "renamed.onnx"
    os.replace(tmp_path / "model.onnx", source)  # still reads model.onnx.data
    data = (tmp_path / "model.onnx.data").read_bytes()
    recipe = _recipe(tmp_path, "steps: [infer_shapes]\n")
    assert main(["prepare", str(source), "-o", str(tmp_path), "--recipe", recipe]) == 2
    _one_line_error(capsys, "model.onnx.data", "still read from this file")
    assert (tmp_path / "model.onnx.data").read_bytes() == data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx.data", "recipe.yaml", "renamed.onnx"]


def test_engine_from_an_earlier_run_is_removed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.engine").write_bytes(b"engine of another model")
    (out / "model.engine.json").write_text("{}")
    (out / "notes.txt").write_text("mine")
    recipe = _recipe(tmp_path, "steps: [sanitize]\n")
    assert main(["prepare", str(EXAMPLE), "-o", str(out), "--recipe", recipe]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["model.onnx", "notes.txt", "report.html", "report.json"]


def test_fp16_recipe_keeps_plugin_nodes_fp32(tmp_path: Path) -> None:
    """TensorRT 11 takes precision from the model: an fp16 recipe must give fp16 weights, fp32 plugin I/O."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        'target: {tensorrt: "8.5"}\n'
        "steps:\n  - replace\n  - infer_shapes\n  - fold\n  - convert: {fp16: true}\n  - infer_shapes\n"
        "  - validate: {atol: 1.0e-2, rtol: 1.0e-2}\n"
    )
    out = tmp_path / "out"
    assert main(["prepare", str(EXAMPLE), "-o", str(out), "--recipe", str(recipe)]) == 0
    model = onnx.load(str(out / "model.onnx"))
    plugins = [n for n in model.graph.node if n.domain == "gskit"]
    assert len(plugins) == 3
    plugin_inputs = {name for n in plugins for name in n.input}
    weights = {t.name: t.data_type for t in model.graph.initializer if t.data_type in (1, 10)}
    # Weights of standard ops are fp16; the plugins' own weights (LayerNorm's) stay fp32 with them.
    assert {k: v for k, v in weights.items() if k not in plugin_inputs}
    assert all(v == onnx.TensorProto.FLOAT16 for k, v in weights.items() if k not in plugin_inputs)
    assert all(v == onnx.TensorProto.FLOAT for k, v in weights.items() if k in plugin_inputs)
    types = {v.name: v.type.tensor_type.elem_type for v in (*model.graph.value_info, *model.graph.input)}
    for node in plugins:  # the plugin specs do not declare fp16: their data stays fp32 behind Casts
        assert types[node.input[0]] == onnx.TensorProto.FLOAT


#: An audio-like front end: reflect-pads 8 samples on each side, so any sequence of 8 or fewer samples fails
#: in onnxruntime (the default size of a symbolic dim is 2).
REFLECT_PAD = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[1, T] x) => (float[1, U] y) {
  pads = Constant<value = int64[4] {0, 8, 0, 8}>()
  p = Pad<mode = "reflect">(x, pads)
  y = Relu(p)
}
"""

#: Needs exactly 1000 elements: no generated size fits.
FIXED_RESHAPE = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[N] x) => (float[10, 100] y) {
  shape = Constant<value = int64[2] {10, 100}>()
  y = Reshape(x, shape)
}
"""


def test_original_failing_on_small_inputs_is_retried_larger(tmp_path: Path, capfd) -> None:
    from conftest import parse_model

    model, out = tmp_path / "pad.onnx", tmp_path / "out"
    onnx.save(parse_model(REFLECT_PAD), model)
    assert main(["prepare", str(model), "-o", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["comparison"]["input_shapes"] == {"x": [1, 16]}
    validate = next(s for s in report["steps"] if s["name"] == "validate")
    assert "1 smaller size(s) failed in the original" in validate["summary"]
    # onnxruntime's own coloured error lines for the failed try stay hidden (no --verbose).
    assert "onnxruntime" not in capfd.readouterr().err


def test_original_that_fits_no_generated_input_says_so_in_one_line(tmp_path: Path, capfd) -> None:
    from conftest import parse_model

    model, out = tmp_path / "reshape.onnx", tmp_path / "out"
    proto = parse_model(FIXED_RESHAPE)
    proto.graph.node[1].name = "y_reshape"
    onnx.save(proto, model)
    assert main(["prepare", str(model), "-o", str(out)]) == 2
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "Traceback" not in err
    assert "the original model cannot run on generated inputs" in lines[0]
    assert "Reshape" in lines[0] and "x float32[" in lines[0] and "--shape NAME:DIMS" in lines[0]
    assert "node y_reshape (Reshape) fails on input(s) ['x']" in lines[0]
    assert "--inputs F.npz" in lines[0]
    assert "[E:onnxruntime" not in err


def test_onnxruntime_logs_follow_gskit_verbosity(monkeypatch) -> None:
    import logging

    # The command line's choice wins (kept for sessions made later in the same run) ...
    for level, severity in ((logging.WARNING, 4), (logging.INFO, 2), (logging.DEBUG, 1)):
        ortb.quiet_default_logger(level)
        assert ortb.log_severity() == severity
    # ... else the "gskit" logger's level decides (library use).
    monkeypatch.setattr(ortb, "_CLI_LEVEL", None)
    logger = logging.getLogger("gskit")
    old = logger.level
    try:
        logger.setLevel(logging.WARNING)
        assert ortb.log_severity() == 4
        logger.setLevel(logging.INFO)
        assert ortb.log_severity() == 2
    finally:
        logger.setLevel(old)
        ortb.quiet_default_logger(logging.WARNING)


#: Dropout exported in training mode: onnxruntime draws a new mask on every run.
TRAINING_DROPOUT = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[2, 64] x) => (float[2, 64] y) {
  ratio = Constant<value = float {0.5}>()
  training = Constant<value = bool {1}>()
  y = Dropout(x, ratio, training)
}
"""


def test_validation_failure_from_an_unsteady_original_says_so(tmp_path: Path) -> None:
    from conftest import parse_model

    model, out = tmp_path / "dropout.onnx", tmp_path / "out"
    onnx.save(parse_model(TRAINING_DROPOUT), model)
    assert main(["prepare", str(model), "-o", str(out)]) == 1
    report = json.loads((out / "report.json").read_text())
    validate = next(s for s in report["steps"] if s["name"] == "validate")
    assert "the ORIGINAL model gives different ['y'] on two runs" in validate["summary"]


def test_unexpected_exception_inside_a_step_is_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    """A library failing deep inside a step (a gskit bug) still ends in one line naming the step, exit 2."""
    from gskit.passes.fold import FOLD

    def broken(self, model, options, context):
        raise ValueError("graphsurgeon could not do it\nsecond line")

    monkeypatch.setattr(type(FOLD), "call", broken)
    out = tmp_path / "out"
    assert main(["prepare", str(EXAMPLE), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    line = next(line for line in err.splitlines() if line.startswith("gskit prepare: error:"))
    assert "step 'fold'" in line and "unexpected ValueError: graphsurgeon could not do it" in line
    assert "--debug" in line and "second line" not in err
    assert json.loads((out / "report.json").read_text())["steps"][-1]["status"] == "failed"


# ---- "validated" describes the written model or nothing (issue 22) -----------------------------------------

EDIT_ALPHA = "  - edit: {set_attrs: {/fc1/Gemm: {alpha: 5.0}}}\n"


@pytest.mark.parametrize(
    "steps",
    [
        f"steps:\n  - validate\n{EDIT_ALPHA}",
        "steps:\n  - validate\n  - convert: {fp16: true}\n",
        "steps:\n  - validate\n  - isolate: {inputs: [x], outputs: [/fc1/Gemm_output_0]}\n",
    ],
    ids=["edit", "convert", "isolate"],
)
def test_a_change_after_validate_stops_before_any_step(tmp_path: Path, capsys, steps: str) -> None:
    out = tmp_path / "out"
    assert main(["prepare", str(EXAMPLE), "-o", str(out), "--recipe", _recipe(tmp_path, steps)]) == 2
    line = _one_line_error(capsys, "recipe.yaml:3: step '", "after step 'validate' (line 2)")
    assert "validation passed" not in line
    assert not out.exists()


@pytest.mark.parametrize("how", ["recipe", "skip"])
def test_a_run_without_validation_says_not_validated_everywhere(tmp_path: Path, capsys, how: str) -> None:
    from gskit.compare.outputs import compare

    out = tmp_path / "out"
    if how == "recipe":  # a change that validation would catch: no run may call it validated
        argv = ["--recipe", _recipe(tmp_path, f"steps:\n{EDIT_ALPHA}")]
    else:
        argv = ["--skip", "validate", "--skip", "build"]
    assert main(["prepare", str(EXAMPLE), "-o", str(out), *argv]) == 0
    printed = capsys.readouterr().out
    assert "not validated" in printed and "validation passed" not in printed
    report = json.loads((out / "report.json").read_text())
    assert report["validated"] is False and report["passed"] is None and report["comparison"] is None
    page = (out / "report.html").read_text()
    assert 'id="verdict">Not validated' in page and "PASSED" not in page
    if how == "recipe":
        assert not compare(EXAMPLE, out / "model.onnx").passed


def test_a_validated_run_says_validated(tmp_path: Path) -> None:
    from conftest import parse_model

    model, out = tmp_path / "relu.onnx", tmp_path / "out"
    onnx.save(parse_model(SMALL_FLOAT), model)
    assert (
        main(["prepare", str(model), "-o", str(out), "--recipe", _recipe(tmp_path, "steps: [validate]")]) == 0
    )
    report = json.loads((out / "report.json").read_text())
    assert report["validated"] is True and report["passed"] is True


SMALL_FLOAT = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[2, 8] x) => (float[2, 8] y) {
  k = Constant<value = float {0.5}>()
  m = Mul(x, k)
  y = Relu(m)
}
"""


def test_an_output_dtype_the_convert_step_changed_is_named(tmp_path: Path, capsys) -> None:
    """keep_io_fp32: false makes the output float16: expected (the report says by what), not a failure."""
    from conftest import parse_model

    model, out = tmp_path / "relu.onnx", tmp_path / "out"
    onnx.save(parse_model(SMALL_FLOAT), model)
    recipe = _recipe(
        tmp_path,
        "steps:\n  - convert: {fp16: true, keep_io_fp32: false}\n"
        "  - validate: {atol: 1.0e-2, rtol: 1.0e-2}\n",
    )
    assert main(["prepare", str(model), "-o", str(out), "--recipe", recipe]) == 0
    report = json.loads((out / "report.json").read_text())
    (y,) = report["comparison"]["outputs"]
    assert (y["dtype"], y["dtype_under_test"]) == ("float32", "float16")
    assert y["note"] == "dtype changed float32 -> float16, made by the recipe's convert step"
    assert y["note"] in report["steps"][-1]["summary"]
    page = (out / "report.html").read_text()
    assert "float32 -&gt; float16, made by the recipe&#x27;s convert step" in page


def test_an_original_that_onnxruntime_cannot_load_is_said_once(tmp_path: Path, capsys) -> None:
    """DeformConv at opset 18 (it exists from 19): no input size can help, so none is tried or suggested."""
    from conftest import parse_model

    proto = parse_model(
        """
        <ir_version: 9, opset_import: ["" : 19]>
        g (float[1, 1, 4, 4] x, float[1, 1, 3, 3] w, float[1, 18, 2, 2] off) => (float[1, 1, 2, 2] y) {
            y = DeformConv(x, w, off)
        }
        """
    )
    proto.opset_import[0].version = 18
    model, out = tmp_path / "deform.onnx", tmp_path / "out"
    onnx.save(proto, model)
    assert main(["prepare", str(model), "-o", str(out)]) == 2
    line = _one_line_error(capsys, "the original model does not load on onnxruntime", "DeformConv")
    assert "--shape" not in line and "size(s)" not in line


# ---- plugin code that raises (issue 22: the plugin author's first run) -------------------------------------


def _raising_clamp_swish(tmp_path: Path, raised: str) -> Path:
    """The shipped ClampSwish folder with a reference that raises (it overrides the shipped one)."""
    plugins = tmp_path / "plugins"
    shutil.copytree(
        REPO / "plugins" / "clamp_swish",
        plugins / "clamp_swish",
        ignore=shutil.ignore_patterns("__pycache__", "test_*.py"),
    )
    (plugins / "clamp_swish" / "reference.py").write_text(f"def clamp_swish(x):\n    raise {raised}\n")
    return plugins


def _gskit(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    """The real command in its own process: an abort (exit 134) must not take pytest with it."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "gskit.cli", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.parametrize(
    ("raised", "said"),
    [
        (
            'NotImplementedError("ClampSwish reference: write it")',
            "NotImplementedError: ClampSwish reference",
        ),
        ("ZeroDivisionError('boom')", "ZeroDivisionError: boom"),
    ],
    ids=["stub", "other"],
)
def test_a_raising_plugin_reference_is_one_line_and_the_report_keeps_the_steps(
    tmp_path: Path, raised: str, said: str
) -> None:
    plugins, out = _raising_clamp_swish(tmp_path, raised), tmp_path / "out"
    done = _gskit(
        "prepare",
        str(EXAMPLE),
        "-o",
        str(out),
        "--plugins",
        str(plugins),
        "--tensorrt",
        PLUGIN_TARGET,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in done.stderr and "terminate" not in done.stderr
    assert "plugin gskit::ClampSwish v1, node '" in errors[0] and said in errors[0]
    assert str(plugins / "clamp_swish" / "reference.py") in errors[0]
    # OUTDIR: the reports of this run, no work folder, no lock
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "report.json"]
    report = json.loads((out / "report.json").read_text())
    assert report["passed"] is False and report["validated"] is False and said in report["error"]
    # what the steps before the failure did stays in the report, as its steps table says
    replace = next(s for s in report["steps"] if s["name"] == "replace")
    assert replace["summary"].startswith("3 replaced")
    assert report["plugins_inserted"] == {"gskit::ClampSwish v1": 2, "gskit::LayerNorm v1": 1}
    assert len(report["regions"]) == 3 and report["tensorrt"] is not None
    page = (out / "report.html").read_text()
    assert "TensorRT check</td><td>not run" not in page and "Replaced regions (3)" in page
    if "boom" in said:
        return
    # compare of the written model (made with the good references) says the same, in one line
    good = tmp_path / "good"
    assert (
        _gskit("prepare", str(EXAMPLE), "-o", str(good), "--skip", "validate", cwd=tmp_path).returncode == 0
    )
    done = _gskit("compare", str(EXAMPLE), str(good / "model.onnx"), "--plugins", str(plugins), cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().count("\n") == 0 and said in done.stderr
    done = _gskit(
        "compare",
        str(EXAMPLE),
        str(good / "model.onnx"),
        "--layerwise",
        "--plugins",
        str(plugins),
        cwd=tmp_path,
    )
    assert done.returncode == 2 and "plugin gskit::ClampSwish v1, node '" in done.stderr


def test_a_failing_plugin_pattern_names_the_plugin(tmp_path: Path, capsys) -> None:
    plugins = _raising_clamp_swish(tmp_path, "ValueError('unused')")
    patterns = plugins / "clamp_swish" / "patterns.py"
    patterns.write_text(
        "from gskit.passes.patterns import OpPattern\n\n"
        "def _check(node):\n    raise KeyError('my check')\n\n"
        "PATTERNS = (OpPattern('Clip', check=_check, name='broken'),)\n"
    )
    out = tmp_path / "out"
    assert (
        main(["prepare", str(EXAMPLE), "-o", str(out), "--plugins", str(plugins), "--skip", "validate"]) == 2
    )
    line = _one_line_error(capsys, "plugin gskit::ClampSwish v1: pattern 'broken' raised KeyError")
    assert "a gskit bug" not in line and str(patterns) in line


def test_outputs_the_recipe_made_float16_are_compared_with_the_float16_floor(tmp_path: Path, capsys) -> None:
    """convert: {fp16: true, keep_io_fp32: false} makes the output float16, as the recipe asked: it used to
    fail on the float32 tolerance (1e-5) while its note said the change was expected."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text("steps:\n  - convert: {fp16: true, keep_io_fp32: false}\n  - validate\n")
    assert (
        main(["prepare", str(EXAMPLE), "-o", str(tmp_path / "out"), "--recipe", str(recipe), "--json"]) == 0
    )
    (row,) = json.loads(capsys.readouterr().out)["comparison"]["outputs"]
    assert (row["dtype"], row["dtype_under_test"], row["atol"], row["rtol"]) == (
        "float32",
        "float16",
        4e-3,
        4e-3,
    )
    assert (
        row["passed"] and row["note"] == "dtype changed float32 -> float16, made by the recipe's convert step"
    )


def test_a_lost_output_is_named_in_the_prepared_model_not_a_work_file(tmp_path: Path, capsys) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("steps:\n  - edit: {rename: {y: z}}\n  - validate\n")
    assert main(["prepare", str(EXAMPLE), "-o", str(tmp_path / "out"), "--recipe", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert (
        f"failed: the prepared model lacks output(s) ['y'] of {EXAMPLE}; outputs are matched by name" in err
    )
    assert ".gskit-work-" not in err


def _sequence_output_model(path: Path) -> Path:
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])
    y = onnx.helper.make_tensor_sequence_value_info("y", onnx.TensorProto.FLOAT, None)
    nodes = [
        onnx.helper.make_node("Neg", ["x"], ["n"]),
        onnx.helper.make_node("SequenceConstruct", ["x", "n"], ["y"]),
    ]
    graph = onnx.helper.make_graph(nodes, "g", [x], [y])
    onnx.save(
        onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=8), path
    )
    return path


def test_a_sequence_output_keeps_its_type_and_is_refused_by_name_for_comparison(
    tmp_path: Path, capsys
) -> None:
    """check_trt's snapshot (a graphsurgeon copy) used to turn the sequence output into a shapeless tensor
    that onnx's checker refused; validation then advised --shape, which cannot help a sequence."""
    model = _sequence_output_model(tmp_path / "seq.onnx")
    assert main(["prepare", str(model), "-o", str(tmp_path / "out"), "--skip", "build"]) == 2
    err = capsys.readouterr().err
    assert "ok check_trt" in err and "--shape" not in err
    assert err.splitlines()[-1].endswith(
        "failed: "
        + f"{model}: output(s) 'y' (sequence_type) are not tensors, and gskit compares tensor outputs "
        "only; compare the tensors they are made of (gskit edit --expose NAME), or leave validate out"
    )
    assert (
        main(["prepare", str(model), "-o", str(tmp_path / "out"), "--skip", "build", "--skip", "validate"])
        == 0
    )
    assert onnx.load(tmp_path / "out" / "model.onnx").graph.output[0].type.HasField("sequence_type")


def test_validate_reads_the_original_once(tmp_path: Path, model_reads: list[str]) -> None:
    """The validate step drew its inputs from a load of its own, then compare loaded the original again:
    now compare's load draws them. The original is read twice in a run: prepare's input and validation."""
    out = tmp_path / "out"
    assert main(["prepare", str(EXAMPLE), "-o", str(out), "--skip", "build", "--json"]) == 0
    assert model_reads.count("example.onnx") == 2, model_reads
    validate = next(
        s for s in json.loads((out / "report.json").read_text())["steps"] if s["name"] == "validate"
    )
    assert validate["status"] == "ok" and "inputs x:" in validate["summary"]


@pytest.mark.skipif(importlib.util.find_spec("tensorrt_rtx") is None, reason="needs tensorrt-rtx-cu13")
def test_the_check_trt_parser_starts_with_the_run_and_its_step_uses_it(tmp_path: Path) -> None:
    """The TensorRT-RTX worker loads while the steps before check_trt run; check_trt hands it the model."""
    from gskit.backends import trt
    from gskit.pipeline.prepare import default_recipe, prepare, recipe_with_overrides

    waiting: dict[str, bool] = {}

    class Listener:
        def started(self, name: str, index: int, total: int) -> None:
            waiting.setdefault(name, "tensorrt_rtx" in trt._WAITING)

        def finished(self, result: object) -> None:
            pass

    recipe = recipe_with_overrides(default_recipe(), skip=["build"])
    report = prepare(EXAMPLE, tmp_path / "out", recipe=recipe, listener=Listener())
    assert waiting["sanitize"] and waiting["check_trt"] and not waiting["validate"]  # check_trt took it
    assert (
        not trt._WAITING and report.tensorrt is not None and report.tensorrt.source.startswith("tensorrt_rtx")
    )
    unused = recipe_with_overrides(default_recipe(), skip=["build", "check_trt"])
    waiting.clear()
    prepare(EXAMPLE, tmp_path / "out2", recipe=unused, listener=Listener())
    assert not any(waiting.values())  # no check_trt step: no worker


@pytest.mark.parametrize(
    "flags",
    [
        [],
        ["--skip", "build", "--nms"],
        ["--skip=fold", "--fp16"],
        ["--tensorrt", "10.3"],
        ["--tensorrt=11"],
        ["--tensorrt", "8.6"],
        ["--tensorrt", "10.16.1.11", "--shape", "x:2x4x8x8"],
    ],
)
def test_the_parser_started_from_the_command_line_is_the_one_check_trt_asks(flags: list[str]) -> None:
    """``gskit prepare`` starts its check_trt step's parser before its imports, guessing from the command
    line: the guess is the flavour the step asks, or nothing (never a wrong one); with TensorRT-RTX alone
    installed, the default recipe's parser is always guessed."""
    from gskit.backends.trt_check import answering_flavour
    from gskit.cli import _early_parser, build_parser
    from gskit.cli.prepare import _recipe
    from gskit.pipeline.prepare import _target

    words = ["--debug", "prepare", str(EXAMPLE), "-o", "out", *flags]
    recipe = _recipe(build_parser(words).parse_args(words))
    step = next(s for s in recipe.steps if s.name == "check_trt")
    asked = answering_flavour(step.options.backend, _target(recipe))
    guessed = _early_parser(words)
    assert guessed in (asked, None)
    rtx_alone = importlib.util.find_spec("tensorrt") is None and importlib.util.find_spec("tensorrt_rtx")
    if rtx_alone:
        assert guessed == (None if asked == "static" else asked)


@pytest.mark.parametrize(
    "flags",
    [
        ["--skip", "check_trt"],
        ["--skip=check_trt"],
        ["--recipe", "r.yaml"],
        ["--recipe=r.yaml"],
        ["--rec", "r.yaml"],  # argparse takes an abbreviation
        ["--tens", "8.6"],
        ["--print-recipe"],
        ["-h"],
        ["--", "--skip", "check_trt"],
    ],
)
def test_no_parser_is_started_from_a_command_line_that_does_not_say_it(flags: list[str]) -> None:
    from gskit.cli import _early_parser

    assert _early_parser(["prepare", str(EXAMPLE), "-o", "out", *flags]) is None
    assert _early_parser(["check-trt", str(EXAMPLE)]) is None


@pytest.mark.skipif(importlib.util.find_spec("tensorrt_rtx") is None, reason="needs tensorrt-rtx-cu13")
def test_gskit_prepare_starts_the_parser_before_its_imports_and_check_trt_uses_it(
    tmp_path: Path, monkeypatch
) -> None:
    """The command starts the worker before it builds its parser (which imports onnx and the passes); the
    check_trt step hands its task to that worker, the one worker of the run."""
    import gskit.cli
    from gskit.backends import trt

    events: list[str] = []
    started: list[object] = []
    ran: list[object] = []
    build_parser = gskit.cli.build_parser
    monkeypatch.setattr(
        gskit.cli, "build_parser", lambda words: events.append("parser") or build_parser(words)
    )
    start, run = trt._Worker.start, trt._Worker.run
    monkeypatch.setattr(
        trt._Worker, "start", lambda self: events.append("worker") or started.append(self) or start(self)
    )
    monkeypatch.setattr(trt._Worker, "run", lambda self, *a: ran.append(self) or run(self, *a))
    assert main(["prepare", str(EXAMPLE), "-o", str(tmp_path / "out"), "--skip", "build"]) == 0
    assert events[:2] == ["worker", "parser"] and len(started) == 1 and ran == started
    assert not trt._WAITING
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["tensorrt"]["source"].startswith("tensorrt_rtx")


def _workers_of(folder: Path) -> list[str]:
    """Processes whose command line names a path under ``folder`` (a worker names its request file)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(folder) in text and "trt_worker" in text:
            found.append(text)
    return found


@pytest.mark.skipif(importlib.util.find_spec("tensorrt_rtx") is None, reason="needs tensorrt-rtx-cu13")
@pytest.mark.parametrize("how", ["error", "interrupted", "done"])
def test_the_parser_started_first_leaves_no_process_or_folder(tmp_path: Path, how: str) -> None:
    """The worker started from the command line is stopped and its folder removed however the command ends:
    an error before check_trt (a missing model), Ctrl-C while the command imports or runs, a whole run (the
    worker that answered exits on its own, reaped while the command goes on)."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    model = tmp_path / "missing.onnx" if how == "error" else EXAMPLE
    words = ["prepare", str(model), "-o", str(tmp_path / "out"), "--skip", "build"]
    env = {**os.environ, "TMPDIR": str(temp)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gskit.cli", *words],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    if how == "interrupted":
        deadline = time.time() + 60
        while time.time() < deadline and not list(temp.glob("gskit-trt-*")) and proc.poll() is None:
            time.sleep(0.01)
        assert list(temp.glob("gskit-trt-*")), "the worker's folder was never made"
        proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == {"error": 2, "interrupted": 130, "done": 0}[how], err
    assert not list(temp.glob("gskit-trt-*")) and not _workers_of(temp)


def test_the_snapshot_of_the_final_graph_is_the_model_written(tmp_path: Path, monkeypatch) -> None:
    """A run whose last snapshot (check_trt's, validate's) shows the final graph writes that file instead of
    saving the graph again; the model is byte for byte the one a run without a snapshot writes, and a snapshot
    taken before the graph changed is not used."""
    from gskit.pipeline.prepare import prepare
    from gskit.pipeline.recipe import make_recipe

    saves: list[str] = []
    real_save = gsmodel.save

    def counting(model, path, **kwargs):
        saves.append(Path(path).parent.name)
        return real_save(model, path, **kwargs)

    monkeypatch.setattr(gsmodel, "save", counting)
    written = {}
    for label, steps in (
        ("plain", ["sanitize", "replace", "fold"]),
        ("snapshot", ["sanitize", "replace", "fold", "validate"]),
        ("stale", ["sanitize", "replace", "check_trt", "fold"]),
    ):
        saves.clear()
        options = {"check_trt": {"backend": "static"}}  # no TensorRT worker: the snapshot is what counts here
        prepare(EXAMPLE, tmp_path / label, recipe=make_recipe([(s, options.get(s, {})) for s in steps]))
        written[label] = ((tmp_path / label / "model.onnx").read_bytes(), list(saves))
    assert written["snapshot"][0] == written["plain"][0] == written["stale"][0]
    assert written["plain"][1] == ["outputs"]  # the final save, into the run's staging folder
    assert written["snapshot"][1] == ["step1"]  # validate's snapshot only: the final model is that file
    assert written["stale"][1] == ["step1", "outputs"]  # fold changed the graph after the snapshot
    assert b"gskit scripts/make_example_model.py" in written["snapshot"][0]  # the producer kept


def test_the_summary_and_step_lines_to_a_pipe_are_the_text_rich_prints(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """To a pipe the step lines (stderr) and the summary (stdout) are written without rich
    (``gskit.io.text``): the same bytes as rich's console, rows and lines rich wraps included."""
    from types import SimpleNamespace

    import gskit.cli.prepare as cli_prepare
    from gskit.io import report as rich_report
    from gskit.pipeline.prepare import StepResult, prepare

    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "NO_COLOR"):
        monkeypatch.delenv(name, raising=False)
    report = prepare(EXAMPLE, tmp_path / "out")
    # a row the table wraps, and a step line longer than the console
    report.steps.append(StepResult("build", None, 0.0, 12, 12, "skipped", "word " * 60))
    monkeypatch.setattr(cli_prepare, "time", SimpleNamespace(perf_counter=lambda: 0.0))
    rich_console = rich_report.console

    def refused(stderr: bool = False) -> None:
        raise AssertionError("rich's console was used")

    printed = {}
    for plain in (True, False):
        monkeypatch.setattr(cli_prepare, "writes_plain", lambda stream, plain=plain: plain)
        monkeypatch.setattr(rich_report, "console", refused if plain else rich_console)
        progress = cli_prepare._Progress(quiet=False)
        for step in report.steps:
            progress.finished(step)
        cli_prepare._print_summary(report)
        printed[plain] = capsys.readouterr()
    assert printed[True] == printed[False]
    assert "\n(docker/)  (total 0.0s)\n" in printed[True].err and "validation passed\n" in printed[True].out
    assert printed[True].out.count("│ word word") > 1  # the long row was wrapped


def test_a_snapshot_saves_the_graph_itself_and_leaves_it_as_it_was(tmp_path: Path) -> None:
    """The step snapshot exports the run's graph without copying it first (it used to save a graphsurgeon
    copy): the file is byte for byte what a save of the same model imported afresh writes, the graph exports
    as before, and a graph without a list of imported domains is left without one (graphsurgeon's export
    fills it in)."""
    from gskit.pipeline.steps import Snapshots

    graph = gsmodel.to_graph(gsmodel.load(EXAMPLE))
    exported = gsmodel.to_model(graph).SerializeToString()
    afresh = gsmodel.to_graph(gsmodel.load(EXAMPLE))
    expected = gsmodel.save(afresh, tmp_path / "afresh" / "model.onnx").read_bytes()
    snapshot = Snapshots(tmp_path / "work")(graph)
    assert snapshot.read_bytes() == expected
    assert gsmodel.to_model(graph).SerializeToString() == exported

    graph.import_domains = None
    (tmp_path / "work2").mkdir()
    snapshot = Snapshots(tmp_path / "work2")(graph)
    assert graph.import_domains is None
    assert [(d.domain, d.version) for d in onnx.load(snapshot).opset_import] == [
        (d.domain, d.version) for d in onnx.load(EXAMPLE).opset_import
    ]
