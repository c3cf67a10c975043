"""Targets and native forms: what each matched region becomes for a TensorRT version, and the check for it.

For each shipped pattern family the same model is prepared for a TensorRT older and one at least as new as the
version that runs the native op (LayerNormalization 8.6, DeformConv 10.1, GroupNormalization-21 10.9,
RMSNormalization-23 10.15, facts of TENSORRT_NOTES.md): the older one gets the plugin node (GroupNorm: the
region left as exported), the newer one the ONNX op, the model's opset raised where that op needs it. Every
written model passes onnx's full checker, imports the opset its ops need, and computes what the original does
on onnxruntime (rtol/atol 1e-5: float32 norms whose reduction order differs).
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from conftest import parse_model, run_subcommand
from test_patterns import LN_OPSET17

from gskit.backends import ort
from gskit.backends.trt_check import NEEDS_PLUGIN, NOT_CHECKED, check_trt
from gskit.backends.trt_support import RESTRICTED, UNSUPPORTED, parser_table
from gskit.cli import main
from gskit.cli import plugin as plugin_cli
from gskit.compare.outputs import compare
from gskit.compare.plugins import compare_plugins
from gskit.errors import GskitError
from gskit.io import model as gsmodel
from gskit.passes.patterns import replace
from gskit.pipeline.prepare import prepare
from gskit.pipeline.recipe import parse_recipe
from gskit.plugin import load_plugins
from gskit.plugin.target import NEWEST_KNOWN, TensorRTTarget, default_target, installed_tensorrt

REPO = Path(__file__).resolve().parents[1]
PLUGINS = load_plugins([REPO / "plugins"], entry_points=False)
rtx = pytest.mark.skipif(importlib.util.find_spec("tensorrt_rtx") is None, reason="needs tensorrt-rtx-cu13")

#: The TorchScript exporter's decomposed LayerNorm at opset 14, below LayerNormalization's 17.
LAYER_NORM_14 = LN_OPSET17.replace('"" : 17', '"" : 14')

RMS_NORM_17 = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,5,6] x) => (float[2,5,6] y) <float[6] w = {1,2,3,4,5,6}> {
    two = Constant <value = float {2.0}> ()
    sq = Pow (x, two)
    ms = ReduceMean <axes = [-1], keepdims = 1> (sq)
    eps = Constant <value = float {1e-6}> ()
    me = Add (ms, eps)
    r = Sqrt (me)
    inv = Reciprocal (r)
    n = Mul (x, inv)
    y = Mul (n, w)
}
"""

