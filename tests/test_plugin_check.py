"""``gskit plugin check NAME MODEL``: rules and their matches, the per-plugin comparison, the stubs left."""

from __future__ import annotations

import json
import re
from pathlib import Path

from gskit.cli import main
from gskit.io.model import load, save
from tests.conftest import parse_model
from tests.test_patterns import LN_OPSET17

NEG_RELU_PATTERNS = """
from gskit.passes.patterns import GraphPattern


def neg_relu(op, x):
    return op.Relu(op.Neg(x))


PATTERNS = (GraphPattern(neg_relu),)
"""

NEG_RELU_MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,4] x) => (float[2,4] y) {
    n = Neg (x)
    y = Relu (n)
}
"""


def test_check_reports_rules_matches_comparison_and_no_stubs(tmp_path: Path, capsys) -> None:
    model = save(parse_model(LN_OPSET17), tmp_path / "ln.onnx")
    kept = tmp_path / "ln.layer_norm.onnx"
    assert main(["plugin", "check", "layer_norm", str(model), "-o", str(kept), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["plugin"] == "gskit::LayerNorm v1" and data["replaced"] == 1 and data["passed"]
    assert data["stubs"] == [] and data["comparison"]["passed"] and data["prepared"] == str(kept)
    assert [n.op_type for n in load(kept).graph.node] == ["LayerNorm"]
    replaced = [r for r in data["rules"] if r["replaced"]]
    assert len(replaced) == 1 and replaced[0]["origin"].startswith("from_torch(")  # derived rules come first
    assert any(line.startswith("from_torch(layer_norm):") for line in data["derived"])


def test_check_of_a_model_without_instances_exits_1_with_each_rule_best_attempt(
    tmp_path: Path, capsys
) -> None:
    model = save(parse_model(NEG_RELU_MODEL), tmp_path / "neg.onnx")
    assert main(["plugin", "check", "RMSNorm", str(model)]) == 1
    text = capsys.readouterr().out
    assert "nothing replaced" in text and "RMSNorm" in text and "fail" in text
    assert main(["plugin", "check", "NoSuchPlugin", str(model)]) == 2
    assert "no plugin called 'NoSuchPlugin'" in capsys.readouterr().err


def test_check_names_the_stubs_a_new_plugin_still_has(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["plugin", "new", "neg_relu"]) == 0
    folder = tmp_path / "plugins" / "neg_relu"
    (folder / "patterns.py").write_text(NEG_RELU_PATTERNS)
    reference = folder / "reference.py"
    body = "    return np.maximum(-x, 0).astype(x.dtype)\n"
    reference.write_text(re.sub(r"    raise NotImplementedError\(.*\)\n", body, reference.read_text()))
    model = save(parse_model(NEG_RELU_MODEL), tmp_path / "neg.onnx")
    capsys.readouterr()
    assert main(["plugin", "check", "NegRelu", str(model)]) == 0
    text = capsys.readouterr().out
    assert "all 1 plugin nodes match" in text or "match their original regions" in text
    assert "still stubs:" in text and "kernel.py: the GPU kernel" in text and "trt_plugin.py" in text
    assert "reference.py" not in text.split("still stubs:")[1]
