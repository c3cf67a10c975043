"""Tensor types and shape inference: the one owner every module asks.

* element types: :func:`elem_type` (a graphsurgeon dtype, a numpy dtype or a type name -> the ONNX element
  type), :func:`gs_dtype` (back), :func:`constant_elem_type` (what a constant exports as);
* weightless views: :func:`weightless_view` gives onnx a model whose constants over
  :data:`WEIGHTLESS_MAX_BYTES` are stubs (name, type, dims, no data), so inference neither reads nor copies
  weights and works past 2 GB;
* shape inference: :func:`infer_types` is the one call of onnx's ``infer_shapes`` on a model's graph; given
  a plugin registry it runs each plugin's output rule (:mod:`gskit.passes.plugin_schemas`), with data
  propagation where it is bounded (:func:`data_propagation_bounded`);
* on a graphsurgeon graph: :func:`infer_tensor_types` fills missing dtypes and shapes (fold, sanitize,
  convert); :class:`GsLosses` and :func:`export_graph` remember what graphsurgeon drops and write it back;
  :func:`constant_nbytes`: a constant's size without reading weights left on disk.

graphsurgeon keeps tensors' dtypes and shapes but drops what it has no field for (sequence, optional and
map value types; ``TYPE_PROTO`` attributes such as ``Optional``'s ``type``).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import TensorProto
from onnx.external_data_helper import uses_external_data
from onnx_graphsurgeon.importers.onnx_importer import get_numpy_type

from gskit.errors import GskitError
from gskit.io import model as gsmodel

if TYPE_CHECKING:
    from gskit.plugin.registry import PluginRegistry

log = logging.getLogger(__name__)

#: Constants of more bytes than this reach shape inference as stubs (name, type, dims, no data); smaller ones
#: (shape operands of ``Reshape``, ``Slice``, ``Pad``...) keep their values, which inference reads.
WEIGHTLESS_MAX_BYTES = 64 * 1024
_STUB_LOCATION = "__gskit_stripped__"


# -- element types -------------------------------------------------------------------------------------------


def elem_type(dtype: Any) -> int | None:
    """The ONNX element type of a dtype, or None when there is none (unknown, or not a type).

    Takes what graphsurgeon stores as a tensor's dtype (a numpy dtype, or the ONNX enum it keeps for types
    numpy lacks: bfloat16, float8), a numpy dtype or scalar type (``ml_dtypes`` ones included), or a name:
    ONNX's (``float`` is float32, ``bfloat16``, ``float8e4m3fn``) before numpy's (``float32``, ``int64``).
    """
    if dtype is None or isinstance(dtype, (bool, np.bool_)):
        return None
    if isinstance(dtype, (int, np.integer)):
        return int(dtype) if int(dtype) in TensorProto.DataType.values() and int(dtype) else None
    if isinstance(dtype, str) and dtype.upper() in TensorProto.DataType.keys():
        return TensorProto.DataType.Value(dtype.upper()) or None
    try:
        return onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    except (TypeError, KeyError, ValueError):
        return None


def gs_dtype(elem: int) -> np.dtype | int:
    """What graphsurgeon's importer stores as the dtype of an ONNX element type: the numpy dtype where it
    has one, else the ONNX enum (bfloat16, float8)."""
    np_dtype = get_numpy_type(elem)
    return elem if np_dtype is None else np.dtype(np_dtype)


def constant_elem_type(tensor: gs.Constant) -> int | None:
    """The element type a constant exports as: its TensorProto's for values still on disk, else its
    ``export_dtype`` (bfloat16 values are held as float32 with ``export_dtype`` BFLOAT16), else its
    values'."""
    values = tensor._values
    if isinstance(values, gs.ir.tensor.LazyValues) and isinstance(values.tensor, TensorProto):
        return values.tensor.data_type
    return elem_type(tensor.export_dtype if tensor.export_dtype is not None else np.asarray(values).dtype)


# -- weightless views ----------------------------------------------------------------------------------------