# nn.GroupNorm(2, 4) as the TorchScript exporter writes it (weights of a trained model: not ones and zeros).
GROUP_NORM_17 = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N,4,3,5] x) => (float[N,4,3,5] y)
  <float[4,1,1] w = {0.5, 1.5, -1.0, 2.0}, float[4,1,1] b = {0.1, -0.2, 0.3, 0.0}> {
    groups = Constant <value = int64[3] {0, 2, -1}> ()
    r = Reshape (x, groups)
    ones = Constant <value = float[2] {1.0, 1.0}> ()
    zeros = Constant <value = float[2] {0.0, 0.0}> ()
    n = InstanceNormalization <epsilon = 1e-5> (r, ones, zeros)
    s = Shape (x)
    back = Reshape (n, s)
    m = Mul (back, w)
    y = Add (m, b)
}
"""


def _deform_conv(pads: str = "1, 1, 1, 1") -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    weight = ", ".join(f"{v:.4f}" for v in rng.standard_normal(4 * 2 * 3 * 3))
    return parse_model(
        f"""
        <ir_version: 9, opset_import: ["" : 19]>
        g (float[1,2,6,7] x, float[1,18,6,7] off) => (float[1,4,6,7] y) <float[4,2,3,3] w = {{{weight}}}> {{
            y = DeformConv <pads = [{pads}], kernel_shape = [3, 3]> (x, w, off)
        }}
        """
    )


def _feeds(model: onnx.ModelProto, rng: np.random.Generator, batch: int = 2) -> dict[str, np.ndarray]:
    feeds = {}
    for info in model.graph.input:
        dims = [d.dim_value or batch for d in info.type.tensor_type.shape.dim]
        feeds[info.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


def _prepared(model: onnx.ModelProto, tensorrt: str, tmp_path: Path):
    """``model`` replaced for ``tensorrt`` and written; the report and the written model."""
    graph = gsmodel.to_graph(onnx.shape_inference.infer_shapes(model))
    report = replace(graph, PLUGINS, tensorrt=tensorrt)
    path = gsmodel.save(graph, tmp_path / f"prepared-{tensorrt}.onnx")
    written = onnx.load(path)
    onnx.checker.check_model(written, full_check=True)
    return report, written, path


def _ops(model: onnx.ModelProto) -> list[str]:
    return [f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in model.graph.node]


def _opset(model: onnx.ModelProto) -> int:
    return next(o.version for o in model.opset_import if o.domain == "")


CASES = {
    # name: (model, target, ops of the main graph after, opset after, form of the region, why contains)
    "layer_norm-8.5": (LAYER_NORM_14, "8.5", ["gskit::LayerNorm"], 14, "plugin", "TensorRT 8.5 < 8.6"),
    "layer_norm-8.6": (LAYER_NORM_14, "8.6", ["LayerNormalization"], 17, "native", "8.6 >= 8.6"),
    "rms_norm-10.3": (RMS_NORM_17, "10.3", ["gskit::RMSNorm"], 17, "plugin", "10.3 < 10.15"),
    "rms_norm-10.15": (RMS_NORM_17, "10.15", ["RMSNormalization"], 23, "native", "RMSNormalization-23"),
    "group_norm-10.9": (GROUP_NORM_17, "10.9", ["GroupNormalization"], 21, "native", "10.9 >= 10.9"),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_the_target_picks_each_region_form_and_the_model_validates(case: str, tmp_path: Path) -> None:
    text, tensorrt, ops, opset, form, why = CASES[case]
    original = parse_model(text)
    report, written, path = _prepared(original, tensorrt, tmp_path)
    assert _ops(written) == ops and _opset(written) == opset
    (region,) = report.regions
    assert region.form == form and why in region.why, region.why
    assert report.target == str(TensorRTTarget.parse(tensorrt)) and report.target_source.startswith(
        "--tensorrt"
    )
    assert report.opset_raised == (None if opset == _opset(original) else [_opset(original), opset])
    result = compare(original, path, feeds=_feeds(original, np.random.default_rng(0)), plugins=PLUGINS)
    assert result.passed, [(o.name, o.max_abs_err) for o in result.outputs]
    # each written region against the original region it replaced, native ops like plugin nodes
    per_region = compare_plugins(original, path, plugins=PLUGINS, shapes={"x": _shape(original)})
    assert [c.op for c in per_region.plugins] == ops and per_region.passed


def _shape(model: onnx.ModelProto) -> tuple[int, ...]:
    return tuple(d.dim_value or 2 for d in model.graph.input[0].type.tensor_type.shape.dim)


def test_group_norm_below_10_9_is_left_as_exported_and_says_why(tmp_path: Path) -> None:
    original = parse_model(GROUP_NORM_17)
    report, written, _ = _prepared(original, "10.3", tmp_path)
    assert report.replaced == 0 and _ops(written) == _ops(original) and _opset(written) == 17
    (skip,) = next(p for p in report.plugins if p.plugin == "gskit::GroupNorm v1").skipped
    assert "TensorRT 10.3 < 10.9" in skip.reason and "has no plugin node" in skip.reason


def test_a_region_that_already_is_the_native_op_is_kept(tmp_path: Path) -> None:
    original = _deform_conv()
    report, written, _ = _prepared(original, "10.1", tmp_path)
    assert _ops(written) == ["DeformConv"] and report.replaced == 0 and report.kept == 1
    (region,) = report.regions
    assert region.kept and region.form == "native" and region.node == original.graph.node[0].name
    assert "already DeformConv: left as it was" in region.why
    # below 10.1 the same node becomes the plugin node
    report, written, _ = _prepared(original, "10.0", tmp_path)
    assert _ops(written) == ["gskit::DeformConv2d"] and report.regions[0].form == "plugin"


def test_native_deform_conv_computes_what_the_plugin_reference_does(tmp_path: Path) -> None:
    """The plugin's numpy reference (10.0) and onnxruntime's DeformConv-19 (10.1) agree on the same model."""
    original = _deform_conv()
    feeds = _feeds(original, np.random.default_rng(1), batch=1)
    _, _, plugin = _prepared(original, "10.0", tmp_path)
    native = gsmodel.to_graph(original)
    got_plugin = ort.run(plugin, feeds, plugins=PLUGINS)["y"]
    got_native = ort.run(gsmodel.to_model(native), feeds)["y"]
    np.testing.assert_allclose(got_plugin, got_native, rtol=1e-5, atol=1e-5)


def test_asymmetric_pads_keep_the_plugin_even_when_tensorrt_has_deform_conv(tmp_path: Path) -> None:
    report, written, _ = _prepared(_deform_conv(pads="1, 0, 1, 2"), "11", tmp_path)
    assert _ops(written) == ["gskit::DeformConv2d"]
    assert "differ at the two ends of an axis" in report.regions[0].why


def test_custom_domain_deform_conv2d_becomes_onnx_deform_conv_with_the_opset_raised(tmp_path: Path) -> None:
    x = gs.Variable("x", np.float32, (1, 2, 6, 7))
    w = gs.Constant("w", np.random.default_rng(0).standard_normal((4, 2, 3, 3)).astype(np.float32))
    off = gs.Variable("off", np.float32, (1, 18, 6, 7))
    mask = gs.Variable("m", np.float32, (1, 9, 6, 7))
    bias = gs.Constant("b", np.zeros(4, np.float32))
    y = gs.Variable("y", np.float32, (1, 4, 6, 7))
    attrs = {"pad_h": 1, "pad_w": 1, "n_weight_grps": 1, "n_offset_grps": 1, "use_mask": 1}
    node = gs.Node("deform_conv2d", domain="custom", attrs=attrs, inputs=[x, w, off, mask, bias], outputs=[y])
    graph = gs.Graph([node], [x, off, mask], [y], opset=17)
    graph.import_domains = [onnx.helper.make_opsetid("", 17), onnx.helper.make_opsetid("custom", 1)]
    report = replace(graph, PLUGINS, tensorrt="10.1")
    assert [(n.op, n.domain) for n in graph.nodes] == [("DeformConv", "")] and graph.opset == 19
    assert [t.name for t in graph.nodes[0].inputs] == ["x", "w", "off", "b", "m"]
    assert report.opset_raised == [17, 19]


def test_an_opset_the_converter_cannot_reach_keeps_the_plugin_form(tmp_path: Path) -> None:
    """A BatchNormalization with spatial=0 (opset 7) has no adapter to opset 17: LayerNormalization is refused
    with onnx's reason and the region keeps its plugin node; the model keeps opset 7 and its ops."""
    text = LAYER_NORM_14.replace('"" : 14', '"" : 7').replace(
        "g (float[2,3,8] x) => (float[2,3,8] y)",
        "g (float[2,3,8] x, float[2,3,4,4] i) => (float[2,3,8] y, float[2,3,4,4] z)",
    )
    text = text.replace(
        "    y = Add (m, b)\n",
        "    y = Add (m, b)\n    s = Constant <value = float[3] {1,1,1}> ()\n"
        "    z = BatchNormalization <spatial = 0> (i, s, s, s, s)\n",
    )
    graph = gsmodel.to_graph(onnx.parser.parse_model(text))
    report = replace(graph, PLUGINS, tensorrt="11")
    assert graph.opset == 7 and report.opset_raised is None
    assert "spatial" in report.opset_refused[17]
    (region,) = report.regions
    assert region.form == "plugin" and "needs opset 17, which the model cannot reach" in region.why


