"""Run a model whose weights lie on disk in consecutive segments, one onnxruntime session at a time.

onnxruntime maps a model's external weights from their data file, and a run touches every page of them: the
kernel counts those pages in the process's resident memory for as long as the session lives, so one run of a
2.5 GB model shows 2.5 GB of RSS although the pages are clean and the kernel drops them when memory is short.
A model with more than :data:`SEGMENTED_OVER` bytes of weights on disk is therefore run as consecutive
segments of its main graph, each holding at most :data:`SEGMENT_BYTES` of weights (a larger weight is a
segment of its own): each segment's session is released before the next is made, so the process maps one
segment's weights at a time.

A segment is a model of its own: a run of consecutive nodes of the main graph in the file's order, with the
model's IR version, opsets and local functions; its initializers point at the same bytes of the same data
files (``gskit.io.model.save_linked`` links them, nothing is read or copied), so a segmented run still checks
the exact file; its inputs are the graph inputs and the values earlier segments produced that it reads, fed as
they came out; its outputs are the values it produces that a later segment or the graph's outputs read.
gskit's comparisons run with graph optimizations off, so onnxruntime runs each node's kernel on the same
inputs as one session would, and the outputs are the same bit for bit (``tests/test_ort_segments.py``).

What is not split is run whole, as before: a graph that is not in topological order, a graph output that no
node of the main graph produces, sparse initializers, a value between segments that is not a tensor (a
sequence, a map); and any failure of a segmented run (a model onnxruntime rejects, inputs that do not fit, a
plugin reference raising) is run again as one session, so errors read exactly as they did.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import onnx
from onnx.external_data_helper import _get_all_tensors, uses_external_data

from gskit.io import model as gsmodel

log = logging.getLogger(__name__)

#: Models with more bytes of weights on disk than this are run in segments.
SEGMENTED_OVER = 1 << 30
#: The most bytes of weights a segment holds (a larger weight is a segment of its own).
SEGMENT_BYTES = 256 << 20


@dataclass(frozen=True)
class Segment:
    """Consecutive nodes of the main graph (``nodes``: indices), the values it takes from the graph inputs
    and earlier segments (``inputs``), those it hands on (``outputs``) and the initializers it reads."""

    nodes: tuple[int, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    initializers: tuple[str, ...]


def plan(model: onnx.ModelProto, *, over: int | None = None, budget: int | None = None) -> list[Segment]:
    """The segments ``model`` is run in; an empty list when it is run whole (at most ``over`` bytes of weights
    on disk, one segment only, or a graph that is not split: see the module's docstring). ``over`` and
    ``budget`` default to :data:`SEGMENTED_OVER` and :data:`SEGMENT_BYTES`."""
    over = SEGMENTED_OVER if over is None else over
    budget = SEGMENT_BYTES if budget is None else budget
    graph = model.graph
    if graph.sparse_initializer:
        return []
    sizes = {t.name: gsmodel.tensor_nbytes(t) for t in graph.initializer}
    on_disk = sum(gsmodel.tensor_nbytes(t) for t in _get_all_tensors(model) if uses_external_data(t))
    if on_disk <= over:
        return []
    reads = [gsmodel.node_reads(node) for node in graph.node]
    groups = _group(graph, reads, sizes, budget)
    if groups is None or len(groups) < 2:
        return []
    produced = {out for node in graph.node for out in node.output if out}
    graph_outputs = [o.name for o in graph.output]
    if any(name not in produced for name in graph_outputs):
        return []
    last_reader = {name: len(groups) for name in graph_outputs}
    for g, nodes in enumerate(groups):
        for i in nodes:
            for name in reads[i]:
                last_reader[name] = max(last_reader.get(name, g), g)
    segments = []
    for g, nodes in enumerate(groups):
        mine = [name for i in nodes for name in reads[i]]
        made = {out for i in nodes for out in graph.node[i].output}
        inputs = [n for n in dict.fromkeys(mine) if n not in made and n not in sizes]
        outputs = [out for i in nodes for out in graph.node[i].output if out and last_reader.get(out, g) > g]
        initializers = [n for n in dict.fromkeys(mine) if n in sizes]
        segments.append(Segment(tuple(nodes), tuple(inputs), tuple(outputs), tuple(initializers)))
    return segments


def _group(
    graph: onnx.GraphProto, reads: list[list[str]], sizes: Mapping[str, int], budget: int
) -> list[list[int]] | None:
    """Node indices in consecutive groups of at most ``budget`` bytes of initializers (those the nodes read,
    and those their subgraphs hold); None where a node reads a value that no earlier node, graph input or
    initializer gives (a graph out of topological order)."""
    known = {i.name for i in graph.input} | set(sizes)
    groups: list[list[int]] = [[]]
    held: set[str] = set()
    weight = 0
    for index, node in enumerate(graph.node):
        if any(name not in known for name in reads[index]):
            return None
        inside = sum(
            gsmodel.tensor_nbytes(t) for sub in gsmodel.proto_subgraphs(node) for t in _initializers_in(sub)
        )
        new = {name for name in reads[index] if name in sizes and name not in held}
        added = inside + sum(sizes[name] for name in new)
        if weight and added and weight + added > budget:  # a node that adds no weight stays with its group
            groups.append([])
            held, weight = set(), 0
            new = {name for name in reads[index] if name in sizes}
            added = inside + sum(sizes[name] for name in new)
        groups[-1].append(index)
        held |= new
        weight += added
        known.update(out for out in node.output if out)
    return groups


def _initializers_in(graph: onnx.GraphProto) -> Iterable[onnx.TensorProto]:
    for inner in gsmodel.graph_protos(graph):
        yield from inner.initializer


def segment_model(model: onnx.ModelProto, segment: Segment, fed: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """``segment`` of ``model`` as a model of its own; the types of the values handed on from earlier
    segments are those of the arrays ``fed``, the other inputs keep their declarations."""
    graph = model.graph
    part = onnx.ModelProto()
    for field in ("ir_version", "producer_name", "producer_version", "domain", "model_version"):
        setattr(part, field, getattr(model, field))
    part.opset_import.extend(model.opset_import)
    part.functions.extend(model.functions)
    part.graph.name = graph.name
    part.graph.node.extend(graph.node[i] for i in segment.nodes)
    initializers = {t.name: t for t in graph.initializer}
    part.graph.initializer.extend(initializers[name] for name in segment.initializers)
    declared = {v.name: v for v in (*graph.input, *graph.value_info, *graph.output)}
    graph_inputs = {i.name for i in graph.input}
    # an initializer that is also a graph input stays one (IR version 3 requires it)
    part.graph.input.extend(declared[name] for name in segment.initializers if name in graph_inputs)
    for name in segment.inputs:
        if name in graph_inputs:
            part.graph.input.append(declared[name])
        else:
            value = fed[name]
            elem = onnx.helper.np_dtype_to_tensor_dtype(value.dtype)
            part.graph.input.append(onnx.helper.make_tensor_value_info(name, elem, value.shape))
    for name in segment.outputs:
        part.graph.output.append(declared.get(name, onnx.ValueInfoProto(name=name)))
    inside = {out for i in segment.nodes for out in graph.node[i].output} - set(segment.outputs)
    part.graph.value_info.extend(v for v in graph.value_info if v.name in inside)
    return part


class _Arg(NamedTuple):
    """What onnxruntime's ``NodeArg`` tells Polygraphy: a name, a type such as ``tensor(float)``, a shape."""

    name: str
    type: str
    shape: list[int | str | None]


class SegmentedSession:
    """A session-like object for Polygraphy's ``OnnxrtRunner`` (``get_inputs``, ``get_outputs``, ``run``)
    that runs ``model`` segment by segment (:func:`plan`), each segment's session made by ``make_session``
    and released before the next; any failure runs the model whole through ``whole`` instead.

    Attributes:
        segments: the plan; ``last_run`` says how the last run went: ``"segments"`` or ``"whole"``.
    """

    def __init__(
        self,
        model: onnx.ModelProto,
        segments: Sequence[Segment],
        make_session: Callable[[onnx.ModelProto], Any],
        whole: Callable[[], Any],
    ) -> None:
        self.model = model
        self.segments = list(segments)
        self._make_session = make_session
        self._whole = whole
        self.last_run = ""

    def get_inputs(self) -> list[_Arg]:
        initializers = {t.name for t in self.model.graph.initializer}
        return [_arg(v) for v in self.model.graph.input if v.name not in initializers]

    def get_outputs(self) -> list[_Arg]:
        return [_arg(v) for v in self.model.graph.output]

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any], *args: Any) -> list[Any]:
        """Outputs ``output_names`` (all if None) of a run on ``input_feed``, as ``InferenceSession.run``."""
        names = list(output_names) if output_names else [o.name for o in self.model.graph.output]
        inputs = {arg.name for arg in self.get_inputs()}
        values = None
        if set(input_feed) <= inputs and all(isinstance(v, np.ndarray) for v in input_feed.values()):
            try:
                values = self._run_segments(input_feed)
            except Exception as err:  # noqa: BLE001  # whatever failed, one session says it as before
                log.info("segmented run failed (%s): the model runs as one session", err)
        if values is None or any(name not in values for name in names):
            self.last_run = "whole"
            whole = self._whole()  # held here: the session's run holds it weakly
            return whole.run(output_names, input_feed, *args)
        self.last_run = "segments"
        return [values[name] for name in names]

    def _run_segments(self, feeds: Mapping[str, np.ndarray]) -> dict[str, Any]:
        values: dict[str, Any] = dict(feeds)
        kept = set(feeds) | {o.name for o in self.model.graph.output}
        for number, segment in enumerate(self.segments, 1):
            handed = {n: values[n] for n in segment.inputs if n in values}
            if any(not isinstance(v, np.ndarray) for v in handed.values()):
                raise _NotATensor
            part = segment_model(self.model, segment, handed)
            sess = self._make_session(part)
            known = {i.name for i in sess.get_inputs()}
            out = sess.run(list(segment.outputs), {n: v for n, v in handed.items() if n in known})
            del sess  # its mapping of this segment's weights goes before the next is made
            values.update(zip(segment.outputs, out, strict=True))
            for name in segment.inputs:  # what no later segment reads is let go
                if name not in kept and not any(name in later.inputs for later in self.segments[number:]):
                    del values[name]
            log.debug("segment %d/%d: %d nodes", number, len(self.segments), len(segment.nodes))
        return values


class _NotATensor(Exception):
    """A value handed between segments is not a tensor: the model runs whole."""


def _arg(value: onnx.ValueInfoProto) -> _Arg:
    tensor = value.type.tensor_type
    name = onnx.TensorProto.DataType.Name(tensor.elem_type).lower() if tensor.elem_type else "float"
    dims: list[int | str | None] = [
        d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim
    ]
    return _Arg(value.name, f"tensor({name})", dims)
