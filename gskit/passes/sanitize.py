"""Tidy a model without changing what it computes.

Built-in steps, run in this order (each can be skipped by name):

``constants_to_initializers``
    Constant nodes become initializers (``gskit.passes.edit.constants_to_initializers``).
``drop_initializer_inputs``
    Initializers are no longer listed as graph inputs (``gskit.passes.edit.drop_initializer_inputs``).
``merge_duplicate_initializers``
    Initializers with the same dtype, shape and bytes become one (candidates grouped by dtype and shape first;
    weights that are the same span of the same data file are equal unread; the others are compared chunk by
    chunk, growing from 64 KiB, and a tensor that no other matches so far is read no further).
``remove_noops``
    ``Identity``, ``Cast`` to the dtype the input already has, and inference ``Dropout`` (no mask used) are
    removed. When the removed node's output is a graph output, the tensor feeding it takes the output's name,
    so the model's interface keeps its names.
``remove_unused``
    Nodes, initializers and value_info that no output depends on, and local functions no node calls.
``remove_unused_opsets``
    Opset imports of domains no node uses (the default domain always stays).

Optional steps from other tools (``extra``), each an optional dependency imported only when asked for:
``onnxoptimizer:PASS`` (one onnxoptimizer pass, e.g. ``onnxoptimizer:eliminate_nop_transpose``),
``onnxslim`` (onnxslim's default pipeline) and ``onnxsim`` or ``onnxsim:skip=PASS,PASS`` (onnx-simplifier,
skipping the named onnxoptimizer passes, e.g. ``onnxsim:skip=fuse_bn_into_conv``).
"""

from __future__ import annotations

import hashlib
import importlib
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from gskit.errors import GskitError
from gskit.io import model as gsmodel
from gskit.passes import edit
from gskit.passes.tensor_types import elem_type, infer_tensor_types
from gskit.passes.transform import GraphPass, PassContext, PassResult, option, run_pass
from gskit.plugin.ops import is_default_domain, op_counts

log = logging.getLogger(__name__)

ModelT = TypeVar("ModelT", onnx.ModelProto, gs.Graph)

DEFAULT_STEPS: tuple[str, ...] = (
    "constants_to_initializers",
    "drop_initializer_inputs",
    "merge_duplicate_initializers",
    "remove_noops",
    "remove_unused",
    "remove_unused_opsets",
)
_EXTRA_PACKAGES = {"onnxoptimizer": "onnxoptimizer", "onnxslim": "onnxslim", "onnxsim": "onnxsim"}


@dataclass
class SanitizeReport:
    """What ``sanitize`` changed.

    Attributes:
        nodes_before: nodes in the graph and its subgraphs before.
        nodes_after: the same after.
        initializers_before: initializers of the main graph before.
        initializers_after: the same after.
        changes: per step that ran, how many things it changed (nodes, tensors, functions or opsets).
        removed_ops: removed nodes by op, most first.
    """

    nodes_before: int = 0
    nodes_after: int = 0
    initializers_before: int = 0
    initializers_after: int = 0
    changes: dict[str, int] = field(default_factory=dict)
    removed_ops: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class SanitizeOptions:
    """Tidy a model: constants to initializers, dedupe, drop no-ops and unused things (``sanitize``'s
    options, the single source of their defaults for the library call, the CLI flags and the recipe)."""

    skip: tuple[str, ...] = option(
        (),
        help=f"skip a step (repeatable): {', '.join(DEFAULT_STEPS)}",
        metavar="STEP",
        choices=DEFAULT_STEPS,
    )
    extra: tuple[str, ...] = option(
        (),
        help="also run onnxoptimizer:PASS, onnxslim or onnxsim[:skip=PASS,...] (repeatable)",
        flag="--with",
        metavar="TOOL[:PASS]",
    )


_DEFAULTS = SanitizeOptions()


def sanitize(
    graph_or_model: ModelT,
    *,
    skip: Iterable[str] = _DEFAULTS.skip,
    extra: Iterable[str] = _DEFAULTS.extra,
) -> tuple[ModelT, SanitizeReport]:
    """Run the built-in tidy steps (minus ``skip``), then the ``extra`` steps of optional tools
    (``run_pass(SANITIZE, ...)``).

    Args:
        graph_or_model: a gs.Graph (changed in place and returned) or a ModelProto (a new one is returned).
        skip: built-in steps not to run.
        extra: optional steps of other tools, e.g. ``("onnxoptimizer:eliminate_nop_transpose",)``.

    Returns:
        ``(sanitized, report)``, the sanitized graph or model being the same kind as given.

    Raises:
        GskitError: an unknown step name, or an optional tool that is not installed (the message names the
            ``pip install``) or that fails.
    """
    result = run_pass(SANITIZE, graph_or_model, SanitizeOptions(skip=tuple(skip), extra=tuple(extra)))
    return result.model, result.report