@pytest.mark.torch
@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript-17", "dynamo-18"])
def test_group_norm_blocks_exported_from_pytorch(dynamo: bool, tmp_path: Path) -> None:
    """Conv/GroupNorm/SiLU blocks as a diffusers UNet has them: every GroupNorm becomes GroupNormalization-21
    for 10.9 and the prepared model validates; for 10.3 the model is left as exported."""
    torch = pytest.importorskip("torch")

    class Block(torch.nn.Module):
        def __init__(self, cin: int, cout: int) -> None:
            super().__init__()
            self.n1, self.c1 = torch.nn.GroupNorm(2, cin, eps=1e-6), torch.nn.Conv2d(cin, cout, 3, padding=1)
            self.n2, self.c2 = torch.nn.GroupNorm(4, cout), torch.nn.Conv2d(cout, cout, 3, padding=1)

        def forward(self, x):
            h = self.c1(torch.nn.functional.silu(self.n1(x)))
            return self.c2(torch.nn.functional.silu(self.n2(h))) + h

    torch.manual_seed(0)
    net = torch.nn.Sequential(Block(4, 8), Block(8, 8)).eval()
    for module in net.modules():  # trained-looking affine parameters
        if isinstance(module, torch.nn.GroupNorm):
            torch.nn.init.normal_(module.weight)
            torch.nn.init.normal_(module.bias)
    path = tmp_path / "blocks.onnx"
    opset = 18 if dynamo else 17
    torch.onnx.export(net, (torch.randn(1, 4, 8, 8),), str(path), dynamo=dynamo, opset_version=opset)
    original = onnx.load(str(path))
    report, written, prepared = _prepared(original, "10.9", tmp_path)
    assert _ops(written).count("GroupNormalization") == 4 and report.replaced == 4 and _opset(written) == 21
    result = compare(path, prepared, plugins=PLUGINS, seed=0)
    assert result.passed, [(o.name, o.max_abs_err) for o in result.outputs]
    report, written, _ = _prepared(original, "10.3", tmp_path)
    assert report.replaced == 0 and "GroupNormalization" not in _ops(written)


