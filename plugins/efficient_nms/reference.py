"""Numpy reference of TensorRT's ``EfficientNMS_TRT`` v1, step by step as its CUDA source does it.

Source: NVIDIA/TensorRT ``plugin/efficientNMSPlugin/efficientNMSInference.cu`` and ``.cuh`` at
82d1dca801c8318a5605399d5240780d0679e4e1 (11.1). See README.md for the facts and where the plugin's
behaviour is not deterministic.
"""

from __future__ import annotations

import numpy as np

#: Candidates that reach the IoU stage, per image: ``EfficientNMSPlugin::initialize`` sets 5000 on GPUs with
#: 64K registers per block (every data-center and RTX GPU; 2000 on Jetson TX1/TX2). The README says 4096.
PRE_NMS_TOP_K = 5000


def efficient_nms(
    boxes: np.ndarray,
    scores: np.ndarray,
    anchors: np.ndarray | None = None,
    *,
    score_threshold: float = 0.25,
    iou_threshold: float = 0.45,
    max_output_boxes: int = 100,
    background_class: int = -1,
    score_activation: int = 0,
    class_agnostic: int = 0,
    box_coding: int = 0,
    pre_nms_top_k: int = PRE_NMS_TOP_K,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Non-maximum suppression of TensorRT's ``EfficientNMS_TRT`` plugin.

    Per image: every (box, class) element whose score is at least ``score_threshold`` (with
    ``score_activation``, the raw score at least ``log(t / (1 - t))``, which is ``sigmoid(score) >= t``) and
    whose class is not ``background_class`` is a candidate; candidates are sorted by score, highest first
    (ties: lower ``box * C + class`` first), the first ``pre_nms_top_k`` are kept; then, in that order, a
    candidate not yet suppressed is kept and suppresses every later candidate of the same class (any class
    when ``class_agnostic``) whose IoU with it is ``>= iou_threshold``, until ``max_output_boxes`` are kept.
    IoU is computed on corner boxes with each pair of coordinates ordered; a box of zero or negative area
    has IoU 0 with everything.

    Boxes: ``box_coding`` 0 reads ``[a1, b1, a2, b2]`` corners (``[x1, y1, x2, y2]`` or ``[y1, x1, y2, x2]``,
    both work), 1 reads ``[a, b, sa, sb]`` center and size (``[cx, cy, w, h]``) and writes ``[a - sa/2,
    b - sb/2, a + sa/2, b + sb/2]``, so the coordinates keep their order. With ``anchors`` (the fused box
    decoder): coding 0 adds the anchor to the box (both reordered first); coding 1 decodes ``[a * sa_anchor
    + a_anchor, b * sb_anchor + b_anchor, sa_anchor * exp(sa), sb_anchor * exp(sb)]``.

    Args:
        boxes: ``[B, N, 4]``, or ``[B, N, C, 4]`` (one box per class).
        scores: ``[B, N, C]``.
        anchors: ``[1, N, 4]`` or ``[B, N, 4]``, or None.
        score_threshold: see above; ``>= 0``.
        iou_threshold: see above; ``> 0``.
        max_output_boxes: detections per image; ``> 0``.
        background_class: a class never detected; -1 for none.
        score_activation: 1: scores are logits; the output scores are their sigmoid.
        class_agnostic: 1: boxes of any class suppress each other.
        box_coding: 0 corners, 1 center and size.
        pre_nms_top_k: candidates per image that reach the IoU stage (:data:`PRE_NMS_TOP_K`).

    Returns:
        ``num_detections [B, 1]`` int32, ``detection_boxes [B, max_output_boxes, 4]`` (corners, the dtype of
        ``boxes``), ``detection_scores [B, max_output_boxes]`` (the dtype of ``scores``) and
        ``detection_classes [B, max_output_boxes]`` int32; slots past ``num_detections`` are 0.

    Raises:
        ValueError: a field out of the range the plugin's creator accepts, or shapes that do not fit.
    """
    _check_fields(
        score_threshold, iou_threshold, max_output_boxes, score_activation, class_agnostic, box_coding
    )
    batch, count, classes = _check_shapes(boxes, scores, anchors)
    out_boxes = np.zeros((batch, max_output_boxes, 4), dtype=boxes.dtype)
    out_scores = np.zeros((batch, max_output_boxes), dtype=scores.dtype)
    out_classes = np.zeros((batch, max_output_boxes), dtype=np.int32)
    num = np.zeros((batch, 1), dtype=np.int32)
    threshold = _threshold(score_threshold, bool(score_activation), scores.dtype)
    for b in range(batch):
        flat = scores[b].reshape(-1)
        keep = flat >= threshold
        if 0 <= background_class < classes:
            keep[background_class::classes] = False
        index = np.flatnonzero(keep)
        order = index[np.argsort(-flat[index].astype(np.float64), kind="stable")][:pre_nms_top_k]
        anchor_of, class_of = order // classes, (order % classes).astype(np.int32)
        decoded = _decode(boxes[b], anchors, b, anchor_of, class_of, box_coding)
        kept = _suppress(decoded, class_of, iou_threshold, bool(class_agnostic), max_output_boxes)
        n = len(kept)
        num[b, 0] = n
        out_boxes[b, :n] = decoded[kept]
        chosen = flat[order[kept]]
        out_scores[b, :n] = _sigmoid(chosen) if score_activation else chosen
        out_classes[b, :n] = class_of[kept]
    return num, out_boxes, out_scores, out_classes


def _check_fields(
    score_threshold: float,
    iou_threshold: float,
    max_output_boxes: int,
    score_activation: int,
    class_agnostic: int,
    box_coding: int,
) -> None:
    """The ranges ``EfficientNMSPluginCreator::createPlugin`` validates (a node outside them fails there)."""
    if not score_threshold >= 0:
        raise ValueError(f"score_threshold must be >= 0, got {score_threshold}")
    if not iou_threshold > 0:
        raise ValueError(f"iou_threshold must be > 0, got {iou_threshold}")
    if max_output_boxes <= 0:
        raise ValueError(f"max_output_boxes must be > 0, got {max_output_boxes}")
    for name, value in (
        ("score_activation", score_activation),
        ("class_agnostic", class_agnostic),
        ("box_coding", box_coding),
    ):
        if value not in (0, 1):
            raise ValueError(f"{name} must be 0 or 1, got {value}")


def _check_shapes(boxes: np.ndarray, scores: np.ndarray, anchors: np.ndarray | None) -> tuple[int, int, int]:
    if scores.ndim != 3:
        raise ValueError(f"scores must be [B, N, C], got shape {scores.shape}")
    batch, count, classes = scores.shape
    shared = (batch, count, 4)
    if boxes.shape not in (shared, (batch, count, classes, 4)):
        raise ValueError(
            f"boxes must be [B, N, 4] or [B, N, C, 4] for scores {scores.shape}, got {boxes.shape}"
        )
    if anchors is not None and anchors.shape not in ((1, count, 4), shared):
        raise ValueError(f"anchors must be [1, N, 4] or [B, N, 4], got {anchors.shape}")
    return batch, count, classes


def _threshold(score_threshold: float, logits: bool, dtype: np.dtype) -> np.floating:
    """The threshold the filter compares raw scores with (``EfficientNMSFilterLauncher``)."""
    if not logits:
        return np.asarray(score_threshold, dtype=np.float32).astype(dtype)
    t = np.float32(score_threshold)
    if t <= 0:
        return np.asarray(-(1 << 15), dtype=dtype)
    return np.asarray(np.log(t / (np.float32(1) - t)), dtype=np.float32).astype(dtype)


def _decode(
    boxes: np.ndarray,
    anchors: np.ndarray | None,
    b: int,
    anchor_of: np.ndarray,
    class_of: np.ndarray,
    box_coding: int,
) -> np.ndarray:
    """Corner boxes ``[K, 4]`` of the candidates of one image (``boxes`` ``[N, 4]`` or ``[N, C, 4]``), in
    the input dtype (``MapNMSData``, ``DecodeBoxes``)."""
    chosen = boxes[anchor_of] if boxes.ndim == 2 else boxes[anchor_of, class_of]
    if anchors is not None:
        anchor = anchors[0 if anchors.shape[0] == 1 else b][anchor_of]
        if box_coding == 0:
            return _ordered(chosen) + _ordered(anchor)
        a, c, sa, sc = (chosen[:, i] for i in range(4))
        chosen = np.stack(
            [
                a * anchor[:, 2] + anchor[:, 0],
                c * anchor[:, 3] + anchor[:, 1],
                anchor[:, 2] * np.exp(sa),
                anchor[:, 3] * np.exp(sc),
            ],
            axis=1,
        ).astype(boxes.dtype)
    if box_coding == 0:
        return chosen
    half = chosen[:, 2:] * boxes.dtype.type(0.5)
    return np.concatenate([chosen[:, :2] - half, chosen[:, :2] + half], axis=1)


def _ordered(corners: np.ndarray) -> np.ndarray:
    """Each coordinate pair ascending (``BoxCorner::reorder``)."""
    low = np.minimum(corners[:, :2], corners[:, 2:])
    high = np.maximum(corners[:, :2], corners[:, 2:])
    return np.concatenate([low, high], axis=1)


def _suppress(
    corners: np.ndarray, classes: np.ndarray, iou_threshold: float, agnostic: bool, limit: int
) -> np.ndarray:
    """Indices (into the sorted candidates) that the greedy IoU stage keeps (``EfficientNMS`` kernel)."""
    ordered = _ordered(corners.astype(np.float32))
    areas = _areas(ordered)
    alive = np.ones(len(ordered), dtype=bool)
    kept: list[int] = []
    threshold = np.float32(iou_threshold)
    for i in range(len(ordered)):
        if not alive[i]:
            continue
        kept.append(i)
        if len(kept) == limit:
            break
        later = np.arange(i + 1, len(ordered))
        later = later[alive[later]]
        if not agnostic:
            later = later[classes[later] == classes[i]]
        if later.size:
            alive[later[_iou(ordered[i], areas[i], ordered[later], areas[later]) >= threshold]] = False
    return np.asarray(kept, dtype=np.intp)


def _areas(ordered: np.ndarray) -> np.ndarray:
    extent = ordered[:, 2:] - ordered[:, :2]
    return np.where((extent > 0).all(axis=1), extent[:, 0] * extent[:, 1], np.float32(0))


def _iou(box: np.ndarray, area: np.float32, others: np.ndarray, other_areas: np.ndarray) -> np.ndarray:
    """IoU of one ordered box with many (``IOU`` in the source): 0 for an empty intersection or union."""
    low = np.maximum(box[:2], others[:, :2])
    high = np.minimum(box[2:], others[:, 2:])
    inter = _areas(np.concatenate([low, high], axis=1))
    union = area + other_areas - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where((inter > 0) & (union > 0), inter / np.where(union > 0, union, 1), np.float32(0))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    wide = x.astype(np.float32)
    return (1 / (1 + np.exp(-wide))).astype(x.dtype)