#: Within :func:`remembered_sizes`: the bytes of each lazily loaded constant's TensorProto already counted, by
#: ``id`` of its LazyValues (which is kept with it, so the id stays its own).
_LAZY_SIZES: ContextVar[dict[int, tuple[Any, Any, int]] | None] = ContextVar("_LAZY_SIZES", default=None)


@contextmanager
def remembered_sizes() -> Iterator[None]:
    """Within the block, each lazily loaded constant's size is counted once.

    Counting the bytes of a TensorProto's ``raw_data`` copies them (protobuf hands out a new bytes object),
    and fold asks for every constant's size in every pass (which constants reach inference as stubs): on a
    model of 50 MB of weights that was a third of fold's time. The block is one fold, whose constants'
    protos nothing rewrites.
    """
    token = _LAZY_SIZES.set({})
    try:
        yield
    finally:
        _LAZY_SIZES.reset(token)


def _lazy_nbytes(values: gs.ir.tensor.LazyValues) -> int:
    """``gsmodel.tensor_nbytes`` of a LazyValues' TensorProto, counted once in :func:`remembered_sizes`."""
    sizes = _LAZY_SIZES.get()
    if sizes is None:
        return gsmodel.tensor_nbytes(values.tensor)
    known = sizes.get(id(values))
    if known is not None and known[1] is values.tensor:
        return known[2]
    nbytes = gsmodel.tensor_nbytes(values.tensor)
    sizes[id(values)] = (values, values.tensor, nbytes)
    return nbytes


def constant_nbytes(tensor: gs.Constant) -> int:
    """Bytes of a constant's values; for values still on disk, read from the TensorProto's header only."""
    values = tensor._values
    if isinstance(values, gs.ir.tensor.LazyValues):
        return _lazy_nbytes(values)
    return int(getattr(values, "nbytes", 0))


def weightless_view(model: gs.Graph | onnx.ModelProto, *, on_disk: bool = False) -> onnx.ModelProto:
    """A model for shape inference in which every constant of more than :data:`WEIGHTLESS_MAX_BYTES`, and
    every one whose data is on disk, is a typed graph input (name, element type, dims, no data).

    Inference then neither reads weights from disk nor copies them, a model of any size stays under
    protobuf's 2 GB, and an op that reads such a constant's values still gets its type and rank (a stub
    initializer would make onnx give up on the node). ``model`` is not changed.

    Args:
        model: a graph (its subgraphs' large constants become stubs, dims and type kept) or a model (its
            main graph's initializers on disk are never read: onnx does not load external data).
        on_disk: (a graph) also leave out the data of every constant still in an external file, whatever
            its size, for callers that promise never to read weights (isolate).
    """
    if isinstance(model, gs.Graph):
        with _stubbed_constants(model, on_disk):
            model = gsmodel.to_model(model)
    view = onnx.ModelProto(ir_version=model.ir_version)
    view.opset_import.extend(model.opset_import)
    view.functions.extend(model.functions)
    src, graph = model.graph, view.graph
    graph.name = src.name
    graph.node.extend(src.node)
    graph.input.extend(src.input)
    graph.output.extend(src.output)
    graph.value_info.extend(src.value_info)
    graph.sparse_initializer.extend(src.sparse_initializer)
    listed = {v.name for v in src.input}
    for tensor in src.initializer:
        if not uses_external_data(tensor) and gsmodel.tensor_nbytes(tensor) <= WEIGHTLESS_MAX_BYTES:
            graph.initializer.append(tensor)
        elif tensor.name not in listed:
            graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims))
    return view


def _stub(tensor: TensorProto) -> TensorProto:
    stub = TensorProto(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims)
    stub.data_location = TensorProto.EXTERNAL
    for key, value in (("location", _STUB_LOCATION), ("offset", "0"), ("length", "0")):
        entry = stub.external_data.add()
        entry.key, entry.value = key, value
    return stub


def _tensor_maps(graphs: tuple[gs.Graph, ...]) -> list[dict[str, gs.Tensor]]:
    """Each graph's tensors by name (a walk of all its nodes: asked once per inference, not once per step)."""
    return [sub.tensors() for sub in graphs]


def _with_subgraphs(graph: gs.Graph) -> tuple[gs.Graph, ...]:
    return (graph, *graph.subgraphs(recursive=True))