# -------------------------------------------------------------------------------------------- the target


def test_versions_parse_and_compare_as_numbers() -> None:
    assert TensorRTTarget.parse("10.15") > TensorRTTarget.parse("10.3") > TensorRTTarget.parse("8.6")
    assert TensorRTTarget.parse("11").version == (11, 0)
    assert TensorRTTarget.parse("10.16.1.11").version == (10, 16)
    assert TensorRTTarget.parse("11.2").at_least("11") and not TensorRTTarget.parse("10.3").at_least("10.15")
    for bad, said in (("abc", "not a TensorRT version"), ("7.2", "gskit knows TensorRT 8.5 and later")):
        with pytest.raises(GskitError, match=said):
            TensorRTTarget.parse(bad)
    with pytest.raises(GskitError, match="write it as a string"):
        TensorRTTarget.parse(10.1)  # YAML's 10.10


def test_a_version_newer_than_gskit_knows_is_taken_and_its_reports_say_whose_facts_apply(tmp_path) -> None:
    newest = ".".join(map(str, NEWEST_KNOWN))
    note = f"newer than any TensorRT gskit knows: gskit's facts of {newest} apply"
    assert TensorRTTarget.parse("105").source == f"--tensorrt 105; {note}"  # 10.5 mistyped shows
    assert TensorRTTarget.parse(newest).source == f"--tensorrt {newest}"
    assert TensorRTTarget.parse("105", "").source == ""  # internal comparisons carry no source
    example = REPO / "gskit" / "data" / "example.onnx"
    report = prepare(
        example, tmp_path / "out", recipe=parse_recipe('target: {tensorrt: "99"}\nsteps: [replace]\n')
    )
    assert report.target == {"tensorrt": "99.0", "source": f"target of <recipe> 99; {note}"}


