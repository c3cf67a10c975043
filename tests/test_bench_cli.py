"""bench/run.py's ``cli`` suite on a tiny model, one run each: processes, floors, ratios, goals, JSON."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bench.processes import Command, measure_pair, measure_process, pycache_env
from bench.run import _cli_model_rows, _cli_startup_rows, _CliRuns, goals


def _tiny_model(path: Path) -> Path:
    bias = numpy_helper.from_array(np.arange(4, dtype=np.float32), "bias")
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "bias"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [bias],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_process_probe_reads_peak_modules_and_work_seconds(tmp_path: Path) -> None:
    code = "import json, numpy; print(json.dumps({'seconds': 0.25}))"
    measured = measure_process(Command("code", [code]), runs=2, timeout=60, warmup=False)
    assert measured.status == "ok" and len(measured.all_seconds) == 2
    assert measured.seconds > 0 and measured.work_seconds == 0.25
    assert "numpy" in measured.modules and "torch" not in measured.modules
    assert 5 * 2**20 < measured.peak_rss < 2**30  # VmHWM of the child, not this (larger) test process
    crashed = measure_process(Command("code", ["raise SystemExit(3)"]), runs=1, timeout=60, warmup=False)
    assert crashed.status == "failed" and crashed.returncode == 3 and crashed.seconds is None
    # an uncaught exception exits 1 too, but without the JSON line that makes exit 1 a result
    raised = measure_process(Command("code", ["1 / 0"]), runs=1, timeout=60, warmup=False)
    assert raised.status == "failed" and "ZeroDivisionError" in raised.note


def test_a_pair_runs_in_turn_and_its_ratios_are_of_the_same_pairs(tmp_path: Path) -> None:
    log = tmp_path / "order.txt"
    code = "import sys, time; open(sys.argv[1], 'a').write(sys.argv[2]); time.sleep(float(sys.argv[3]))"
    slow, fast = (
        Command("code", [code, str(log), name, pause]) for name, pause in (("A", "0.2"), ("B", "0.05"))
    )
    first, second, ratios = measure_pair(slow, fast, runs=3, timeout=60, warmup=True)
    assert log.read_text() == "AB" * 4  # the unmeasured first pair, then three in turn
    assert len(first.all_seconds) == len(second.all_seconds) == len(ratios) == 3
    expected = [a / b for a, b in zip(first.all_seconds, second.all_seconds, strict=True)]
    assert ratios == pytest.approx(expected, rel=1e-3)  # each pair's own (the seconds are rounded apart)
    failing = Command("code", ["raise SystemExit(3)"])
    first, second, ratios = measure_pair(slow, failing, runs=2, timeout=60, warmup=False)
    assert second.status == "failed" and ratios == [] and len(first.all_seconds) == 1


def test_cli_suite_rows_floors_ratios_and_goals(tmp_path: Path) -> None:
    model = _tiny_model(tmp_path / "tiny.onnx")
    cli = _CliRuns(runs=1, timeout=180, env=pycache_env(tmp_path / "cache"), warmup=False, cwd=tmp_path)
    rows = _cli_startup_rows(cli, model) + _cli_model_rows(cli, "tiny", model, tmp_path / "work")
    by_tool = {row.tool: row for row in rows}
    assert set(by_tool) == {
        "floor: python -c pass",
        "floor: python -c import onnx",
        "gskit --version",
        "gskit --help",
        "gskit inspect",
        "floor: one session",
        "gskit prepare",
        "library prepare()",
        "floor: two sessions",
        "gskit compare",
        "library compare()",
    }
    for row in rows:
        assert row.suite == "cli" and row.status == "ok", (row.tool, row.note)
        assert row.seconds > 0 and row.runs == 1 and row.peak_rss > 0
        assert isinstance(row.detail["imports"], list) and row.detail["modules"] > 0
    pairs = {
        "gskit --version": ("floor: python -c pass", "whole process"),
        "gskit inspect": ("floor: python -c import onnx", "whole process"),
        "gskit prepare": ("floor: one session", "whole process, median of 1 pairs run in turn"),
        "library prepare()": ("floor: one session", "work after imports"),
        "gskit compare": ("floor: two sessions", "whole process, median of 1 pairs run in turn"),
        "library compare()": ("floor: two sessions", "work after imports"),
    }
    for tool, (floor, basis) in pairs.items():
        row = by_tool[tool]
        assert row.detail["floor"] == floor and row.detail["ratio_of"] == basis
        assert row.detail["ratio"] > 0
    for tool in ("gskit prepare", "gskit compare"):  # the pair's own ratio, not the ratio of two medians
        row, floor = by_tool[tool], by_tool[pairs[tool][0]]
        assert row.detail["pair_ratios"] == pytest.approx([row.seconds / floor.seconds], rel=1e-3)
    # the floors did the work they stand for: onnxruntime, and no gskit
    for floor in ("floor: one session", "floor: two sessions"):
        assert "onnxruntime" in by_tool[floor].detail["imports"]
        assert by_tool[floor].detail["work_seconds"] > 0
    assert by_tool["floor: two sessions"].match is True
    assert by_tool["gskit prepare"].match is True and by_tool["gskit compare"].match is True
    for tool in ("gskit --version", "gskit --help", "gskit inspect"):  # judged against what each may import
        assert set(by_tool[tool].detail["unused_imports"]) <= set(by_tool[tool].detail["imports"])
    assert "onnx" in by_tool["gskit inspect"].detail["imports"]  # it reads the model
    assert "onnx" not in by_tool["gskit inspect"].detail["unused_imports"]
    assert not (tmp_path / "work").exists()

    goal_rows = {g["goal"]: g for g in goals(rows, None, quick=True)}
    measured = [name for name in goal_rows if name.startswith(("small models: prepare", "compare <="))]
    assert len(measured) == 4  # command and library call, for prepare and compare
    for name in measured:
        assert goal_rows[name]["met"] in (True, False) and "tiny" in goal_rows[name]["value"]
    assert goal_rows["torch never imported by prepare/compare/inspect/--help/--version"]["met"] in (
        True,
        False,
    )
    assert goal_rows["--help, --version, inspect import only what they use"]["met"] in (True, False)
    json.dumps([row.as_dict() for row in rows] + list(goal_rows.values()), allow_nan=False)  # strict JSON


def test_the_plugin_floor_runs_the_plugin_nodes_as_their_references(tmp_path: Path) -> None:
    """A plain script cannot run the prepared example's ClampSwish nodes: the plugin floor runs them as
    onnxruntime-extensions Python ops of the plugin's reference (named as bench/run.py names them), matches
    the original, and tells a wrong reference by its outputs."""
    import subprocess
    import sys

    from bench.run import _plugin_references
    from gskit.pipeline.prepare import prepare

    example = Path(__file__).parents[1] / "gskit" / "data" / "example.onnx"
    prepare(example, tmp_path / "out")
    prepared = tmp_path / "out" / "model.onnx"
    references = _plugin_references(prepared)
    assert references == ["gskit:ClampSwish=gskit_plugins.clamp_swish.reference:clamp_swish"]
    floors = Path(__file__).parents[1] / "bench" / "floors.py"

    def floor(*given: str) -> subprocess.CompletedProcess:
        argv = [sys.executable, str(floors), "plugins", str(example), str(prepared)]
        argv += [f"--reference={r}" for r in given]
        return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)

    done = floor(*references)
    assert done.returncode == 0 and float(done.stdout) > 0, done.stderr
    wrong = floor("gskit:ClampSwish=numpy:negative")
    assert wrong.returncode == 1 and "differs" in wrong.stderr
