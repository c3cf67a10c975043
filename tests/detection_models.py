"""Small detection models with the graph forms of YOLO-family heads, built with graphsurgeon.

Each takes its raw features as graph inputs (random inputs then give real detections: sigmoid scores around
0.5, boxes of 5 to 60 pixels on a 100 x 100 field, many overlapping), so an NMS behind them has work to do.

* :func:`ultralytics_head`: the ultralytics ``Detect`` output ``[B, 4 + C, N]``, ``Concat(axis=1)`` of
  ``dist2bbox`` boxes times the strides and ``Sigmoid`` class scores; center-size or corner boxes.
* :func:`yolov5_head`: the YOLOv5/v7 output ``[B, N, 5 + C]``, per-level ``Sigmoid``, decode, ``Concat`` and
  ``Reshape`` to ``[B, -1, 5 + C]``, then ``Concat(axis=1)``.
* :func:`with_exported_nms`: the ultralytics head (corner boxes) followed by an exported NMS as ultralytics
  ``nms=True`` and torchvision's ``batched_nms`` write it: best class, ``score > conf``, ``NonZero`` and
  gathers, per-class box offsets, ONNX ``NonMaxSuppression``, the first ``max_det`` kept; one ``[1, K, 6]``
  output padded with zeros, or three outputs ``boxes``, ``scores``, ``labels``.
* :func:`segment_head`, :func:`segment_head_one_concat`, :func:`end2end_head`: what the nms step refuses.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from gskit.io import model as gsmodel

OPSET = 17


class _Graph:
    """A graph under construction: ``g.op("Add", a, b)`` adds a node and returns its output."""

    def __init__(self) -> None:
        self.nodes: list[gs.Node] = []
        self.count = 0

    def op(self, op: str, *inputs: gs.Tensor, outputs: int = 1, dtype=None, **attrs):
        self.count += 1
        outs = [gs.Variable(f"{op.lower()}_{self.count}_{i}", dtype=dtype) for i in range(outputs)]
        self.nodes.append(
            gs.Node(op, name=f"{op}_{self.count}", attrs=attrs, inputs=list(inputs), outputs=outs)
        )
        return outs[0] if outputs == 1 else outs

    def const(self, value, dtype=np.float32) -> gs.Constant:
        self.count += 1
        return gs.Constant(f"c{self.count}", np.asarray(value, dtype=dtype))

    def slice(self, x: gs.Tensor, start: int, end: int, axis: int) -> gs.Variable:
        i64 = np.int64
        return self.op("Slice", x, self.const([start], i64), self.const([end], i64), self.const([axis], i64))

    def model(self, inputs: list[gs.Variable], outputs: list[gs.Tensor]) -> onnx.ModelProto:
        graph = gs.Graph(nodes=self.nodes, inputs=inputs, outputs=outputs, opset=OPSET)
        model = gsmodel.to_model(graph)
        return onnx.shape_inference.infer_shapes(model)


def _anchors(count: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    points = rng.uniform(0, 100, size=(1, 2, count)).astype(np.float32)
    strides = np.full((1, 1, count), 2.0, dtype=np.float32)
    return points, strides


def _ultralytics(
    g: _Graph, feats: gs.Tensor, count: int, *, xywh: bool, extra: gs.Tensor | None = None
) -> gs.Variable:
    """dist2bbox on ``|feats[:, 0:4]| * 6`` around fixed anchor points, times the strides; Sigmoid scores;
    ``extra`` channels in the same Concat (TorchScript's form of a Segment head)."""
    points, strides = _anchors(count)
    distances = g.op("Mul", g.op("Abs", g.slice(feats, 0, 4, 1)), g.const(6.0))
    lt, rb = g.op("Split", distances, g.const([2, 2], np.int64), outputs=2, axis=1)
    x1y1 = g.op("Sub", g.const(points), lt)
    x2y2 = g.op("Add", g.const(points), rb)
    if xywh:
        pair = [g.op("Div", g.op("Add", x1y1, x2y2), g.const(2.0)), g.op("Sub", x2y2, x1y1)]
    else:
        pair = [x1y1, x2y2]
    boxes = g.op("Mul", g.op("Concat", *pair, axis=1), g.const(strides))
    scores = g.op("Sigmoid", g.slice(feats, 4, 1 << 30, 1))
    return g.op("Concat", boxes, scores, *([extra] if extra is not None else []), axis=1)


def ultralytics_head(classes: int = 3, count: int = 200, *, xywh: bool = True) -> onnx.ModelProto:
    """``feats [1, 4 + C, N]`` -> ``output0 [1, 4 + C, N]`` as ultralytics' Detect decodes it."""
    g = _Graph()
    feats = gs.Variable("feats", np.float32, [1, 4 + classes, count])
    head = _ultralytics(g, feats, count, xywh=xywh)
    head.name, head.dtype = "output0", np.float32
    return g.model([feats], [head])


def yolov5_head(classes: int = 3) -> onnx.ModelProto:
    """Two levels ``p3 [1, 3, 6, 6, 5 + C]``, ``p4 [1, 3, 3, 3, 5 + C]`` -> ``output0 [1, 135, 5 + C]``."""
    g = _Graph()
    width = 5 + classes
    levels, parts = [], []
    for name, size, stride in (("p3", 6, 8.0), ("p4", 3, 16.0)):
        x = gs.Variable(name, np.float32, [1, 3, size, size, width])
        levels.append(x)
        y = g.op("Sigmoid", x)
        grid = np.stack(np.meshgrid(np.arange(size), np.arange(size)), -1).reshape(1, 1, size, size, 2)
        xy = g.op(
            "Mul",
            g.op(
                "Add",
                g.op("Sub", g.op("Mul", g.slice(y, 0, 2, 4), g.const(2.0)), g.const(0.5)),
                g.const(grid),
            ),
            g.const(stride),
        )
        wh_unit = g.op("Mul", g.slice(y, 2, 4, 4), g.const(2.0))
        wh = g.op("Mul", g.op("Mul", wh_unit, wh_unit), g.const(np.full((1, 3, 1, 1, 2), stride * 2)))
        decoded = g.op("Concat", xy, wh, g.slice(y, 4, width, 4), axis=4)
        parts.append(g.op("Reshape", decoded, g.const([1, -1, width], np.int64)))
    out = g.op("Concat", *parts, axis=1)
    out.name, out.dtype = "output0", np.float32
    return g.model(levels, [out])


def with_exported_nms(
    classes: int = 3,
    count: int = 200,
    *,
    conf: float = 0.25,
    iou: float = 0.6,
    max_det: int = 50,
    rows: bool = True,
) -> onnx.ModelProto:
    """The corner-box ultralytics head and, behind it, an exported per-class NMS (batch 1)."""
    g = _Graph()
    feats = gs.Variable("feats", np.float32, [1, 4 + classes, count])
    head = _ultralytics(g, feats, count, xywh=False)
    i64 = np.int64
    table = g.op("Squeeze", g.op("Transpose", head, perm=[0, 2, 1]), g.const([0], i64))  # [N, 4 + C]
    boxes = g.slice(table, 0, 4, 1)
    class_scores = g.slice(table, 4, 4 + classes, 1)
    best = g.op("ReduceMax", class_scores, axes=[1], keepdims=0)
    label = g.op("ArgMax", class_scores, axis=1, keepdims=0)
    chosen = g.op("Squeeze", g.op("NonZero", g.op("Greater", best, g.const(conf))), g.const([0], i64))
    boxes, best = g.op("Gather", boxes, chosen, axis=0), g.op("Gather", best, chosen, axis=0)
    labels = g.op("Cast", g.op("Gather", label, chosen, axis=0), to=onnx.TensorProto.FLOAT)
    shifted = g.op("Add", boxes, g.op("Mul", g.op("Unsqueeze", labels, g.const([1], i64)), g.const(1000.0)))
    selected = g.op(
        "NonMaxSuppression",
        g.op("Unsqueeze", shifted, g.const([0], i64)),
        g.op("Unsqueeze", best, g.const([0, 1], i64)),
        g.const([max_det], i64),
        g.const([iou]),
    )
    keep = g.op("Squeeze", g.slice(selected, 2, 3, 1), g.const([1], i64))
    keep = g.slice(keep, 0, max_det, 0)
    kept = [
        g.op("Gather", boxes, keep, axis=0),
        g.op("Gather", best, keep, axis=0),
        g.op("Gather", labels, keep, axis=0),
    ]
    if not rows:
        kept[2] = g.op("Cast", kept[2], to=onnx.TensorProto.INT64, dtype=np.int64)
        for tensor, name, dtype, rank in zip(
            kept, ("boxes", "scores", "labels"), (np.float32, np.float32, np.int64), (2, 1, 1), strict=True
        ):
            tensor.name, tensor.dtype, tensor.shape = name, dtype, ["K", 4][:rank]
        return g.model([feats], kept)
    dets = g.op(
        "Concat",
        kept[0],
        g.op("Unsqueeze", kept[1], g.const([1], i64)),
        g.op("Unsqueeze", kept[2], g.const([1], i64)),
        axis=1,
    )
    found = g.slice(g.op("Shape", dets), 0, 1, 0)
    pads = g.op(
        "Concat", g.const([0, 0], i64), g.op("Sub", g.const([max_det], i64), found), g.const([0], i64), axis=0
    )
    out = g.op("Unsqueeze", g.op("Pad", dets, pads), g.const([0], i64))
    out.name, out.dtype, out.shape = "output0", np.float32, [1, max_det, 6]
    return g.model([feats], [out])


def segment_head(classes: int = 3, count: int = 200) -> onnx.ModelProto:
    """An ultralytics Segment output: the Detect output concatenated with 8 mask coefficients."""
    g = _Graph()
    feats = gs.Variable("feats", np.float32, [1, 4 + classes, count])
    coefficients = gs.Variable("coefficients", np.float32, [1, 8, count])
    out = g.op("Concat", _ultralytics(g, feats, count, xywh=True), coefficients, axis=1)
    out.name, out.dtype = "output0", np.float32
    return g.model([feats, coefficients], [out])


def end2end_head(classes: int = 3, count: int = 200, top: int = 20) -> onnx.ModelProto:
    """An NMS-free head: the best ``top`` boxes by TopK, no NonMaxSuppression."""
    g = _Graph()
    feats = gs.Variable("feats", np.float32, [1, 4 + classes, count])
    table = g.op("Transpose", _ultralytics(g, feats, count, xywh=False), perm=[0, 2, 1])
    best = g.op("ReduceMax", g.slice(table, 4, 4 + classes, 2), axes=[2], keepdims=0)
    values, _ = g.op("TopK", best, g.const([top], np.int64), outputs=2, axis=1)
    values.name, values.dtype = "scores", np.float32
    return g.model([feats], [values])


def segment_head_one_concat(classes: int = 3, count: int = 200) -> onnx.ModelProto:
    """The Segment output as TorchScript writes it: one Concat of boxes, Sigmoid scores and coefficients."""
    g = _Graph()
    feats = gs.Variable("feats", np.float32, [1, 4 + classes, count])
    coefficients = gs.Variable("coefficients", np.float32, [1, 8, count])
    out = _ultralytics(g, feats, count, xywh=True, extra=coefficients)
    out.name, out.dtype = "output0", np.float32
    return g.model([feats, coefficients], [out])