def test_default_target_is_the_installed_tensorrt_else_the_newest_known() -> None:
    target = default_target()
    installed = installed_tensorrt()
    if installed is None:
        assert target.version == NEWEST_KNOWN and "no full TensorRT installed" in target.source
    else:
        assert str(target) == ".".join(installed.split(".")[:2]) and installed in target.source


def test_a_recipe_has_one_target() -> None:
    recipe = parse_recipe('target: {tensorrt: "10.3"}\nsteps:\n  - replace\n', source="r.yaml")
    assert recipe.target == "10.3" and 'tensorrt: "10.3"' in recipe.to_yaml().replace("'", '"')
    with pytest.raises(
        GskitError, match=r"r.yaml:3: step 'replace' asks for TensorRT 11, the recipe's target"
    ):
        parse_recipe('target: {tensorrt: "10.3"}\nsteps:\n  - replace: {tensorrt: "11"}\n', source="r.yaml")
    with pytest.raises(GskitError, match=r"r.yaml:1: target.tensorrt: .*write it as a string"):
        parse_recipe("target: {tensorrt: 10.10}\nsteps: [replace]\n", source="r.yaml")
    with pytest.raises(GskitError, match="target takes one key, tensorrt"):
        parse_recipe("target: {trt: '10.3'}\nsteps: [replace]\n", source="r.yaml")


def test_prepare_reports_the_target_and_each_region_form(tmp_path: Path) -> None:
    source = gsmodel.save(parse_model(RMS_NORM_17), tmp_path / "rms.onnx")
    recipe = parse_recipe(
        'target: {tensorrt: "11"}\nsteps:\n  - replace\n  - infer_shapes\n  - validate\n', source="r.yaml"
    )
    report = prepare(source, tmp_path / "out", recipe=recipe, plugin_dirs=[REPO / "plugins"])
    assert report.passed and report.target == {"tensorrt": "11.0", "source": "target of r.yaml 11"}
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["native_inserted"] == {"RMSNormalization": 1} and saved["plugins_inserted"] == {}
    (region,) = saved["regions"]
    assert (region["form"], region["op"], region["kept"]) == ("native", "RMSNormalization", False)
    assert region["why"] == "TensorRT 11.0 >= 10.15 runs RMSNormalization-23 natively"
    html = (tmp_path / "out" / "report.html").read_text()
    assert "TensorRT target</td><td>11.0 (target of r.yaml 11)" in html
    assert "form: native RMSNormalization: TensorRT 11.0 &gt;= 10.15" in html


def test_plugin_list_says_what_each_pattern_becomes_for_a_version(capsys) -> None:
    def forms(version: str) -> dict[str, str]:
        assert run_subcommand(plugin_cli, "plugin", "list", "--tensorrt", version, "--json") == 0
        return {r["name"]: r["for_target"]["short"] for r in json.loads(capsys.readouterr().out)}

    old, jetson, new = forms("8.6"), forms("10.3"), forms("11")
    assert old["LayerNorm"] == jetson["LayerNorm"] == new["LayerNorm"] == "LayerNormalization-17 (native)"
    assert old["DeformConv2d"] == "plugin node (DeformConv-19 from 10.1)"
    assert jetson["DeformConv2d"] == "DeformConv-19 (native)"
    assert jetson["RMSNorm"] == "plugin node (RMSNormalization-23 from 10.15)"
    assert new["RMSNorm"] == "RMSNormalization-23 (native)"
    assert jetson["GroupNorm"] == "left as it is (GroupNormalization-21 from 10.9)"
    assert new["GroupNorm"] == "GroupNormalization-21 (native)" and new["ClampSwish"] == "plugin node"