class _Sanitize(GraphPass[SanitizeOptions]):
    name, options, effect = "sanitize", SanitizeOptions, "in_place"

    def requires(self, model: Any, options: SanitizeOptions) -> None:
        unknown = set(options.skip) - set(DEFAULT_STEPS)
        if unknown:
            raise GskitError(
                f"sanitize: unknown step(s) {sorted(unknown)}; known: {', '.join(DEFAULT_STEPS)}"
            )
        for item in options.extra:
            _check_extra(item)

    def call(self, model: Any, options: SanitizeOptions, context: PassContext) -> PassResult:
        out, report = _sanitize(model, set(options.skip), options.extra)
        changed = ", ".join(f"{step} {n}" for step, n in report.changes.items() if n) or "nothing to tidy"
        return PassResult(
            out,
            modified=any(report.changes.values()) or report.nodes_after != report.nodes_before,
            report=report,
            summary=f"{report.nodes_before} -> {report.nodes_after} nodes ({changed})",
        )


#: The sanitize pass: ``run_pass(SANITIZE, graph_or_model, SanitizeOptions(...))``.
SANITIZE = _Sanitize()


def _sanitize(
    graph_or_model: ModelT, skip: set[str], extra: tuple[str, ...]
) -> tuple[ModelT, SanitizeReport]:
    is_model = isinstance(graph_or_model, onnx.ModelProto)
    graph = gsmodel.to_graph(graph_or_model) if is_model else graph_or_model
    report = SanitizeReport()
    ops_before = op_counts(graph)
    report.nodes_before = sum(ops_before.values())
    report.initializers_before = _initializer_count(graph)
    for name in DEFAULT_STEPS:
        if name not in skip:
            report.changes[name] = _STEPS[name](graph)
    if extra:
        model = gsmodel.to_model(graph)
        for item in extra:
            model = _run_extra(item, model)
        new = gsmodel.to_graph(model)
        if is_model:
            graph = new
        else:  # keep the caller's graph object
            graph.__dict__.update(new.__dict__)
    ops_after = op_counts(graph)
    report.nodes_after = sum(ops_after.values())
    report.initializers_after = _initializer_count(graph)
    report.removed_ops = dict((ops_before - ops_after).most_common())
    if is_model:
        out = gsmodel.to_model(graph)
        out.doc_string, out.model_version = graph_or_model.doc_string, graph_or_model.model_version
        out.metadata_props.extend(graph_or_model.metadata_props)
        return out, report
    return graph, report


# --- built-in steps: each returns how many things it changed ------------------------------------------------


def _constants_to_initializers(graph: gs.Graph) -> int:
    before = gsmodel.count_nodes(graph)
    edit.constants_to_initializers(graph)
    return before - gsmodel.count_nodes(graph)


def _drop_initializer_inputs(graph: gs.Graph) -> int:
    before = len(graph.inputs)
    edit.drop_initializer_inputs(graph)
    return before - len(graph.inputs)


def _merge_duplicate_initializers(graph: gs.Graph) -> int:
    protected = {id(t) for t in (*graph.inputs, *graph.outputs)}
    by_kind: dict[tuple, list[gs.Constant]] = defaultdict(list)
    for tensor in graph.tensors().values():
        if isinstance(tensor, gs.Constant) and id(tensor) not in protected and tensor.outputs:
            by_kind[
                (np.dtype(tensor.dtype).str if _is_np(tensor.dtype) else tensor.dtype, tuple(tensor.shape))
            ].append(tensor)
    merged = 0
    for group in by_kind.values():
        if len(group) < 2:
            continue
        for keeper, *duplicates in _equal_bytes(group):
            for tensor in duplicates:
                for consumer in list(tensor.outputs):
                    for index, inp in enumerate(consumer.inputs):
                        if inp is tensor:
                            consumer.inputs[index] = keeper
                merged += 1
    return merged


#: Bytes compared in the first round of :func:`_equal_bytes`; each later round reads four times more, up to
#: the last size. Weights that differ usually differ in their first bytes: those are read no further.
_FIRST_CHUNK = 64 * 1024
_LAST_CHUNK = 64 * 1024 * 1024


