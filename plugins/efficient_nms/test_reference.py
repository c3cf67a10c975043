"""EfficientNMS_TRT reference against NVIDIA's recorded plugin outputs and ONNX NonMaxSuppression.

* NVIDIA/TensorRT's golden input/output file of this plugin (``EfficientNMSPlugin_PluginGoldenIO.json``, in
  the repository from c94f85b3e131eb3b34ae4fff4a9aee1c31d2124c until 10.12 removed it): the two cases,
  per-class and class-agnostic, are reproduced exactly.
* onnxruntime's ``NonMaxSuppression`` (an independent implementation of greedy NMS): on random boxes with
  distinct scores the kept (class, box) pairs are the same set, per class and (with each box's best class)
  class-agnostic, for corner and center-size boxes. ONNX suppresses at IoU > threshold and keeps scores
  > threshold where the plugin uses >=; random float data has no ties, so both rules agree.
Boxes and scores are compared exactly (the reference copies input values); float16 inputs likewise.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from .reference import efficient_nms
from .spec import SPEC

# NVIDIA's golden case: six boxes [y1, x1, y2, x2] of two classes, score_threshold 0, iou_threshold 0.5.
GOLDEN_BOXES = np.array(
    [
        [
            [0, 0, 1, 1],
            [0, 0.1, 1, 1.1],
            [0, -0.1, 1, 0.9],
            [0, 10, 1, 11],
            [0, 10.1, 1, 11.1],
            [0, 100, 1, 101],
        ]
    ],
    dtype=np.float32,
)
GOLDEN_SCORES = np.array(
    [[[0.21, 0.22], [0.32, 0.13], [0.30, 0.16], [0.74, 0.06], [0.10, 0.93], [0.77, 0.64]]], dtype=np.float32
)
# Rows of GOLDEN_BOXES the plugin output, in its order: per class, and class-agnostic (then zero padding).
GOLDEN_PER_CLASS = [4, 5, 3, 5, 1, 0]
GOLDEN_AGNOSTIC = [4, 5, 1]


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


@pytest.mark.parametrize(("agnostic", "rows"), [(0, GOLDEN_PER_CLASS), (1, GOLDEN_AGNOSTIC)])
def test_nvidia_golden_outputs(agnostic: int, rows: list[int]) -> None:
    num, boxes, scores, classes = efficient_nms(
        GOLDEN_BOXES,
        GOLDEN_SCORES,
        score_threshold=0.0,
        iou_threshold=0.5,
        max_output_boxes=6,
        class_agnostic=agnostic,
    )
    assert num.tolist() == [[len(rows)]] and num.dtype == np.int32
    expected = np.zeros((1, 6, 4), dtype=np.float32)
    expected[0, : len(rows)] = GOLDEN_BOXES[0, rows]
    np.testing.assert_array_equal(boxes, expected)
    assert (scores[0, len(rows) :] == 0).all() and (classes[0, len(rows) :] == 0).all()
    assert (np.diff(scores[0, : len(rows)]) <= 0).all(), "detections come highest score first"


def _onnx_nms(boxes: np.ndarray, scores: np.ndarray, iou: float, threshold: float, center: int) -> np.ndarray:
    """onnxruntime's NonMaxSuppression: selected ``[K, 3]`` (batch, class, box)."""
    node = helper.make_node(
        "NonMaxSuppression", ["boxes", "scores", "max", "iou", "thr"], ["sel"], center_point_box=center
    )
    graph = helper.make_graph(
        [node],
        "nms",
        [
            helper.make_tensor_value_info("boxes", TensorProto.FLOAT, boxes.shape),
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, scores.transpose(0, 2, 1).shape),
        ],
        [helper.make_tensor_value_info("sel", TensorProto.INT64, ["K", 3])],
        initializer=[
            helper.make_tensor("max", TensorProto.INT64, [1], [10_000]),
            helper.make_tensor("iou", TensorProto.FLOAT, [1], [iou]),
            helper.make_tensor("thr", TensorProto.FLOAT, [1], [threshold]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=8)
    onnx.checker.check_model(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"boxes": boxes, "scores": scores.transpose(0, 2, 1).copy()})[0]


def _random_detections(rng: np.random.Generator, center: bool) -> tuple[np.ndarray, np.ndarray]:
    """Crowded boxes (many overlaps) of 2 images x 300 boxes x 4 classes."""
    xy = rng.uniform(0, 100, size=(2, 300, 2))
    wh = rng.uniform(5, 40, size=(2, 300, 2))
    boxes = np.concatenate([xy, wh] if center else [xy, xy + wh], axis=-1).astype(np.float32)
    return boxes, rng.random((2, 300, 4)).astype(np.float32)


@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize("iou", [0.3, 0.5, 0.7])
def test_per_class_matches_onnx_nonmaxsuppression(rng: np.random.Generator, center: int, iou: float) -> None:
    boxes, scores = _random_detections(rng, bool(center))
    threshold = 0.25
    num, out_boxes, out_scores, out_classes = efficient_nms(
        boxes, scores, score_threshold=threshold, iou_threshold=iou, max_output_boxes=1200, box_coding=center
    )
    selected = _onnx_nms(boxes, scores, iou, threshold, center)
    for b in range(2):
        n = int(num[b, 0])
        want = {(int(c), int(i)) for bb, c, i in selected if bb == b}
        got_pairs = set()
        for k in range(n):
            cls = int(out_classes[b, k])
            (index,) = np.flatnonzero(scores[b, :, cls] == out_scores[b, k])
            got_pairs.add((cls, int(index)))
        assert got_pairs == want
        assert (np.diff(out_scores[b, :n]) <= 0).all()
        if center:  # corner output of [cx, cy, w, h] input
            index = [i for _, i in sorted(got_pairs)]
            assert np.isin(out_boxes[b, :n, 0], boxes[b, index, 0] - boxes[b, index, 2] * 0.5).all()


