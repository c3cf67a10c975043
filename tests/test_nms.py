"""The nms step: EfficientNMS_TRT behind YOLO-family heads, an exported NMS replaced, refusals, validation.

Models are built in tests/detection_models.py (graph forms of the heads, raw features as inputs, so random
inputs give real detections) and, for the exporters' own forms, exported from a small torch module that
decodes boxes as ultralytics' ``dist2bbox`` does. The detections of prepared models are checked against
onnxruntime's own ``NonMaxSuppression`` (an independent NMS) on the original's head output, besides gskit's
validation (reference on the original's head output, and the exported NMS where there is one).
"""

from __future__ import annotations

from pathlib import Path

import detection_models as dm
import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from conftest import parse_model

from gskit.backends import ort
from gskit.compare.detections import compare_detections
from gskit.errors import GskitError
from gskit.io import model as gsmodel
from gskit.passes.nms import NMS, NmsOptions, plugin_inputs
from gskit.passes.transform import run_pass
from gskit.pipeline.prepare import default_recipe, prepare, recipe_with_overrides
from gskit.plugin import load_plugins

REGISTRY = load_plugins()


def _nms(model: onnx.ModelProto, **options):
    graph = gsmodel.to_graph(model)
    report = run_pass(NMS, graph, NmsOptions(**options), plugins=list(REGISTRY)).report
    return gsmodel.to_model(graph), report


def _feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
        for i in model.graph.input
    }


def _onnx_nms(boxes: np.ndarray, scores: np.ndarray, iou: float, threshold: float, center: int) -> set:
    """Kept (class, box) pairs of onnxruntime's NonMaxSuppression on boxes [N, 4], scores [N, C]."""
    text = f"""
    <ir_version: 8, opset_import: ["" : 11]>
    g (float[1,N,4] boxes, float[1,C,N] scores) => (int64[K,3] sel) {{
        top = Constant<value = int64[1] {{100000}}>()
        iou = Constant<value = float[1] {{{iou}}}>()
        thr = Constant<value = float[1] {{{threshold}}}>()
        sel = NonMaxSuppression<center_point_box = {center}>(boxes, scores, top, iou, thr)
    }}"""
    session = ort.session(parse_model(text))
    selected = session.run(None, {"boxes": boxes[None], "scores": scores.T[None].copy()})[0]
    return {(int(c), int(i)) for _, c, i in selected}


def _kept_pairs(prepared: dict, boxes: np.ndarray, scores: np.ndarray) -> set:
    """(class, box index) of each detection, found by its score (scores are distinct in random data)."""
    n = int(prepared["num_detections"][0, 0])
    pairs = set()
    for k in range(n):
        cls = int(prepared["detection_classes"][0, k])
        (index,) = np.flatnonzero(scores[:, cls] == prepared["detection_scores"][0, k])
        pairs.add((cls, int(index)))
    return pairs


