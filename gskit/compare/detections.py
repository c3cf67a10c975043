"""Validation of an ``nms`` step: the model's outputs changed, so outputs are not compared by name.

The ``nms`` pass (``gskit.passes.nms``) replaced the detection head's raw output (and an NMS the exporter
wrote) with the four outputs of TensorRT's ``EfficientNMS_TRT``. What "validated" means here, checked on
onnxruntime with the same inputs for both models:

1. **The wiring.** The ``boxes`` and ``scores`` the plugin node receives in the prepared model equal what
   ``plugin_inputs`` computes from the original model's raw head output (every candidate, within the
   tolerances): the slices, transposes, objectness products and best-class masks are right.
2. **The detections.** The prepared model's four outputs equal the plugin's reference applied to the
   original's raw head output: the same number per image, and the detections matched one to one by class and
   IoU, with boxes and scores within the tolerances.
3. **The original's own NMS**, where it had one ([B, K, 6] rows ``x1 y1 x2 y2 score class`` as ultralytics
   ``nms=True`` writes, or ``boxes``/``scores``/``labels`` outputs): its detections and the prepared model's,
   matched the same way. This says whether EfficientNMS_TRT's rule (``>=`` at both thresholds, a top-5000
   cut) did what the model's NMS did on these inputs.

What it does not say: that TensorRT's plugin computes what its reference does (the reference follows the
plugin's CUDA source and is tested against NVIDIA's recorded outputs; the GPU test runs the plugin itself),
and anything about detections the inputs do not produce: random inputs of an untrained head may score no box
above the threshold, and then 2. and 3. compare empty sets. Each row's note gives the number of detections.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from gskit.backends import ort as ort_backend
from gskit.compare.options import CompareOptions, ModelSource, header_fields, source_model
from gskit.compare.outputs import (
    CompareReport,
    OutputComparison,
    ReferenceRunError,
    compare_arrays,
    describe_feeds,
)
from gskit.errors import GskitError, ModelLoadError, PluginError
from gskit.io import model as gsmodel
from gskit.io.feeds import feed_shapes
from gskit.passes.edit import expose_tensors
from gskit.passes.nms import PLUGIN_KEY, NmsReport, plugin_inputs
from gskit.plugin.registry import PluginRegistry

#: IoU at which two detections of the same class are the same detection.
MATCH_IOU = 0.5


def compare_detections(
    original: ModelSource,
    prepared: ModelSource,
    nms: NmsReport,
    options: CompareOptions | None = None,
    **changes: Any,
) -> CompareReport:
    """Compare a model prepared with an ``nms`` step with its original (see the module docstring), on
    onnxruntime with ``options``' inputs, tolerances and plugins (:class:`CompareOptions`; ``changes``: fields
    of it to change).

    Raises:
        ReferenceRunError: the original cannot run on the inputs.
        GskitError: the prepared model cannot run, or the EfficientNMS_TRT spec is not loaded.
    """
    options = CompareOptions.given(options, changes).plugins_for(always=True)
    plugins = options.plugins
    spec = plugins.get(*PLUGIN_KEY) if plugins is not None else None
    if spec is None:
        raise GskitError("validating an nms step needs the EfficientNMS_TRT plugin spec; it is not loaded")
    original_proto = source_model(original)
    feeds = options.feeds_for(original_proto)
    raw_outputs = [nms.head, *(n for n in nms.replaced_outputs if n != nms.head)]
    try:
        got_original = _run_exposing(original_proto, raw_outputs, feeds, plugins)
    except (ModelLoadError, PluginError):
        raise  # no other inputs would help
    except GskitError as err:
        raise ReferenceRunError(
            f"the original model cannot run on the inputs {describe_feeds(feeds)}: {err}",
            str(err),
            feed_shapes(feeds),
        ) from err
    got_prepared = _run_exposing(source_model(prepared), [*nms.plugin_inputs, *nms.outputs], feeds, plugins)
    boxes, scores = plugin_inputs(got_original[nms.head], nms.layout, best_class_only=nms.best_class_only)
    expected = spec.run_reference([boxes, scores], nms.attrs)
    rows = [
        dataclasses.replace(r, note=f"EfficientNMS_TRT input from the original's '{nms.head}'")
        for r in _rows(nms.plugin_inputs, [boxes, scores], got_prepared, options)
    ]
    rows += _detection_rows(nms, expected, [got_prepared[n] for n in nms.outputs], options)
    own = _own_nms_row(nms, got_original, [got_prepared[n] for n in nms.outputs], options)
    if own is not None:
        rows.append(own)
    return CompareReport(outputs=rows, **header_fields(options, feeds, all(r.passed for r in rows)))


def _rows(
    names: Sequence[str],
    expected: Sequence[np.ndarray],
    actual: Mapping[str, np.ndarray],
    options: CompareOptions,
) -> list[OutputComparison]:
    """``expected`` (in the order of ``names``) against ``actual`` (by name), with the options' tolerances."""
    reference = dict(zip(names, expected, strict=True))
    return compare_arrays(reference, actual, list(names), atol=options.atol, rtol=options.rtol)


