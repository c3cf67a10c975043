"""The ``nms`` pass: TensorRT's ``EfficientNMS_TRT`` behind a YOLO-family detection head.

The pass finds the raw output of the detection head, adds the nodes that turn it into the plugin's ``boxes``
and ``scores`` inputs, and makes the plugin's four outputs (``num_detections``, ``detection_boxes``,
``detection_scores``, ``detection_classes``) the model's outputs in place of the head's and of everything
computed from it (an NMS the exporter wrote, ONNX ``NonMaxSuppression`` with its gathers, goes that way).

Heads it reads, by their structure (the layout of the exporters' graphs, not tensor names):

* **ultralytics** YOLOv8 / YOLO11 ``Detect``: ``Concat(axis=1)`` of the decoded boxes ``[B, 4, N]`` and
  ``Sigmoid`` class scores ``[B, C, N]``, giving ``[B, 4 + C, N]``. Boxes are center-size (``[cx, cy, w, h]``,
  the default export) or corners (``nms=True`` exports), told apart from the decoding (``dist2bbox``: the
  center is a ``Div`` of a sum, a corner a ``Sub``). The plugin gets ``Transpose`` d slices.
* **yolov5** (YOLOv5, YOLOv7): ``Concat(axis=1)`` of per-level ``Reshape`` s to ``[B, -1, 5 + C]``; boxes
  ``[cx, cy, w, h]``, objectness, class probabilities; the plugin's scores are ``objectness * class``, as
  those projects' ``non_max_suppression`` computes them.

Refused with one line: a head whose channels carry more than boxes and scores (ultralytics ``Segment`` mask
coefficients, ``Pose`` keypoints), an NMS-free end-to-end head (its output is already the top-k detections),
and a graph where no head of these layouts is found (the ``tensor`` and ``head`` options name it).

The numpy side of the same wiring (:func:`plugin_inputs`) lets validation compute, from the original model's
raw head output, what the plugin node must receive and produce.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from gskit.errors import GskitError
from gskit.passes.edit import unique_name
from gskit.passes.patterns.match import constant_value, label, op_key, producer, through_noop_casts
from gskit.passes.transform import (
    Before,
    GraphPass,
    PassContext,
    PassResult,
    StepFlag,
    ensure,
    option,
    run_pass,
)
from gskit.plugin import libnvinfer
from gskit.plugin.spec import INT32_MAX, PluginSpec

log = logging.getLogger(__name__)

#: The plugin the pass writes: ``(domain, name, version)``.
PLUGIN_KEY = (libnvinfer.DOMAIN, "EfficientNMS_TRT", "1")
#: Names of the new model outputs (made unique if the graph has them already).
OUTPUT_NAMES = ("num_detections", "detection_boxes", "detection_scores", "detection_classes")
#: TensorRT's replacement for the deprecated plugin, named in the report.
ALTERNATIVE = (
    "TensorRT's alternative to the deprecated EfficientNMS_TRT is INMSLayer, which its parser builds from "
    "ONNX NonMaxSuppression (selected indices: gathers follow; data-dependent shapes, slower, TRT#4248)"
)

Head = Literal["auto", "ultralytics", "yolov5"]
BoxFormat = Literal["auto", "xywh", "xyxy"]

#: Thresholds each head family's own code uses when the model has no exported NMS to read them from:
#: ultralytics ``cfg/default.yaml`` (iou 0.7, max_det 300; export sets conf 0.25 for ``nms=True``) and
#: YOLOv5/YOLOv7 ``non_max_suppression`` (conf_thres 0.25, iou_thres 0.45, max_det 300).
FAMILY_DEFAULTS: dict[str, tuple[float, float, int]] = {
    "ultralytics": (0.25, 0.7, 300),
    "yolov5": (0.25, 0.45, 300),
}


@dataclass(frozen=True)
class NmsOptions:
    """Add TensorRT's EfficientNMS_TRT behind a YOLO detection head; its four outputs become the model's."""

    #: ``gskit prepare``'s flag that sets no field: an nms step after sanitize when the recipe has none
    step_flags: ClassVar[tuple[StepFlag, ...]] = (
        StepFlag(
            "--nms",
            "add TensorRT's EfficientNMS_TRT behind a YOLO detection head; its four outputs become the "
            "model's (an nms step after sanitize when the recipe has none; recipe: nms: {score_threshold, "
            "iou_threshold, max_output_boxes, class_agnostic})",
            kind="switch",
            adds_step=("after", ("sanitize",)),
        ),
    )

    score_threshold: float | None = option(
        None,
        help="keep boxes whose score is at least this (default: the model's exported NMS, else 0.25)",
        metavar="T",
    )
    iou_threshold: float | None = option(
        None,
        help="suppress boxes overlapping a kept one by at least this IoU (default: the model's exported NMS, "
        "else the head family's: 0.7 ultralytics, 0.45 YOLOv5/v7)",
        metavar="T",
    )
    max_output_boxes: int | None = option(
        None, help="detections per image (default: the model's exported NMS, else 300)", metavar="N"
    )
    class_agnostic: bool = option(False, help="one NMS over all classes instead of one per class")
    best_class_only: bool = option(
        True,
        help="score each box for its best class only, as ultralytics and YOLOv5 do (the plugin alone would "
        "also detect a box for its other classes above the threshold)",
    )
    head: Head = option("auto", help="the head's layout (auto: read from the graph)", cli=False)
    box_format: BoxFormat = option(
        "auto", help="ultralytics boxes: center-size or corners (auto: read from the decoding)", cli=False
    )
    tensor: str | None = option(None, help="the raw head output's tensor name (auto: found)", cli=False)

    def __post_init__(self) -> None:
        for name in ("score_threshold", "iou_threshold"):
            value = getattr(self, name)
            if value is not None and not (0 <= value <= 1):
                raise GskitError(f"nms: {name} must be between 0 and 1, got {value}")
        if self.score_threshold is not None and self.score_threshold < 0.007:
            raise GskitError(
                f"nms: score_threshold {self.score_threshold} is below 0.007, where EfficientNMS_TRT takes "
                "to a dense path that can output below-threshold boxes (score -32768); use 0.007 or more"
            )
        if self.iou_threshold is not None and self.iou_threshold == 0:
            raise GskitError("nms: iou_threshold must be > 0 (EfficientNMS_TRT's creator refuses 0)")
        if self.max_output_boxes is not None and self.max_output_boxes < 1:
            raise GskitError(f"nms: max_output_boxes must be >= 1, got {self.max_output_boxes}")


@dataclass
class NmsReport:
    """What the pass did, enough to validate it.

    Attributes:
        head: the raw head output's tensor name.
        layout: ``ultralytics`` or ``yolov5``.
        box_format: ``xywh`` or ``xyxy`` (ultralytics; yolov5 boxes are ``xywh``).
        node: the EfficientNMS_TRT node's name.
        attrs: the plugin fields written.
        best_class_only: scores of other classes than each box's best are zeroed first.
        plugin_inputs: the tensors the node reads (boxes, scores).
        outputs: the new model outputs, in the plugin's order.
        replaced_outputs: the model outputs that were computed from the head (gone now).
        removed_nodes: nodes computed from the head only, removed.
        exported_nms: the exporter's NonMaxSuppression nodes among them.
        settings: where each threshold came from (``option``, ``exported NMS``, ``ultralytics default``).
    """

    head: str
    layout: str
    box_format: str
    node: str
    attrs: dict[str, Any]
    best_class_only: bool
    plugin_inputs: tuple[str, str]
    outputs: tuple[str, ...]
    replaced_outputs: tuple[str, ...]
    removed_nodes: tuple[str, ...] = ()
    exported_nms: tuple[str, ...] = ()
    settings: dict[str, str] = field(default_factory=dict)
    alternative: str = ALTERNATIVE


_DEFAULTS = NmsOptions()


def add_nms(graph: gs.Graph, plugins: Iterable[PluginSpec], **options: Any) -> NmsReport:
    """Add EfficientNMS_TRT behind the graph's detection head, in place (``run_pass(NMS, graph,
    NmsOptions(...), plugins=plugins).report``); ``options`` are :class:`NmsOptions` fields.

    Raises:
        GskitError: no readable head (the message says why), or the EfficientNMS_TRT spec is not loaded.
    """
    return run_pass(NMS, graph, NmsOptions(**options), plugins=plugins).report


@dataclass(frozen=True)
class _Head:
    tensor: gs.Tensor
    layout: str
    box_format: str


def find_head(graph: gs.Graph, options: NmsOptions = _DEFAULTS) -> _Head:
    """The raw detection-head output of ``graph`` and its layout (see the module docstring).

    Raises:
        GskitError: one line saying why no head can be used.
    """
    if options.tensor is not None:
        tensor = graph.tensors().get(options.tensor)
        if tensor is None or isinstance(tensor, gs.Constant):
            raise GskitError(f"nms: tensor '{options.tensor}' is not a computed tensor of the graph")
        node = producer(tensor)
        layout = options.head if options.head != "auto" else _layout_of(node, tensor)
        return _checked(_Head(tensor, layout, _box_format(node, layout, options)))
    found = [h for node in graph.nodes if (h := _recognize(node, options)) is not None]
    if options.head != "auto":
        found = [h for h in found if h.layout == options.head]
    if not found:
        raise GskitError(
            "nms: no YOLO detection head found (looked for the ultralytics Detect output, Concat(axis=1) of "
            "boxes and Sigmoid class scores, and the YOLOv5/v7 one, Concat(axis=1) of Reshapes to "
            "[B, -1, 5+C]); name the raw head output with nms: {tensor: NAME, head: ultralytics|yolov5}"
        )
    if len({id(h.tensor) for h in found}) > 1:
        names = ", ".join(f"'{h.tensor.name}' ({h.layout})" for h in found)
        raise GskitError(f"nms: several detection heads: {names}; choose one with nms: {{tensor: NAME}}")
    return _checked(found[0])


def _recognize(node: gs.Node, options: NmsOptions) -> _Head | None:
    if op_key(node) != ("", "Concat") or node.attrs.get("axis") not in (1, -2) or len(node.outputs) != 1:
        return None
    out = node.outputs[0]
    if out.shape is not None and len(out.shape) != 3:
        return None
    scored = len(node.inputs) >= 2 and _op(producer(through_noop_casts(node.inputs[1]))) == "Sigmoid"
    if scored and len(node.inputs) > 2:  # TorchScript writes Segment's two concatenations as one
        raise GskitError(_EXTRA_CHANNELS.format(tensor=out.name, node=label(node)))
    if scored:
        return _Head(out, "ultralytics", _box_format(node, "ultralytics", options))
    widths = [_reshape_width(t) for t in node.inputs]
    if widths and all(w is not None and w >= 6 and w == widths[0] for w in widths):
        return _Head(out, "yolov5", "xywh")
    return None


def _reshape_width(tensor: gs.Tensor) -> int | None:
    """K of a ``Reshape(x, [B, -1, K])``; None for anything else."""
    node = producer(tensor)
    if _op(node) != "Reshape" or len(node.inputs) < 2:
        return None
    shape = constant_value(node.inputs[1])
    if shape is None or shape.ndim != 1 or shape.size != 3:
        return None
    return int(shape[-1])


def _layout_of(node: gs.Node | None, tensor: gs.Tensor) -> str:
    recognized = _recognize(node, _DEFAULTS) if node is not None else None
    if recognized is not None:
        return recognized.layout
    shape = tensor.shape
    if shape is not None and len(shape) == 3 and all(isinstance(d, int) for d in shape[1:]):
        return "ultralytics" if shape[1] < shape[2] else "yolov5"
    raise GskitError(
        f"nms: cannot tell the layout of tensor '{tensor.name}' (shape {shape}); give "
        "nms: {head: ultralytics} for [B, 4+C, N] or {head: yolov5} for [B, N, 5+C]"
    )


def _box_format(node: gs.Node | None, layout: str, options: NmsOptions) -> str:
    """ultralytics: center-size when dist2bbox's first half is a ``Div`` (``(x1y1 + x2y2) / 2``), corners when
    it is a ``Sub`` (``anchors - lt``); what the option says otherwise."""
    if layout != "ultralytics":
        return "xywh"
    if options.box_format != "auto":
        return options.box_format
    concat = None
    if node is not None and _op(node) == "Concat" and len(node.inputs) == 2:
        boxes = producer(through_noop_casts(node.inputs[0]))
        # dbox = dist2bbox(...) * strides: the Concat of dist2bbox is one of the Mul's inputs.
        candidates = [boxes] if _op(boxes) == "Concat" else []
        if _op(boxes) == "Mul":
            candidates = [p for t in boxes.inputs if _op(p := producer(t)) == "Concat"]
        concat = candidates[0] if candidates else None
    first = _op(producer(concat.inputs[0])) if concat is not None and concat.inputs else None
    if first in ("Div", "Mul"):
        return "xywh"
    if first == "Sub":
        return "xyxy"
    raise GskitError(
        "nms: cannot tell whether the head's boxes are center-size or corners (no dist2bbox decoding found "
        "before it); give nms: {box_format: xywh} or {box_format: xyxy}"
    )


_EXTRA_CHANNELS = (
    "nms: the head output '{tensor}' gets more channels after the class scores at node '{node}' (an "
    "ultralytics Segment or Pose head: mask coefficients or keypoints), which EfficientNMS_TRT cannot carry "
    "through; not supported"
)


def _checked(head: _Head) -> _Head:
    """Refuse heads whose output carries more than boxes and class scores (Segment, Pose, OBB)."""
    for consumer in head.tensor.outputs:
        if _op(consumer) == "Concat" and consumer.attrs.get("axis") in (1, -2):
            raise GskitError(_EXTRA_CHANNELS.format(tensor=head.tensor.name, node=label(consumer)))
    return head


def _op(node: gs.Node | None) -> str | None:
    return node.op if node is not None and op_key(node)[0] == "" else None


# --------------------------------------------------------------------------------------------- rewiring


class _Nms(GraphPass[NmsOptions]):
    name, options, effect, keeps_outputs, takes_model = "nms", NmsOptions, "in_place", False, False

    def call(self, model: Any, options: NmsOptions, context: PassContext) -> PassResult:
        if context.results.get(self.name):
            raise GskitError("nms: the recipe has a second nms step; the model has its NMS already")
        spec = _plugin_spec(context.plugins or ())
        report = _add(model, spec, options)
        removed = len(report.removed_nodes)
        own = (
            f", replacing the exported NMS ({', '.join(report.exported_nms)})" if report.exported_nms else ""
        )
        settings = ", ".join(f"{k} {report.attrs[k]} ({v})" for k, v in report.settings.items())
        summary = (
            f"EfficientNMS_TRT after {report.layout} head '{report.head}' ({report.box_format} boxes){own}; "
            f"{removed} node(s) removed; {settings}; outputs {', '.join(report.outputs)} (the plugin is "
            "deprecated since TensorRT 10.12; TensorRT's alternative: INMSLayer, from ONNX NonMaxSuppression)"
        )
        return PassResult(model, modified=True, report=report, summary=summary)

    def ensures(self, model: Any, options: NmsOptions, result: PassResult, before: Before) -> None:
        """The plugin's four outputs are the graph's outputs now, produced by the node."""
        report = result.report
        outputs = [t.name for t in model.outputs]
        ensure(all(n in outputs for n in report.outputs), self.name, f"outputs are {outputs}")
        ensure(
            any(n.name == report.node for n in model.nodes),
            self.name,
            f"node {report.node} is not in the graph",
        )


#: The nms pass: ``run_pass(NMS, graph, NmsOptions(...), plugins=specs)``.
NMS = _Nms()


def _plugin_spec(plugins: Iterable[PluginSpec]) -> PluginSpec:
    for spec in plugins:
        if spec.key == PLUGIN_KEY:
            return spec
    raise GskitError(
        "nms: the EfficientNMS_TRT plugin spec is not loaded (it ships with gskit in plugins/efficient_nms); "
        "check --plugins and $GSKIT_PLUGINS"
    )


def _add(graph: gs.Graph, spec: PluginSpec, options: NmsOptions) -> NmsReport:
    head = find_head(graph, options)
    downstream = _downstream(graph, head.tensor)
    if any(_op(n) == "TopK" for n in downstream) and not any(
        _op(n) == "NonMaxSuppression" for n in downstream
    ):
        raise GskitError(
            f"nms: the head output '{head.tensor.name}' goes through TopK and no NonMaxSuppression: an "
            "NMS-free end-to-end head (YOLOv10/YOLO26), whose output is already the detections; no NMS to add"
        )
    exported = [n for n in downstream if _op(n) == "NonMaxSuppression"]
    attrs, settings = _fields(head, exported, downstream, options, graph)
    replaced = [t for t in graph.outputs if t is head.tensor or any(t in n.outputs for n in downstream)]
    taken = {t for t in graph.tensors()}
    boxes, scores = _plugin_input_nodes(graph, head, options, taken)
    outputs = [
        gs.Variable(unique_name(name, taken), dtype=dtype)
        for name, dtype in zip(OUTPUT_NAMES, (np.int32, boxes.dtype, scores.dtype, np.int32), strict=True)
    ]
    names_before = {n.name for n in graph.nodes}
    node = spec.make_node([boxes, scores], outputs, attrs, name=unique_name("EfficientNMS_TRT", names_before))
    graph.nodes.append(node)
    kept = [t for t in graph.outputs if not any(t is r for r in replaced)]
    graph.outputs = [*outputs, *kept]
    before = {id(n): label(n) for n in graph.nodes}
    graph.cleanup(remove_unused_graph_inputs=False).toposort()
    left = {id(n) for n in graph.nodes}
    _import_domain(graph, spec.domain)
    return NmsReport(
        head=head.tensor.name,
        layout=head.layout,
        box_format=head.box_format,
        node=node.name,
        attrs=attrs,
        best_class_only=options.best_class_only and not options.class_agnostic,
        plugin_inputs=(boxes.name, scores.name),
        outputs=tuple(t.name for t in outputs),
        replaced_outputs=tuple(t.name for t in replaced),
        removed_nodes=tuple(name for key, name in before.items() if key not in left),
        exported_nms=tuple(label(n) for n in exported),
        settings=settings,
    )


def _downstream(graph: gs.Graph, tensor: gs.Tensor) -> list[gs.Node]:
    """Nodes computed from ``tensor`` (directly or not), in graph order."""
    reached: set[int] = set()
    frontier = list(tensor.outputs)
    while frontier:
        node = frontier.pop()
        if id(node) in reached:
            continue
        reached.add(id(node))
        frontier.extend(c for out in node.outputs for c in out.outputs)
    return [n for n in graph.nodes if id(n) in reached]


def _fields(
    head: _Head,
    exported: Sequence[gs.Node],
    downstream: Sequence[gs.Node],
    options: NmsOptions,
    graph: gs.Graph,
) -> tuple[dict[str, Any], dict[str, str]]:
    """The plugin's fields, each from the option, else the exported NMS, else the head family's default."""
    score, iou, top = FAMILY_DEFAULTS[head.layout]
    found = _exported_settings(exported, downstream, graph)
    settings: dict[str, str] = {}
    values: dict[str, Any] = {}
    for name, given, default in (
        ("score_threshold", options.score_threshold, score),
        ("iou_threshold", options.iou_threshold, iou),
        ("max_output_boxes", options.max_output_boxes, top),
    ):
        if given is not None:
            values[name], settings[name] = given, "option"
        elif name in found:
            values[name], settings[name] = found[name], "exported NMS"
        else:
            values[name], settings[name] = default, f"{head.layout} default"
    values["score_threshold"] = max(float(values["score_threshold"]), 0.007)
    attrs = {
        **values,
        "background_class": -1,
        "score_activation": 0,
        "class_agnostic": int(options.class_agnostic),
        "box_coding": 1 if head.box_format == "xywh" else 0,
    }
    return attrs, settings


def _exported_settings(
    exported: Sequence[gs.Node], downstream: Sequence[gs.Node], graph: gs.Graph
) -> dict[str, Any]:
    """Thresholds an exported NMS used: NonMaxSuppression's iou (and score) inputs, the constant of a
    ``Greater`` on the scores (ultralytics, torchvision: ``score > conf`` before the NMS), and the detections
    per image of a ``[B, K, 6]`` output, else NonMaxSuppression's ``max_output_boxes_per_class`` (the whole
    count for the one-class NMS over class-shifted boxes that ultralytics and torchvision's ``batched_nms``
    write)."""
    found: dict[str, Any] = {}
    for node in exported:
        for index, name in ((2, "max_output_boxes"), (3, "iou_threshold"), (4, "score_threshold")):
            value = constant_value(node.inputs[index]) if len(node.inputs) > index else None
            if value is not None and value.size == 1:
                number = value.reshape(()).item()
                found.setdefault(name, int(number) if name == "max_output_boxes" else round(float(number), 6))
    if exported and "score_threshold" not in found:
        for node in downstream:
            if _op(node) in ("Greater", "GreaterOrEqual"):
                value = constant_value(node.inputs[1])
                if value is not None and value.size == 1 and value.dtype.kind == "f":
                    found["score_threshold"] = round(float(value.reshape(())), 6)
                    break
    for tensor in graph.outputs:
        shape = tensor.shape
        if exported and tensor.inputs and tensor.inputs[0] in downstream and shape is not None:
            if len(shape) == 3 and shape[2] == 6 and isinstance(shape[1], int):
                found["max_output_boxes"] = int(shape[1])
    if found.get("max_output_boxes", 1) > INT32_MAX:
        del found["max_output_boxes"]  # an "all of them" sentinel (INT64_MAX), not a count
    return found


def _plugin_input_nodes(
    graph: gs.Graph, head: _Head, options: NmsOptions, taken: set[str]
) -> tuple[gs.Variable, gs.Variable]:
    """Nodes making ``boxes [B, N, 4]`` and ``scores [B, N, C]`` from the head output (``plugin_inputs``)."""
    build = _Builder(graph, head.tensor.name, taken)
    dtype = head.tensor.dtype if head.tensor.dtype is not None else np.float32
    rows = (
        build.op("Transpose", [head.tensor], perm=[0, 2, 1]) if head.layout == "ultralytics" else head.tensor
    )
    boxes = build.slice(rows, 0, 4, "boxes")
    if head.layout == "ultralytics":
        scores = build.slice(rows, 4, None, "class_scores")
    else:
        objectness = build.slice(rows, 4, 5, "objectness")
        scores = build.op("Mul", [build.slice(rows, 5, None, "class_probs"), objectness], name="scores")
    if options.best_class_only and not options.class_agnostic:
        best = build.reduce_max(scores)
        is_best = build.op("Equal", [scores, best])
        zero = gs.Constant(unique_name(f"{head.tensor.name}_nms_zero", taken), np.zeros((), dtype=dtype))
        scores = build.op("Where", [is_best, scores, zero], name="best_class_scores")
    for tensor in (boxes, scores):
        tensor.dtype = dtype
    return boxes, scores


class _Builder:
    """Adds standard nodes to a graph with names derived from the head tensor's."""

    def __init__(self, graph: gs.Graph, base: str, taken: set[str]) -> None:
        self.graph, self.base, self.taken = graph, base, taken
        self.nodes = {n.name for n in graph.nodes}

    def op(self, op: str, inputs: list[gs.Tensor], *, name: str | None = None, **attrs: Any) -> gs.Variable:
        out = gs.Variable(unique_name(f"{self.base}_nms_{name or op.lower()}", self.taken))
        node_name = unique_name(f"{self.base}_nms_{op}", self.nodes)
        self.graph.nodes.append(gs.Node(op, name=node_name, attrs=attrs, inputs=inputs, outputs=[out]))
        return out

    def const(self, values: Sequence[int]) -> gs.Constant:
        return gs.Constant(
            unique_name(f"{self.base}_nms_const", self.taken), np.asarray(values, dtype=np.int64)
        )

    def slice(self, tensor: gs.Tensor, start: int, end: int | None, name: str) -> gs.Variable:
        stop = np.iinfo(np.int64).max if end is None else end
        return self.op(
            "Slice", [tensor, self.const([start]), self.const([stop]), self.const([-1])], name=name
        )

    def reduce_max(self, tensor: gs.Tensor) -> gs.Variable:
        if (self.graph.opset or 0) >= 18:
            return self.op("ReduceMax", [tensor, self.const([-1])], name="best", keepdims=1)
        return self.op("ReduceMax", [tensor], name="best", axes=[-1], keepdims=1)


def _import_domain(graph: gs.Graph, domain: str) -> None:
    if graph.import_domains is None:
        graph.import_domains = [onnx.helper.make_opsetid("", graph.opset)]
    if all(d.domain != domain for d in graph.import_domains):
        graph.import_domains.append(onnx.helper.make_opsetid(domain, 1))


# ------------------------------------------------------------------------------------ the numpy side


def plugin_inputs(raw: np.ndarray, layout: str, *, best_class_only: bool) -> tuple[np.ndarray, np.ndarray]:
    """What the wiring computes from the raw head output: the plugin's ``boxes`` and ``scores``."""
    rows = np.transpose(raw, (0, 2, 1)) if layout == "ultralytics" else raw
    boxes = rows[..., :4]
    scores = rows[..., 4:] if layout == "ultralytics" else rows[..., 5:] * rows[..., 4:5]
    if best_class_only:
        scores = np.where(scores == scores.max(axis=-1, keepdims=True), scores, np.zeros((), scores.dtype))
    return np.ascontiguousarray(boxes), np.ascontiguousarray(scores)