def test_weakly_typed_build_options_are_refused_with_the_strongly_typed_way(tmp_path: Path, capsys) -> None:
    model = str(REPO / "gskit" / "data" / "example.onnx")
    assert main(["build", model, "-o", str(tmp_path / "e"), "--fp16"]) == 2
    assert "gskit convert --fp16" in capsys.readouterr().err
    assert main(["build", model, "-o", str(tmp_path / "e"), "--int8"]) == 2
    assert "Q/DQ" in capsys.readouterr().err
    assert not (tmp_path / "e").exists()
    with pytest.raises(GskitError, match=r"r.yaml:2: build.fp16: .*gskit convert --fp16"):
        parse_recipe("steps:\n  - build: {fp16: true}\n", source="r.yaml")


# ------------------------------------------------------------------------------------ the check for a target


def _save(tmp_path: Path, text: str, name: str = "m.onnx") -> Path:
    path = tmp_path / name
    onnx.save(onnx.parser.parse_model(text), path)
    return path


def test_the_static_table_answers_for_the_target(tmp_path: Path) -> None:
    rms = _save(
        tmp_path,
        '<ir_version: 10, opset_import: ["" : 23]> g (float[2,6] x, float[6] w) '
        "=> (float[2,6] y) { y = RMSNormalization(x, w) }",
    )
    old = check_trt(rms, plugins=[], backend="static", target="10.3")
    assert [(i.op_type, i.status) for i in old.issues] == [("RMSNormalization", UNSUPPORTED)]
    assert "imported from TensorRT 10.15" in old.issues[0].reason and old.target == "10.3"
    assert "operators.md of TensorRT 10.1" in old.table and "changelog to 10.3" in old.table
    assert check_trt(rms, plugins=[], backend="static", target="10.15").ok
    group = _save(
        tmp_path,
        '<ir_version: 10, opset_import: ["" : 21]> g (float[1,4,2,2] x, float[4] s, '
        "float[4] b) => (float[1,4,2,2] y) { y = GroupNormalization<num_groups = 2>(x, s, b) }",
    )
    (issue,) = check_trt(group, plugins=[], backend="static", target="10.8").issues
    assert issue.status == UNSUPPORTED and "imported from TensorRT 10.9" in issue.reason
    assert check_trt(group, plugins=[], backend="static", target="10.9").ok
    dft = _save(
        tmp_path,
        '<ir_version: 10, opset_import: ["" : 20]> g (float[1,8,1] x) => (float[1,8,2] y) { y = DFT(x) }',
    )
    assert not check_trt(dft, plugins=[], backend="static", target="11.1").ok
    assert check_trt(dft, plugins=[], backend="static", target="11.2").ok


def test_tensorrt_11_names_removed_and_iplugin_v2_plugins_with_their_replacement(tmp_path: Path) -> None:
    text = """
    <ir_version: 10, opset_import: ["" : 17, "trt" : 1]>
    g (float[1,8,4] boxes, float[1,8,3] scores) => (int32[1,1] n, float[1,4,4] b) {
      n, b = trt.BatchedNMS_TRT<plugin_namespace: string = "", plugin_version: string = "1">(boxes, scores)
    }
    """
    path = _save(tmp_path, text)
    (issue,) = check_trt(path, plugins=[], backend="static", target="11").issues
    assert (
        issue.status == UNSUPPORTED
        and "removed in 11.0" in issue.reason
        and "EfficientNMS_TRT" in issue.reason
    )
    (issue,) = check_trt(path, plugins=[], backend="static", target="10.16").issues
    assert issue.status == NEEDS_PLUGIN
    path = _save(tmp_path, text.replace("BatchedNMS_TRT", "EfficientNMS_TRT"), "e.onnx")
    (issue,) = check_trt(path, plugins=[], backend="static", target="11.1").issues
    assert issue.status == RESTRICTED and "IPluginV2" in issue.reason and "NonMaxSuppression" in issue.reason


def test_tables_come_from_the_data_file_with_their_source() -> None:
    table = parser_table("10.3")
    assert table.table == "10.1" and table.commit.startswith("96e7811")
    assert table.ops["Slice"] == "" and "initializer" in parser_table("10.1").ops["Slice"]
    assert not parser_table("8.6").supports("DeformConv") and parser_table("10.1").supports("DeformConv")
    assert parser_table("11.5").opsets == (9, 25)


