"""Opset conversion, fp16 conversion with range clamping, and int64 -> int32.

TensorRT 11 builds strongly typed networks only: the precision of each layer is the precision in the ONNX
model, so ``to_fp16`` is how a model gets an fp16 engine.

``to_fp16`` decides per node whether it runs in fp16 or stays fp32:

* fp32: ops in ``block_ops``, nodes with subgraphs (``If``/``Loop``/``Scan``), and plugin nodes, unless the
  plugin's spec has ``supports_fp16=True``,
* fp16: every other node.

Float32 tensors produced by fp16 nodes become float16; a ``Cast`` is inserted wherever a tensor crosses from
one precision to the other (once per tensor and direction). Inputs that an op's schema fixes to
``tensor(float)`` (``Resize`` scales, for example) keep fp32. Constants read by fp16 nodes are converted after
clamping into fp16's range: magnitudes below ``clamp_min`` become ``+-clamp_min``, above ``clamp_max`` become
``+-clamp_max``;
zeros, NaN and infinities are kept. Graph inputs and outputs stay fp32 with ``keep_io_types`` (and those named
in ``keep_inputs``/``keep_outputs``), with Casts at the boundary.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from gskit.errors import GskitError
from gskit.io import model as gsmodel
from gskit.passes.edit import unique_name
from gskit.passes.tensor_types import infer_tensor_types
from gskit.passes.transform import GraphPass, PassContext, PassResult, StepFlag, option, run_pass
from gskit.plugin.ops import DEFAULT_DOMAINS, is_default_domain, is_plugin_node, node_key, plugin_keys

log = logging.getLogger(__name__)

ModelT = TypeVar("ModelT", onnx.ModelProto, gs.Graph)
_F32, _F16 = np.dtype(np.float32), np.dtype(np.float16)
#: Ops whose int64 inputs may be given as int32 (their index type is a separate type parameter).
_INT32_INDEX_INPUTS = {
    "Gather": (1,),
    "GatherElements": (1,),
    "GatherND": (1,),
    "ScatterElements": (1,),
    "ScatterND": (1,),
    "OneHot": (0, 1),
}


@dataclass
class Fp16Report:
    """What ``to_fp16`` did.

    Attributes:
        fp16_nodes: nodes now computing in fp16.
        fp32_nodes: nodes kept in fp32, by op, with the reason in ``kept_fp32``.
        kept_fp32: node name -> why it stays fp32.
        casts_inserted: Casts added at precision boundaries.
        constants_converted: float32 constants converted to float16.
        values_clamped: constant elements moved into fp16's range.
    """

    fp16_nodes: int = 0
    fp32_nodes: dict[str, int] = field(default_factory=dict)
    kept_fp32: dict[str, str] = field(default_factory=dict)
    casts_inserted: int = 0
    constants_converted: int = 0
    values_clamped: int = 0


@dataclass(frozen=True)
class ConvertOptions:
    """Opset conversion, then fp16, then int64 -> int32, as asked (``convert``'s options: the single source
    of the defaults of ``convert_opset``, ``to_fp16``, ``int64_to_int32``, the CLI flags and the recipe)."""

    opset: int | None = option(None, help="target default-domain opset", metavar="N")
    fp16: bool = option(
        False,
        help="convert float32 computation to float16",
        step_flag=StepFlag(
            "--fp16",
            "convert to fp16 (convert.fp16; adds a convert step before check_trt when the recipe has none); "
            "validation then needs looser tolerances, e.g. --atol 1e-2 --rtol 1e-2",
            kind="switch",
            adds_step=("before", ("check_trt", "validate", "build")),
        ),
    )
    keep_io_fp32: bool = option(True, help="with fp16: keep float32 graph inputs and outputs in float32")
    keep_inputs: tuple[str, ...] = option(
        (), help="with fp16: keep this graph input float32 (repeatable)", flag="--keep-input", metavar="NAME"
    )
    keep_outputs: tuple[str, ...] = option(
        (),
        help="with fp16: keep this graph output float32 (repeatable)",
        flag="--keep-output",
        metavar="NAME",
    )
    block_ops: tuple[str, ...] = option(
        (), help="with fp16: keep this op type float32 (repeatable)", flag="--block-op", metavar="TYPE"
    )
    clamp_min: float = option(
        1e-7, help="with fp16: smallest non-zero magnitude of a converted constant", metavar="X"
    )
    clamp_max: float = option(
        1e4, help="with fp16: largest finite magnitude of a converted constant", metavar="X"
    )
    int32: bool = option(False, help="int64 inputs and index constants to int32")
    int32_inputs: bool = option(True, help="with int32: int64 graph inputs become int32 (Cast back inside)")
    int32_constants: bool = option(True, help="with int32: narrow int64 index constants")


_DEFAULTS = ConvertOptions()


@dataclass
class ConvertReport:
    """What ``convert`` did: the opset reached and each conversion's own report (None: not asked for)."""

    opset: int | None = None
    fp16: Fp16Report | None = None
    int32: Int32Report | None = None
    #: graph outputs whose element type changed, ``{name: (before, after)}`` (numpy names; a gs.Graph's
    #: only): validation expects them (``keep_io_fp32: false``)
    output_dtypes: dict[str, tuple[str, str]] = field(default_factory=dict)


