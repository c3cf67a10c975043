"""Tensor types on a graphsurgeon graph: fill missing dtypes and shapes, export without losing types.

graphsurgeon keeps tensors' dtypes and shapes but drops what it has no field for (sequence, optional and
map value types; ``TYPE_PROTO`` attributes such as ``Optional``'s ``type``). The passes that rebuild
nodes (fold, sanitize, convert) need the dtypes of every tensor and a faithful export, so they share:

* :func:`infer_tensor_types`: onnx shape inference on a weightless view, results written back onto the
  graph's tensors (works past 2 GB: large constants are given to onnx as typed inputs);
* :class:`GsLosses` and :func:`export_graph`: remember what graphsurgeon drops and write it back;
* :func:`constant_nbytes`: a constant's size without reading weights left on disk.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import onnx
import onnx_graphsurgeon as gs

from gskit.io import model as gsmodel

log = logging.getLogger(__name__)

#: Constants larger than this are given to shape inference as typed inputs instead of values.
INFER_VALUE_BYTES = 64 * 1024


def constant_nbytes(tensor: gs.Constant) -> int:
    """Bytes of a constant's values; for values still on disk, read from the TensorProto's header only."""
    values = tensor._values
    if isinstance(values, gs.ir.tensor.LazyValues):
        return gsmodel.tensor_nbytes(values.tensor)
    return int(getattr(values, "nbytes", 0))


#: Most elements of 1-D tensors, read by all nodes together, that onnx's data propagation is given.
DATA_PROP_ELEMENTS = 2**20


def data_propagation_bounded(model: onnx.ModelProto) -> bool:
    """Whether onnx's shape inference may propagate data (``data_prop=True``) through ``model`` in bounded
    time.

    onnx's data propagation makes a protobuf dim of every element of a 1-D tensor that enters ``Concat``,
    ``Add``, ``Gather``, ``Slice``, ``Cast``... (values it does not know included), holding the GIL all along:
    a 17 kB model that concatenates 400 ``Expand`` results of 1M elements took minutes and gigabytes in
    inference alone, and no signal could stop it. So the 1-D tensors the nodes read are measured first, with
    inference that propagates no data and ignores the model's declared shapes (they are claims); past
    ``DATA_PROP_ELEMENTS`` in all, data is not propagated (shapes are still inferred, a little less far).
    Lengths that only data propagation itself could find are not seen here.
    """
    view = onnx.ModelProto()
    view.CopyFrom(model)
    del view.graph.value_info[:]
    for info in view.graph.output:
        if info.type.HasField("tensor_type"):
            info.type.tensor_type.ClearField("shape")
    try:
        inferred = onnx.shape_inference.infer_shapes(view, strict_mode=False, data_prop=False)
    except Exception:  # noqa: BLE001  # the caller's own inference meets the same problem and reports it
        return True
    graph = inferred.graph
    lengths = {t.name: int(t.dims[0]) for t in graph.initializer if len(t.dims) == 1}
    for info in (*graph.input, *graph.value_info, *graph.output):
        dims = info.type.tensor_type.shape.dim if info.type.HasField("tensor_type") else ()
        if len(dims) == 1 and dims[0].HasField("dim_value"):
            lengths[info.name] = int(dims[0].dim_value)
    read = sum(lengths.get(name, 0) for node in graph.node for name in node.input)
    if read > DATA_PROP_ELEMENTS:
        log.info("shape inference without data propagation: nodes read %d elements of 1-D tensors", read)
        return False
    return True


def infer_tensor_types(
    graph: gs.Graph, odd_types: GsLosses | None = None, *, dtypes_only: bool = False, symbolic: bool = True
) -> None:
    """Fill missing dtypes, shapes and value kinds of graph tensors from onnx shape inference (best effort).

    Large constants are given to onnx as typed inputs, so this works on models over 2 GB. Failures are logged,
    not raised: callers use the result as extra information only. ``dtypes_only`` leaves shapes as they are
    (pattern matching needs dtypes only and should not add shapes to the model it writes). ``symbolic`` asks
    onnxruntime's symbolic shape inference where onnx leaves the input of a ``Shape`` unknown (slower).
    """
    odd_types = odd_types or GsLosses()
    view = graph.copy()
    for tensor in view.tensors().values():
        if isinstance(tensor, gs.Constant) and constant_nbytes(tensor) > INFER_VALUE_BYTES:
            dtype, shape = tensor.dtype, tuple(tensor.shape)
            tensor.to_variable(dtype=dtype, shape=shape)
            tensor.type = "tensor_type"  # to_variable leaves out what Variable.__init__ sets; export needs it
            view.inputs.append(tensor)
    try:
        proto = export_graph(view, odd_types)
        inferred = onnx.shape_inference.infer_shapes(
            proto, strict_mode=False, data_prop=data_propagation_bounded(proto)
        )
    except Exception as err:  # onnx raises several types; the passes still work without the extra shapes
        log.info("shape inference failed (%s); keeping the shapes in the model", err)
        return
    infos: dict[str, onnx.ValueInfoProto] = {}
    for proto_graph in gsmodel.graph_protos(inferred.graph):
        for info in proto_graph.value_info:
            infos.setdefault(info.name, info)
    for sub in (graph, *graph.subgraphs(recursive=True)):
        for name, tensor in sub.tensors().items():
            info = infos.get(name)
            if info is None or not isinstance(tensor, gs.Variable):
                continue
            _apply_value_info(tensor, info, dtypes_only)
    if symbolic and not dtypes_only and _shape_inputs_unknown(graph):
        _infer_symbolic_shapes(graph, inferred)


def _shape_inputs_unknown(graph: gs.Graph) -> bool:
    """Some ``Shape``, in the graph or a subgraph, reads a tensor of unknown rank or with a dim onnx could not
    name (``unk__N``)."""
    return any(
        n.op == "Shape" and n.inputs and (n.inputs[0].shape is None or _invented_dims(n.inputs[0].shape))
        for sub in (graph, *graph.subgraphs(recursive=True))
        for n in sub.nodes
    )


def _invented_dims(shape: Any) -> bool:
    return any(isinstance(d, str) and d.startswith("unk__") for d in shape)


def _infer_symbolic_shapes(graph: gs.Graph, proto: onnx.ModelProto) -> None:
    """Second opinion: onnxruntime's symbolic shape inference, as Polygraphy uses, on the graph and its
    subgraphs.

    onnx gives up on e.g. ``Reshape(x, [W, -1, 512])`` with a symbolic ``W``, or on every dim of a ``Slice``
    whose starts are computed (in a ``Loop`` body: the iteration number); onnxruntime's inference computes
    such dims as expressions and keeps the dims a slice does not touch, so a ``Shape -> Gather`` of a static
    dim after it folds. Run only when some ``Shape`` still reads a tensor of unknown shape (it is slower);
    failures are logged, not raised. Only fixed sizes it derives are taken over.
    """
    from gskit.backends import ort as ort_backend  # runs onnxruntime's inference code: only when needed

    try:
        inferred = ort_backend.symbolic_shape_inference(proto)
    except Exception as err:  # its own asserts and exceptions on ops it does not know; best effort
        log.info("onnxruntime's symbolic shape inference failed (%s)", _first_line(err))
        return
    if inferred is None:
        return
    infos: dict[str, onnx.ValueInfoProto] = {}
    for proto_graph in gsmodel.graph_protos(inferred.graph):
        for info in proto_graph.value_info:
            infos.setdefault(info.name, info)
    tensors = (t for sub in (graph, *graph.subgraphs(recursive=True)) for t in sub.tensors().values())
    for tensor in tensors:
        info = infos.get(tensor.name)
        if info is None or not isinstance(tensor, gs.Variable):
            continue
        if tensor.shape is None:
            _apply_value_info(tensor, info)
        elif _invented_dims(tensor.shape) and len(info.type.tensor_type.shape.dim) == len(tensor.shape):
            # a fixed size onnx could not work out replaces its placeholder name
            tensor.shape = [
                d.dim_value
                if isinstance(old, str) and old.startswith("unk__") and d.HasField("dim_value")
                else old
                for old, d in zip(tensor.shape, info.type.tensor_type.shape.dim, strict=True)
            ]


def _first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [repr(err)])[0]


@dataclass
class GsLosses:
    """What graphsurgeon drops on import: non-tensor value types, TYPE_PROTO attrs (``Optional``'s type)."""

    types: dict[str, onnx.TypeProto] = field(default_factory=dict)
    #: by the node's first output name
    attrs: dict[str, list[onnx.AttributeProto]] = field(default_factory=dict)

    @classmethod
    def of(cls, graph: onnx.GraphProto) -> GsLosses:
        losses = cls()
        for proto_graph in gsmodel.graph_protos(graph):
            for info in (*proto_graph.input, *proto_graph.output, *proto_graph.value_info):
                kind = info.type.WhichOneof("value")
                if kind not in (None, "tensor_type"):
                    losses.types[info.name] = info.type
            for node in proto_graph.node:
                lost = [a for a in node.attribute if a.type in _GS_UNSUPPORTED_ATTRS]
                if lost and node.output:
                    losses.attrs[node.output[0]] = lost
        return losses

    def restore(self, model: onnx.ModelProto) -> None:
        if not (self.types or self.attrs):
            return
        for proto_graph in gsmodel.graph_protos(model.graph):
            for info in (*proto_graph.input, *proto_graph.output, *proto_graph.value_info):
                if info.name in self.types:
                    info.type.CopyFrom(self.types[info.name])
            for node in proto_graph.node:
                lost = self.attrs.get(node.output[0]) if node.output else None
                present = {a.name for a in node.attribute}
                node.attribute.extend(a for a in lost or () if a.name not in present)


_GS_UNSUPPORTED_ATTRS = (onnx.AttributeProto.TYPE_PROTO, onnx.AttributeProto.TYPE_PROTOS)


def export_graph(graph: gs.Graph, odd_types: GsLosses) -> onnx.ModelProto:
    """``gsmodel.to_model`` that writes back the non-tensor types graphsurgeon cannot export, exactly."""
    model = gsmodel.to_model(graph)
    odd_types.restore(model)
    return model


def _apply_value_info(tensor: gs.Variable, info: onnx.ValueInfoProto, dtypes_only: bool = False) -> None:
    kind = info.type.WhichOneof("value")
    if kind and kind != "tensor_type":
        if not dtypes_only:
            tensor.type = kind
        return
    ttype = info.type.tensor_type
    if tensor.dtype is None and ttype.elem_type:
        tensor.dtype = onnx.helper.tensor_dtype_to_np_dtype(ttype.elem_type)
    if tensor.shape is None and ttype.HasField("shape") and not dtypes_only:
        tensor.shape = [
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in ttype.shape.dim
        ]
