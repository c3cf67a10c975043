"""What evaluating a constant node will cost, judged before onnxruntime runs it (for ``gskit.passes.fold``).

A model's declared shapes (``value_info``, a subgraph's inputs) are claims, not facts: a 200-byte model whose
``Expand`` is declared ``[1]`` makes a 1.6 GB tensor, and 400 ``Expand`` results of 4 MB each, every one under
the size threshold, make 13 GB together. So fold judges:

* **result sizes** from onnx's inference of the node alone (``infer_node_outputs``), fed with what its
  inputs really are: a constant's own dtype and shape, and its values when it is small (shapes, repeats,
  range bounds, pads); a result of a node already accepted into the same evaluation, with the type inferred
  for it. Where inference cannot give a size the node waits (its inputs become constants in a later pass),
  except for ops whose result never holds more elements than their data input (reshapes, slices,
  reductions).
  A ``Loop``'s or ``Scan``'s results are known only when its body, typed with the real shapes, keeps every
  loop-carried shape from one iteration to the next (scan outputs: trip count times one iteration's slice).
* **work** of ``Loop`` and ``Scan``: trip count times the nodes their body runs (nested loops multiply). Over
  :data:`RUN_BUDGET` node runs, or with a trip count that is not a constant, a loop is never evaluated: a
  constant ``Loop`` of 10^12 iterations used to make fold run for ever.

``gskit.passes.fold`` adds up what a fold's evaluations produce and stops at its budget (see
``gskit.passes.fold.exclusion.Exclusion``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter

from gskit.io import model as gsmodel
from gskit.passes.tensor_types import constant_elem_type, infer_types
from gskit.plugin.ops import is_default_domain

log = logging.getLogger(__name__)

#: Types of tensors, by name (what onnx's node inference takes and gives).
Types = dict[str, onnx.TypeProto]
#: Values of small constant tensors, by name (what onnx's node inference reads shapes and repeats from).
Values = dict[str, onnx.TensorProto]
#: Most node runs a constant Loop or Scan may take to be evaluated (trip count x nodes in its body).
RUN_BUDGET = 10**6
#: Constant inputs up to this many elements are given to inference with their values (shapes, repeats, pads).
SMALL_INPUT_ELEMENTS = 64
#: Ops whose result holds at most as many elements as their first input, whatever the other inputs say;
#: used when inference cannot give the result's shape (a shape input computed in the same evaluation).
_NO_LARGER_OPS = frozenset(
    {
        "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Compress", "Unique",
        "ArgMax", "ArgMin", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax",
        "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare",
    }
)  # fmt: skip
#: onnxruntime's elementwise contrib ops (no ONNX schema): a result as large as the largest input.
_ORT_ELEMENTWISE_OPS = frozenset({"Gelu", "FastGelu", "BiasGelu", "QuickGelu"})
#: The largest element of any ONNX tensor type (double, int64, complex128: 16).
_WIDEST_ITEM = 16


class ResultSizes:
    """Sizes of constant nodes' results, from the real types of their inputs, one evaluation at a time.

    Args:
        opsets: the model's opset version per domain (``""`` for the default domain).
    """

    def __init__(self, opsets: dict[str, int]) -> None:
        self.opsets = opsets
        #: types of the results of the nodes accepted into the current evaluation, by tensor name
        self.known: Types = {}

    def start(self) -> None:
        """A new evaluation (batch) begins: results of the earlier one are constants by now."""
        self.known.clear()

    def nbytes(self, node: gs.Node) -> tuple[int, Types] | None:
        """``(bytes of all of node's results, their types)``; None when unknown before evaluating."""
        if not node.inputs and all(t.is_empty() for t in node.outputs) and not has_subgraphs(node):
            # reads nothing and makes nothing (a Constant node whose value was lowered to a constant): what
            # inference would say, without asking it (most of silero-vad's questions)
            return 0, {}
        types: Types | None = {}
        try:
            types, data = self._input_types(node)
            if types is None:
                return None
            if has_subgraphs(node):
                outputs = _loop_outputs(node, types, data, self.opsets)
            else:
                outputs = _node_outputs(node, types, data, self.opsets)
        except Exception as err:  # onnx raises InferenceError, ValidationError, SchemaError...: unknown
            log.debug("fold: no result size for %s (%s)", node.name or node.op, err)
            outputs = None  # an op with a bound of its own (_no_larger_bound) still has a size
        total = 0
        for tensor in node.outputs:
            if tensor.is_empty():
                continue
            size = _type_nbytes(outputs.get(tensor.name)) if outputs is not None else None
            if size is None:
                size = _no_larger_bound(node, types, outputs)
            if size is None:
                return None
            total += size
        return total, outputs or {}

    def accept(self, types: Types) -> None:
        """The node whose result types these are is evaluated with this batch."""
        self.known.update(types)

    def _input_types(self, node: gs.Node) -> tuple[Types | None, Values]:
        types: Types = {}
        data: Values = {}
        for tensor in _read_tensors(node):
            if tensor.is_empty() or tensor.name in types:
                continue
            if isinstance(tensor, gs.Constant):
                elem, shape = constant_type(tensor)
                types[tensor.name] = onnx.helper.make_tensor_type_proto(elem, shape)
                small = small_values(tensor)
                if small is not None:
                    data[tensor.name] = onnx.numpy_helper.from_array(small, tensor.name)
            elif tensor.name in self.known:
                types[tensor.name] = self.known[tensor.name]
            else:
                return None, data
        return types, data


def constant_type(tensor: gs.Constant) -> tuple[int, list[int]]:
    """A constant's ONNX element type and shape, from its values (or, on disk, its TensorProto's header)."""
    values = tensor._values
    if isinstance(values, gs.ir.tensor.LazyValues) and isinstance(values.tensor, onnx.TensorProto):
        return values.tensor.data_type, [int(d) for d in values.tensor.dims]
    return constant_elem_type(tensor) or 0, [int(d) for d in np.shape(values)]


def small_values(tensor: gs.Tensor) -> np.ndarray | None:
    """The values of a small numeric constant (at most ``SMALL_INPUT_ELEMENTS``); None for others."""
    if not isinstance(tensor, gs.Constant):
        return None
    elem, shape = constant_type(tensor)
    if volume(shape) > SMALL_INPUT_ELEMENTS or elem in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
        return None
    try:
        return np.asarray(tensor.values)
    except Exception:  # noqa: BLE001  # a value that does not read: the node's size stays unknown
        return None


def run_cost(node: gs.Node) -> int | None:
    """Node runs that evaluating ``node`` takes: 1, or for ``Loop``/``Scan`` trip count x body (nested loops
    multiply; an ``If`` counts both branches). None when a trip count is not a constant."""
    if not is_default_domain(node.domain) or node.op not in ("Loop", "Scan", "If"):
        return 1
    bodies = list(gsmodel.node_subgraphs(node))
    inner = 0
    for body in bodies:
        for child in body.nodes:
            cost = run_cost(child)
            if cost is None:
                return None
            inner += cost
    if node.op == "If":
        return 1 + inner
    trips = _trip_count(node)
    return None if trips is None else 1 + trips * max(inner, 1)


def _trip_count(node: gs.Node) -> int | None:
    if node.op == "Loop":
        # Without a constant trip count M the loop runs until its condition says stop: not known here.
        values = small_values(node.inputs[0]) if node.inputs and not node.inputs[0].is_empty() else None
        return max(0, int(values.reshape(-1)[0])) if values is not None and values.size == 1 else None
    scan_inputs = node.attrs.get("num_scan_inputs")
    if not isinstance(scan_inputs, int) or scan_inputs < 1 or len(node.inputs) < scan_inputs:
        return None
    first = node.inputs[len(node.inputs) - scan_inputs]
    axes = node.attrs.get("scan_input_axes") or [0]
    if not isinstance(first, gs.Constant):
        return None
    shape = constant_type(first)[1]
    axis = int(axes[0]) + len(shape) if int(axes[0]) < 0 else int(axes[0])
    return shape[axis] if 0 <= axis < len(shape) else None


def has_subgraphs(node: gs.Node) -> bool:
    """Whether ``node`` holds a graph attribute (If, Loop, Scan...)."""
    return next(gsmodel.node_subgraphs(node), None) is not None


def _read_tensors(node: gs.Node) -> Iterable[gs.Tensor]:
    """The node's inputs and the outer tensors its subgraphs read."""
    yield from node.inputs
    for body in gsmodel.node_subgraphs(node):
        yield from body._foreign_tensors().values()


def _node_outputs(node: gs.Node, types: Types, data: Values, opsets: dict[str, int]) -> Types | None:
    domain = node.domain or ""
    version = opsets.get(domain) or opsets.get("ai.onnx" if domain == "" else domain)
    if version is None:
        return None
    schema = onnx.defs.get_schema(node.op, version, domain)
    proto = OnnxExporter.export_node(node)
    opset_imports = [onnx.helper.make_opsetid(d, v) for d, v in opsets.items()]
    return onnx.shape_inference.infer_node_outputs(schema, proto, types, data, opset_imports=opset_imports)


def _loop_outputs(node: gs.Node, types: Types, data: Values, opsets: dict[str, int]) -> Types | None:
    """Result types of a ``Loop`` or ``Scan`` whose body keeps every loop-carried shape; None otherwise (and
    for ``If``, whose constant form gskit flattens itself)."""
    if not is_default_domain(node.domain) or node.op not in ("Loop", "Scan"):
        return None
    body = node.attrs.get("body")
    trips = _trip_count(node)
    if not isinstance(body, gs.Graph) or trips is None:
        return None
    given = [types.get(t.name) if not t.is_empty() else None for t in node.inputs]
    if node.op == "Loop":
        carried_in = given[2:]
        scan_in: list[onnx.TypeProto | None] = []
        body_in = [_scalar(onnx.TensorProto.INT64), _scalar(onnx.TensorProto.BOOL), *carried_in]
    else:
        count = int(node.attrs["num_scan_inputs"])
        carried_in, scan_in = given[: len(given) - count], given[len(given) - count :]
        if node.attrs.get("scan_input_axes") not in (None, [0] * count):
            return None
        body_in = [*carried_in, *(_drop_first_dim(t) for t in scan_in)]
    if any(t is None for t in body_in) or len(body_in) != len(body.inputs):
        return None
    outs = _body_outputs(body, body_in, types, data, opsets)  # type: ignore[arg-type]
    if outs is None:
        return None
    carried = len(carried_in)
    first_out = 1 if node.op == "Loop" else 0  # a Loop body's first output is its condition
    results: Types = {}
    for index, tensor in enumerate(node.outputs):
        body_type = outs[first_out + index] if first_out + index < len(outs) else None
        if body_type is None or _static_shape(body_type) is None:
            return None
        if index < carried:  # the same shape in and out: every iteration keeps it
            if _static_shape(body_type) != _static_shape(carried_in[index]):  # type: ignore[arg-type]
                return None
            results[tensor.name] = body_type
        else:  # one slice per iteration, stacked
            shape = [trips, *_static_shape(body_type)]  # type: ignore[misc]
            results[tensor.name] = onnx.helper.make_tensor_type_proto(body_type.tensor_type.elem_type, shape)
    return results


def _body_outputs(
    body: gs.Graph,
    body_in: list[onnx.TypeProto],
    outer: Types,
    data: Values,
    opsets: dict[str, int],
) -> list[onnx.TypeProto] | None:
    """The types onnx infers for ``body``'s outputs when its inputs have the types ``body_in`` (not the ones
    it declares) and the outer tensors it reads have theirs."""
    proto = OnnxExporter.export_graph(body, do_type_check=False)
    del proto.value_info[:]  # declared shapes are claims: only what inference finds counts
    inputs = [
        onnx.helper.make_value_info(info.name, typed)
        for info, typed in zip(proto.input, body_in, strict=True)
    ]
    outer_names = {t.name for t in body._foreign_tensors().values()}
    inputs += [onnx.helper.make_value_info(name, outer[name]) for name in outer_names if name not in data]
    initializers = [data[name] for name in outer_names if name in data]
    outputs = [onnx.helper.make_value_info(info.name, onnx.TypeProto()) for info in proto.output]
    graph = onnx.helper.make_graph(list(proto.node), "body", inputs, outputs, initializer=initializers)
    opset_imports = [onnx.helper.make_opsetid(d, v) for d, v in opsets.items()]
    model = onnx.helper.make_model(graph, opset_imports=opset_imports, ir_version=gsmodel.MAX_ORT_IR_VERSION)
    inferred = infer_types(model, strict=True)
    found = {info.name: info.type for info in (*inferred.graph.value_info, *inferred.graph.output)}
    by_name = {info.name: typed for info, typed in zip(inputs, (*body_in,), strict=False)}
    return [found.get(info.name) or by_name.get(info.name) for info in proto.output]  # type: ignore[misc]


def _scalar(elem: int) -> onnx.TypeProto:
    return onnx.helper.make_tensor_type_proto(elem, [])


def _drop_first_dim(typed: onnx.TypeProto | None) -> onnx.TypeProto | None:
    shape = _static_shape(typed) if typed is not None else None
    if not shape:
        return None
    return onnx.helper.make_tensor_type_proto(typed.tensor_type.elem_type, shape[1:])  # type: ignore[union-attr]


def _static_shape(typed: onnx.TypeProto) -> list[int] | None:
    if typed.WhichOneof("value") != "tensor_type" or not typed.tensor_type.HasField("shape"):
        return None
    dims = typed.tensor_type.shape.dim
    if not all(d.HasField("dim_value") and d.dim_value >= 0 for d in dims):
        return None
    return [int(d.dim_value) for d in dims]


def _itemsize(elem: int) -> int | None:
    if elem == onnx.TensorProto.UNDEFINED:
        return None
    if elem == onnx.TensorProto.STRING:
        return None  # strings are never folded (gskit.passes.fold.exclusion.Exclusion.reason)
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)).itemsize
    except (KeyError, TypeError, ValueError):  # float8, int4 and others numpy has no dtype for
        return 1