class _Convert(GraphPass[ConvertOptions]):
    name, options, effect = "convert", ConvertOptions, "in_place"

    def requires(self, model: Any, options: ConvertOptions) -> None:
        low, high = options.clamp_min, options.clamp_max
        if options.fp16 and not 0 < low < high <= 65504:
            raise GskitError(f"to_fp16: need 0 < clamp_min < clamp_max <= 65504, got {low}, {high}")

    def call(self, model: Any, options: ConvertOptions, context: PassContext) -> PassResult:
        is_model = isinstance(model, onnx.ModelProto)
        out, report, done = model, ConvertReport(), []
        before = {} if is_model else _output_dtypes(model)
        if options.opset is not None:
            proto = _convert_opset(gsmodel.to_model(out) if not is_model else out, options.opset)
            if is_model:
                out = proto
            else:  # an in-place pass keeps the caller's graph object
                out.__dict__.update(gsmodel.to_graph(proto).__dict__)
            report.opset = options.opset
            done.append(f"opset {options.opset}")
        if options.fp16:
            out, report.fp16 = _to_fp16(out, options, context.plugins)
            done.append("fp16")
        if options.int32:
            out, report.int32 = _int64_to_int32(out, options.int32_inputs, options.int32_constants)
            done.append("int64 -> int32")
        summary = ", ".join(done) or "nothing to convert"
        if not is_model:
            after = _output_dtypes(out)
            report.output_dtypes = {n: (before[n], d) for n, d in after.items() if before.get(n, d) != d}
        return PassResult(out, modified=bool(done), report=report, summary=summary)


def _output_dtypes(graph: gs.Graph) -> dict[str, str]:
    return {t.name: np.dtype(t.dtype).name for t in graph.outputs if t.dtype is not None}


#: The convert pass: ``run_pass(CONVERT, graph_or_model, ConvertOptions(...), plugins=...)``.
CONVERT = _Convert()


def convert_opset(model: onnx.ModelProto, target: int) -> onnx.ModelProto:
    """Convert a model to another default-domain opset with onnx's version converter
    (``run_pass(CONVERT, model, ConvertOptions(opset=target))``).

    Raises:
        GskitError: the converter cannot convert some op (the message names it) or the target is invalid.
    """
    return run_pass(CONVERT, model, ConvertOptions(opset=target)).model


def _convert_opset(model: onnx.ModelProto, target: int) -> onnx.ModelProto:
    if target < 1 or target > onnx.defs.onnx_opset_version():
        raise GskitError(f"convert: opset {target} is not between 1 and {onnx.defs.onnx_opset_version()}")
    try:
        return convert_default_opset(model, target)
    except GskitError as err:
        raise GskitError(
            f"convert: {err}; replace or edit that op first, or choose another --opset"
        ) from err.__cause__