def _equal_bytes(tensors: list[gs.Constant]) -> list[list[gs.Constant]]:
    """The groups of two or more tensors (of one dtype and shape) whose bytes are equal, each in the given
    order.

    Tensors whose data is the same span of the same file are equal unread. The others are compared chunk by
    chunk (a SHA-256 of each chunk), and a tensor that no other matches so far is read no further: weights
    on disk are read only as far as they are alike, and only equal ones to the end.
    """
    order = {id(t): i for i, t in enumerate(tensors)}
    same_storage: dict[Any, list[gs.Constant]] = {}
    for tensor in tensors:
        same_storage.setdefault(_storage(tensor), []).append(tensor)
    # Each candidate: (its bytes, the tensors known to hold them); candidates alike so far are compared on.
    pending = [[(_TensorBytes(alike[0]), alike) for alike in same_storage.values()]]
    equal: list[list[gs.Constant]] = []
    start, size = 0, _FIRST_CHUNK
    while pending:
        next_round = []
        for candidates in pending:
            if len(candidates) == 1:  # unlike every other: equal only to the tensors of its own storage
                equal.append(candidates[0][1])
                continue
            split: dict[tuple[int, bytes], list] = {}
            for candidate in candidates:
                chunk = candidate[0].read(start, size)
                split.setdefault((len(chunk), hashlib.sha256(chunk).digest()), []).append(candidate)
            for (length, _), alike in split.items():
                if length == 0:  # read to the end and alike all the way: equal
                    equal.append([t for _, same in alike for t in same])
                else:
                    next_round.append(alike)
        pending = next_round
        start, size = start + size, min(size * 4, _LAST_CHUNK)
    return [sorted(group, key=lambda t: order[id(t)]) for group in equal if len(group) > 1]


def _storage(tensor: gs.Constant) -> Any:
    """What a constant's bytes are stored as: the span of its data file for weights still on disk (two
    tensors with the same span are equal unread), else the tensor itself."""
    on_disk = gsmodel.disk_tensor(tensor)
    return id(tensor) if on_disk is None else gsmodel.external_span(on_disk)


class _TensorBytes:
    """A constant's bytes, read a range at a time: from its data file for weights still on disk (nothing
    held between reads), else from its values in memory (loaded on the first read, dropped with this)."""

    def __init__(self, tensor: gs.Constant) -> None:
        self._tensor = tensor
        self._memory: memoryview | None = None

    def read(self, start: int, size: int) -> bytes:
        on_disk = gsmodel.disk_tensor(self._tensor)
        if on_disk is not None:
            return gsmodel.external_range(on_disk, start, size)
        if self._memory is None:
            self._memory = _memory_bytes(self._tensor)
        return bytes(self._memory[start : start + size])


def _memory_bytes(tensor: gs.Constant) -> memoryview:
    """The bytes of a constant whose values are in memory, without caching lazy values on the tensor."""
    lazy = tensor._values
    # load() leaves lazy values lazy: the array is dropped with the view instead of cached on the tensor.
    values = np.ascontiguousarray(lazy.load() if isinstance(lazy, gs.ir.tensor.LazyValues) else tensor.values)
    if values.dtype == object:  # strings: no buffer to compare
        return memoryview(repr(values.tolist()).encode())
    return memoryview(values.reshape(-1).view(np.uint8))  # a view: no copy of the bytes


def _remove_noops(graph: gs.Graph) -> int:
    infer_tensor_types(graph)  # Cast needs its input's dtype
    removed = 0
    for sub in (graph, *graph.subgraphs(recursive=True)):
        local = {id(n) for n in sub.nodes}
        interface = {id(t) for t in (*sub.inputs, *sub.outputs)}
        keep = []
        for node in sub.nodes:
            if _is_noop(node) and _bypass(sub, node, local, interface):
                removed += 1
            else:
                keep.append(node)
        sub.nodes = keep
    return removed


def _is_noop(node: gs.Node) -> bool:
    if not is_default_domain(node.domain) or not node.inputs or node.inputs[0].is_empty():
        return False
    if node.op == "Identity":
        return True
    if node.op == "Cast":
        src = node.inputs[0].dtype
        # the enum graphsurgeon keeps for bfloat16 and float8 counts too: a Cast to the same type is a no-op
        return src is not None and elem_type(src) == node.attrs.get("to")
    if node.op == "Dropout":
        mask_used = len(node.outputs) > 1 and bool(node.outputs[1].outputs)
        training = node.inputs[2] if len(node.inputs) > 2 else None
        inference = (
            training is None
            or training.is_empty()
            or (isinstance(training, gs.Constant) and not bool(np.asarray(training.values).reshape(-1)[0]))
        )
        return inference and not mask_used
    return False


def _bypass(sub: gs.Graph, node: gs.Node, local: set[int], interface: set[int]) -> bool:
    """Reconnect the users of ``node``'s output to its input; False when that would change the interface."""
    src, out = node.inputs[0], node.outputs[0]
    if id(out) in interface:
        # The input takes the output's name; only safe when the input is a plain local tensor.
        produced_here = isinstance(src, gs.Variable) and len(src.inputs) == 1 and id(src.inputs[0]) in local
        if (
            not produced_here
            or id(src) in interface
            or any(id(c) not in local for c in src.outputs if c is not node)
        ):
            return False
        for consumer in list(out.outputs):
            _replace_input(consumer, out, src)
        sub.outputs = [src if t is out else t for t in sub.outputs]
        if src.shape is None:
            src.shape = out.shape
        if src.dtype is None:
            src.dtype = out.dtype
        node.inputs.clear()
        node.outputs.clear()
        src.name = out.name
        return True
    for consumer in list(out.outputs):
        _replace_input(consumer, out, src)
    node.inputs.clear()
    node.outputs.clear()
    return True