def _run_exposing(
    model: onnx.ModelProto,
    names: Sequence[str],
    feeds: Mapping[str, np.ndarray],
    plugins: PluginRegistry | None,
) -> dict[str, np.ndarray]:
    """Run ``model`` on onnxruntime with ``names`` (intermediate tensors too) as outputs."""
    graph = gsmodel.to_graph(model)
    expose_tensors(graph, names)
    graph.outputs = [t for t in graph.outputs if t.name in set(names)]
    return ort_backend.run(gsmodel.to_model(graph), feeds, outputs=list(names), plugins=plugins)


Detections = list[
    tuple[np.ndarray, np.ndarray, np.ndarray]
]  # per image: boxes [K, 4], scores [K], classes [K]


def _per_image(outputs: Sequence[np.ndarray]) -> Detections:
    num, boxes, scores, classes = outputs
    return [
        (boxes[b, : int(num[b, 0])], scores[b, : int(num[b, 0])], classes[b, : int(num[b, 0])])
        for b in range(num.shape[0])
    ]


def _detection_rows(
    nms: NmsReport, expected: Sequence[np.ndarray], actual: Sequence[np.ndarray], options: CompareOptions
) -> list[OutputComparison]:
    """The four outputs against the reference, after matching detections (their order may differ at ties)."""
    want, have = _per_image(expected), _per_image(actual)
    order = _match(want, have)
    count = sum(len(s) for _, s, _ in want)
    if order is None:
        note = (
            f"detections differ from the reference on the original's head output "
            f"({[len(s) for _, s, _ in want]} expected per image, {[len(s) for _, s, _ in have]} found)"
        )
        rows = _rows(nms.outputs, expected, dict(zip(nms.outputs, actual, strict=True)), options)
        return [dataclasses.replace(r, passed=False, note=note) for r in rows]
    aligned = [np.array(a, copy=True) for a in actual]
    for b, perm in enumerate(order):
        for out in aligned[1:]:
            out[b, : len(perm)] = out[b, perm]
    rows = _rows(nms.outputs, expected, dict(zip(nms.outputs, aligned, strict=True)), options)
    note = f"{count} detection(s) of the reference on the original's '{nms.head}', matched by class and IoU"
    if count == 0:
        note = f"no detection on these inputs (no score >= {nms.attrs['score_threshold']}): compared empty"
    return [dataclasses.replace(r, note=note) for r in rows]


def _match(want: Detections, have: Detections) -> list[list[int]] | None:
    """For each image, the index in ``have`` of each detection of ``want``; None when they are not the same
    set (another count, a detection without a partner of its class at IoU >= MATCH_IOU)."""
    order = []
    for (w_boxes, _, w_classes), (h_boxes, _, h_classes) in zip(want, have, strict=True):
        if len(w_boxes) != len(h_boxes):
            return None
        free = set(range(len(h_boxes)))
        perm = []
        for box, cls in zip(w_boxes, w_classes, strict=True):
            candidates = [j for j in free if h_classes[j] == cls]
            if not candidates:
                return None
            ious = _iou(box, h_boxes[candidates])
            best = int(np.argmax(ious))
            if ious[best] < MATCH_IOU:
                return None
            perm.append(candidates[best])
            free.discard(candidates[best])
        order.append(perm)
    return order


