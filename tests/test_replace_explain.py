"""Rules refused when a plugin loads, --explain as one row per rule, and plugin output dtypes checked.

A rule naming an op ONNX does not have (``op.tanh``) used to load, replace nothing and pass validation; it is
an error naming the rule now. ``--explain`` shows each rule once (what it replaced, or its furthest attempt),
an op the model's opset lacks is said so, and a plugin whose output rule gives another dtype than the model
has there is not inserted, while one whose spec declares that dtype (RMSNorm: the weight's) covers the fp16
TorchScript form of Hugging Face norms (float32 residual stream, result cast to float16).
"""

from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

from gskit.backends import ort as gort
from gskit.cli import main
from gskit.errors import PluginError
from gskit.io.model import load, save, to_graph, to_model
from gskit.passes.patterns import GraphPattern, replace
from gskit.plugin import PluginRegistry, PluginSpec, load_plugins, same_as_input
from plugins.rms_norm.spec import SPEC as RMS_NORM
from tests.conftest import parse_model

SCALED_TANH_SPEC = """
import numpy as np
from gskit.passes.patterns import GraphPattern
from gskit.plugin import PluginSpec, same_as_input


def scaled_tanh(op, x):
    return op.Mul(op.{tanh}(x), 2.0)


SPEC = PluginSpec(
    name="ScaledTanh", namespace="test.explain", infer=same_as_input(0),
    reference=lambda x: (np.tanh(x) * 2).astype(x.dtype), patterns=(GraphPattern(scaled_tanh),),
)
"""

TANH_MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,4] x) => (float[2,4] y) {
    t = Tanh (x)
    two = Constant <value = float {2.0}> ()
    y = Mul (t, two)
}
"""


def _plugin(root: Path, tanh: str) -> Path:
    folder = root / "scaled_tanh"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "spec.py").write_text(textwrap.dedent(SCALED_TANH_SPEC.replace("{tanh}", tanh)))
    return root


def test_a_rule_naming_an_op_onnx_lacks_is_refused_when_the_plugin_loads(tmp_path: Path, capsys) -> None:
    root = _plugin(tmp_path / "plugins", "tanh")
    with pytest.raises(
        PluginError, match=r"names op 'tanh', which ONNX does not define \(did you mean 'Tanh'\?\)"
    ):
        load_plugins([root], entry_points=False)
    model = save(parse_model(TANH_MODEL), tmp_path / "m.onnx")
    code = main(["replace", str(model), "-o", str(tmp_path / "o.onnx"), "--plugins", str(root)])
    assert (
        code == 2 and "scaled_tanh/spec.py: pattern 'scaled_tanh' names op 'tanh'" in capsys.readouterr().err
    )
    _plugin(tmp_path / "plugins", "Tanh")  # fixed: loads, and replaces
    out = tmp_path / "o.onnx"
    assert main(["replace", str(model), "-o", str(out), "--plugins", str(root), "--only", "ScaledTanh"]) == 0
    assert [n.op_type for n in load(out).graph.node] == ["ScaledTanh"]


def test_a_rule_setting_an_undeclared_attribute_is_refused() -> None:
    def scaled(op, x):
        return op.Mul(op.Tanh(x), op.capture("k"))

    spec = PluginSpec(name="S", namespace="t", patterns=(GraphPattern(scaled, attrs={"alpha": "k"}),))
    with pytest.raises(
        PluginError, match=r"sets attribute\(s\) \['alpha'\], which the spec does not declare"
    ):
        PluginRegistry([spec])


def test_a_rule_naming_an_op_of_its_own_namespace_must_name_a_loaded_plugin(tmp_path: Path) -> None:
    root = _plugin(tmp_path / "plugins", "Tanh")
    text = (root / "scaled_tanh" / "spec.py").read_text()
    text = text.replace("op.Mul(op.Tanh(x), 2.0)", 'op.Mul(op.Tanhh(x, _domain="test.explain"), 2.0)')
    (root / "scaled_tanh" / "spec.py").write_text(text)
    with pytest.raises(PluginError, match="no loaded plugin of namespace 'test.explain' is called Tanhh"):
        load_plugins([root], entry_points=False)


def test_explain_has_one_row_per_rule_and_says_when_the_opset_lacks_an_op() -> None:
    def gelu(op, x):
        return op.Gelu(x, approximate="tanh")

    def tanh_times(op, x):
        return op.Mul(op.Tanh(x), 3.0)

    spec = PluginSpec(
        name="Demo",
        namespace="t",
        infer=same_as_input(0),
        patterns=(GraphPattern(gelu), GraphPattern(tanh_times)),
    )
    model = parse_model(TANH_MODEL.replace("t = Tanh (x)", "t0 = Tanh (x)\n    t = Tanh (t0)"))
    report = replace(to_graph(model), [spec], explain=True)
    assert [r.rule for r in report.rules] == ["gelu", "tanh_times"]
    gelu_row, tanh_row = report.rules
    assert gelu_row.best.reason == "Gelu is not an ONNX op at the model's opset 17 (it is from opset 20)"
    assert tanh_row.anchors == 1 and tanh_row.best.depth == 2 and tanh_row.size == 2
    assert tanh_row.best.reason == "constant 'two' is 2.0, pattern wants 3.0"


def test_explain_table_is_one_row_per_rule_and_only_keeps_to_one_plugin(tmp_path: Path, capsys) -> None:
    model = save(parse_model(TANH_MODEL), tmp_path / "m.onnx")
    argv = ["replace", str(model), "-o", str(tmp_path / "o.onnx"), "--explain", "--only", "RMSNorm", "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    rules = data["rules"]
    assert {r["plugin"] for r in rules} == {"gskit::RMSNorm v1"} and len(rules) == len(RMS_NORM.patterns)
    assert all(r["replaced"] == 0 and r["best"]["reason"] for r in rules)
    assert main(argv[:-1]) == 0
    text = capsys.readouterr().out
    assert "Rules: matches, and the best partial match" in text and "LayerNorm" not in text


# Hugging Face's RMSNorm in an fp16 TorchScript export: x (the residual stream) stays float32, the normalized
# value is cast to float16 before the float16 weight.
FP16_LLAMA_NORM = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,8] x, float16[8] w) => (float16[2,8] y) {
    c = Cast <to = 1> (x)
    two = Constant <value = float {2.0}> ()
    p = Pow (c, two)
    m = ReduceMean <axes = [-1]> (p)
    eps = Constant <value = float {1e-6}> ()
    a = Add (m, eps)
    s = Sqrt (a)
    one = Constant <value = float {1.0}> ()
    r = Div (one, s)
    n = Mul (c, r)
    h = Cast <to = 10> (n)
    y = Mul (w, h)
}
"""


