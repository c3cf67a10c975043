"""A graph's large weights kept out of graphsurgeon's export and put into the exported model after it.

graphsurgeon's export copies a weight four times on its way into the model: the array's bytes
(``tobytes``), those bytes into a ``TensorProto``, that tensor into the ``GraphProto`` and the graph into the
``ModelProto`` (``onnx.helper.make_graph``/``make_model`` copy their parts). A weight it already holds as a
``TensorProto`` (a lazily loaded initializer) is copied twice. Each copy is fresh memory: on a 5 MB model
those copies, and the page faults that come with them, were most of an export's time.

:func:`exporting_weights_apart` gives each large weight of the top-level graph, for the time of the export, a
stand-in holding its header only (type, dims) and a mark; :func:`restore_weights` then writes the payload
into every exported tensor that carries the mark (graphsurgeon also writes a weight a subgraph reads from
the outer graph as an initializer of that subgraph): the array's bytes (two copies) or the held tensor (one).
The model is the one the export would have made, field for field (``tests/test_model.py``). A weight of
another form (a dtype graphsurgeon converts on export, a set data location, values outside ``raw_data``,
data on disk) is exported as before.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx.external_data_helper import _get_all_tensors
from onnx_graphsurgeon.exporters.onnx_exporter import dtype_to_onnx

from gskit.io.gs_export import node_subgraphs

#: Weights smaller than this are exported as graphsurgeon does: their copies cost less than the stand-in.
APART_MIN_BYTES = 64 * 1024
#: numpy kinds whose ``tobytes`` is what graphsurgeon writes as ``raw_data`` (bool, ints, floats, complex).
_RAW_KINDS = frozenset("biufc")


@dataclass
class WeightsApart:
    """The weights :func:`exporting_weights_apart` kept out of an export, by the mark of their stand-ins."""

    sources: dict[str, Any] = field(default_factory=dict)
    #: False when only the top-level graph's initializers can hold a stand-in (no subgraph, no weight used as
    #: an attribute): the rest of the exported model is not searched (a few microseconds per node)
    everywhere: bool = False


@contextmanager
def exporting_weights_apart(graph: gs.Graph) -> Iterator[WeightsApart]:
    """While exporting ``graph``: its large weights are header-only stand-ins, each marked in its
    ``doc_string`` (a field graphsurgeon writes for no weight).

    Yields the weights kept apart (a numpy array, or the ``TensorProto`` held), for :func:`restore_weights`.
    The weights are put back afterwards: the caller's graph is left as it was.
    """
    prefix = f"gskit-weight-{uuid.uuid4().hex}:"
    swapped: list[tuple[gs.Constant, Any, onnx.TensorProto]] = []
    apart = WeightsApart()
    for tensor in _constants(graph):
        values = tensor._values
        held = not isinstance(values, np.ndarray)
        header = _held_header(values) if held else _array_header(tensor, values)
        if header is None:
            continue
        header.doc_string = mark = f"{prefix}{len(swapped)}"
        apart.sources[mark] = values.tensor if held else values
        swapped.append((tensor, values, header))
    if swapped:  # graphsurgeon also writes a weight a subgraph reads there, and one used as an attribute
        ids = {id(tensor) for tensor, _, _ in swapped}
        apart.everywhere = any(
            _elsewhere(value, ids) for node in graph.nodes for value in node.attrs.values()
        )
    for tensor, _, header in swapped:
        tensor._values = gs.ir.tensor.LazyValues(header)
    try:
        yield apart
    finally:
        for tensor, values, _ in swapped:
            tensor._values = values


def restore_weights(model: onnx.ModelProto, apart: WeightsApart) -> None:
    """Write the payload of each weight :func:`exporting_weights_apart` kept apart into every tensor of
    ``model`` that carries its mark (initializers of the graph and of its subgraphs, tensor attributes)."""
    if not apart.sources:
        return
    tensors = _get_all_tensors(model) if apart.everywhere else model.graph.initializer
    for tensor in tensors:
        source = apart.sources.get(tensor.doc_string) if tensor.doc_string else None
        if source is None:
            continue
        if isinstance(source, np.ndarray):
            tensor.ClearField("doc_string")
            tensor.raw_data = source.tobytes()
        else:
            name = tensor.name  # the constant's, which the held tensor (the caller's) keeps out of
            tensor.CopyFrom(source)
            tensor.name = name


@contextmanager
def held_names_kept(graph: gs.Graph) -> Iterator[None]:
    """While exporting ``graph``: the names of the tensors its constants hold (``LazyValues``: the
    initializers of the model it was imported from, the caller's) are the ones they had.

    graphsurgeon's export names a held tensor after its constant in place, so renaming a weight in the graph
    and exporting it renamed the initializer of the caller's model, which its nodes still read by the old
    name. Graphs and subgraphs are walked once; a name is put back only where the export changed it.
    """
    held: list[tuple[onnx.TensorProto, str]] = []
    pending = [graph]
    while pending:
        current = pending.pop()
        for tensor in _constants(current):
            values = tensor._values
            if type(values) is gs.ir.tensor.LazyValues and isinstance(values.tensor, onnx.TensorProto):
                if values.tensor.name != tensor.name:
                    held.append((values.tensor, values.tensor.name))
        pending.extend(sub for node in current.nodes for sub in node_subgraphs(node))
    try:
        yield
    finally:
        for proto, name in held:
            proto.name = name


def _constants(graph: gs.Graph) -> list[gs.Constant]:
    """The top-level graph's constants, each once (``graph.tensors()`` checks every tensor's name on the
    way: 4x the time of this walk on a 10k-node graph)."""
    found: dict[int, gs.Constant] = {}
    for node in graph.nodes:
        for tensor in node.inputs:
            if type(tensor) is gs.Constant:
                found[id(tensor)] = tensor
    for tensor in (*graph.inputs, *graph.outputs):
        if type(tensor) is gs.Constant:
            found[id(tensor)] = tensor
    return list(found.values())


def _elsewhere(value: Any, ids: set[int]) -> bool:
    """Whether an attribute value is a subgraph, or one of the weights ``ids``, or a list holding either."""
    if isinstance(value, list):
        return any(_elsewhere(item, ids) for item in value)
    return isinstance(value, gs.Graph) or id(value) in ids


def _array_header(tensor: gs.Constant, values: np.ndarray) -> onnx.TensorProto | None:
    """The header graphsurgeon's ``constant_to_onnx_tensor`` writes for an array it exports unconverted."""
    if values.nbytes < APART_MIN_BYTES or values.dtype.kind not in _RAW_KINDS:
        return None
    if tensor.data_location is not None:
        return None  # the export sets it on the tensor
    data_type = dtype_to_onnx(values.dtype)
    if data_type != dtype_to_onnx(tensor.export_dtype):
        return None  # converted on export (float32 to bfloat16 or float8)
    header = onnx.TensorProto()
    header.data_type = data_type
    header.dims.extend(values.shape)
    return header


def _held_header(values: Any) -> onnx.TensorProto | None:
    """A held tensor's type and dims, when its payload is ``raw_data`` in the proto (the whole tensor is
    copied into each exported one afterwards)."""
    if type(values) is not gs.ir.tensor.LazyValues:  # a weight on disk (DiskValues) or sparse
        return None
    held = values.tensor
    if not isinstance(held, onnx.TensorProto) or not held.HasField("raw_data"):
        return None
    if held.data_location != onnx.TensorProto.DEFAULT or held.external_data:
        return None
    if held.ByteSize() < APART_MIN_BYTES:  # the size without reading the payload out (a copy)
        return None
    header = onnx.TensorProto()  # what graphsurgeon reads of it while exporting; the payload brings the rest
    header.data_type = held.data_type
    header.dims.extend(held.dims)
    return header