def convert_default_opset(model: onnx.ModelProto, target: int) -> onnx.ModelProto:
    """The model converted to default-domain opset ``target`` by onnx's version converter (a new model;
    ``model`` is unchanged). Other domains (plugin nodes) pass through as they are.

    Raises:
        GskitError: the target is not an opset onnx knows, or the converter cannot convert some op (one
            line naming the op when the converter's message does).
    """
    current = next((o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS), None)
    if current == target:
        return model
    if target < 1 or target > onnx.defs.onnx_opset_version():
        raise GskitError(f"opset {target} is not between 1 and {onnx.defs.onnx_opset_version()}")
    try:
        converted = onnx.version_converter.convert_version(model, target)
    except Exception as err:  # the C++ converter raises RuntimeError/ValueError/IndexError
        first = (str(err).strip().splitlines() or [repr(err)])[0]
        op = _op_in_message(first, model)
        where = f" (op {op})" if op else ""
        raise GskitError(
            f"onnx's version converter cannot convert opset {current} -> {target}{where}: {first}"
        ) from err
    if model.functions and not converted.functions:
        # onnx 1.23's converter drops model-local functions; each keeps its own opset imports, which the
        # checker and onnxruntime accept beside the model's newer ones.
        converted.functions.extend(model.functions)
    return converted


def clamp_to_fp16(
    values: np.ndarray, clamp_min: float = _DEFAULTS.clamp_min, clamp_max: float = _DEFAULTS.clamp_max
) -> tuple[np.ndarray, int]:
    """Clamp magnitudes into ``[clamp_min, clamp_max]`` (keeping sign, 0, NaN and inf), then cast to float16.

    Returns:
        The float16 array and how many elements were clamped.
    """
    values = np.asarray(values, dtype=np.float32)
    finite = np.isfinite(values) & (values != 0)
    magnitude = np.abs(values)
    low = finite & (magnitude < clamp_min)
    high = finite & (magnitude > clamp_max)
    out = np.where(low, np.sign(values) * np.float32(clamp_min), values)
    out = np.where(high, np.sign(values) * np.float32(clamp_max), out)
    return out.astype(np.float16), int(low.sum() + high.sum())


def to_fp16(
    graph_or_model: ModelT,
    *,
    keep_io_types: bool = _DEFAULTS.keep_io_fp32,
    keep_inputs: tuple[str, ...] = _DEFAULTS.keep_inputs,
    keep_outputs: tuple[str, ...] = _DEFAULTS.keep_outputs,
    clamp_min: float = _DEFAULTS.clamp_min,
    clamp_max: float = _DEFAULTS.clamp_max,
    block_ops: tuple[str, ...] = _DEFAULTS.block_ops,
    plugins: Any = None,
) -> tuple[ModelT, Fp16Report]:
    """Convert float32 computation to float16 (see the module docstring for the rules;
    ``run_pass(CONVERT, graph_or_model, ConvertOptions(fp16=True, ...))``).

    Args:
        graph_or_model: a gs.Graph (converted in place) or a ModelProto (a new one is returned).
        keep_io_types: keep every float32 graph input and output in float32.
        keep_inputs: graph inputs kept in float32 even without ``keep_io_types``.
        keep_outputs: graph outputs kept in float32 even without ``keep_io_types``.
        clamp_min: smallest non-zero magnitude of a converted constant.
        clamp_max: largest finite magnitude of a converted constant.
        block_ops: op types kept in float32.
        plugins: PluginSpecs (a registry or iterable); a plugin node goes fp16 only if its spec's
            ``supports_fp16`` is True.

    Returns:
        ``(converted, report)``.

    Raises:
        GskitError: a name in ``keep_inputs``/``keep_outputs`` is not a graph input/output, or clamp bounds
            are not ``0 < clamp_min < clamp_max <= 65504``.
    """
    options = ConvertOptions(
        fp16=True,
        keep_io_fp32=keep_io_types,
        keep_inputs=tuple(keep_inputs),
        keep_outputs=tuple(keep_outputs),
        clamp_min=clamp_min,
        clamp_max=clamp_max,
        block_ops=tuple(block_ops),
    )
    result = run_pass(CONVERT, graph_or_model, options, plugins=plugins)
    return result.model, result.report.fp16


