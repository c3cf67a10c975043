"""Safe by default with files: no code from the current folder, no data read through links out of the
model's folder, no output over a file the input reads, timing caches that are caches, outputs that replace a
link instead of following it, and one OUTDIR per prepare run (locked, cleaned, honest after a failure)."""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

from gskit.backends.trt import run_worker
from gskit.cli import main
from gskit.errors import GskitError
from gskit.io import model as gsmodel

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "gskit" / "data" / "example.onnx"
rtx = pytest.mark.skipif(importlib.util.find_spec("tensorrt_rtx") is None, reason="needs tensorrt-rtx-cu13")


def _model(path: Path, *, location: str | None = None) -> Path:
    """y = x @ w with w (1 KiB) in external data, at ``location`` when given (default: <name>.data)."""
    w = np.arange(256, dtype=np.float32).reshape(16, 16) / 256
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["x", "w"], ["y"])],
        "mm",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 16])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 16])],
        [onnx.numpy_helper.from_array(w, "w")],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)])
    gsmodel.save(model, path, external_data=True)
    if location is not None:
        proto = onnx.load(str(path), load_external_data=False)
        for entry in proto.graph.initializer[0].external_data:
            if entry.key == "location":
                entry.value = location
        (path.parent / location).parent.mkdir(exist_ok=True)
        os.replace(path.with_name(path.name + ".data"), path.parent / location)
        path.write_bytes(proto.SerializeToString())
    return path


def _one_line_error(capsys, command: str, *fragments: str) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert "Traceback" not in err and lines[-1].startswith(f"gskit {command}: error: "), err
    for fragment in fragments:
        assert fragment in lines[-1], lines[-1]
    return lines[-1]


# ------------------------------------------------------------------- 1. no code from the current folder


