"""Terminal output: progress of long steps (gskit.io.progress and its display), NO_COLOR, no log noise.

The display is checked on a real pseudo-terminal (``os.openpty``): bars appear there and nowhere else (a pipe,
a file, ``--json``), and ``NO_COLOR`` leaves no colour or style escape even with ``FORCE_COLOR``.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from collections.abc import Hashable
from pathlib import Path

import onnx
import pytest
from rich.console import Console

import gskit
from gskit.compare.layers import compare_layerwise
from gskit.io import model as gsmodel
from gskit.io import progress
from gskit.io.report import console, progress_display, table, verdict
from gskit.passes import fold as gsfold
from gskit.passes.fold import batched as fold_batched

EXAMPLE = Path(gskit.__file__).parent / "data" / "example.onnx"
REPO = Path(gskit.__file__).resolve().parent.parent
#: Select Graphic Rendition: the escapes that colour and style text (``\x1b[1m``, ``\x1b[31m``, ...).
SGR = re.compile(r"\x1b\[[0-9;]*m")


class Recorder:
    """A progress display that writes down what it is told."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def start(self, description: str, total: int | None) -> Hashable:
        self.events.append(("start", description, total))
        return len(self.events)

    def advance(self, handle: Hashable, amount: int) -> None:
        self.events.append(("advance", amount))

    def stop(self, handle: Hashable) -> None:
        self.events.append(("stop",))


def test_task_without_a_display_does_nothing():
    with progress.task("nobody listens", total=3) as advance:
        advance(3)  # no display installed: a no-op, and nothing to show


