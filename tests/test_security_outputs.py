"""Outputs only ever replace regular files (issue 22, "Files and processes").

* an output name that is a device, a FIFO, a socket or a folder is refused in one line naming it, before any
  work, for every command's ``-o``, ``build``'s ``--timing-cache`` and ``prepare``'s OUTDIR files;
* ``fold -o out.onnx`` beside a folder ``out.onnx.data`` is refused before anything is written;
* ``prepare``'s leftover cleanup removes only scratch folders a gskit process marked as its own, once that
  process is gone, and never one holding the input model;
* OUTDIR holds one run's files or none: at every step of a run that replaces another run's files, what is
  there belongs to one run, and ``report.json`` only beside all of its run; a full disk names the file it
  could not write, and the report never says ``passed: true`` with exit 2.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import json
import os
import resource
import shutil
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hostile_models import ONE_RUN_SETS, OUTPUT_COMMANDS, check_one_run, make_entry, small_model
from test_security_files import _one_line_error

from gskit.cli import main
from gskit.errors import GskitError
from gskit.io import model as gsmodel
from gskit.io import outputs
from gskit.pipeline.prepare import set_names

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "gskit" / "data" / "example.onnx"
rtx = pytest.mark.skipif(importlib.util.find_spec("tensorrt_rtx") is None, reason="needs tensorrt-rtx-cu13")


@contextlib.contextmanager
def special(path: Path, kind: str) -> Iterator[Path]:
    """An entry of ``kind`` at ``path``: fifo, socket, folder, chardev (a node like /dev/null; root only)."""
    sockets: list[socket.socket] = []
    try:
        if not make_entry(path, kind, sockets):
            pytest.skip("creating a device node needs root")
        yield path
    finally:
        for sock in sockets:
            sock.close()


KINDS = {"fifo": stat.S_ISFIFO, "socket": stat.S_ISSOCK, "folder": stat.S_ISDIR, "chardev": stat.S_ISCHR}


def _entries(folder: Path) -> dict[str, tuple[int, int]]:
    """Name -> (inode, mode) of every entry under ``folder`` (links not followed)."""
    return {
        str(p.relative_to(folder)): (p.lstat().st_ino, p.lstat().st_mode) for p in sorted(folder.rglob("*"))
    }


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("command", sorted(OUTPUT_COMMANDS))
def test_an_output_that_is_not_a_regular_file_is_refused(tmp_path, capsys, command, kind) -> None:
    model = small_model(tmp_path / "in" / "m.onnx")
    out = tmp_path / "out"
    with special(out / "o.onnx", kind) as target:
        before = _entries(out)
        assert main([command, str(model), "-o", str(target), *OUTPUT_COMMANDS[command]]) == 2
        _one_line_error(capsys, command, str(target))
        assert KINDS[kind](target.lstat().st_mode)
        assert _entries(out) == before  # nothing replaced, nothing left beside it


@pytest.mark.parametrize("kind", ["fifo", "chardev"])
def test_the_data_file_name_beside_an_output_is_checked_too(tmp_path, capsys, kind) -> None:
    model = small_model(tmp_path / "in" / "m.onnx", weights=32)  # its weights go to o.onnx.data
    out = tmp_path / "out"
    with special(out / "o.onnx.data", kind) as target:
        assert main(["fold", str(model), "-o", str(out / "o.onnx")]) == 2
        _one_line_error(capsys, "fold", str(target), "external data of o.onnx")
        assert KINDS[kind](target.lstat().st_mode) and not (out / "o.onnx").exists()


def test_dev_null_is_refused_by_the_one_check_every_writer_makes() -> None:
    """/dev/null itself is only ever checked here, never written: as root a bug would replace it."""
    with pytest.raises(GskitError, match="/dev/null: is a character device, not a regular file"):
        outputs.check_replaceable("/dev/null")
    with pytest.raises(GskitError, match="character device"):
        outputs.check_output("/dev/null")
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)


@pytest.mark.skipif(os.geteuid() == 0, reason="as root a regression would replace the system's /dev/null")
def test_fold_to_dev_null_is_refused(tmp_path, capsys) -> None:
    assert main(["fold", str(small_model(tmp_path / "m.onnx")), "-o", "/dev/null"]) == 2
    _one_line_error(capsys, "fold", "/dev/null", "character device")
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)


def test_a_link_to_a_device_is_replaced_not_followed(tmp_path) -> None:
    """A link is a name: it is replaced by the output, and the device it points at is not touched."""
    with special(tmp_path / "fifo", "fifo") as fifo:
        (tmp_path / "o.onnx").symlink_to(fifo)
        assert main(["fold", str(small_model(tmp_path / "m.onnx")), "-o", str(tmp_path / "o.onnx")]) == 0
        assert stat.S_ISFIFO(fifo.lstat().st_mode) and (tmp_path / "o.onnx").is_file()
        assert not (tmp_path / "o.onnx").is_symlink()


@pytest.mark.parametrize("name", ["model.onnx", "model.onnx.data", "report.json", "report.html"])
@pytest.mark.parametrize("kind", ["fifo", "chardev", "folder"])
def test_prepare_refuses_an_outdir_name_that_is_not_a_regular_file(tmp_path, capsys, name, kind) -> None:
    out = tmp_path / "out"
    with special(out / name, kind) as target:
        before = _entries(out)
        assert main(["prepare", str(EXAMPLE), "-o", str(out)]) == 2
        _one_line_error(capsys, "prepare", str(target))
        assert KINDS[kind](target.lstat().st_mode)
        assert _entries(out) == before  # refused before any step: no lock, no work folder, no report


@rtx
@pytest.mark.parametrize("option", ["-o", "--timing-cache"])
@pytest.mark.parametrize("kind", ["fifo", "chardev"])
def test_build_refuses_an_engine_or_cache_that_is_not_a_regular_file(tmp_path, capsys, option, kind) -> None:
    model = small_model(tmp_path / "m.onnx")
    with special(tmp_path / "target", kind) as target:
        engine = target if option == "-o" else tmp_path / "m.engine"
        extra = ["--timing-cache", str(target)] if option == "--timing-cache" else []
        start = time.monotonic()
        argv = ["build", str(model), "-o", str(engine), "--compute-capability", "8.9", *extra]
        assert main(argv) == 2
        assert time.monotonic() - start < 30  # a FIFO read as a cache would block for ever
        _one_line_error(capsys, "build", "target")
        assert KINDS[kind](target.lstat().st_mode)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "target"]


def test_only_the_outputs_module_renames_over_final_names() -> None:
    """Every writer puts its output in place through gskit.io.outputs, the one place that decides."""
    renames = {"replace", "rename", "move", "renames"}
    found = []
    for path in sorted((REPO / "gskit").rglob("*.py")):
        if path == REPO / "gskit" / "io" / "outputs.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            call = node.func if isinstance(node, ast.Call) else None
            if isinstance(call, ast.Attribute) and call.attr in renames and isinstance(call.value, ast.Name):
                if call.value.id in ("os", "shutil"):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not found, found


# ------------------------------------------------------------------ the external data name (item 6)


def test_fold_beside_a_folder_named_like_its_data_file_writes_nothing(tmp_path, capsys) -> None:
    model = small_model(tmp_path / "m.onnx")
    (tmp_path / "out.onnx.data").mkdir()
    assert main(["fold", str(model), "-o", str(tmp_path / "out.onnx")]) == 2
    line = _one_line_error(capsys, "fold", "out.onnx.data", "is a folder")
    assert "out.onnx:" not in line.replace("out.onnx.data", "")
    assert not (tmp_path / "out.onnx").exists() and (tmp_path / "out.onnx.data").is_dir()


def test_save_checks_the_data_name_before_writing(tmp_path) -> None:
    (tmp_path / "out.onnx.data").mkdir()
    with pytest.raises(GskitError, match=r"out\.onnx\.data: is a folder, but gskit writes the external data"):
        gsmodel.save(gsmodel.load(small_model(tmp_path / "m.onnx")), tmp_path / "out.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "out.onnx.data"]


# ------------------------------------------------------------------------- leftovers (item 5)


def _scratch_of_an_ended_process(folder: Path, prefix: str) -> Path:
    code = "import sys; from gskit.io.outputs import make_scratch_folder as make; print(make(*sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-c", code, str(folder), prefix], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip())


def _sanitize(tmp_path: Path) -> str:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("steps: [sanitize]\n")
    return str(recipe)


@pytest.mark.parametrize("marked", [False, True])
def test_cleanup_never_removes_a_folder_that_holds_the_input(tmp_path, marked) -> None:
    out = tmp_path / "out"
    out.mkdir()
    folder = _scratch_of_an_ended_process(out, ".gskit-work-") if marked else out / ".gskit-work-mine"
    folder.mkdir(exist_ok=True)
    model = small_model(folder / "model.onnx", weights=32)
    before = _entries(folder)
    assert main(["prepare", str(model), "-o", str(out), "--recipe", _sanitize(tmp_path)]) == 0
    assert _entries(folder) == before
    assert (out / "model.onnx").is_file()


def test_cleanup_keeps_the_scratch_folder_of_a_live_process(tmp_path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    code = "import sys, time; from gskit.io.outputs import make_scratch_folder; "
    code += "print(make_scratch_folder(sys.argv[1], '.model.onnx.'), flush=True); time.sleep(60)"
    live = subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        folder = Path(live.stdout.readline().strip())  # type: ignore[union-attr]
        assert folder.name.startswith(".model.onnx.") and folder.is_dir()
        assert main(["prepare", str(EXAMPLE), "-o", str(out), "--recipe", _sanitize(tmp_path)]) == 0
        assert folder.is_dir()
    finally:
        live.kill()
        live.wait()


def test_a_forged_or_foreign_mark_is_not_enough(tmp_path) -> None:
    out = tmp_path / "out"
    forged = out / ".gskit-work-forged"
    forged.mkdir(parents=True)
    (forged / outputs.SCRATCH_MARK).write_text("anything\n1 host\n")
    foreign = _scratch_of_an_ended_process(out, ".gskit-work-")
    mark = foreign / outputs.SCRATCH_MARK
    header, owner = mark.read_text().splitlines()
    mark.write_text(f"{header}\n{owner.split()[0]} another-host\n")  # a run on another machine (NFS)
    assert outputs.remove_abandoned_scratch(out) == []
    assert forged.is_dir() and foreign.is_dir()


# ------------------------------------------------------------------- one run's files or none (item 4)


class _Snapshots:
    """Audit hook: the OUTDIR state before every rename and removal a run makes (where a SIGKILL may land)."""

    def __init__(self) -> None:
        self.out: Path | None = None
        self.seen: list[str | None] = []
        self.broken: list[str] = []
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple) -> None:
        if self.out is not None and event in ("os.rename", "os.remove"):
            out, self.out = self.out, None  # the check itself reads files: no recursion
            try:
                self.seen.append(check_one_run(out))
            except AssertionError as err:  # raised here it would fail the rename itself
                self.broken.append(f"before {event} {args[:2]}: {err}")
            finally:
                self.out = out


_SNAPSHOTS: _Snapshots | None = None


def test_outdir_holds_one_runs_files_at_every_step(tmp_path, capsys) -> None:
    global _SNAPSHOTS
    if _SNAPSHOTS is None:
        _SNAPSHOTS = _Snapshots()
    models = {"a": small_model(tmp_path / "a.onnx"), "b": small_model(tmp_path / "b.onnx", weights=32)}
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps:\n  - isolate: {outputs: [no_such_tensor]}\n")
    out = tmp_path / "out"
    for run, recipe, code in [("a", None, 0), ("b", None, 0), ("a", None, 0), ("b", bad, 2), ("b", None, 0)]:
        extra = ["--recipe", str(recipe)] if recipe else ["--recipe", _sanitize(tmp_path)]
        _SNAPSHOTS.out, _SNAPSHOTS.seen, _SNAPSHOTS.broken = out, [], []
        try:
            assert main(["prepare", str(models[run]), "-o", str(out), *extra]) == code
        finally:
            _SNAPSHOTS.out = None
        capsys.readouterr()
        assert not _SNAPSHOTS.broken, _SNAPSHOTS.broken
        assert len(_SNAPSHOTS.seen) > 3  # the check ran at every rename and removal
        assert check_one_run(out) == run
    assert sorted(p.name for p in out.iterdir()) == sorted(ONE_RUN_SETS["b"])
    # a run whose reports could not be written either leaves no run, the earlier seal going first
    _SNAPSHOTS.out, _SNAPSHOTS.broken = out, []
    try:
        outputs.replace_set([], [out / name for name in set_names()])
    finally:
        _SNAPSHOTS.out = None
    assert not _SNAPSHOTS.broken and list(out.iterdir()) == [], _SNAPSHOTS.broken


def _full_disk_run(out: Path, model: Path, limit: int | None, steps: str) -> subprocess.CompletedProcess:
    def set_limit() -> None:
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    recipe = out.parent / "recipe.yaml"
    recipe.write_text(f"steps: [{steps}]\n")
    return subprocess.run(
        [sys.executable, "-m", "gskit.cli", "prepare", str(model), "-o", str(out), "--recipe", str(recipe)],
        capture_output=True,
        text=True,
        preexec_fn=set_limit,
        timeout=300,
    )


@contextlib.contextmanager
def _small_disk(folder: Path, size: str) -> Iterator[Path]:
    folder.mkdir()
    command = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)]
    done = subprocess.run(command, capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip("mounting a small tmpfs needs root (the file-size limit cases run everywhere)")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


@pytest.mark.parametrize(
    "how", ["weights over a file-size limit", "report.html over a file-size limit", "full disk"]
)
def test_a_full_disk_leaves_no_mixed_run_and_names_the_file(tmp_path, how) -> None:
    """The first run fits, the second does not (its weights, or its report.html, which is written after the
    model and report.json): OUTDIR then holds the second run's failure reports alone, or nothing; never the
    first run's files beside the second's, never ``passed: true`` with exit 2."""
    small, big = small_model(tmp_path / "a.onnx"), small_model(tmp_path / "b.onnx", weights=724)
    steps, second, culprit = "sanitize, fold", big, "model.onnx"  # the final save is the first large write
    with contextlib.ExitStack() as stack:
        out, limit = tmp_path / "out", None
        if how == "full disk":
            out = stack.enter_context(_small_disk(tmp_path / "disk", "1m")) / "out"
        first = _full_disk_run(out, small, None, "sanitize, fold, validate")
        assert first.returncode == 0, first.stderr
        if how.startswith("weights"):
            limit = 1_000_000
        elif how.startswith("report.html"):  # between the sizes of report.json and report.html
            json_size, html_size = ((out / name).stat().st_size for name in ("report.json", "report.html"))
            assert json_size < html_size
            limit, steps, second, culprit = (
                (json_size + html_size) // 2,
                "sanitize, fold, validate",
                small,
                "report.html",
            )
            second = small_model(tmp_path / "c.onnx")
        done = _full_disk_run(out, second, limit, steps)
        assert done.returncode == 2, done.stderr
        last = done.stderr.strip().splitlines()[-1]
        assert "Traceback" not in done.stderr, done.stderr
        assert last.startswith(f"gskit prepare: error: cannot write {out}/{culprit}"), last
        assert "no space left" in last or "file too large" in last, last
        present = sorted(p.name for p in out.iterdir())
        assert present in ([], ["report.html", "report.json"]), present
        if present:
            report = json.loads((out / "report.json").read_text())
            assert report["passed"] is False and "cannot write" in report["error"]
            assert f"gskit prepare: {second.name}" in (out / "report.html").read_text()
        shutil.rmtree(out)


def test_a_scratch_folder_stays_marked_until_it_is_gone(tmp_path, monkeypatch) -> None:
    """A run killed while it removed its work folder left it without its mark, which nothing removes (a
    kill fuzz case found one): the mark now goes last, so a folder cut short while being removed is still
    marked, and the next run removes it."""
    out = tmp_path / "out"
    out.mkdir()
    folder = outputs.make_scratch_folder(out, ".gskit-work-")
    (folder / "outputs").mkdir()
    (folder / "outputs" / "model.onnx").write_bytes(b"staged")
    for name in ("a.tmp", "b.tmp", "z.tmp"):
        (folder / name).write_text(name)
    unlink = os.unlink

    def killed_on_the_last_file(path, *args, **kwargs):
        if Path(path).name == "z.tmp":
            raise KeyboardInterrupt  # stands for the SIGKILL: nothing after it runs
        return unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", killed_on_the_last_file)
    with pytest.raises(KeyboardInterrupt):
        outputs.remove_scratch_folder(folder)
    monkeypatch.undo()
    assert (folder / outputs.SCRATCH_MARK).is_file() and outputs.scratch_owner(folder) is not None
    outputs.remove_scratch_folder(folder)
    assert not folder.exists()