def _to_fp16(graph_or_model: ModelT, options: ConvertOptions, plugins: Any) -> tuple[ModelT, Fp16Report]:
    is_model = isinstance(graph_or_model, onnx.ModelProto)
    graph = gsmodel.to_graph(graph_or_model) if is_model else graph_or_model
    _check_names("keep_inputs", options.keep_inputs, graph.inputs)
    _check_names("keep_outputs", options.keep_outputs, graph.outputs)
    _check_block_ops(options.block_ops, graph)
    infer_tensor_types(graph)
    clamp = (options.clamp_min, options.clamp_max)
    converter = _Fp16(graph, *clamp, set(options.block_ops), _fp16_plugins(plugins))
    kept_in = {t.name for t in graph.inputs} if options.keep_io_fp32 else set(options.keep_inputs)
    kept_out = {t.name for t in graph.outputs} if options.keep_io_fp32 else set(options.keep_outputs)
    converter.run(kept_in, kept_out)
    graph.cleanup(remove_unused_graph_inputs=False).toposort()
    if is_model:
        out = gsmodel.to_model(graph)
        out.metadata_props.extend(graph_or_model.metadata_props)
        return out, converter.report
    return graph, converter.report


class _Fp16:
    def __init__(self, graph: gs.Graph, clamp_min: float, clamp_max: float, block: set[str], fp16_plugins):
        self.graph = graph
        self.clamp = (clamp_min, clamp_max)
        self.block = block
        self.fp16_plugins = fp16_plugins
        self.report = Fp16Report()
        self.casts: dict[tuple[int, str], gs.Variable] = {}
        self.const16: dict[int, gs.Constant] = {}
        self.names = set(graph.tensors()) | {n.name for n in graph.nodes if n.name}
        self.new_nodes: list[gs.Node] = []

    def fp32_reason(self, node: gs.Node) -> str | None:
        if node.op in self.block:
            return "blocked op"
        if any(True for _ in gsmodel.node_subgraphs(node)):
            return "has subgraphs"
        if is_plugin_node(node) and node_key(node) not in self.fp16_plugins:
            return "plugin node (spec does not declare fp16 support)"
        return None

    def run(self, kept_in: set[str], kept_out: set[str]) -> None:
        graph = self.graph
        fp16_nodes = []
        for node in graph.nodes:
            reason = self.fp32_reason(node)
            if reason:
                self.report.kept_fp32[node.name or f"{node.op}:{node.outputs[0].name}"] = reason
            else:
                fp16_nodes.append(node)
        fp16_ids = {id(n) for n in fp16_nodes}
        self.report.fp16_nodes = len(fp16_nodes)
        self.report.fp32_nodes = dict(Counter(n.op for n in graph.nodes if id(n) not in fp16_ids))

        for tensor in graph.inputs:  # graph inputs not kept become float16
            if tensor.dtype == _F32 and tensor.name not in kept_in:
                tensor.dtype = _F16
        for node in fp16_nodes:
            for tensor in node.outputs:
                if tensor.dtype == _F32 or (tensor.dtype is None and _produces_float(node)):
                    tensor.dtype = _F16
            if node.op == "Cast" and node.attrs.get("to") == onnx.TensorProto.FLOAT:
                node.attrs["to"] = onnx.TensorProto.FLOAT16
            if node.op in ("Constant", "ConstantOfShape"):
                self.constant_node16(node)
        for node in list(graph.nodes):
            wants16 = id(node) in fp16_ids
            fixed = _fixed_float_inputs(node)
            for index, tensor in enumerate(node.inputs):
                if tensor.is_empty():
                    continue
                want = _F16 if wants16 and index not in fixed else _F32
                if isinstance(tensor, gs.Constant):
                    if tensor.dtype == _F32 and want == _F16:
                        node.inputs[index] = self.constant16(tensor)
                    continue
                if tensor.dtype in (_F16, _F32) and tensor.dtype != want:
                    node.inputs[index] = self.cast(tensor, want)
        for position, tensor in enumerate(list(graph.outputs)):
            if tensor.dtype == _F16 and tensor.name in kept_out and not isinstance(tensor, gs.Constant):
                graph.outputs[position] = self.cast_output(tensor)
        graph.nodes.extend(self.new_nodes)

    def constant_node16(self, node: gs.Node) -> None:
        """A Constant/ConstantOfShape node whose output became float16 must produce float16 values."""
        value = node.attrs.get("value")
        if node.op == "Constant" and value is None:
            for key in ("value_float", "value_floats"):
                if key in node.attrs:  # these forms are float32 by definition: turn them into a tensor
                    values = np.asarray(node.attrs.pop(key), dtype=np.float32)
                    value = gs.Constant(f"{node.name}_{key}", values)
        if isinstance(value, gs.Constant) and value.dtype == _F32:
            values, clamped = clamp_to_fp16(value.values, *self.clamp)
            self.report.values_clamped += clamped
            self.report.constants_converted += 1
            node.attrs["value"] = gs.Constant(value.name, values)

    def constant16(self, tensor: gs.Constant) -> gs.Constant:
        if id(tensor) not in self.const16:
            values, clamped = clamp_to_fp16(tensor.values, *self.clamp)
            self.report.values_clamped += clamped
            self.report.constants_converted += 1
            self.const16[id(tensor)] = gs.Constant(self.unique(f"{tensor.name}_fp16"), values)
        return self.const16[id(tensor)]

    def cast(self, tensor: gs.Tensor, dtype: np.dtype) -> gs.Variable:
        key = (id(tensor), dtype.name)
        if key not in self.casts:
            out = gs.Variable(
                self.unique(f"{tensor.name}_{'fp16' if dtype == _F16 else 'fp32'}"),
                dtype=dtype,
                shape=tensor.shape,
            )
            to = onnx.TensorProto.FLOAT16 if dtype == _F16 else onnx.TensorProto.FLOAT
            self.new_nodes.append(
                gs.Node(
                    "Cast",
                    name=self.unique(f"{out.name}_cast"),
                    attrs={"to": to},
                    inputs=[tensor],
                    outputs=[out],
                )
            )
            self.report.casts_inserted += 1
            self.casts[key] = out
        return self.casts[key]

    def cast_output(self, tensor: gs.Variable) -> gs.Variable:
        """Keep the output's name on a float32 Cast of the (renamed) float16 tensor."""
        name = tensor.name
        tensor.name = self.unique(f"{name}_fp16")
        out = gs.Variable(name, dtype=_F32, shape=tensor.shape)
        self.new_nodes.append(
            gs.Node(
                "Cast",
                name=self.unique(f"{name}_cast"),
                attrs={"to": onnx.TensorProto.FLOAT},
                inputs=[tensor],
                outputs=[out],
            )
        )
        self.report.casts_inserted += 1
        return out

    def unique(self, name: str) -> str:
        return unique_name(name, self.names)


