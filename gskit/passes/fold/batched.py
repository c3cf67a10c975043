"""Batched evaluation of constant nodes, for models over ``_PARTITION_BYTES`` of constants or with weights on
disk (``gskit.io.model.load(path, load_weights=False)``), which are never serialized whole.

The nodes whose inputs are all constant are grouped, in topological order, into batches reading and writing at
most ``_BATCH_BYTES``; each batch becomes a small model (those nodes only) whose large constants are fed
as inputs, read from disk just for that batch. Folded constants of ``_SPILL_BYTES`` or more go to a temporary
data file (:class:`Spill`) and stay on disk as lazy values, so ``gskit.io.model.save`` streams them and peak
memory stays near one batch. A batch that onnxruntime cannot evaluate is evaluated node by node, so the error
(or, with ``allow_partial``, the failure recorded in the report) names the node. Nodes with subgraphs are not
evaluated in this mode.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx.external_data_helper import uses_external_data
from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter, update_import_domains

from gskit.errors import GskitError
from gskit.io import model as gsmodel
from gskit.io import progress
from gskit.passes.fold.cost import volume
from gskit.passes.fold.exclusion import Exclusion, report_key
from gskit.passes.fold.options import FoldReport
from gskit.passes.fold.shape_nodes import is_static, make_constant
from gskit.passes.tensor_types import constant_elem_type, constant_nbytes

log = logging.getLogger(__name__)


#: Above this many bytes of constants, evaluate foldable nodes partition by partition (protobuf's 2 GB limit).
_PARTITION_BYTES = 1_500_000_000
#: Batched folding: most bytes of constants (read) plus known results (written) one onnxruntime run handles.
_BATCH_BYTES = 512 * 2**20
#: Batched folding: folded constants at least this large are written to a data file instead of kept in memory.
_SPILL_BYTES = 2**20
#: Batched folding: in-memory constants up to this size go into a batch model as initializers, others are fed.
_FEED_BYTES = 64 * 1024
#: Element types read from data files with numpy directly (one copy, no protobuf round trip).
_PLAIN_TYPES = frozenset(
    {
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.DOUBLE,
        onnx.TensorProto.FLOAT16,
        onnx.TensorProto.BOOL,
        onnx.TensorProto.INT8,
        onnx.TensorProto.INT16,
        onnx.TensorProto.INT32,
        onnx.TensorProto.INT64,
        onnx.TensorProto.UINT8,
        onnx.TensorProto.UINT16,
        onnx.TensorProto.UINT32,
        onnx.TensorProto.UINT64,
    }
)


def uses_batches(graph: gs.Graph, constant_bytes: int) -> bool:
    """Whether ``graph`` must be folded batch by batch: its ``constant_bytes`` exceed ``_PARTITION_BYTES`` or
    some weights are still on disk."""
    if constant_bytes > _PARTITION_BYTES or _has_disk_weights(graph):
        log.info("constants exceed %d bytes or are on disk: folding batch by batch", _PARTITION_BYTES)
        return True
    return False


def _has_disk_weights(graph: gs.Graph) -> bool:
    """Some constant still reads its values from a data file (``load_weights=False``)."""
    return any(
        isinstance(t, gs.Constant) and gsmodel.disk_tensor(t) is not None for t in graph.tensors().values()
    )


def fold_batched(
    graph: gs.Graph,
    exclude: Exclusion,
    size_threshold: int | None,
    allow_partial: bool,
    spill: Spill,
    report: FoldReport,
) -> None:
    """Evaluate the constant nodes of ``graph`` batch by batch and replace their used results by constants."""
    graph.toposort()
    context = _BatchContext(graph, size_threshold, allow_partial, spill, report, exclude.failed)
    exclude.start_batch()
    nodes = _foldable_nodes(graph, exclude, report)
    with progress.task("fold: constant nodes evaluated", total=len(nodes)) as advance:
        for batch in _batches(nodes, exclude.result_bytes):
            context.evaluate(batch)
            advance(len(batch))


def _foldable_nodes(graph: gs.Graph, exclude: Exclusion, report: FoldReport) -> list[gs.Node]:
    """Nodes (topological order) whose inputs are constants or results of earlier foldable nodes."""
    produced: set[int] = set()
    foldable = []
    for node in graph.nodes:
        if not node.outputs or id(node) in exclude.failed:
            continue
        if not all(_is_available(t, produced) for t in node.inputs):
            continue
        if exclude(node):
            continue
        key = report_key(node)
        if any(True for _ in gsmodel.node_subgraphs(node)):
            report.excluded[key] = "has a subgraph (not evaluated when folding batch by batch)"
            continue
        foldable.append(node)
        produced.update(id(t) for t in node.outputs)
    return foldable


def _batches(nodes: list[gs.Node], result_bytes: dict[int, int]) -> Iterator[list[gs.Node]]:
    """Consecutive groups of ``nodes`` reading and writing about ``_BATCH_BYTES`` at most (or one node).

    A node's results count with the size fold judged they will have (``result_bytes``), else (no size
    threshold) with their declared size.
    """
    batch: list[gs.Node] = []
    seen: set[int] = set()
    size = 0
    for node in nodes:
        reads = [t for t in node.inputs if isinstance(t, gs.Constant) and id(t) not in seen]
        writes = result_bytes.get(id(node))
        if writes is None:
            writes = sum(_known_nbytes(t) or 0 for t in node.outputs)
        cost = sum(constant_nbytes(t) for t in reads) + writes
        if batch and size + cost > _BATCH_BYTES:
            yield batch
            batch, seen, size = [], set(), 0
            reads = [t for t in node.inputs if isinstance(t, gs.Constant)]
        batch.append(node)
        seen.update(id(t) for t in reads)
        size += cost
    if batch:
        yield batch


class _BatchContext:
    """Evaluates batches of constant nodes of one graph on onnxruntime and folds their results."""

    def __init__(
        self,
        graph: gs.Graph,
        size_threshold: int | None,
        allow_partial: bool,
        spill: Spill,
        report: FoldReport,
        failed: set[int],
    ) -> None:
        self.graph = graph
        self.failed = failed
        self.size_threshold = size_threshold
        self.allow_partial = allow_partial
        self.spill = spill
        self.report = report
        self.graph_outputs = {id(t) for t in graph.outputs}
        self.opsets = list(update_import_domains(graph))

    def evaluate(self, batch: list[gs.Node]) -> None:
        """Evaluate ``batch``; on failure evaluate its nodes one by one to name the culprit."""
        produced: set[int] = set()
        nodes = []
        for node in batch:  # an input may have stayed unfolded (a failure, a result over the size threshold)
            if all(_is_available(t, produced) for t in node.inputs):
                nodes.append(node)
                produced.update(id(t) for t in node.outputs)
        if not nodes:
            return
        in_batch = {id(n) for n in nodes}
        outputs = [  # results read outside the batch; the others are never materialized
            t
            for n in nodes
            for t in n.outputs
            if not t.is_empty()
            and (id(t) in self.graph_outputs or any(id(c) not in in_batch for c in t.outputs))
        ]
        if not outputs:
            return
        try:
            values = self._run(nodes, outputs)
        except GskitError as err:
            if len(nodes) > 1:
                log.info("fold: a batch of %d nodes failed (%s); evaluating node by node", len(nodes), err)
                for node in nodes:
                    self.evaluate([node])
                return
            node = nodes[0]
            message = f"fold: onnxruntime could not evaluate node '{report_key(node)}' ({node.op}): {err}"
            if not self.allow_partial:
                raise GskitError(
                    f"{message}; pass allow_partial=True (--allow-partial) to keep it unfolded"
                ) from err
            log.warning("%s; left unfolded", message)
            self.report.failures.append(message)
            self.failed.add(id(node))
            return
        self.report.batches += 1
        self.report.evaluated_nodes += len(nodes)
        for tensor, value in zip(outputs, values, strict=True):
            self._fold_tensor(tensor, value)

    def _run(self, nodes: list[gs.Node], outputs: list[gs.Tensor]) -> list[np.ndarray]:
        consts: dict[int, gs.Constant] = {}
        for node in nodes:
            for tensor in node.inputs:
                if isinstance(tensor, gs.Constant):
                    consts.setdefault(id(tensor), tensor)
        fed = [
            t
            for t in consts.values()
            if isinstance(t._values, gs.ir.tensor.LazyValues) or constant_nbytes(t) > _FEED_BYTES
        ]
        fed_ids = {id(t) for t in fed}
        kept = [t for t in consts.values() if id(t) not in fed_ids]
        graph = onnx.helper.make_graph(
            [OnnxExporter.export_node(n) for n in nodes],
            "gskit_fold_batch",
            [onnx.helper.make_tensor_value_info(t.name, constant_elem_type(t), t.shape) for t in fed],
            [OnnxExporter.export_value_info_proto(t, do_type_check=False) for t in outputs],
            initializer=[OnnxExporter.export_tensor_proto(t) for t in kept],
        )
        model = onnx.helper.make_model(graph, opset_imports=self.opsets, ir_version=self.graph.ir_version)
        feeds = {t.name: _read_values(t) for t in fed}
        # Evaluating nodes is execution, which lives in gskit.backends: imported here, where it is needed
        # (the one core-to-backend import docs/architecture.md allows).
        from gskit.backends import ort

        results = ort.run(ort.session(model), feeds, [t.name for t in outputs])
        return [results[t.name] for t in outputs]

    def _fold_tensor(self, tensor: gs.Tensor, value: Any) -> None:
        if not isinstance(value, np.ndarray):
            log.warning("fold: '%s' evaluated to a non-tensor value; left unfolded", tensor.name)
            return
        if _over(value.nbytes, self.size_threshold):
            self.report.excluded[tensor.name] = (
                f"result of {value.nbytes} bytes is larger than size_threshold ({self.size_threshold} bytes)"
            )
            return
        make_constant(tensor, value)
        if value.nbytes >= _SPILL_BYTES and value.dtype.kind in "biuf" and value.dtype.isnative:
            tensor._values = self.spill.write(tensor.name, value)
            self.report.spilled_bytes += value.nbytes


class Spill:
    """A data file holding large folded constants until the model is saved; constants read it lazily."""

    def __init__(self, folder: str | os.PathLike | None) -> None:
        self.folder = Path(folder) if folder is not None else None
        self.temporary = folder is None
        self.path: Path | None = None

    def write(self, name: str, value: np.ndarray) -> gs.ir.tensor.LazyValues:
        """Append ``value`` to the data file; return lazy values reading it back from there."""
        if self.path is None:
            if self.folder is None:
                self.folder = Path(tempfile.mkdtemp(prefix="gskit-fold-"))
            self.folder.mkdir(parents=True, exist_ok=True)
            handle, path = tempfile.mkstemp(prefix="folded-", suffix=".data", dir=self.folder)
            os.close(handle)
            self.path = Path(path)
        with open(self.path, "ab") as data:
            offset = data.tell()
            pad = (-offset) % 4096
            data.write(b"\0" * pad)
            offset += pad
            data.write(memoryview(np.ascontiguousarray(value)).cast("B"))
        tensor = onnx.TensorProto(
            name=name,
            data_type=onnx.helper.np_dtype_to_tensor_dtype(value.dtype),
            dims=value.shape,
            data_location=onnx.TensorProto.EXTERNAL,
        )
        entries = {
            "location": self.path.name,
            "offset": offset,
            "length": value.nbytes,
            "basepath": self.path.parent,
        }
        for key, entry in entries.items():
            tensor.external_data.add(key=key, value=str(entry))
        return gsmodel.DiskValues(tensor)

    def keep_while(self, owner: object) -> None:
        """Remove a temporary folder once ``owner`` is collected (or at exit)."""
        if self.temporary and self.folder is not None:
            weakref.finalize(owner, shutil.rmtree, str(self.folder), True)

    def keep_until_exit(self) -> None:
        """Remove a temporary folder when the interpreter exits."""
        if self.temporary and self.folder is not None:
            atexit.register(shutil.rmtree, str(self.folder), True)


def _is_available(tensor: gs.Tensor, produced: set[int]) -> bool:
    return isinstance(tensor, gs.Constant) or tensor.is_empty() or id(tensor) in produced


def _known_nbytes(tensor: gs.Tensor) -> int | None:
    if tensor.dtype is None or tensor.shape is None or not is_static(tensor.shape):
        return None
    try:
        itemsize = np.dtype(tensor.dtype).itemsize
    except TypeError:
        return None
    return volume(tensor.shape) * itemsize


def _over(nbytes: int | None, size_threshold: int | None) -> bool:
    return nbytes is not None and size_threshold is not None and nbytes > size_threshold


def _read_values(tensor: gs.Constant) -> np.ndarray:
    """A constant's values without caching them on the tensor (so they are freed after the batch)."""
    values = tensor._values
    if not isinstance(values, gs.ir.tensor.LazyValues):
        return values
    proto = values.tensor
    if uses_external_data(proto) and proto.data_type in _PLAIN_TYPES:
        entries = {e.key: e.value for e in proto.external_data}
        path = Path(entries.get("basepath", ".")) / entries["location"]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(proto.data_type)
        count = int(np.prod(proto.dims, dtype=np.int64))
        array = np.fromfile(path, dtype=dtype, count=count, offset=int(entries.get("offset", 0)))
        if array.size != count:
            raise GskitError(
                f"{path}: external data ends early for tensor '{proto.name}'; the file is truncated"
            )
        return array.reshape(tuple(proto.dims))
    return values.load()
