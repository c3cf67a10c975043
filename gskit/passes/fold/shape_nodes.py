"""gskit's own shape folding: ``Shape`` (honouring its ``start``/``end`` attributes) and ``Shape -> Gather`` /
``Shape -> Slice`` (also through an integer ``Cast``) become constants where the dims they read are static."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from gskit.plugin.ops import is_default_domain


def fold_shape_nodes(graph: gs.Graph) -> None:
    """Replace Shape, Shape->Gather and Shape->Slice outputs by constants where the dims read are static."""
    for node in list(graph.nodes):
        if node.op != "Shape" or not is_default_domain(node.domain) or not node.outputs or not node.inputs:
            continue  # a Shape without input is malformed: left for the checker to name
        data = node.inputs[0]
        if data.shape is None:
            continue
        dims = _shape_slice(list(data.shape), node.attrs.get("start", 0), node.attrs.get("end"))
        out = node.outputs[0]
        if is_static(dims):
            make_constant(out, np.array(dims, dtype=np.int64))
            continue
        for user in list(out.outputs):
            values = _fold_shape_user(user, out, dims)
            if values is not None:
                make_constant(user.outputs[0], values)
            elif _is_int_cast(user):  # TensorFlow exports cast the shape to int32 before picking dims
                dtype = onnx.helper.tensor_dtype_to_np_dtype(user.attrs["to"])
                for picker in list(user.outputs[0].outputs):
                    values = _fold_shape_user(picker, user.outputs[0], dims)
                    if values is not None:
                        make_constant(picker.outputs[0], values.astype(dtype))


def _is_int_cast(node: gs.Node) -> bool:
    return (
        node.op == "Cast"
        and (node.domain or "") in ("", "ai.onnx")
        and node.attrs.get("to") in (onnx.TensorProto.INT32, onnx.TensorProto.INT64)
        and bool(node.outputs)
    )


def _shape_slice(dims: list, start: int, end: int | None) -> list:
    """Shape's ``start``/``end`` semantics: negative counts from the back, both clamped to [0, rank]."""
    rank = len(dims)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = rank if end is None else min(max(end + rank if end < 0 else end, 0), rank)
    return dims[start:end]


def is_static(dims: Iterable) -> bool:
    return all(isinstance(d, (int, np.integer)) and d >= 0 for d in dims)


def _fold_shape_user(user: gs.Node, shape_out: gs.Tensor, dims: list) -> np.ndarray | None:
    if not is_default_domain(user.domain) or not user.inputs or user.inputs[0] is not shape_out:
        return None
    if user.op == "Gather" and len(user.inputs) == 2 and isinstance(user.inputs[1], gs.Constant):
        if user.attrs.get("axis", 0) not in (0, -1):
            return None
        indices = np.asarray(user.inputs[1].values)
        if indices.size and (indices.min() < -len(dims) or indices.max() >= len(dims)):
            return None
        picked = np.array(dims, dtype=object)[indices] if dims else None
        if picked is None or not is_static(np.ravel(picked)):
            return None
        return np.asarray(picked, dtype=np.int64)  # a scalar index picks a Python int
    if user.op == "Slice" and len(user.inputs) >= 3:
        consts = user.inputs[1:]
        if not all(isinstance(t, gs.Constant) for t in consts if not t.is_empty()):
            return None
        starts, ends = (np.ravel(t.values) for t in consts[:2])
        axes = np.ravel(consts[2].values) if len(consts) > 2 and not consts[2].is_empty() else np.array([0])
        steps = np.ravel(consts[3].values) if len(consts) > 3 and not consts[3].is_empty() else np.array([1])
        if (
            starts.size != 1
            or ends.size != 1
            or axes.size != 1
            or int(axes[0]) not in (0, -1)
            or steps[0] == 0
        ):
            return None
        picked = dims[_onnx_slice(len(dims), int(starts[0]), int(ends[0]), int(steps[0]))]
        return np.array(picked, dtype=np.int64) if is_static(picked) else None
    return None


def _onnx_slice(length: int, start: int, end: int, step: int) -> slice:
    """A Python slice with ONNX Slice's clamping (ends past the range, INT64 sentinels, negative steps)."""

    def clamp(value: int, low: int, high: int) -> int:
        value = value + length if value < 0 else value
        return min(max(value, low), high)

    if step > 0:
        return slice(clamp(start, 0, length), clamp(end, 0, length), step)
    first, last = clamp(start, -1, length - 1), clamp(end, -1, length - 1)
    return slice(first, None if last < 0 else last, step)


def make_constant(tensor: gs.Tensor, values: np.ndarray) -> None:
    tensor.to_constant(values)
    tensor.inputs.clear()