def _produces_float(node: gs.Node) -> bool:
    return any(t.dtype in (_F32, _F16) for t in node.inputs if not t.is_empty())


def _fixed_float_inputs(node: gs.Node) -> set[int]:
    """Input positions whose schema type is exactly tensor(float) (not a type parameter)."""
    try:
        schema = onnx.defs.get_schema(node.op, domain=node.domain or "")
    except Exception:  # unknown op (plugin): no fixed inputs
        return set()
    fixed = set()
    for index, formal in enumerate(schema.inputs):
        if formal.type_str == "tensor(float)":
            fixed.add(index)
    if schema.inputs and schema.inputs[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic:
        last = len(schema.inputs) - 1
        if last in fixed:
            fixed |= set(range(last, len(node.inputs)))
    return fixed


def _fp16_plugins(plugins: Any) -> frozenset[tuple[str, str, str]]:
    return plugin_keys(s for s in (plugins or ()) if s.supports_fp16)


def _check_block_ops(ops: tuple[str, ...], graph: gs.Graph) -> None:
    """An op type onnx does not know and no node has is a typo (``Softmx``) that would keep nothing fp32."""
    present = {n.op for g in (graph, *graph.subgraphs(recursive=True)) for n in g.nodes}
    typos = [op for op in ops if op not in present and not onnx.defs.has(op)]
    if typos:
        raise GskitError(
            f"to_fp16: block_ops names {typos}: not an onnx op nor an op of the model; check the spelling "
            "(op types are case-sensitive, e.g. Softmax)"
        )


def _check_names(label: str, names: tuple[str, ...], tensors: list[gs.Tensor]) -> None:
    known = {t.name for t in tensors}
    missing = [n for n in names if n not in known]
    if missing:
        raise GskitError(f"to_fp16: {label} names {missing}, not among {sorted(known)}")


def _op_in_message(message: str, model: onnx.ModelProto) -> str | None:
    for node in model.graph.node:
        if node.op_type in message:
            return node.op_type
    return None


# --- int64 -> int32 ----------------------------------------------------------------------------------------


@dataclass
class Int32Report:
    """What ``int64_to_int32`` changed: graph inputs now int32 (cast back inside) and index constants."""

    inputs: list[str] = field(default_factory=list)
    constants: list[str] = field(default_factory=list)


def int64_to_int32(
    graph_or_model: ModelT,
    *,
    inputs: bool = _DEFAULTS.int32_inputs,
    constants: bool = _DEFAULTS.int32_constants,
) -> tuple[ModelT, Int32Report]:
    """Make int64 graph inputs int32 (with a Cast back to int64 inside) and narrow int64 index constants
    (``run_pass(CONVERT, graph_or_model, ConvertOptions(int32=True, ...))``).

    Constants are narrowed only where the op takes int32 for that input independently of its other inputs
    (the indices of Gather, GatherElements, GatherND, ScatterElements, ScatterND, OneHot).

    Raises:
        GskitError: an index constant holds values outside int32's range (the message lists them).
    """
    options = ConvertOptions(int32=True, int32_inputs=inputs, int32_constants=constants)
    result = run_pass(CONVERT, graph_or_model, options)
    return result.model, result.report.int32


def _int64_to_int32(graph_or_model: ModelT, inputs: bool, constants: bool) -> tuple[ModelT, Int32Report]:
    is_model = isinstance(graph_or_model, onnx.ModelProto)
    graph = gsmodel.to_graph(graph_or_model) if is_model else graph_or_model
    report = Int32Report()
    info = np.iinfo(np.int32)
    if constants:
        converted: dict[int, gs.Constant] = {}
        for node in graph.nodes:
            for index in _INT32_INDEX_INPUTS.get(node.op, ()) if is_default_domain(node.domain) else ():
                if index >= len(node.inputs):
                    continue
                tensor = node.inputs[index]
                if not isinstance(tensor, gs.Constant) or tensor.dtype != np.int64:
                    continue
                if id(tensor) not in converted:
                    values = np.asarray(tensor.values)
                    bad = values[(values < info.min) | (values > info.max)]
                    if bad.size:
                        raise GskitError(
                            f"int64_to_int32: constant '{tensor.name}' (input of {node.op} '{node.name}') "
                            f"holds values outside int32: {bad[:5].tolist()}; leave constants as int64 "
                            "(constants=False)"
                        )
                    converted[id(tensor)] = gs.Constant(f"{tensor.name}_int32", values.astype(np.int32))
                    report.constants.append(tensor.name)
                node.inputs[index] = converted[id(tensor)]
    if inputs:
        names = set(graph.tensors())
        for tensor in list(graph.inputs):
            if tensor.dtype != np.int64 or not isinstance(tensor, gs.Variable):
                continue
            inner_name = f"{tensor.name}_int64"
            while inner_name in names:
                inner_name += "_"
            inner = gs.Variable(inner_name, dtype=np.int64, shape=tensor.shape)
            for consumer in list(tensor.outputs):
                for i, t in enumerate(consumer.inputs):
                    if t is tensor:
                        consumer.inputs[i] = inner
            graph.outputs = [inner if t is tensor else t for t in graph.outputs]
            tensor.dtype = np.int32
            graph.nodes.append(
                gs.Node(
                    "Cast",
                    name=f"{inner_name}_cast",
                    attrs={"to": onnx.TensorProto.INT64},
                    inputs=[tensor],
                    outputs=[inner],
                )
            )
            report.inputs.append(tensor.name)
    graph.cleanup(remove_unused_graph_inputs=False).toposort()
    if is_model:
        return gsmodel.to_model(graph), report
    return graph, report
