"""EfficientNMS_TRT v1: TensorRT's own non-maximum suppression plugin (``libnvinfer_plugin``).

TensorRT implements it: this folder has no kernel and no ``trt_plugin.py``, only what gskit needs to write
the node, infer its outputs and run it on onnxruntime (``reference.efficient_nms``). Inputs, outputs and
fields as NVIDIA/TensorRT's ``plugin/efficientNMSPlugin`` defines them (README.md says where each fact
comes from).
The ``gskit prepare --nms`` step (``gskit.passes.nms``) writes these nodes behind detection heads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from onnx import TensorProto

from gskit.errors import PluginError
from gskit.plugin import Attribute, AttrType, PluginSpec, TensorInfo, libnvinfer, patterns_in

from .reference import efficient_nms


def example_inputs(rng: np.random.Generator) -> list[np.ndarray]:
    """Boxes ``[2, 64, 4]`` (corners), scores ``[2, 64, 3]`` and anchors ``[1, 64, 4]`` (added to the boxes)
    for a one-node test model."""
    corner = rng.uniform(0, 50, size=(2, 64, 2))
    size = rng.uniform(2, 20, size=(2, 64, 2))
    boxes = np.concatenate([corner, corner + size], axis=-1).astype(np.float32)
    anchors = rng.uniform(-2, 2, size=(1, 64, 4)).astype(np.float32)
    return [boxes, rng.random((2, 64, 3)).astype(np.float32), anchors]


def infer(inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any]) -> list[TensorInfo]:
    """``num_detections [B, 1]`` int32, ``detection_boxes [B, max, 4]``, ``detection_scores [B, max]`` (the
    boxes' and scores' dtypes) and ``detection_classes [B, max]`` int32, ``B`` from the boxes (symbolic kept).

    Raises:
        PluginError: boxes or scores are absent, or of a known rank the plugin does not take.
    """
    boxes, scores = inputs[0], inputs[1] if len(inputs) > 1 else None
    if boxes is None or scores is None:
        raise PluginError("EfficientNMS_TRT needs inputs boxes and scores")
    if boxes.shape is not None and len(boxes.shape) not in (3, 4):
        raise PluginError(f"EfficientNMS_TRT boxes have rank {len(boxes.shape)}, expected 3 or 4")
    if scores.shape is not None and len(scores.shape) != 3:
        raise PluginError(f"EfficientNMS_TRT scores have rank {len(scores.shape)}, expected 3")
    top = int(attrs.get("max_output_boxes", 100))
    batch = boxes.shape[0] if boxes.shape else scores.shape[0] if scores.shape else None
    return [
        TensorInfo(TensorProto.INT32, (batch, 1)),
        TensorInfo(boxes.dtype, (batch, top, 4)),
        TensorInfo(scores.dtype, (batch, top)),
        TensorInfo(TensorProto.INT32, (batch, top)),
    ]


SPEC = PluginSpec(
    name="EfficientNMS_TRT",
    **libnvinfer.SPEC_FIELDS,
    version="1",
    inputs=("boxes", "scores", "anchors?"),
    outputs=("num_detections", "detection_boxes", "detection_scores", "detection_classes"),
    attributes=(
        Attribute("score_threshold", AttrType.FLOAT, 0.25, doc="candidates need a score >= this (>= 0)"),
        Attribute("iou_threshold", AttrType.FLOAT, 0.45, doc="suppress where IoU >= this (> 0)"),
        Attribute("max_output_boxes", AttrType.INT, 100, doc="detections per image (> 0)"),
        Attribute("background_class", AttrType.INT, -1, doc="class never detected; -1: none"),
        Attribute("score_activation", AttrType.INT, 0, doc="1: scores are logits, sigmoid applied"),
        Attribute("class_agnostic", AttrType.INT, 0, doc="1: one NMS over all classes (TensorRT >= 8.6)"),
        Attribute("box_coding", AttrType.INT, 0, doc="0: corners, 1: center and size"),
    ),
    infer=infer,
    reference=efficient_nms,
    patterns=patterns_in(".patterns", __package__),  # built when replacing reads them
    supports_fp16=True,
    doc=(
        "TensorRT's EfficientNMS_TRT (libnvinfer_plugin, deprecated since 10.12 in favour of INMSLayer): "
        "score filter, sort, top 5000, per-class or class-agnostic greedy IoU suppression; outputs "
        "num_detections, corner boxes, scores and int32 classes, padded with zeros."
    ),
)