def _iou(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    box, others = box.astype(np.float64), others.astype(np.float64)
    low = np.maximum(np.minimum(box[:2], box[2:]), np.minimum(others[:, :2], others[:, 2:]))
    high = np.minimum(np.maximum(box[:2], box[2:]), np.maximum(others[:, :2], others[:, 2:]))
    inter = np.prod(np.clip(high - low, 0, None), axis=1)
    area = np.prod(np.abs(box[2:] - box[:2]))
    areas = np.prod(np.abs(others[:, 2:] - others[:, :2]), axis=1)
    union = area + areas - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def _own_nms_row(
    nms: NmsReport,
    original: Mapping[str, np.ndarray],
    actual: Sequence[np.ndarray],
    options: CompareOptions,
) -> OutputComparison | None:
    """The original's exported NMS against the prepared detections, when its output format is known."""
    if not nms.exported_nms:
        return None
    theirs = _read_own_nms([original[n] for n in nms.replaced_outputs if n in original and n != nms.head])
    name = f"exported NMS ({', '.join(nms.replaced_outputs)}) vs EfficientNMS_TRT"
    if theirs is None:
        return OutputComparison(
            name,
            (),
            "",
            0.0,
            0.0,
            True,
            note="not compared: the exported NMS's output format is not one gskit reads",
        )
    ours = _per_image(actual)
    if len(theirs) != len(ours):
        theirs = theirs[: len(ours)]
    order = _match(theirs, ours)
    count = sum(len(s) for _, s, _ in theirs)
    if order is None:
        return OutputComparison(
            name,
            (count,),
            "detections",
            float("inf"),
            float("inf"),
            False,
            note=f"the exported NMS kept {[len(s) for _, s, _ in theirs]} detection(s) per image, "
            f"EfficientNMS_TRT {[len(s) for _, s, _ in ours]}, or they differ in class or place",
        )
    err = max(
        (
            float(np.abs(s.astype(np.float64) - ours[b][1][perm].astype(np.float64)).max())
            for b, ((_, s, _), perm) in enumerate(zip(theirs, order, strict=True))
            if len(s)
        ),
        default=0.0,
    )
    passed = err <= options.atol + options.rtol
    note = f"{count} detection(s) of the exported NMS, matched by class and IoU >= {MATCH_IOU}"
    if count == 0:
        note = "the exported NMS kept no detection on these inputs: compared empty"
    return OutputComparison(
        name, (count,), "detections", err, err, passed, atol=options.atol, rtol=options.rtol, note=note
    )


def _read_own_nms(outputs: Sequence[np.ndarray]) -> Detections | None:
    """Detections from an exported NMS's outputs: ``[B, K, 6]`` rows (zero rows unused), or three outputs
    ``boxes [K, 4]``, ``scores [K]``, ``labels [K]`` of one image; None for other formats."""
    if len(outputs) == 1 and outputs[0].ndim == 3 and outputs[0].shape[2] == 6:
        rows = outputs[0]
        found = []
        for image in rows:
            used = image[image[:, 4] > 0]
            found.append((used[:, :4], used[:, 4], used[:, 5].astype(np.int64)))
        return found
    if len(outputs) == 3:
        by_rank = sorted(outputs, key=lambda a: (a.ndim, a.dtype.kind == "f"))
        labels, scores, boxes = (
            by_rank if by_rank[0].dtype.kind != "f" else (by_rank[1], by_rank[0], by_rank[2])
        )
        if boxes.ndim == 2 and boxes.shape[1] == 4 and scores.ndim == labels.ndim == 1:
            return [(boxes, scores, labels.astype(np.int64))]
    return None