@contextmanager
def _stubbed_constants(
    graph: gs.Graph, on_disk: bool, tensor_maps: list[dict[str, gs.Tensor]] | None = None
) -> Iterator[None]:
    """Large constants of ``graph`` and its subgraphs export as stubs until the block exits
    (``tensor_maps``: :func:`_tensor_maps` of them, when the caller has it)."""
    swapped: list[tuple[gs.Constant, Any]] = []
    try:
        for tensors in tensor_maps if tensor_maps is not None else _tensor_maps(_with_subgraphs(graph)):
            for tensor in tensors.values():
                if not isinstance(tensor, gs.Constant):
                    continue
                proto = _stub_for(tensor, on_disk)
                if proto is not None:
                    swapped.append((tensor, tensor._values))
                    tensor._values = gs.ir.tensor.LazyValues(_stub(proto))
        yield
    finally:
        for tensor, values in swapped:
            tensor._values = values


def _stub_for(tensor: gs.Constant, on_disk: bool) -> TensorProto | None:
    """A data-free TensorProto with the constant's name, type and dims, or None to keep its data."""
    values = tensor._values
    if isinstance(values, gs.ir.tensor.LazyValues):
        lazy = values.tensor
        if not isinstance(lazy, TensorProto):
            return None  # sparse
        if not (on_disk and uses_external_data(lazy)) and _lazy_nbytes(values) <= WEIGHTLESS_MAX_BYTES:
            return None
        return TensorProto(name=tensor.name, data_type=lazy.data_type, dims=lazy.dims)
    if np.asarray(values).nbytes <= WEIGHTLESS_MAX_BYTES:
        return None
    return TensorProto(name=tensor.name, data_type=constant_elem_type(tensor), dims=list(np.shape(values)))


# -- shape inference -----------------------------------------------------------------------------------------


#: What onnx raises when it refuses a model (a node's inference, a type check, a proto over 2 GB).
_ONNX_REFUSALS = (onnx.shape_inference.InferenceError, onnx.checker.ValidationError, RuntimeError, ValueError)