@rtx
def test_trt_worker_does_not_import_modules_from_the_current_folder(tmp_path, monkeypatch, capsys) -> None:
    model = _model(tmp_path / "m.onnx")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    marker = tmp_path / "imported"
    for name in ("json", "ctypes", "polygraphy", "tensorrt_rtx"):
        (cwd / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write('{name} ')\n")
    monkeypatch.chdir(cwd)
    assert main(["check-trt", str(model), "--backend", "tensorrt_rtx"]) == 0, capsys.readouterr().err
    assert not marker.exists(), marker.read_text()


@rtx
def test_trt_worker_runs_the_gskit_that_started_it(tmp_path) -> None:
    """gskit found only through the working folder (a source checkout, no PYTHONPATH): the worker, which
    does not look there, is still given this checkout, not another gskit installed elsewhere."""
    model = _model(tmp_path / "m.onnx")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-m", "gskit.cli", "check-trt", str(model), "--backend", "tensorrt_rtx"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


# ------------------------------------------------------ 2. external data read through links is refused


def _secret(tmp_path: Path) -> Path:
    secret = tmp_path / "outside" / "secret.bin"
    secret.parent.mkdir()
    secret.write_bytes(b"TOKEN=hunter2;" * 100)
    return secret


def _linked(tmp_path: Path, kind: str) -> Path:
    """A model in tmp/a whose external data file is a link of ``kind`` to a file outside tmp/a."""
    secret = _secret(tmp_path)
    folder = tmp_path / "a"
    folder.mkdir()
    location = "sub/w.bin" if kind == "folder symlink" else "w.bin"
    path = _model(folder / "x.onnx", location=location)
    data = folder / location
    data.unlink()
    if kind == "absolute symlink":
        data.symlink_to(secret)
    elif kind == "relative symlink":
        data.symlink_to(os.path.relpath(secret, folder))
    elif kind == "folder symlink":
        data.parent.rmdir()
        os.replace(secret, secret.with_name("w.bin"))
        data.parent.symlink_to(secret.parent, target_is_directory=True)
    else:
        os.link(secret, data)
    return path


LINKS = ["absolute symlink", "relative symlink", "folder symlink", "hardlink"]


@pytest.mark.parametrize("kind", LINKS)
@pytest.mark.parametrize("load_weights", [True, False])
def test_external_data_through_a_link_is_refused(tmp_path, kind, load_weights) -> None:
    path = _linked(tmp_path, kind)
    with pytest.raises(GskitError, match="tensor 'w'") as err:
        gsmodel.load(path, load_weights=load_weights)
    assert "w.bin" in str(err.value) and len(str(err.value).splitlines()) == 1


@pytest.mark.parametrize("kind", LINKS)
@pytest.mark.parametrize("command", ["fold", "sanitize", "isolate", "edit", "prepare"])
def test_commands_refuse_linked_external_data(tmp_path, capsys, kind, command) -> None:
    path = _linked(tmp_path, kind)
    out = tmp_path / "out" / "model.onnx"
    extra = {"isolate": ["--outputs", "y"], "edit": ["--rename", "y=z"], "prepare": []}.get(command, [])
    target = out.parent if command == "prepare" else out
    assert main([command, str(path), "-o", str(target), *extra]) == 2
    _one_line_error(capsys, command, "tensor 'w'", "w.bin")
    assert not out.exists()


def test_hardlinked_external_data_loads_when_allowed(tmp_path, monkeypatch) -> None:
    path = _linked(tmp_path, "hardlink")
    monkeypatch.setenv("GSKIT_ALLOW_HARDLINKED_DATA", "1")
    model = gsmodel.load(path)
    assert model.graph.initializer[0].raw_data.startswith(b"TOKEN")


def test_symlink_inside_the_model_folder_is_fine(tmp_path) -> None:
    path = _model(tmp_path / "x.onnx", location="w.bin")
    os.replace(tmp_path / "w.bin", tmp_path / "real.bin")
    (tmp_path / "w.bin").symlink_to("real.bin")
    assert gsmodel.load(path).graph.initializer[0].raw_data


# ------------------------------------------------------ 3. no output over a file the input model reads


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


@pytest.mark.parametrize(
    ("command", "output"),
    [
        ("fold", "model.onnx"),  # model.onnx.data is the input's weight file
        ("fold", "model.onnx.data"),
        ("sanitize", "model.onnx.data"),
        ("infer-shapes", "model.onnx"),
        ("convert", "model.onnx"),
        ("prepare", "."),
    ],
)
def test_outputs_never_replace_or_delete_the_inputs_files(tmp_path, capsys, command, output) -> None:
    path = _model(tmp_path / "x.onnx", location="model.onnx.data")
    before = _snapshot(tmp_path)
    extra = ["--opset", "18"] if command == "convert" else []
    assert main([command, str(path), "-o", str(tmp_path / output), *extra]) == 2
    _one_line_error(capsys, command, "model.onnx.data", "x.onnx")
    after = _snapshot(tmp_path)
    assert {k: after.get(k) for k in before} == before
    assert gsmodel.load(path).graph.initializer[0].raw_data == before["model.onnx.data"]


def test_prepare_refuses_a_report_name_that_the_input_reads_before_running(tmp_path, capsys) -> None:
    path = _model(tmp_path / "x.onnx", location="report.json")
    before = _snapshot(tmp_path)
    assert main(["prepare", str(path), "-o", str(tmp_path)]) == 2
    _one_line_error(capsys, "prepare", "report.json", "x.onnx")
    assert _snapshot(tmp_path) == before and not (tmp_path / "model.onnx").exists()


def test_output_over_the_input_names_in_place_only_where_the_command_has_it(tmp_path, capsys) -> None:
    path = _model(tmp_path / "x.onnx")
    assert main(["fold", str(path), "-o", str(path)]) == 2
    assert "--in-place" not in _one_line_error(capsys, "fold", "input model")
    assert main(["edit", str(path), "-o", str(path), "--rename", "y=z"]) == 2
    _one_line_error(capsys, "edit", "input model", "--in-place")


def test_edit_in_place_still_rewrites_the_model(tmp_path) -> None:
    path = _model(tmp_path / "x.onnx")
    assert main(["edit", str(path), "--in-place", "--rename", "y=z"]) == 0
    assert gsmodel.load(path).graph.output[0].name == "z"


# -------------------------------------------------------------------- 4. timing caches are only caches


@rtx
@pytest.mark.parametrize("victim", ["model", "text"])
def test_timing_cache_that_is_not_a_cache_is_neither_read_nor_written(tmp_path, capsys, victim) -> None:
    path = _model(tmp_path / "x.onnx")
    cache = path if victim == "model" else tmp_path / "notes.txt"
    if victim == "text":
        cache.write_text("my notes")
    before = cache.read_bytes()
    args = ["build", str(path), "-o", str(tmp_path / "m.engine"), "--compute-capability", "8.9"]
    assert main([*args, "--timing-cache", str(cache)]) == 2
    _one_line_error(capsys, "build", str(cache))
    assert cache.read_bytes() == before
    assert not (tmp_path / "m.engine").exists()


@rtx
def test_timing_cache_is_created_then_reused(tmp_path, capsys) -> None:
    path = _model(tmp_path / "x.onnx")
    cache = tmp_path / "new" / "timing.cache"
    args = ["build", str(path), "-o", str(tmp_path / "m.engine"), "--compute-capability", "8.9"]
    assert main([*args, "--timing-cache", str(cache)]) == 0
    first = cache.read_bytes()
    assert first.startswith(b"ptrt")
    assert main([*args, "--timing-cache", str(cache)]) == 0
    assert cache.read_bytes().startswith(b"ptrt")
    assert sorted(p.name for p in cache.parent.iterdir()) == ["timing.cache"]


# ------------------------------------------------------------ 7. a link at an output path is replaced


def test_save_replaces_a_link_instead_of_writing_through_it(tmp_path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.onnx").symlink_to(outside)
    (out / "model.onnx.data").symlink_to(outside)
    gsmodel.save(gsmodel.load(_model(tmp_path / "x.onnx")), out / "model.onnx", external_data=True)
    assert outside.read_text() == "keep me"
    assert not (out / "model.onnx").is_symlink() and not (out / "model.onnx.data").is_symlink()
    assert gsmodel.load(out / "model.onnx").graph.initializer[0].raw_data


def test_prepare_replaces_links_in_outdir(tmp_path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    for name in ("report.json", "report.html", "model.onnx"):
        (out / name).symlink_to(outside)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("steps: [sanitize]\n")
    assert main(["prepare", str(EXAMPLE), "-o", str(out), "--recipe", str(recipe)]) == 0
    assert outside.read_text() == "keep me"
    report = json.loads((out / "report.json").read_text())
    assert report["validated"] is False and report["passed"] is None  # no validate step: "not validated"


# ---------------------------------------------------------------------------------- 10. OUTDIR state


def _sanitize_recipe(tmp_path: Path) -> str:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("steps: [sanitize]\n")
    return str(recipe)


def test_second_prepare_into_a_locked_outdir_is_refused(tmp_path, capsys) -> None:
    out = tmp_path / "out"
    out.mkdir()
    with open(out / ".gskit.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert main(["prepare", str(EXAMPLE), "-o", str(out), "--recipe", _sanitize_recipe(tmp_path)]) == 2
    _one_line_error(capsys, "prepare", str(out), "another gskit prepare")
    assert not (out / "model.onnx").exists() and not (out / "report.json").exists()


def _abandoned_scratch(folder: Path, prefix: str) -> Path:
    """A scratch folder marked by a gskit process that has ended (as a killed run leaves it)."""
    code = (
        "import sys; from gskit.io.outputs import make_scratch_folder; "
        "print(make_scratch_folder(sys.argv[1], sys.argv[2]))"
    )
    done = subprocess.run([sys.executable, "-c", code, str(folder), prefix], capture_output=True, text=True)
    return Path(done.stdout.strip())


def test_abandoned_work_folders_are_removed_by_the_next_run(tmp_path) -> None:
    """Only folders a gskit process marked as its own go, once that process is gone; names decide nothing."""
    out = tmp_path / "out"
    out.mkdir()
    work = _abandoned_scratch(out, ".gskit-work-")
    (work / "model.onnx").write_bytes(b"half")
    saving = _abandoned_scratch(out, ".model.onnx.")  # gsmodel.save's temporary folder
    (out / ".gskit-work-old").mkdir()  # the user's, unmarked: kept whatever its name
    (out / ".model.onnx.abc123").mkdir()
    (out / ".report.json.abc123.tmp").write_text("{")
    (out / ".model.onnx.bak").write_text("the user's")
    assert main(["prepare", str(EXAMPLE), "-o", str(out), "--recipe", _sanitize_recipe(tmp_path)]) == 0
    assert not work.exists() and not saving.exists()
    assert sorted(p.name for p in out.iterdir()) == [
        ".gskit-work-old",
        ".model.onnx.abc123",
        ".model.onnx.bak",
        ".report.json.abc123.tmp",
        "model.onnx",
        "report.html",
        "report.json",
    ]


def test_failed_run_leaves_no_model_of_an_earlier_run(tmp_path, capsys) -> None:
    out = tmp_path / "out"
    assert main(["prepare", str(EXAMPLE), "-o", str(out), "--recipe", _sanitize_recipe(tmp_path)]) == 0
    assert (out / "model.onnx").is_file()
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps:\n  - isolate: {outputs: [no_such_tensor]}\n")
    assert main(["prepare", str(EXAMPLE), "-o", str(out), "--recipe", str(bad)]) == 2
    capsys.readouterr()
    report = json.loads((out / "report.json").read_text())
    assert report["passed"] is False and report["error"] and report["prepared_model"] is None
    assert not (out / "model.onnx").exists()


def test_failed_run_keeps_a_folder_named_like_an_output(tmp_path, capsys) -> None:
    out = tmp_path / "out"
    (out / "model.engine").mkdir(parents=True)  # the user's folder, not an engine of an earlier run
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps:\n  - isolate: {outputs: [no_such_tensor]}\n")
    assert main(["prepare", str(EXAMPLE), "-o", str(out), "--recipe", str(bad)]) == 2
    _one_line_error(capsys, "prepare", "step 'isolate'")
    assert (out / "model.engine").is_dir()


@rtx
def test_trt_worker_dies_with_its_parent(tmp_path) -> None:
    pid_file = tmp_path / "worker.pid"
    slow = tmp_path / "slow_plugin.py"
    slow.write_text(f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)")
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                from gskit.backends.trt import run_worker
                run_worker("ops", "tensorrt_rtx", {{"ops": [], "plugin_modules": [{str(slow)!r}]}})
                """
            ),
        ]
    )
    deadline = time.time() + 30
    while time.time() < deadline and not pid_file.is_file():
        time.sleep(0.05)
    time.sleep(0.2)
    worker = int(pid_file.read_text())
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=10)
    deadline = time.time() + 10
    while time.time() < deadline and _alive(worker):
        time.sleep(0.05)
    assert not _alive(worker)
    # Its request folder is left (a SIGKILL runs no cleanup); the next call removes it once it is old.
    (left,) = Path(tempfile.gettempdir()).glob(f"gskit-trt-{parent.pid}-*")
    os.utime(left, (time.time() - 3600, time.time() - 3600))
    run_worker("ops", "tensorrt_rtx", {"ops": ["Relu"]})
    assert not left.exists()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_sigterm_removes_the_work_folder_and_the_lock(tmp_path) -> None:
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gskit.cli", "prepare", str(EXAMPLE), "-o", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.time() + 60
    while time.time() < deadline and not list(out.glob(".gskit-work-*")):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    if proc.returncode == 0:
        pytest.skip("the run finished before the signal arrived")
    assert proc.returncode == 143 and b"terminated" in err, err
    assert not list(out.glob(".gskit-*"))