def _replace_input(node: gs.Node, old: gs.Tensor, new: gs.Tensor) -> None:
    for index, tensor in enumerate(node.inputs):
        if tensor is old:
            node.inputs[index] = new


def _remove_unused(graph: gs.Graph) -> int:
    before = gsmodel.count_nodes(graph) + _initializer_count(graph) + len(graph.functions)
    graph.cleanup(remove_unused_graph_inputs=False, recurse_subgraphs=True)
    used = _used_ops(graph)
    changed = True
    while changed:  # functions may call functions
        changed = False
        for func in graph.functions:
            key = (func.domain or "", func.name)
            if key in used:
                for node in func.nodes:
                    op_key = (node.domain or "", node.op)
                    if op_key not in used:
                        used.add(op_key)
                        changed = True
    graph.functions = [f for f in graph.functions if (f.domain or "", f.name) in used]
    return before - (gsmodel.count_nodes(graph) + _initializer_count(graph) + len(graph.functions))


def _remove_unused_opsets(graph: gs.Graph) -> int:
    domains = {d for d, _ in _used_ops(graph, include_functions=True)} | {""}
    current = list(graph.import_domains or [])
    if not current:
        return 0
    kept = [o for o in current if (o.domain or "") in domains or (o.domain == "ai.onnx")]
    graph.import_domains = kept
    return len(current) - len(kept)


_STEPS: dict[str, Callable[[gs.Graph], int]] = {
    "constants_to_initializers": _constants_to_initializers,
    "drop_initializer_inputs": _drop_initializer_inputs,
    "merge_duplicate_initializers": _merge_duplicate_initializers,
    "remove_noops": _remove_noops,
    "remove_unused": _remove_unused,
    "remove_unused_opsets": _remove_unused_opsets,
}


# --- optional tools ----------------------------------------------------------------------------------------


def _check_extra(item: str) -> None:
    tool = item.split(":", 1)[0]
    if tool not in _EXTRA_PACKAGES:
        raise GskitError(
            f"sanitize: unknown extra step '{item}'; use onnxoptimizer:PASS, onnxslim or onnxsim"
        )
    if tool == "onnxoptimizer" and ":" not in item:
        raise GskitError(
            f"sanitize: '{item}' names no pass; use onnxoptimizer:PASS (e.g. onnxoptimizer:eliminate_deadend)"
        )
    _import(tool)


def _import(tool: str):
    try:
        return importlib.import_module(tool)
    except ImportError as err:
        raise GskitError(f"sanitize: '{tool}' is not installed; pip install {_EXTRA_PACKAGES[tool]}") from err


def _run_extra(item: str, model: onnx.ModelProto) -> onnx.ModelProto:
    tool, _, arg = item.partition(":")
    module = _import(tool)
    try:
        if tool == "onnxoptimizer":
            known = set(module.get_available_passes())
            if arg not in known:
                raise GskitError(
                    f"sanitize: onnxoptimizer has no pass '{arg}'; see onnxoptimizer.get_available_passes()"
                )
            return module.optimize(model, [arg])
        if tool == "onnxslim":
            return module.slim(model)
        skipped = arg.removeprefix("skip=").split(",") if arg else []
        simplified, ok = module.simplify(model, skipped_optimizers=[s for s in skipped if s] or None)
        if not ok:
            raise GskitError("sanitize: onnxsim could not validate the simplified model")
        return simplified
    except GskitError:
        raise
    except Exception as err:  # third-party tools raise anything
        first = (str(err).strip().splitlines() or [repr(err)])[0]
        raise GskitError(f"sanitize: {item} failed: {first}") from err


# --- counting ----------------------------------------------------------------------------------------------


def _used_ops(graph: gs.Graph, include_functions: bool = False) -> set[tuple[str, str]]:
    graphs = [graph, *graph.subgraphs(recursive=True)]
    if include_functions:
        graphs += list(graph.functions)
    return {(node.domain or "", node.op) for g in graphs for node in g.nodes}


def _initializer_count(graph: gs.Graph) -> int:
    return sum(isinstance(t, gs.Constant) for t in graph.tensors().values())


def _is_np(dtype) -> bool:
    try:
        np.dtype(dtype)
        return True
    except TypeError:
        return False
