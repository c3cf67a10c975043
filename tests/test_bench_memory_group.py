"""bench/large_model_memory.py's memory groups: a process over its cap is killed and said to be, one under it
completes with the group's numbers; where groups cannot be made the large suite says why and skips."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench import large_model_memory as memory
from bench.peers import Row
from bench.run import PREPARE_CLI, _capped_goals

ALLOCATE = (
    "import time; block = bytearray({size}); block[::4096] = b'x' * len(block[::4096]); time.sleep(0.2)"
)
MB = 1_000_000


@pytest.mark.skipif(memory.memory_groups_unavailable() is not None, reason="memory groups cannot be made")
def test_a_process_over_its_cap_is_killed_and_one_under_it_completes(tmp_path: Path) -> None:
    (tmp_path / "input.bin").write_bytes(b"\0" * MB)
    argv = [sys.executable, "-c", ALLOCATE.format(size=200 * MB)]
    free = memory.run_in_group(argv, tmp_path, None, timeout=60)
    assert free["returncode"] == 0 and free["group"]["oom_kills"] == 0
    assert free["group"]["max_usage"] >= 200 * MB and free["group"]["largest"]["rss"] >= 200 * MB
    capped = memory.run_in_group(argv, tmp_path, 100 * MB, timeout=60)
    assert capped["returncode"] == -9 and capped["group"]["oom_kills"] == 1
    assert capped["group"]["max_usage"] <= 100 * MB and capped["group"]["limit"] == 100 * MB


def test_without_memory_groups_the_capped_runs_are_skipped_with_the_reason(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(memory, "CGROUP_MEMORY", tmp_path / "memory")
    why = memory.memory_groups_unavailable()
    assert why is not None and "memory" in why
    goals = _capped_goals({}, {"memory_cap": {"fraction": 0.3, "skipped": why}}, "")
    assert goals[0]["met"] is None and why in goals[0]["value"]


def test_the_capped_goal_reads_the_capped_run_against_the_uncapped_one() -> None:
    def row(tool: str, status: str, seconds: float) -> Row:
        return Row(
            "large", "m", tool, status=status, seconds=seconds, detail={"in_weights": {"max_usage": 0.3}}
        )

    big = {
        f"{PREPARE_CLI}, cold, no cap": row(f"{PREPARE_CLI}, cold, no cap", "ok", 8.0),
        f"{PREPARE_CLI}, cold, capped 0.3x weights": row("c", "ok", 9.0),
        "onnx-floor (process), cold, capped 0.3x weights": row("f", "out of memory", 1.0),
    }
    goal = _capped_goals(big, {"memory_cap": {"fraction": 0.3, "skipped": None}}, "")[0]
    assert goal["met"] is True
    assert (
        goal["value"].startswith("ok, 9.0 s vs 8.0 s uncapped")
        and "floor capped: out of memory" in goal["value"]
    )


def test_a_cap_below_what_the_interpreter_needs_is_skipped_with_the_reason(tmp_path: Path) -> None:
    from bench.run import MIN_CAP_BYTES, _large_capped

    weights = 200 * MB  # the quick stand-in: 0.3x of it is under what the interpreter alone holds
    assert 0.3 * weights < MIN_CAP_BYTES
    capped = _large_capped(tmp_path / "absent.onnx", "m", tmp_path, 0.3, weights, timeout=1)
    assert capped["rows"] == [] and "interpreter" in capped["memory_cap"]["skipped"]