def test_class_agnostic_matches_nms_of_each_box_best_class(rng: np.random.Generator) -> None:
    boxes, scores = _random_detections(rng, False)
    num, _, out_scores, out_classes = efficient_nms(
        boxes, scores, score_threshold=0.25, iou_threshold=0.45, max_output_boxes=1200, class_agnostic=1
    )
    best = scores.max(axis=2, keepdims=True)
    selected = _onnx_nms(boxes, best, 0.45, 0.25, 0)
    for b in range(2):
        n = int(num[b, 0])
        want = sorted(int(i) for bb, _, i in selected if bb == b)
        got = [int(np.flatnonzero(best[b, :, 0] == s)[0]) for s in out_scores[b, :n]]
        assert sorted(got) == want
        np.testing.assert_array_equal(out_classes[b, :n], scores[b].argmax(axis=1)[got])


def test_limits_background_and_top_k(rng: np.random.Generator) -> None:
    boxes, scores = _random_detections(rng, False)
    full = efficient_nms(boxes, scores, score_threshold=0.1, max_output_boxes=1200)
    few = efficient_nms(boxes, scores, score_threshold=0.1, max_output_boxes=7)
    assert (few[0] == 7).all()
    np.testing.assert_array_equal(few[1], full[1][:, :7])
    no_class_2 = efficient_nms(boxes, scores, score_threshold=0.1, max_output_boxes=1200, background_class=2)
    assert not (no_class_2[3][0, : no_class_2[0][0, 0]] == 2).any()
    # Only the 20 best-scored candidates reach the IoU stage.
    top = efficient_nms(boxes, scores, score_threshold=0.1, max_output_boxes=1200, pre_nms_top_k=20)
    assert top[0][0, 0] <= 20
    assert top[2][0, top[0][0, 0] - 1] >= np.sort(scores[0].reshape(-1))[-20]


def test_score_activation_takes_logits(rng: np.random.Generator) -> None:
    boxes, scores = _random_detections(rng, False)
    logits = np.log(scores / (1 - scores)).astype(np.float32)
    plain = efficient_nms(boxes, scores, score_threshold=0.3, max_output_boxes=500)
    activated = efficient_nms(boxes, logits, score_threshold=0.3, max_output_boxes=500, score_activation=1)
    np.testing.assert_array_equal(plain[0], activated[0])
    np.testing.assert_array_equal(plain[1], activated[1])
    np.testing.assert_allclose(plain[2], activated[2], rtol=1e-5)


def test_anchors_decode_before_nms(rng: np.random.Generator) -> None:
    anchors = np.concatenate([rng.uniform(10, 90, (1, 50, 2)), rng.uniform(5, 20, (1, 50, 2))], -1)
    anchors = anchors.astype(np.float32)
    deltas = rng.normal(0, 0.2, size=(1, 50, 4)).astype(np.float32)
    scores = rng.random((1, 50, 2)).astype(np.float32)
    centers = deltas[..., :2] * anchors[..., 2:] + anchors[..., :2]
    decoded = np.concatenate([centers, anchors[..., 2:] * np.exp(deltas[..., 2:])], -1)
    fused = efficient_nms(deltas, scores, anchors, box_coding=1, max_output_boxes=50)
    plain = efficient_nms(decoded.astype(np.float32), scores, box_coding=1, max_output_boxes=50)
    np.testing.assert_array_equal(fused[0], plain[0])
    np.testing.assert_allclose(fused[1], plain[1], rtol=1e-5, atol=1e-4)


def test_boxes_per_class_and_float16(rng: np.random.Generator) -> None:
    boxes, scores = _random_detections(rng, False)
    per_class = np.repeat(boxes[:, :, None, :], 4, axis=2)
    np.testing.assert_array_equal(
        efficient_nms(per_class, scores, max_output_boxes=300)[1],
        efficient_nms(boxes, scores, max_output_boxes=300)[1],
    )
    half = efficient_nms(boxes.astype(np.float16), scores.astype(np.float16), max_output_boxes=300)
    assert half[1].dtype == np.float16 and half[2].dtype == np.float16 and half[3].dtype == np.int32


@pytest.mark.parametrize(
    "fields",
    [{"score_threshold": -0.1}, {"iou_threshold": 0.0}, {"max_output_boxes": 0}, {"box_coding": 2}],
)
def test_fields_the_creator_refuses(rng: np.random.Generator, fields: dict) -> None:
    boxes, scores = _random_detections(rng, False)
    with pytest.raises(ValueError, match=next(iter(fields))):
        efficient_nms(boxes, scores, **fields)


def test_spec_fields_are_what_the_parser_passes() -> None:
    """The creator's fields (efficientNMSPlugin.cpp): FLOAT32 thresholds, INT32 for the rest."""
    kinds = {a.name: a.type.value for a in SPEC.attributes}
    assert kinds == {
        "score_threshold": "float",
        "iou_threshold": "float",
        "max_output_boxes": "int",
        "background_class": "int",
        "score_activation": "int",
        "class_agnostic": "int",
        "box_coding": "int",
    }
    assert (SPEC.namespace, SPEC.domain, SPEC.version, SPEC.library) == ("", "TRT", "1", "libnvinfer_plugin")