@pytest.mark.parametrize("xywh", [True, False])
def test_ultralytics_head_gets_efficient_nms(xywh: bool) -> None:
    original = dm.ultralytics_head(xywh=xywh)
    prepared, report = _nms(original, iou_threshold=0.3)
    (node,) = [n for n in prepared.graph.node if n.op_type == "EfficientNMS_TRT"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    kinds = {a.name: a.type for a in node.attribute}
    assert node.domain == "TRT" and attrs["plugin_namespace"] == b"" and attrs["plugin_version"] == b"1"
    assert attrs["box_coding"] == (1 if xywh else 0) and kinds["box_coding"] == onnx.AttributeProto.INT
    assert (attrs["max_output_boxes"], attrs["class_agnostic"], attrs["background_class"]) == (300, 0, -1)
    assert attrs["score_threshold"] == pytest.approx(0.25) and attrs["iou_threshold"] == pytest.approx(0.3)
    assert kinds["score_threshold"] == kinds["iou_threshold"] == onnx.AttributeProto.FLOAT
    assert [o.name for o in prepared.graph.output] == list(report.outputs)
    assert report.settings == {
        "score_threshold": "ultralytics default",
        "iou_threshold": "option",
        "max_output_boxes": "ultralytics default",
    }
    feeds = _feeds(original)
    raw = ort.run(original, feeds)["output0"][0]
    got = ort.run(prepared, feeds, plugins=REGISTRY)
    assert got["num_detections"].dtype == np.int32 and got["detection_classes"].dtype == np.int32
    # Independent: onnxruntime's NonMaxSuppression per class on each box's best class score.
    boxes, scores = raw[:4].T, raw[4:].T
    best = np.where(scores == scores.max(1, keepdims=True), scores, 0)
    want = _onnx_nms(boxes.copy(), best, 0.3, 0.25, int(xywh))
    assert 20 < len(want) < 200, "the model must give detections and suppress some"
    assert _kept_pairs(got, boxes, best) == want


def test_yolov5_head_scores_are_objectness_times_class() -> None:
    original = dm.yolov5_head()
    prepared, report = _nms(original, iou_threshold=0.3)
    assert (report.layout, report.box_format, report.attrs["box_coding"]) == ("yolov5", "xywh", 1)
    feeds = _feeds(original, seed=3)
    raw = ort.run(original, feeds)["output0"][0]
    got = ort.run(prepared, feeds, plugins=REGISTRY)
    scores = raw[:, 5:] * raw[:, 4:5]
    best = np.where(scores == scores.max(1, keepdims=True), scores, 0)
    want = _onnx_nms(raw[:, :4].copy(), best, 0.3, 0.25, 1)
    assert len(want) > 5
    assert _kept_pairs(got, raw[:, :4], best) == want


def test_family_defaults_are_those_of_the_head_code() -> None:
    assert _nms(dm.ultralytics_head())[1].attrs["iou_threshold"] == pytest.approx(0.7)
    v5 = _nms(dm.yolov5_head())[1].attrs
    assert (v5["iou_threshold"], v5["score_threshold"], v5["max_output_boxes"]) == (0.45, 0.25, 300)


def test_class_agnostic_keeps_every_class() -> None:
    original = dm.ultralytics_head()
    prepared, report = _nms(original, class_agnostic=True, iou_threshold=0.3)
    assert report.attrs["class_agnostic"] == 1 and not report.best_class_only
    feeds = _feeds(original)
    raw = ort.run(original, feeds)["output0"][0]
    got = ort.run(prepared, feeds, plugins=REGISTRY)
    best = raw[4:].max(0, keepdims=True).T
    want = {i for _, i in _onnx_nms(raw[:4].T.copy(), best, 0.3, 0.25, 1)}
    n = int(got["num_detections"][0, 0])
    found = {int(np.flatnonzero(best[:, 0] == s)[0]) for s in got["detection_scores"][0, :n]}
    assert found == want


@pytest.mark.parametrize("rows", [True, False])
def test_exported_nms_is_replaced_and_validated(tmp_path: Path, rows: bool) -> None:
    """ultralytics nms=True's [1, K, 6] output, or batched_nms's boxes/scores/labels: the NMS subgraph goes,
    its thresholds are kept, and validation compares the detections with the model's own NMS."""
    path = tmp_path / "model.onnx"
    onnx.save(dm.with_exported_nms(rows=rows, iou=0.6, max_det=50), path)
    recipe = recipe_with_overrides(default_recipe(), nms=True)
    assert [s.name for s in recipe.steps][:2] == ["sanitize", "nms"]
    report = prepare(path, tmp_path / "out", recipe=recipe)
    assert report.passed and report.validated
    assert report.plugins_inserted == {"TRT::EfficientNMS_TRT v1": 1}
    prepared = onnx.load(tmp_path / "out" / "model.onnx")
    ops = {n.op_type for n in prepared.graph.node}
    assert "NonMaxSuppression" not in ops and "NonZero" not in ops and "EfficientNMS_TRT" in ops
    nms_step = next(s for s in report.steps if s.name == "nms")
    assert "replacing the exported NMS (NonMaxSuppression_" in nms_step.summary
    assert "iou_threshold 0.6 (exported NMS)" in nms_step.summary
    assert "max_output_boxes 50 (exported NMS)" in nms_step.summary
    names = [o.name for o in report.comparison.outputs]
    assert names[-1].startswith("exported NMS (") and report.comparison.outputs[-1].passed
    assert "50 detection(s) of the exported NMS" in report.comparison.outputs[-1].note


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (dm.segment_head, "an ultralytics Segment or Pose head"),
        (dm.segment_head_one_concat, "an ultralytics Segment or Pose head"),
        (dm.end2end_head, "NMS-free end-to-end head"),
    ],
)
def test_heads_it_cannot_use_are_refused_in_one_line(model, message: str) -> None:
    with pytest.raises(GskitError, match=message) as err:
        _nms(model())
    assert "\n" not in str(err.value)


def test_no_head_found_says_what_it_looked_for() -> None:
    plain = parse_model(
        '<ir_version: 8, opset_import: ["" : 17]> g (float[1,8] x) => (float[1,8] y) {y = Relu(x)}'
    )
    with pytest.raises(GskitError, match="no YOLO detection head found .* nms: {tensor: NAME"):
        _nms(plain)
    # Naming a tensor reads its layout from its shape.
    with pytest.raises(GskitError, match="cannot tell the layout of tensor 'y'"):
        _nms(plain, tensor="y")


