"""bench/run.py's tables show colours, not the markup tags that asked for them."""

from __future__ import annotations

import pytest

from bench.peers import Row
from bench.run import render


def test_goal_and_status_cells_print_no_markup(capsys: pytest.CaptureFixture[str]) -> None:
    rows = [Row(suite="s", model="m", tool="gskit", status="crashed", note="boom")]
    goals = [
        {"goal": "fold faster", "value": "1.0 s", "met": False},
        {"goal": "peak RSS", "value": "2 GB", "met": True},
    ]
    render(rows, goals, quick=True)
    out = capsys.readouterr().out
    assert "not met" in out and "crashed boom" in out
    assert "[red]" not in out and "[/red]" not in out and "[green]" not in out