def _type_nbytes(typed: onnx.TypeProto | None) -> int | None:
    if typed is None:
        return None
    shape = _static_shape(typed)
    itemsize = _itemsize(typed.tensor_type.elem_type) if shape is not None else None
    return None if itemsize is None else volume(shape) * itemsize  # type: ignore[arg-type]


def _no_larger_bound(node: gs.Node, types: Types, outputs: Types | None) -> int | None:
    """Bytes one result of an op in ``_NO_LARGER_OPS`` may take: its data input's elements at the widest
    element size (for onnxruntime's elementwise contrib ops, its largest input's); None for other ops or when
    that input's shape is unknown."""
    if node.domain == "com.microsoft" and node.op in _ORT_ELEMENTWISE_OPS:
        reads = [node.inputs[i] for i in range(len(node.inputs)) if not node.inputs[i].is_empty()]
    elif is_default_domain(node.domain) and node.op in _NO_LARGER_OPS and node.inputs:
        reads = node.inputs[:1]
    else:
        return None
    shapes = [_static_shape(types[t.name]) if t.name in types else None for t in reads]
    if not shapes or any(shape is None for shape in shapes):
        return None
    return max(volume(shape) for shape in shapes) * _WIDEST_ITEM


def volume(dims: Iterable[Any]) -> int:
    """Elements of a shape, as a Python int (no int64 overflow); a negative dim counts as 0."""
    total = 1
    for dim in dims:
        total *= max(0, int(dim))
    return total