def test_options_the_plugin_would_refuse() -> None:
    with pytest.raises(GskitError, match="below 0.007"):
        NmsOptions(score_threshold=0.001)
    with pytest.raises(GskitError, match="iou_threshold must be > 0"):
        NmsOptions(iou_threshold=0.0)


def test_validation_catches_wrong_wiring(tmp_path: Path) -> None:
    """A prepared model whose plugin gets other boxes than the head's fails the wiring row."""
    original = dm.ultralytics_head()
    prepared, report = _nms(original, iou_threshold=0.3)
    graph = gsmodel.to_graph(prepared)
    (box_slice,) = [n for n in graph.nodes if n.outputs[0].name == report.plugin_inputs[0]]
    box_slice.inputs[1] = gs.Constant("wrong_start", np.array([1], dtype=np.int64))
    box_slice.inputs[2] = gs.Constant("wrong_end", np.array([5], dtype=np.int64))
    good = compare_detections(original, prepared, report, plugins=REGISTRY)
    bad = compare_detections(original, gsmodel.to_model(graph), report, plugins=REGISTRY)
    assert good.passed and not bad.passed
    assert not bad.outputs[0].passed and bad.outputs[0].name == report.plugin_inputs[0]


def test_plugin_inputs_numpy_side_matches_the_graph() -> None:
    original = dm.yolov5_head()
    prepared, report = _nms(original)
    graph = gsmodel.to_graph(prepared)
    from gskit.passes.edit import expose_tensors

    expose_tensors(graph, report.plugin_inputs)
    feeds = _feeds(original)
    got = ort.run(gsmodel.to_model(graph), feeds, plugins=REGISTRY)
    boxes, scores = plugin_inputs(ort.run(original, feeds)["output0"], "yolov5", best_class_only=True)
    np.testing.assert_array_equal(got[report.plugin_inputs[0]], boxes)
    np.testing.assert_array_equal(got[report.plugin_inputs[1]], scores)


# ---- torch exports of an ultralytics-style Detect decoding, both exporters --------------------------------


def _tiny_detect(xyxy: bool):
    import torch

    class TinyDetect(torch.nn.Module):
        """Boxes decoded as ultralytics' dist2bbox does, class scores through a sigmoid, [B, 4 + C, N]."""

        def __init__(self) -> None:
            super().__init__()
            self.box = torch.nn.Conv2d(3, 4, 1)
            self.cls = torch.nn.Conv2d(3, 3, 1)
            ys, xs = torch.meshgrid(torch.arange(8.0), torch.arange(8.0), indexing="ij")
            self.register_buffer("anchors", torch.stack([xs, ys]).reshape(1, 2, 64) + 0.5)
            self.register_buffer("strides", torch.full((1, 1, 64), 8.0))

        def forward(self, x):
            b = x.shape[0]
            lt, rb = self.box(x).view(b, 4, -1).exp().chunk(2, 1)
            x1y1, x2y2 = self.anchors - lt, self.anchors + rb
            pair = (x1y1, x2y2) if xyxy else ((x1y1 + x2y2) / 2, x2y2 - x1y1)
            return torch.cat((torch.cat(pair, 1) * self.strides, self.cls(x).view(b, 3, -1).sigmoid()), 1)

    return TinyDetect().eval()


@pytest.mark.torch
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")
@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.parametrize("xyxy", [False, True], ids=["xywh", "xyxy"])
def test_exported_detect_head_is_read(tmp_path: Path, dynamo: bool, xyxy: bool) -> None:
    import torch

    torch.manual_seed(0)
    path = tmp_path / "detect.onnx"
    x = torch.randn(1, 3, 8, 8)
    if dynamo:
        torch.onnx.export(
            _tiny_detect(xyxy), (x,), str(path), dynamo=True, input_names=["x"], output_names=["y"]
        )
    else:
        torch.onnx.export(
            _tiny_detect(xyxy),
            (x,),
            str(path),
            dynamo=False,
            opset_version=17,
            input_names=["x"],
            output_names=["y"],
        )
    report = prepare(path, tmp_path / "out", recipe=recipe_with_overrides(default_recipe(), nms=True))
    assert report.passed, report.comparison
    nms = next(s for s in report.steps if s.name == "nms")
    assert f"({'xyxy' if xyxy else 'xywh'} boxes)" in nms.summary