class InferenceFailed(GskitError):
    """onnx's shape inference refused the model; ``reason`` is onnx's first line that says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"shape inference failed: {reason}")
        self.reason = reason


def infer_types(
    model: gs.Graph | onnx.ModelProto,
    registry: PluginRegistry | None = None,
    *,
    strict: bool = False,
    check_type: bool = False,
    on_disk: bool = False,
) -> onnx.ModelProto:
    """onnx's shape inference on a weightless view of ``model``: the one place gskit runs it on a model.

    Args:
        model: a graph or a model; left unchanged.
        registry: plugins whose output rules type their nodes' outputs (and so every tensor after them);
            without it, plugin nodes' outputs stay unknown.
        strict: raise on the first node whose inference fails (a plugin rule included); else onnx skips it.
        check_type: also check input types against the op schemas (raises even when not strict).
        on_disk: see :func:`weightless_view`.

    Returns:
        onnx's inferred model: read its types (``value_info``, inputs, outputs, subgraphs' ``value_info``),
        not its initializers (the large ones are stubs).

    Raises:
        InferenceFailed: onnx refused the model (with ``strict`` or ``check_type``: a node's inference
            failed), or a plugin's output rule failed (``strict``).
    """
    strictness: AbstractContextManager[None] = nullcontext()
    if registry is not None:
        # plugin_schemas builds on this module's element types, so it is imported only when plugins ask
        from gskit.passes.plugin_schemas import register_schemas, strict_inference

        register_schemas(registry)
        strictness = strict_inference(strict)
    view = weightless_view(model, on_disk=on_disk)
    with strictness:
        try:
            return onnx.shape_inference.infer_shapes(
                view.SerializeToString(),
                check_type=check_type,
                strict_mode=strict,
                data_prop=data_propagation_bounded(view),
            )
        except _ONNX_REFUSALS as err:
            raise InferenceFailed(first_line(err)) from err


def with_inferred_types(
    model: onnx.ModelProto,
    registry: PluginRegistry | None = None,
    *,
    strict: bool = False,
    check_type: bool = False,
) -> onnx.ModelProto:
    """A copy of ``model``, weights included, with the ``value_info`` and graph output types
    :func:`infer_types` finds (subgraphs' too). Same arguments and errors."""
    inferred = infer_types(model, registry, strict=strict, check_type=check_type)
    result = onnx.ModelProto()
    result.CopyFrom(model)
    result.graph.ClearField("value_info")
    result.graph.value_info.extend(inferred.graph.value_info)
    result.graph.ClearField("output")
    result.graph.output.extend(inferred.graph.output)
    _copy_subgraph_value_info(inferred.graph, result.graph)
    return result


def _copy_subgraph_value_info(source: onnx.GraphProto, target: onnx.GraphProto) -> None:
    for src_node, dst_node in zip(source.node, target.node, strict=True):
        for src_attr, dst_attr in zip(src_node.attribute, dst_node.attribute, strict=True):
            if src_attr.type == onnx.AttributeProto.GRAPH:
                dst_attr.g.ClearField("value_info")
                dst_attr.g.value_info.extend(src_attr.g.value_info)
                _copy_subgraph_value_info(src_attr.g, dst_attr.g)
            elif src_attr.type == onnx.AttributeProto.GRAPHS:
                for src_g, dst_g in zip(src_attr.graphs, dst_attr.graphs, strict=True):
                    dst_g.ClearField("value_info")
                    dst_g.value_info.extend(src_g.value_info)
                    _copy_subgraph_value_info(src_g, dst_g)


def first_line(err: BaseException) -> str:
    """The line of an onnx error that says what failed (not the ``Inference error(s):`` header)."""
    text = str(err).strip()
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("[ShapeInferenceError] Inference error(s):"):
            return line
    return text.splitlines()[0] if text else repr(err)


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
    graph: gs.Graph,
    odd_types: GsLosses | None = None,
    *,
    dtypes_only: bool = False,
    symbolic: bool = True,
    symbolic_memo: SymbolicMemo | None = None,
) -> None:
    """Fill missing dtypes, shapes and value kinds of graph tensors from onnx shape inference (best effort).

    Runs :func:`infer_types` on a weightless export, so this works on models over 2 GB. Failures are logged,
    not raised: callers use the result as extra information only. ``dtypes_only`` leaves shapes as they are
    (pattern matching needs dtypes only and should not add shapes to the model it writes). ``symbolic`` asks
    onnxruntime's symbolic shape inference where onnx leaves the input of a ``Shape`` unknown (slower).
    ``symbolic_memo``: what it said in earlier calls on the same graph (a fold's passes): it is asked again
    only when another tensor read by a ``Shape`` is unknown; otherwise its earlier answers are applied again.
    """
    odd_types = odd_types or GsLosses()
    # the graphs and their tensors, walked once: exporting and inferring change no node and no name
    graphs = _with_subgraphs(graph)
    tensor_maps = _tensor_maps(graphs)
    try:
        with _stubbed_constants(graph, on_disk=False, tensor_maps=tensor_maps):
            proto = export_graph(graph, odd_types)
        inferred = infer_types(proto)
    except Exception as err:  # onnx raises several types; the passes still work without the extra shapes
        log.info("shape inference failed (%s); keeping the shapes in the model", err)
        return
    infos: dict[str, onnx.ValueInfoProto] = {}
    for proto_graph in gsmodel.graph_protos(inferred.graph):
        for info in proto_graph.value_info:
            infos.setdefault(info.name, info)
    for tensors in tensor_maps:
        for name, tensor in tensors.items():
            info = infos.get(name)
            if info is None or not isinstance(tensor, gs.Variable):
                continue
            _apply_value_info(tensor, info, dtypes_only)
    if not symbolic or dtypes_only:
        return
    memo = SymbolicMemo() if symbolic_memo is None else symbolic_memo
    unknown = _unknown_shape_inputs(graphs)
    if unknown - memo.asked:
        memo.infos = _symbolic_shapes(inferred, memo.sympy_results)
        memo.asked |= unknown
    if unknown:
        _apply_symbolic_shapes(tensor_maps, memo.infos)