def test_layerwise_reports_its_chunks():
    recorder = Recorder()
    with progress.shown_by(recorder):
        report = compare_layerwise(EXAMPLE, EXAMPLE, shapes={"x": (2, 4, 8, 8)}, chunk=16)
    assert report.passed and report.runs == -(-report.candidates // 16) >= 2
    start, *advances, stop = recorder.events
    assert start == ("start", "layerwise: tensors compared", report.candidates) and stop == ("stop",)
    assert [a[1] for a in advances] == [min(16, report.candidates - 16 * i) for i in range(report.runs)]


def test_batched_fold_reports_its_nodes(monkeypatch):
    monkeypatch.setattr(fold_batched, "_PARTITION_BYTES", -1)  # batched mode for a small model
    recorder = Recorder()
    with progress.shown_by(recorder):
        _, report = gsfold.fold(gsmodel.load(EXAMPLE))
    assert report.mode == "batched" and report.batches >= 1
    starts = [e for e in recorder.events if e[0] == "start"]
    advanced = sum(e[1] for e in recorder.events if e[0] == "advance")
    assert starts and all(e[1] == "fold: constant nodes evaluated" for e in starts)
    assert advanced == sum(e[2] for e in starts) >= report.evaluated_nodes > 0
    assert recorder.events.count(("stop",)) == len(starts)


def _terminal() -> tuple[Console, io.TextIOWrapper, int]:
    """A console on the writing end of a pseudo-terminal, and the reading end."""
    reader, writer = os.openpty()
    stream = open(writer, "w", encoding="utf-8", closefd=True)  # noqa: SIM115 (closed by the caller)
    return Console(file=stream, force_terminal=True, width=80), stream, reader


def _drain(reader: int) -> str:
    os.set_blocking(reader, False)
    chunks = []
    while True:
        try:
            chunk = os.read(reader, 65536)
        except OSError:  # nothing more (EAGAIN), or the writing end is closed (EIO)
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(reader)
    return b"".join(chunks).decode("utf-8", "replace")


def _show_a_task(out: Console, enabled: bool = True) -> None:
    with progress_display(enabled=enabled, out=out), progress.task("demo step", total=4) as advance:
        advance(4)


def test_bars_show_on_a_terminal_only():
    out, stream, reader = _terminal()
    _show_a_task(out)
    stream.close()
    assert "demo step" in _drain(reader)

    out, stream, reader = _terminal()
    _show_a_task(out, enabled=False)  # --json
    stream.close()
    assert _drain(reader) == ""

    text = io.StringIO()  # a pipe or a file, even where rich is told it is a terminal (FORCE_COLOR)
    _show_a_task(Console(file=text, force_terminal=True))
    assert text.getvalue() == ""


def _print_a_report(out: Console) -> None:
    out.print(table("result", ("output", "result"), [("y", verdict(False))]))
    out.print("[green]validation passed[/]")


def test_no_color_turns_off_every_style_escape(monkeypatch):
    monkeypatch.setenv("FORCE_COLOR", "1")  # as a CI runner may set it: a terminal, in colour
    monkeypatch.delenv("NO_COLOR", raising=False)
    coloured = console()
    coloured.file = io.StringIO()
    _print_a_report(coloured)
    assert SGR.search(coloured.file.getvalue())  # the check below can fail

    monkeypatch.setenv("NO_COLOR", "1")
    plain = console()
    plain.file = io.StringIO()
    _print_a_report(plain)
    assert "\x1b" not in plain.file.getvalue() and "FAIL" in plain.file.getvalue()


def test_no_color_on_a_pseudo_terminal_writes_no_escape_at_all(monkeypatch):
    monkeypatch.setenv("FORCE_COLOR", "1")
    for no_color, escapes in (("", True), ("1", False)):
        monkeypatch.setenv("NO_COLOR", no_color)
        reader, writer = os.openpty()
        stream = open(writer, "w", encoding="utf-8")  # noqa: SIM115
        out = console()
        out.file = stream
        _show_a_task(out)
        _print_a_report(out)
        stream.close()
        text = _drain(reader)
        assert "validation passed" in text and ("\x1b" in text) == escapes, no_color


def _cli(capfd: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run ``gskit`` in this process; stdout and stderr as the file descriptors saw them (C++ logs too)."""
    from gskit.cli import main

    capfd.readouterr()
    code = main(list(argv))
    out, err = capfd.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def shape_chain(tmp_path_factory) -> Path:
    """A model whose Reshape target comes from a Shape -> Gather -> Concat chain that fold removes."""
    model = onnx.parser.parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        chain (float[N, 4, 6] x) => (float[N, 24] y) {
            s = Shape(x)
            zero = Constant<value = int64[1] {0}>()
            n = Gather<axis = 0>(s, zero)
            w = Constant<value = int64[1] {24}>()
            target = Concat<axis = 0>(n, w)
            y = Reshape(x, target)
        }
        """
    )
    return gsmodel.save(model, tmp_path_factory.mktemp("chain") / "chain.onnx")


def test_commands_print_no_library_log_lines(tmp_path, shape_chain, capfd):
    """Without --verbose/--debug, stderr holds gskit's own step lines only: nothing from onnxruntime,
    Polygraphy, graphsurgeon or TensorRT-RTX, and no warnings."""
    folded = str(tmp_path / "folded.onnx")
    runs = {
        "prepare": ("prepare", str(shape_chain), "-o", str(tmp_path / "out")),
        "fold": ("fold", str(EXAMPLE), "-o", folded),
        "compare": ("compare", str(EXAMPLE), folded),
        "layerwise": ("compare", str(EXAMPLE), folded, "--layerwise", "--chunk", "8"),
        "check-trt": ("check-trt", str(EXAMPLE)),
        "build": ("build", str(shape_chain), "-o", str(tmp_path / "e"), "--compute-capability", "8.9"),
    }
    step_line = re.compile(r"^(ok|skip|FAIL) +\w+ ")
    for name, argv in runs.items():
        code, out, err = _cli(capfd, *argv)
        assert code == 0, (name, err)
        noise = [line for line in err.splitlines() if line.strip() and not step_line.match(line)]
        assert noise == [], name
        assert "\x1b" not in out + err, name  # a pipe gets no escapes


def test_cli_on_a_terminal_with_no_color_writes_plain_text(tmp_path):
    """gskit as a person runs it: stdout and stderr on a pseudo-terminal, NO_COLOR and FORCE_COLOR set."""
    reader, writer = os.openpty()
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1", "FORCE_COLOR": "1"}
    command = [sys.executable, "-m", "gskit.cli", "compare", str(EXAMPLE), str(EXAMPLE), "--layerwise"]
    chunks = []
    with subprocess.Popen(command, stdout=writer, stderr=writer, env=env, cwd=tmp_path) as proc:
        os.close(writer)
        while True:
            try:
                chunk = os.read(reader, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
    os.close(reader)
    text = b"".join(chunks).decode("utf-8", "replace")
    assert proc.returncode == 0 and "shared tensors match" in text
    assert "\x1b" not in text


def test_console_on_a_stream_without_a_terminal_answer_gets_file_width(monkeypatch) -> None:
    # A test runner or a wrapper may put a stream without isatty (or a closed one) in sys.stdout.
    closed = io.StringIO()
    closed.close()
    monkeypatch.setattr(sys, "stdout", closed)
    assert console().width == 160
