"""Evaluation that a small model cannot turn into gigabytes or into a run without end (issue 22).

* fold judges sizes from the shapes evaluation really produces, never from a declared value_info, and from
  what an evaluation and the whole fold hold together: 400 Expand results of 4 MB each, or an Expand that
  claims ``[1]``, no longer take gigabytes (measured as the peak memory of a real process);
* a constant Loop's cost is estimated before evaluating it: one of 10^12 iterations is left as it is;
* SIGINT and SIGTERM end fold, compare, prepare and build within seconds while onnxruntime evaluates in C++,
  with the exit code said and no partial file left.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from hostile_models import (
    expand_concat,
    growing,
    has_child,
    long_loop,
    lying_expand,
    matmul_chain,
    signalled,
    threads_at_least,
)

from gskit.backends import ort as gsort
from gskit.passes.fold import fold

REPO = Path(__file__).resolve().parents[1]
rtx = pytest.mark.skipif(importlib.util.find_spec("tensorrt_rtx") is None, reason="needs tensorrt-rtx-cu13")
# Peak memory is read from /proc (VmHWM), and signals are Linux's here.
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux process accounting")
#: Peak memory (resident) a fold of the hostile models may take, whole process included (it was 13-23 GB).
PEAK_BYTES = 1500 * 2**20
#: Ops that make a large result from a few bytes (see hostile_models.growing).
GROWING = ["Expand", "Tile", "ConstantOfShape", "Range", "Pad", "OneHot", "Outer", "Add"]
#: Seconds a command may take to end after SIGINT or SIGTERM.
END_SECONDS = 8.0


def _gskit(*argv: str, timeout: float = 300) -> tuple[subprocess.CompletedProcess, int]:
    """``gskit ARGV`` in a real process: the finished process and its peak resident memory in bytes
    (hostile_models.peak_resident_bytes, read once the command has ended)."""
    code = (
        "import sys\n"
        "from gskit.cli import main\n"
        "code = main(sys.argv[1:])\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\n"
        "from hostile_models import peak_resident_bytes\n"
        "print(peak_resident_bytes(), file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )
    peak = int(done.stderr.strip().splitlines()[-1])
    return done, peak


def _save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


def test_declared_shapes_do_not_hide_a_large_result(tmp_path) -> None:
    """An Expand of 1.6 GB that claims [1] took 1.7 GB to fold; now it is never evaluated."""
    path = _save(lying_expand(), tmp_path / "liar.onnx")
    done, peak = _gskit("fold", str(path), "-o", str(tmp_path / "f.onnx"), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert "over size_threshold" in report["excluded"]["expand"], report["excluded"]
    assert peak < PEAK_BYTES / 3, peak


def test_many_small_results_do_not_add_up_to_gigabytes(tmp_path) -> None:
    """400 Expand results of 4 MB each (16 MiB threshold each) peaked at 13 GB; an evaluation now holds at
    most the threshold plus 4x what it reads, and the fold max_passes x the threshold."""
    path = _save(expand_concat(), tmp_path / "concat.onnx")
    out = tmp_path / "f.onnx"
    done, peak = _gskit("fold", str(path), "-o", str(out), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["folded_ops"].get("Expand", 0) <= 40  # 10 passes x 16 MiB / 4 MiB
    assert any("one evaluation past" in reason for reason in report["excluded"].values())
    assert out.stat().st_size < 10 * 16 * 2**20 + 2**20
    assert peak < PEAK_BYTES, peak


@pytest.mark.parametrize(
    "op", ["Expand", "Tile", "ConstantOfShape", "Range", "Pad", "OneHot", "Outer", "Add"]
)
def test_growing_ops_are_judged_by_what_they_make(op) -> None:
    """Each makes 2^30 elements (4 GiB) from a few bytes while its value_info says [1]: not evaluated."""
    folded, report = fold(growing(op, 2**30))
    assert any("over size_threshold" in r or "unknown" in r for r in report.excluded.values()), (
        report.excluded
    )
    assert sum(t.ByteSize() for t in folded.graph.initializer) < 2**20


@pytest.mark.parametrize(
    "op", ["Expand", "Tile", "ConstantOfShape", "Range", "Pad", "OneHot", "Outer", "Add"]
)
def test_growing_ops_within_the_threshold_still_fold(op) -> None:
    model = growing(op, 4096, claim=None)
    folded, report = fold(model)
    assert [n.op_type for n in folded.graph.node] == ["Add"], (report.excluded, report.folded_ops)
    x = {"x": np.ones(1, np.float32)}
    np.testing.assert_allclose(gsort.run(folded, x)["y"], gsort.run(model, x)["y"], rtol=1e-6)


def test_a_loop_of_a_trillion_iterations_is_left_as_it_is(tmp_path) -> None:
    path = _save(long_loop(10**12), tmp_path / "loop.onnx")
    start = time.monotonic()
    done, _ = _gskit("fold", str(path), "-o", str(tmp_path / "f.onnx"), "--json", timeout=120)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - start < 60
    assert "would run" in json.loads(done.stdout)["excluded"]["loop"]


@pytest.mark.parametrize(
    ("trips", "body", "nested", "left"),
    [
        (5, 3, None, None),
        (10**5, 3, None, None),  # 5 x 10^5 node runs: within the budget (about a second)
        (10**6, 3, None, "would run"),
        (1000, 1, 10**4, "would run"),  # nested: 1000 x 10^4
        (100, 1, 10, "unknown"),  # cheap, but onnx gives no shape for an inner loop's result
        (None, 1, None, "not a constant"),  # no trip count: runs while its condition holds
    ],
)
def test_loop_cost_is_estimated_before_evaluating(trips, body, nested, left) -> None:
    model = long_loop(trips, body, nested=nested)
    start = time.monotonic()
    folded, report = fold(model)
    assert time.monotonic() - start < 30
    if left is None:
        assert "Loop" not in [n.op_type for n in folded.graph.node], report.excluded
        x = {"x": np.ones(1, np.float32)}
        np.testing.assert_allclose(gsort.run(folded, x)["y"], gsort.run(model, x)["y"], rtol=1e-6)
    else:
        assert left in report.excluded["loop"], report.excluded


# ---------------------------------------------------------------------------------- signals end commands


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize(
    ("command", "sig"),
    [
        ("fold", signal.SIGTERM),
        ("fold", signal.SIGINT),
        ("compare", signal.SIGTERM),
        ("prepare", signal.SIGINT),
        ("prepare", signal.SIGTERM),
    ],
)
def test_signals_end_a_long_evaluation_within_seconds(tmp_path, command, sig) -> None:
    """The signal comes once onnxruntime evaluates (its threads run; for prepare, after the fold step)."""
    if command == "fold":  # allowed to fold, slow: onnxruntime evaluates graphsurgeon's session
        model = _save(matmul_chain(), tmp_path / "chain.onnx")
        argv = ["fold", str(model), "-o", str(tmp_path / "out" / "f.onnx")]
    else:  # the Loop fold leaves alone runs when the model runs (compare, prepare's validate step)
        model = _save(long_loop(10**12), tmp_path / "loop.onnx")
        argv = ["compare", str(model), str(model)] if command == "compare" else []
        argv = argv or ["prepare", str(model), "-o", str(tmp_path / "out"), "--skip", "check_trt"]
    (tmp_path / "out").mkdir()
    evaluating = threads_at_least(4)

    def ready(pid: int, err: str) -> bool:
        return evaluating(pid, err) and (command != "prepare" or " fold " in err)

    code, seconds, err = signalled(argv, sig, 1.0, tmp_path, ready)
    assert code is not None, f"gskit {command} still ran 60 s after {sig.name}"
    if code == 0:
        pytest.skip("the command ended before the signal")
    word = "interrupted" if sig == signal.SIGINT else "terminated"
    assert code == 128 + sig, err
    assert err.strip().splitlines()[-1] == f"gskit {command}: {word}", err
    assert "Traceback" not in err and "terminate called" not in err, err
    assert seconds < END_SECONDS, seconds
    assert _files(tmp_path / "out") == []  # no output, no work folder, no lock


@rtx
def test_sigterm_ends_a_build(tmp_path) -> None:
    model = _save(matmul_chain(256, 400), tmp_path / "chain.onnx")
    (tmp_path / "out").mkdir()
    argv = ["build", str(model), "-o", str(tmp_path / "out" / "m.engine"), "--compute-capability", "8.9"]
    code, seconds, err = signalled(argv, signal.SIGTERM, 0.5, tmp_path, has_child)  # the TensorRT worker
    assert code is not None, "gskit build still ran 60 s after SIGTERM"
    if code == 0:
        pytest.skip("the build ended before the signal")
    assert code == 143, err
    assert err.strip().splitlines()[-1] == "gskit build: terminated", err
    assert seconds < END_SECONDS and _files(tmp_path / "out") == []


def test_a_signal_stops_onnxruntime_inside_a_loop(tmp_path) -> None:
    """In-process, at a known moment: SIGTERM during a run of a 10^12-iteration Loop raises within a second or
    two, and onnxruntime's terminate flag has stopped the run (no thread is left running)."""
    import os
    import threading

    from gskit.io import interrupt

    session = gsort.session(long_loop(10**12))
    with interrupt.signals_unwind():
        timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM))
        timer.start()
        start = time.monotonic()
        with pytest.raises(interrupt.Terminated):
            gsort.run(session, {"x": np.ones(1, np.float32)})
        assert time.monotonic() - start < 1.0 + interrupt.CANCEL_GRACE_S + 1.0
    assert not interrupt.stranded()