@dataclass
class SymbolicMemo:
    """onnxruntime's symbolic shape inference in a fold's earlier passes: the tensors read by a ``Shape``
    it was asked about, and its answers (by tensor name). Folding keeps the shapes of the tensors it leaves,
    and each pass's onnx inference forgets the fixed sizes only this inference works out."""

    asked: set[str] = field(default_factory=set)
    infos: dict[str, onnx.ValueInfoProto] = field(default_factory=dict)
    #: what sympy printed and simplified for it, kept for its next call (:func:`_sympy_results_remembered`)
    sympy_results: dict[str, dict[tuple[Any, ...], Any]] = field(default_factory=dict)


def _unknown_shape_inputs(graphs: tuple[gs.Graph, ...]) -> set[str]:
    """The tensors that a ``Shape``, in a graph or a subgraph (``graphs``: both), reads while their rank is
    unknown or a dim is one onnx could not name (``unk__N``)."""
    return {
        n.inputs[0].name
        for sub in graphs
        for n in sub.nodes
        if n.op == "Shape" and n.inputs and (n.inputs[0].shape is None or _invented_dims(n.inputs[0].shape))
    }


def _invented_dims(shape: Any) -> bool:
    return any(isinstance(d, str) and d.startswith("unk__") for d in shape)


def _symbolic_shapes(
    proto: onnx.ModelProto, sympy_results: dict[str, dict[tuple[Any, ...], Any]] | None = None
) -> dict[str, onnx.ValueInfoProto]:
    """Second opinion: onnxruntime's symbolic shape inference, as Polygraphy uses, on the graph and its
    subgraphs; its value infos by tensor name ({} where it fails). ``sympy_results``: what sympy computed
    in earlier calls (:func:`_sympy_results_remembered`), added to.

    onnx gives up on e.g. ``Reshape(x, [W, -1, 512])`` with a symbolic ``W``, or on every dim of a ``Slice``
    whose starts are computed (in a ``Loop`` body: the iteration number); onnxruntime's inference computes
    such dims as expressions and keeps the dims a slice does not touch, so a ``Shape -> Gather`` of a static
    dim after it folds. Run only when some ``Shape`` still reads a tensor of unknown shape (it is slower);
    failures are logged, not raised.
    """
    from gskit.backends import ort as ort_backend  # runs onnxruntime's inference code: only when needed

    try:
        with _sympy_results_remembered(sympy_results):
            inferred = ort_backend.symbolic_shape_inference(proto)
    except Exception as err:  # its own asserts and exceptions on ops it does not know; best effort
        log.info("onnxruntime's symbolic shape inference failed (%s)", first_line(err))
        return {}
    if inferred is None:
        return {}
    graphs = list(gsmodel.graph_protos(inferred.graph))
    infos: dict[str, onnx.ValueInfoProto] = {}
    for proto_graph in graphs:
        for info in proto_graph.value_info:
            infos.setdefault(info.name, info)
    for name in _after_guessed_splits(graphs, infos):
        infos.pop(name, None)
    return infos


@contextmanager
def _sympy_results_remembered(
    results: dict[str, dict[tuple[Any, ...], Any]] | None = None,
) -> Iterator[None]:
    """Within the block, sympy prints each expression once and simplifies each once (``results``: what it
    printed and simplified in earlier blocks, by function, added to: a fold's passes ask about the same
    dims).

    onnxruntime's symbolic inference keeps dims as the strings of sympy expressions and prints the same few
    expressions again at every node: PP-OCRv4 rec printed 10 expressions 407 times, nmp one 456 times (60%
    of the inference's time); silero-vad's ``Slice`` nodes simplified 8 expressions 40 times, SLANet's
    ``Resize`` nodes 8 expressions 50 times (simplify simplifies the parts of an expression again). An
    expression is immutable, and what it prints as and simplifies to depends only on it (its type and
    structure) and the settings: the key. sympy's ``__str__`` imports ``sstr`` from its module at each
    call, and the inference calls ``sympy.simplify``: those names are where the remembering functions go
    (replacing ``__str__`` itself cleared every sympy class's attribute cache, about 1 ms a time).
    """
    import sympy  # loaded: onnxruntime's inference imports it
    from sympy.printing import str as sympy_str

    # simplify calls itself through its own module's name
    simplify_module = importlib.import_module("sympy.simplify.simplify")
    results = {} if results is None else results
    originals = (sympy_str.sstr, sympy.simplify, simplify_module.simplify)
    sympy_str.sstr = _remembering(sympy_str.sstr, results.setdefault("sstr", {}))
    simplify = _remembering(sympy.simplify, results.setdefault("simplify", {}))
    sympy.simplify = simplify_module.simplify = simplify
    try:
        yield
    finally:
        sympy_str.sstr, sympy.simplify, simplify_module.simplify = originals


