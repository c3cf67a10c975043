"""Plugins TensorRT implements (``libnvinfer_plugin``): specs that say so, their nodes, check and listing.

A spec with ``library="libnvinfer_plugin"`` needs no kernel: gskit writes its node in domain ``TRT`` with
``plugin_namespace=""`` (TensorRT's namespace), runs it on onnxruntime through the numpy reference, and
``check_trt`` names it as TensorRT's own plugin with the releases that ship it (``gskit.plugin.libnvinfer``).
The attribute kinds of the written nodes are those the TensorRT parser turns into the creator's field types
(INT -> INT32, FLOAT -> FLOAT32, no INT64 tensor).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from conftest import parse_model, run_subcommand
from plugin_folders import REPO, example_inputs, load_plugin, one_node_model

from gskit.backends import ort
from gskit.backends.trt_build import needs_tensorrt_plugins
from gskit.backends.trt_check import NEEDS_PLUGIN, PLUGIN_PROBLEM, NodeIssue, _plugin_issue, check_trt
from gskit.backends.trt_support import UNSUPPORTED
from gskit.cli import plugin as plugin_cli
from gskit.errors import PluginError
from gskit.io import model as gsmodel
from gskit.plugin import PluginRegistry, libnvinfer
from gskit.plugin.spec import validate_spec
from gskit.plugin.target import TensorRTTarget

#: The plugin folders of TensorRT's own plugins, with the field types of their creators (the NVIDIA/TensorRT
#: sources named in each README): what the ONNX attributes must become.
CREATOR_FIELDS = {
    "efficient_nms": {
        "score_threshold": onnx.AttributeProto.FLOAT,
        "iou_threshold": onnx.AttributeProto.FLOAT,
        "max_output_boxes": onnx.AttributeProto.INT,
        "background_class": onnx.AttributeProto.INT,
        "score_activation": onnx.AttributeProto.INT,
        "class_agnostic": onnx.AttributeProto.INT,
        "box_coding": onnx.AttributeProto.INT,
    },
    "multiscale_deformable_attn": {},
    "modulated_deform_conv": {
        "stride": onnx.AttributeProto.INTS,
        "padding": onnx.AttributeProto.INTS,
        "dilation": onnx.AttributeProto.INTS,
        "group": onnx.AttributeProto.INT,
        "deformable_group": onnx.AttributeProto.INT,
    },
}


def _own(folder: str):
    spec, _ = load_plugin(REPO / "plugins" / folder)
    return spec


@pytest.mark.parametrize("folder", sorted(CREATOR_FIELDS))
def test_written_node_has_the_creator_fields_as_the_parser_passes_them(folder: str) -> None:
    spec = _own(folder)
    assert spec.library == libnvinfer.LIBRARY and spec.shipped is not None
    arrays = example_inputs(REPO / "plugins" / folder, np.random.default_rng(0))
    (node,) = one_node_model(spec, arrays).graph.node
    kinds = {a.name: a.type for a in node.attribute}
    assert kinds == {
        **CREATOR_FIELDS[folder],
        "plugin_namespace": onnx.AttributeProto.STRING,
        "plugin_version": onnx.AttributeProto.STRING,
    }
    values = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert values["plugin_namespace"] == b"" and values["plugin_version"] == spec.version.encode()
    assert all(-(2**31) <= v < 2**31 for a in node.attribute if a.type == a.INT for v in [a.i])
    assert (node.domain, node.op_type) == (libnvinfer.DOMAIN, spec.name)


def test_a_spec_of_tensorrt_must_name_a_known_creator_and_a_domain() -> None:
    spec = _own("efficient_nms")
    with pytest.raises(PluginError, match="not a libnvinfer_plugin creator gskit knows"):
        validate_spec(dataclasses.replace(spec, version="7"))
    with pytest.raises(PluginError, match="needs a node_domain"):
        validate_spec(dataclasses.replace(spec, node_domain=None))
    with pytest.raises(PluginError, match="one onnx or onnxruntime implements"):
        validate_spec(dataclasses.replace(spec, node_domain="com.microsoft"))
    with pytest.raises(PluginError, match="library must be"):
        validate_spec(dataclasses.replace(spec, library="libmyplugins"))
    assert spec.key == ("TRT", "EfficientNMS_TRT", "1") and spec.qualified_name == "TRT::EfficientNMS_TRT v1"


def _nms_model(tmp_path: Path, attrs: dict | None = None, *, namespace: bool = True) -> Path:
    """boxes/scores -> Identity -> TRT::EfficientNMS_TRT (a standard node first, for the parsers to see)."""
    spec = _own("efficient_nms")
    boxes = gs.Variable("boxes", np.float32, [1, 16, 4])
    scores = gs.Variable("scores", np.float32, [1, 16, 3])
    moved = gs.Variable("boxes_in", np.float32, [1, 16, 4])
    outs = [
        gs.Variable("num_detections", np.int32, [1, 1]),
        gs.Variable("detection_boxes", np.float32, [1, 5, 4]),
        gs.Variable("detection_scores", np.float32, [1, 5]),
        gs.Variable("detection_classes", np.int32, [1, 5]),
    ]
    node = spec.make_node([moved, scores], outs, {"max_output_boxes": 5, **(attrs or {})})
    if not namespace:  # as YOLOv7's --end2end export writes it
        del node.attrs["plugin_namespace"]
    graph = gs.Graph(
        nodes=[gs.Node("Identity", inputs=[boxes], outputs=[moved]), node],
        inputs=[boxes, scores],
        outputs=outs,
        opset=17,
    )
    graph.import_domains = [onnx.helper.make_opsetid("", 17), onnx.helper.make_opsetid("TRT", 1)]
    return gsmodel.save(gsmodel.to_model(graph), tmp_path / "nms.onnx")


@pytest.mark.parametrize("backend", ["static", "tensorrt_rtx"])
def test_check_trt_knows_tensorrt_own_plugin(tmp_path: Path, backend: str) -> None:
    report = check_trt(_nms_model(tmp_path), backend=backend, target="10.16")  # 11.x: IPluginV2, deprecated
    assert report.ok, report.issues
    (issue,) = report.nodes_with(NEEDS_PLUGIN)
    assert (
        "needs plugin EfficientNMS_TRT v1 (TensorRT's own plugin: libnvinfer_plugin since TensorRT 8.0"
        in (issue.reason)
    )
    assert "deprecated since 10.12" in issue.reason


def test_rtx_check_cuts_every_output_of_a_multi_output_plugin(tmp_path: Path) -> None:
    """All four outputs become graph inputs (every second one used to stay behind as a dangling output,
    and the parser failed with 'Trying to access weights or a null tensor')."""
    report = check_trt(_nms_model(tmp_path), backend="tensorrt_rtx")
    assert not report.model_errors, report.model_errors
    assert any("1 plugin or custom node(s) cut out" in note for note in report.notes)


def test_exported_node_without_plugin_namespace_is_the_plugin(tmp_path: Path, rng) -> None:
    """YOLOv7's exporter writes TRT::EfficientNMS_TRT without plugin_namespace; the parser looks in ""."""
    path = _nms_model(tmp_path, namespace=False)
    (issue,) = check_trt(path, backend="static", target="10.16").nodes_with(NEEDS_PLUGIN)
    assert "TensorRT's own plugin" in issue.reason
    spec = _own("efficient_nms")
    feeds = {
        "boxes": example_inputs(REPO / "plugins/efficient_nms", rng)[0][:1, :16],
        "scores": rng.random((1, 16, 3)),
    }
    feeds["scores"] = feeds["scores"].astype(np.float32)
    got = ort.run(path, feeds, plugins=PluginRegistry([spec]))
    want = spec.run_reference([feeds["boxes"], feeds["scores"]], {"max_output_boxes": 5})
    for name, value in zip(spec.outputs, want, strict=True):
        np.testing.assert_array_equal(got[name], value)