@rtx
def test_rtx_answers_for_a_target_and_the_table_corrects_it(tmp_path: Path) -> None:
    """TensorRT-RTX 1.7's parser is at TensorRT 11.1's level: for 10.3 it takes RMSNormalization, which 10.3
    does not import; it has no DeformConv importer, which full TensorRT has from 10.1: not checked, not a
    rejection. For an 8.x target the table answers."""
    rms = _save(
        tmp_path,
        '<ir_version: 10, opset_import: ["" : 23]> g (float[2,6] x, float[6] w) '
        "=> (float[2,6] y) { y = RMSNormalization(x, w) }",
    )
    report = check_trt(rms, plugins=[], target="10.3")
    assert report.source.startswith("tensorrt_rtx 1.")
    assert [(i.op_type, i.status) for i in report.issues] == [("RMSNormalization", UNSUPPORTED)]
    assert "TensorRT 10.3 does not" in report.issues[0].reason
    assert check_trt(rms, plugins=[], target="11").ok
    deform = tmp_path / "deform.onnx"
    onnx.save(_deform_conv(), deform)
    report = check_trt(deform, plugins=[], target="11")
    assert report.source.startswith("tensorrt_rtx 1.") and report.ok
    (issue,) = report.issues
    assert issue.status == NOT_CHECKED and "full TensorRT >= 10.1 imports DeformConv natively" in issue.reason
    old = check_trt(deform, plugins=[], target="8.6")
    assert old.source == "static table" and any("does not answer for TensorRT 8.6" in n for n in old.notes)
    assert old.issues[0].status == UNSUPPORTED and "imported from TensorRT 10.1" in old.issues[0].reason


@rtx
def test_rtx_takes_the_native_forms_of_prepared_models(tmp_path: Path) -> None:
    """LayerNormalization-17, GroupNormalization-21 and RMSNormalization-23 as replace writes them:
    TensorRT-RTX 1.7's parser rejects none of them."""
    for text, tensorrt in ((LAYER_NORM_14, "10.3"), (GROUP_NORM_17, "10.9"), (RMS_NORM_17, "11")):
        _, written, path = _prepared(parse_model(text), tensorrt, tmp_path)
        report = check_trt(path, plugins=[], target=tensorrt)
        assert report.source.startswith("tensorrt_rtx 1.") and report.ok and not report.issues, report.issues