def _remembering(function: Any, results: dict[tuple[Any, ...], Any]) -> Any:
    """``function(expr, **settings)``, its result for an equal expression of the same type and the same
    settings given again (kept in ``results``) instead of computed again."""

    def remembered(expr: Any, *args: Any, **settings: Any) -> Any:
        if args:  # positional settings: not worth a key
            return function(expr, *args, **settings)
        try:
            key = (type(expr), expr, *sorted(settings.items()))
            if key in results:
                return results[key]
        except TypeError:  # an unhashable object (a mutable matrix) or setting: computed each time
            return function(expr, **settings)
        result = results[key] = function(expr, **settings)
        return result

    return remembered


def _after_guessed_splits(
    graphs: list[onnx.GraphProto], infos: Mapping[str, onnx.ValueInfoProto]
) -> set[str]:
    """The tensors whose shapes onnxruntime's inference may have guessed: the outputs of a ``Split`` whose
    sizes are computed (an input, not a constant) and that it split evenly, and every tensor made from them.

    Where it cannot read a ``Split``'s sizes it splits the axis evenly instead of leaving the dims unknown, so
    folding a ``Shape`` of such an output wrote a wrong constant (onnx's rotary embedding test models split
    ``[8, 0]``, which it made ``[4, 4]``). An uneven answer can only come from the sizes it read.
    """
    constants = {t.name for g in graphs for t in g.initializer}
    constants |= {o for g in graphs for n in g.node if n.op_type == "Constant" for o in n.output}
    guessed: set[str] = set()
    for graph in graphs:
        for node in graph.node:
            if node.op_type != "Split" or node.domain not in ("", "ai.onnx"):
                continue
            if len(node.input) < 2 or not node.input[1] or node.input[1] in constants:
                continue  # sizes absent (even by definition) or read from a constant
            if _split_evenly(node, infos):
                guessed.update(o for o in node.output if o)
    if not guessed:
        return guessed
    readers: dict[str, list[onnx.NodeProto]] = {}
    for graph in graphs:
        for node in graph.node:
            for name in gsmodel.node_reads(node):
                readers.setdefault(name, []).append(node)
    pending = list(guessed)
    while pending:
        for node in readers.get(pending.pop(), ()):
            for out in node.output:
                if out and out not in guessed:
                    guessed.add(out)
                    pending.append(out)
    return guessed


def _split_evenly(node: onnx.NodeProto, infos: Mapping[str, onnx.ValueInfoProto]) -> bool:
    """Whether every output of the ``Split`` ``node`` has one size along its axis (or a shape not known)."""
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    sizes = set()
    for out in node.output:
        info = infos.get(out)
        dims = info.type.tensor_type.shape.dim if info is not None else ()
        if not dims or not -len(dims) <= axis < len(dims):
            return True
        dim = dims[axis]
        sizes.add(dim.dim_value if dim.HasField("dim_value") else dim.dim_param)
    return len(sizes) <= 1


def _apply_symbolic_shapes(
    tensor_maps: list[dict[str, gs.Tensor]], infos: Mapping[str, onnx.ValueInfoProto]
) -> None:
    """Only the fixed sizes symbolic inference derived are taken over (on the tensors of ``tensor_maps``,
    :func:`_tensor_maps` of a graph and its subgraphs): a shape onnx left unknown, or a dim onnx could only
    name ``unk__N``."""
    if not infos:
        return
    tensors = (t for tensors in tensor_maps for t in tensors.values())
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