def test_rms_norm_writes_the_weight_dtype_so_the_fp16_torchscript_form_is_one_node(rng) -> None:
    model = parse_model(FP16_LLAMA_NORM)
    graph = to_graph(model)
    report = replace(graph, [RMS_NORM])
    assert report.replaced == 1 and [n.op for n in graph.nodes] == ["RMSNorm"], report.plugins
    feeds = {
        "x": (rng.standard_normal((2, 8)) * 3).astype(np.float32),
        "w": rng.standard_normal(8).astype(np.float16),
    }
    got = gort.run(to_model(graph), feeds, plugins=PluginRegistry([RMS_NORM]))["y"]
    want = gort.run(model, feeds)["y"]
    assert got.dtype == want.dtype == np.float16
    # the plugin rounds once to float16, the original rounds the normalized value and then the product
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3)


def test_a_plugin_whose_output_rule_gives_another_dtype_is_not_inserted() -> None:
    keeps_x = dataclasses.replace(RMS_NORM, infer=same_as_input(0))  # output: x's dtype (float32)
    graph = to_graph(parse_model(FP16_LLAMA_NORM))
    report = replace(graph, [keeps_x])
    assert report.replaced == 0
    reasons = [s.reason for p in report.plugins for s in p.skipped]
    assert "the plugin's output rule gives FLOAT for 'y', which is FLOAT16 in the model" in reasons


def test_a_pattern_cast_the_model_does_not_need_matches_no_node(rng) -> None:
    """sanitize removes the no-op ``Cast(x, to=float)`` of a float32 x: the rule's Cast matches nothing."""
    model = parse_model(FP16_LLAMA_NORM.replace("c = Cast <to = 1> (x)", "c = Identity (x)"))
    for kind in ("hand-written", "derived"):
        rules = tuple(r for r in RMS_NORM.patterns if hasattr(r, "forms") == (kind == "derived"))
        graph = to_graph(model)
        report = replace(graph, [dataclasses.replace(RMS_NORM, patterns=rules)])
        assert report.replaced == 1, (kind, report.plugins)
        assert [n.op for n in graph.nodes] == ["Identity", "RMSNorm"], kind
    # a Cast to another dtype than the tensor has is still a real Cast the model must have
    graph = to_graph(parse_model(FP16_LLAMA_NORM.replace("c = Cast <to = 1> (x)", "c = Cast <to = 11> (x)")))
    assert replace(graph, [RMS_NORM]).replaced == 0


@pytest.mark.torch
@pytest.mark.slow
def test_fp16_torchscript_llama_has_every_rms_norm_replaced_by_prepare(tmp_path: Path, capsys) -> None:
    """transformers' LLaMA in float16, TorchScript opset 17: the residual stream stays float32 and each
    norm's result is cast to float16. prepare (sanitize removes the no-op Casts first) replaces all 5 and
    validates."""
    pytest.importorskip("transformers", reason="the corpus extra: pip install -e '.[corpus]'")
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import real_models

    build = dict((name, b) for name, _, b in real_models._architectures())["llama"]
    module, args = build()
    path = tmp_path / "llama.fp16.torchscript-17.onnx"
    real_models._export(module.half(), args, path, 17, False)
    code = main(["prepare", str(path), "-o", str(tmp_path / "out"), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["passed"] is True
    assert report["plugins_inserted"] == {"gskit::RMSNorm v1": 5}