def _plugin_node(op: str, version: str = "1", namespace: str | None = "") -> onnx.NodeProto:
    node = onnx.helper.make_node(op, ["x"], ["y"], domain="TRT", plugin_version=version)
    if namespace is not None:
        node.attribute.append(onnx.helper.make_attribute("plugin_namespace", namespace))
    return node


def test_removed_and_too_new_plugins_are_problems_for_that_release() -> None:
    registry = PluginRegistry()

    def issue(node: onnx.NodeProto, version: str) -> NodeIssue:
        return _plugin_issue(0, node, registry, TensorRTTarget.parse(version))

    gone = issue(_plugin_node("BatchedNMS_TRT"), "11.0")
    assert gone.status == UNSUPPORTED and "BatchedNMS_TRT plugin was removed in 11.0" in gone.reason
    assert issue(_plugin_node("BatchedNMS_TRT"), "10.3").status == NEEDS_PLUGIN
    early = issue(_plugin_node("MultiscaleDeformableAttnPlugin_TRT", "2"), "10.3")
    assert early.status == PLUGIN_PROBLEM and "predates MultiscaleDeformableAttnPlugin_TRT v2" in early.reason
    # Another namespace is not TensorRT's plugin of that name.
    other = issue(_plugin_node("BatchedNMS_TRT", namespace="acme"), "11.0")
    assert "TensorRT's own plugin" not in other.reason and other.status == NEEDS_PLUGIN


