"""``gskit replace``: the command writes a checked model with plugin nodes and reports per plugin."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from gskit.backends import ort as gort
from gskit.cli import replace as replace_cli
from gskit.io.model import load, save
from tests.conftest import parse_model
from tests.test_patterns import LN_OPSET17

PLUGINS = Path(__file__).resolve().parent.parent / "plugins"


def _main(argv: list[str]) -> int:
    # The replace subcommand's own parser (the same add_parser the gskit command registers).
    parser = argparse.ArgumentParser(prog="gskit")
    replace_cli.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_replace_json_and_keep_function(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = save(parse_model(LN_OPSET17), tmp_path / "ln.onnx")
    out = tmp_path / "ln_plugins.onnx"
    assert (
        _main(
            ["replace", str(src), "-o", str(out), "--plugins", str(PLUGINS), "--keep-function", "--json"]
            + ["--tensorrt", "8.5"]  # older than LayerNormalization's 8.6: the plugin node
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    by_name = {p["plugin"]: p for p in data["plugins"]}
    assert by_name["gskit::LayerNorm v1"]["replaced"] == 1 and data["replaced"] == 1
    assert "overlaps" in by_name["gskit::RMSNorm v1"]["skipped"][0]["reason"]
    model = load(out)
    onnx.checker.check_model(model)
    assert [n.op_type for n in model.graph.node] == ["LayerNorm"]
    assert [f.name for f in model.functions] == ["LayerNorm"]
    x = np.random.default_rng(1).standard_normal((2, 3, 8)).astype(np.float32)
    np.testing.assert_allclose(
        gort.run(out, {"x": x})["y"], gort.run(src, {"x": x})["y"], rtol=1e-6, atol=1e-6
    )


def test_cli_replace_table_only_and_explain(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = save(parse_model(LN_OPSET17), tmp_path / "ln.onnx")
    out = tmp_path / "out.onnx"
    assert (
        _main(
            [
                "replace",
                str(src),
                "-o",
                str(out),
                "--plugins",
                str(PLUGINS),
                "--only",
                "ClampSwish",
                "--explain",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "ClampSwish" in text and "no Div node in the graph" not in text
    assert "Rules: matches, and the best partial match" in text and "LayerNorm" not in text.split("Rules:")[1]
    assert "1 norm-like computation(s) left unreplaced (at Sqrt(std))" in text  # --only left the LayerNorm
    assert [n.op_type for n in load(out).graph.node].count("ReduceMean") == 2  # nothing replaced


def test_cli_replace_refuses_to_overwrite_input(tmp_path: Path) -> None:
    from gskit.errors import GskitError

    src = save(parse_model(LN_OPSET17), tmp_path / "ln.onnx")
    with pytest.raises(GskitError, match="overwrite"):
        _main(["replace", str(src), "-o", str(src), "--plugins", str(PLUGINS)])