def test_the_parser_data_is_what_its_script_writes() -> None:
    """gskit/data/tensorrt_parser.json comes from scripts/trt_parser_tables.py: its changes are the script's,
    every table names the commit it was read at, and the script reads both header forms of operators.md."""
    spec = importlib.util.spec_from_file_location(
        "trt_parser_tables", REPO / "scripts" / "trt_parser_tables.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    data = json.loads((REPO / "gskit" / "data" / "tensorrt_parser.json").read_text())
    assert data["changes"] == json.loads(json.dumps(script.CHANGES))
    for version, table in data["tables"].items():
        assert table["commit"] == script.RELEASES[version] and table["read"], version
    old = script.parse_operators(
        "TensorRT 8.6 supports operators up to Opset 17.\n| Operator | Supported | Types | Restrictions |\n"
        "|---|---|---|---|\n| Slice | Y | FP32 | `axes` must be an initializer |\n| Unique | N |\n"
    )
    assert old == {
        "header": "8.6",
        "opsets": [1, 17],
        "ops": {"Slice": "`axes` must be an initializer"},
        "unsupported": ["Unique"],
    }
    new = script.parse_operators(
        "TensorRT 11.1 supports operators in the inclusive range of opset 9 to opset 24."
    )
    assert (new["header"], new["opsets"]) == ("11.1", [9, 24])


@rtx
def test_rtx_for_an_older_target_adds_only_what_the_version_explains(tmp_path: Path) -> None:
    """Where TensorRT-RTX answers for an older target, the table adds ops that version does not import, not
    the checks every version makes: the parser stops at its first failing node, and the nodes after it were
    not judged. (A statically quantized model of the corpus got 145 Q/DQ rejections for 10.3 instead of the
    parser's 1 when every static check was added.)"""
    path = _save(
        tmp_path,
        """
        <ir_version: 10, opset_import: ["" : 17]>
        g (uint8[4] q) => (float[4] y) <float s = {0.5}, uint8 z = {3}> {
          a = DequantizeLinear(q, s, z)
          b = QuantizeLinear(a, s, z)
          y = DequantizeLinear(b, s, z)
        }
        """,
    )
    newest = check_trt(path, plugins=[], target="11.5")
    older = check_trt(path, plugins=[], target="10.3")
    assert newest.source.startswith("tensorrt_rtx 1.") and older.source == newest.source
    assert [(i.name, i.status) for i in older.issues] == [(i.name, i.status) for i in newest.issues]


def test_a_native_op_that_cannot_take_the_region_types_keeps_the_plugin() -> None:
    """The op's schema decides which input types a native form takes (LayerNormalization one type for X, Scale
    and B), and onnx's type inference which output type it writes: the fp16 TorchScript LLaMA normalizes a
    float32 residual into float16, which RMSNormalization's schema allows (Y: the scale's type) but onnx 1.23
    infers as float32 and onnxruntime cannot run, so those regions keep the RMSNorm plugin node (seen on the
    corpus: 4 of its 5 norms, the first one, all float16, becomes RMSNormalization)."""
    from gskit.plugin.native import choose_form

    f32, f16 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16
    layer, rms = PLUGINS.get("gskit", "LayerNorm"), PLUGINS.get("gskit", "RMSNorm")
    target = TensorRTTarget.parse("11")
    mixed = choose_form(layer, target, {"epsilon": 1e-5}, dtypes=[f32, f16, f16])
    assert mixed.kind == "plugin" and "takes one type for X and Scale" in mixed.why
    assert choose_form(layer, target, {"epsilon": 1e-5}, dtypes=[f16, f16, f16]).kind == "native"
    residual = choose_form(rms, target, {"epsilon": 1e-5}, dtypes=[f32, f16], out_dtypes=[f16])
    assert residual.kind == "plugin" and "onnx infers float for RMSNormalization's output" in residual.why
    assert choose_form(rms, target, {"epsilon": 1e-5}, dtypes=[f16, f16], out_dtypes=[f16]).kind == "native"


def test_a_spec_native_form_is_checked_against_onnx_and_the_spec() -> None:
    from gskit.errors import PluginError
    from gskit.plugin import Attribute, AttrType, NativeForm, PluginRegistry, PluginSpec

    def spec(*forms: NativeForm, plugin_form: bool = True) -> PluginSpec:
        return PluginSpec(
            name="MyNorm",
            namespace="test.native",
            inputs=("x", "w"),
            attributes=(Attribute("eps", AttrType.FLOAT, 1e-5),),
            native=forms,
            plugin_form=plugin_form,
        )

    PluginRegistry([spec(NativeForm("RMSNormalization", 23, "10.15", attributes={"epsilon": "eps"}))])
    for bad, said in (
        (spec(NativeForm("RMSNormalization", 17, "10.15")), "no such ONNX op at that opset"),
        (
            spec(NativeForm("RMSNormalization", 23, "10.15", attributes={"eps": "eps"})),
            "has no attribute 'eps'",
        ),
        (spec(NativeForm("RMSNormalization", 23, "10.15", attributes={"epsilon": "e"})), "no attribute 'e'"),
        (spec(NativeForm("RMSNormalization", 23, "ten")), "not a TensorRT version"),
        (spec(NativeForm("RMSNormalization", 23, "10.15", inputs=(0, 5))), "input indices [5]"),
        (spec(plugin_form=False), "needs at least one native form"),
    ):
        with pytest.raises(PluginError, match=re.escape(said)):
            PluginRegistry([bad])
