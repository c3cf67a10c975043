"""The tree stays lint-clean and formatted under the ruff settings in pyproject.toml."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATHS = ("gskit", "plugins", "tests", "scripts", "bench")


def _ruff() -> list[str]:
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    exe = shutil.which("ruff")
    if exe is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    return [exe]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_ruff(), *args, "--no-cache", *PATHS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_ruff_check_is_clean():
    result = _run("check")
    assert result.returncode == 0, f"ruff check {' '.join(PATHS)}:\n{result.stdout}{result.stderr}"


def test_ruff_format_leaves_files_unchanged():
    result = _run("format", "--check")
    assert result.returncode == 0, (
        f"run `ruff format {' '.join(PATHS)}`; ruff format --check says:\n{result.stdout}{result.stderr}"
    )