def test_builds_ask_for_tensorrt_plugins_only_when_the_model_has_them(tmp_path: Path) -> None:
    assert needs_tensorrt_plugins(onnx.load(_nms_model(tmp_path)))
    plain = onnx.parser.parse_model(
        '<ir_version: 8, opset_import: ["" : 17]> g (float[2] x) => (float[2] y) {y = Relu(x)}'
    )
    assert not needs_tensorrt_plugins(plain)


def test_plugin_list_says_tensorrt_implements_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_subcommand(plugin_cli, "plugin", "list", "--json") == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    nms = rows["EfficientNMS_TRT"]
    assert (nms["namespace"], nms["domain"], nms["version"]) == ("", "TRT", "1")
    assert nms["implementations"] == [
        "reference",
        "libnvinfer_plugin since TensorRT 8.0, deprecated since 10.12 "
        "(use INMSLayer (ONNX NonMaxSuppression))",
    ]
    assert rows["LayerNorm"]["domain"] == "gskit"


DEFORM_CONV = """
<ir_version: 9, opset_import: ["" : 19]>
g (float[N,4,8,9] x, float[N,18,8,9] offset, float[N,9,8,9] mask) => (float[N,6,8,9] y) {{
    w = Constant<value = float[6,4,3,3] {{{weights}}}>()
    b = Constant<value = float[6] {{0.5, -1, 2, 0, 1, -0.25}}>()
    y = DeformConv<pads = {pads}>(x, w, offset, b{mask})
}}"""


def _deform_conv(rng, pads=(1, 1, 1, 1), mask: bool = True) -> onnx.ModelProto:
    weights = ", ".join(f"{v:.4f}" for v in rng.standard_normal(6 * 4 * 9))
    return parse_model(DEFORM_CONV.format(weights=weights, pads=list(pads), mask=", mask" if mask else ""))


def test_dcnv2_target_is_the_users_choice(rng) -> None:
    """gskit's DeformConv2d by default; ``only`` picks TensorRT's ModulatedDeformConv2d; both validate."""
    from gskit.passes.patterns import replace
    from gskit.plugin import load_plugins

    registry = load_plugins()
    model = _deform_conv(rng)
    feeds = {
        "x": rng.standard_normal((2, 4, 8, 9)).astype(np.float32),
        "offset": rng.uniform(-3, 3, (2, 18, 8, 9)).astype(np.float32),
        "mask": rng.random((2, 9, 8, 9)).astype(np.float32),
    }
    want = ort.run(model, feeds)["y"]
    default = gsmodel.to_graph(model)
    report = replace(default, list(registry))
    assert [r.plugin for r in report.regions] == ["gskit::DeformConv2d v1"]
    (mdc,) = [p for p in report.plugins if p.plugin == "TRT::ModulatedDeformConv2d v2"]
    assert "overlaps the DeformConv2d match" in mdc.skipped[0].reason
    chosen = gsmodel.to_graph(model)
    report = replace(chosen, list(registry), only=["ModulatedDeformConv2d"])
    assert [r.plugin for r in report.regions] == ["TRT::ModulatedDeformConv2d v2"]
    (node,) = [n for n in chosen.nodes if n.op == "ModulatedDeformConv2d"]
    assert [t.name for t in node.inputs] == ["x", "offset", "mask", "w", "b"]
    assert (node.attrs["padding"], node.attrs["stride"], node.attrs["deformable_group"]) == (
        [1, 1],
        [1, 1],
        1,
    )
    got = ort.run(gsmodel.to_model(chosen), feeds, plugins=registry)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("pads", "mask", "reason"),
    [((1, 1, 1, 1), False, "has no mask (DCNv1)"), ((1, 0, 1, 2), True, "pads both sides alike")],
)
def test_dcn_forms_tensorrt_plugin_cannot_take(rng, pads, mask, reason) -> None:
    from gskit.passes.patterns import replace
    from gskit.plugin import load_plugins

    graph = gsmodel.to_graph(_deform_conv(rng, pads, mask))
    report = replace(graph, list(load_plugins()), only=["ModulatedDeformConv2d"])
    assert not report.regions and reason in report.plugins[0].skipped[0].reason
