"""Plugin-by-plugin comparison: each plugin node against the original region it replaced.

A replacement keeps the names of its boundary tensors, so the region a plugin node replaced is the part
of the ORIGINAL model between the node's input and output tensors (``gskit.passes.isolate``). A region written
in a plugin's native form (the ONNX op the target TensorRT runs natively, ``gskit.plugin.native``) is compared
the same way: a node of an op some loaded spec declares as a native form, that the original does not have
under that name, is checked against the original region between its tensors. The original
runs once with every boundary tensor exposed; each region then runs alone on onnxruntime on the captured
inputs, and so does the plugin node (its numpy reference on onnxruntime, or TensorRT with
``backend="trt"``). A failing plugin is named with its node, its input shapes and its error, even when a
later part of the model hides the error.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs

from gskit.backends import ort as ort_backend
from gskit.backends.model_run import ModelRun
from gskit.compare.options import (
    CompareOptions,
    ComparisonHeader,
    ModelSource,
    header_fields,
    source_label,
    source_model,
)
from gskit.compare.outputs import OutputComparison, backend_for, compare_arrays
from gskit.errors import GskitError
from gskit.io import model as gsmodel
from gskit.io.feeds import feed_shapes
from gskit.passes.isolate import isolate
from gskit.plugin.ops import canonical_domain, is_default_domain, is_plugin_node
from gskit.plugin.registry import PluginRegistry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PluginCheck:
    """One plugin node compared with the original region it replaced.

    Attributes:
        node: the plugin node's name in the prepared model.
        op: ``domain::op_type`` of the node.
        inputs: shape of each (non-constant) input fed to both sides.
        outputs: one comparison per output of the node.
        original_nodes: names of the original region's operator nodes, ``Constant`` nodes (values the region
            reads) not counted, as in ``prepare``'s regions (empty when it could not be cut out).
        passed: every output within tolerance.
        max_abs_err: largest absolute error over the outputs.
        max_rel_err: largest relative error over the outputs.
        note: why the check is incomplete or failed to run (empty when it ran).
    """

    node: str
    op: str
    inputs: dict[str, tuple[int, ...]]
    outputs: list[OutputComparison]
    original_nodes: tuple[str, ...]
    passed: bool
    max_abs_err: float
    max_rel_err: float
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class PluginCompareReport(ComparisonHeader):
    """Result of :func:`compare_plugins`: the header (:class:`ComparisonHeader`: ``passed``: every plugin node
    passed, a node that could not be checked fails; ``input_shapes``: the model inputs fed to the original;
    ``under_test``: what ran the plugin nodes), then

    Attributes:
        plugins: one entry per plugin node of the prepared model's main graph, in its order.
    """

    plugins: list[PluginCheck]
    under_test: str = "numpy reference"

    @property
    def failed(self) -> list[PluginCheck]:
        return [p for p in self.plugins if not p.passed]


#: What runs the plugin nodes, by backend (onnxruntime runs a plugin node through its numpy reference).
UNDER_TEST_NAMES = {"onnxruntime": "numpy reference", "trt": "tensorrt"}


def compare_plugins(
    original: ModelSource,
    prepared: ModelSource,
    options: CompareOptions | None = None,
    **changes: Any,
) -> PluginCompareReport:
    """Compare each plugin node of ``prepared`` with the region of ``original`` between its tensors.

    Args:
        original: the model before replacement (runs on onnxruntime).
        prepared: the model with plugin nodes (nodes of a domain onnxruntime does not implement).
        options: inputs of ``original``, tolerances, what runs the plugin nodes (``backend``) and the plugins
            (:class:`CompareOptions`; its defaults if None).
        changes: fields of ``options`` to change (``plugins=registry``).

    Raises:
        GskitError: a model cannot be loaded or the original cannot run, ``prepared`` has no plugin node,
            or ``"trt"`` without TensorRT and a GPU.
    """
    options = CompareOptions.given(options, changes).plugins_for(always=True)  # native forms need specs too
    backend = backend_for(options)
    registry = options.plugins if options.plugins is not None else PluginRegistry()
    original_proto = source_model(original)
    prepared_graph = gsmodel.to_graph(source_model(prepared))
    original_graph = gsmodel.to_graph(original_proto)
    native = _native_nodes(prepared_graph, original_graph, registry)
    nodes = [
        n
        for n in prepared_graph.nodes
        if (is_plugin_node(n) and n.domain != ort_backend.PYOP_DOMAIN) or id(n) in native
    ]
    if not nodes:
        raise GskitError(
            f"{source_label(prepared)} has no plugin node (custom-domain node) and no native-form node of a "
            "loaded plugin in its main graph"
        )
    feeds = options.feeds_for(original_proto)
    original_tensors = original_graph.tensors()
    boundaries = {id(n): _boundary(n, original_tensors) for n in nodes}
    wanted = [
        name
        for ins, outs in boundaries.values()
        for name in (*ins, *outs)
        if isinstance(original_tensors.get(name), gs.Variable)
    ]
    captured = ort_backend.ExposedTensors(original_proto, feeds, options.plugins, "original").run(
        list(dict.fromkeys(wanted))
    )
    graphs = _Graphs(original_graph, prepared_graph, registry)
    checks = []
    for node in nodes:
        ins, outs = boundaries[id(node)]
        missing = [n for n in (*ins, *outs) if n not in captured]
        if missing:
            checks.append(_unchecked(node, captured, f"tensor(s) {missing} are not computed by the original"))
            continue
        checks.append(_check(node, ins, outs, graphs, captured, backend, options))
    return PluginCompareReport(
        plugins=checks,
        under_test=UNDER_TEST_NAMES[options.under_test_backend],
        **header_fields(options, feeds, all(c.passed for c in checks)),
    )


@dataclass(frozen=True)
class _Graphs:
    """Both models as graphs, and the specs that cut regions and run plugin nodes."""

    original: gs.Graph
    prepared: gs.Graph
    registry: PluginRegistry


def _check(
    node: gs.Node,
    inputs: list[str],
    outputs: list[str],
    graphs: _Graphs,
    captured: Mapping[str, np.ndarray],
    backend: ModuleType,
    options: CompareOptions,
) -> PluginCheck:
    fed = {name: captured[name] for name in inputs}
    note = ""
    try:
        region = isolate(graphs.original, inputs, outputs, registry=graphs.registry)
        expected = ort_backend.run(gsmodel.to_model(region), fed, outputs=outputs)
        region_nodes = tuple(n.name or n.op for n in region.nodes if not _is_constant_node(n))
    except GskitError as err:
        note = f"original region not cut out ({err}); compared with the full original run"
        expected, region_nodes = {name: captured[name] for name in outputs}, ()
    try:
        unit = isolate(graphs.prepared, inputs, outputs, registry=graphs.registry)
        if graphs.registry.for_node(node) is not None:
            unit.functions = []  # run the plugin's reference, not a kept copy of the original region
        unit_run = ModelRun(gsmodel.to_model(unit), fed, backend.NAME, graphs.registry, options.trt_plugins)
        actual = backend.run_unit(unit_run, outputs)
    except GskitError as err:
        return _unchecked(node, captured, f"plugin failed to run: {err}", region_nodes)
    rows = compare_arrays(expected, actual, outputs, atol=options.atol, rtol=options.rtol)
    if any(not r.passed for r in rows):
        log.warning("plugin node '%s' (%s) differs from the original region", node.name, _op(node))
    return PluginCheck(
        node=node.name,
        op=_op(node),
        inputs=feed_shapes(fed),
        outputs=rows,
        original_nodes=region_nodes,
        passed=all(r.passed for r in rows),
        max_abs_err=max(r.max_abs_err for r in rows),
        max_rel_err=max(r.max_rel_err for r in rows),
        note=note,
    )


def _native_nodes(prepared: gs.Graph, original: gs.Graph, registry: PluginRegistry) -> set[int]:
    """Nodes of ``prepared`` written in a loaded plugin's native form: an op some spec declares as one, under
    a name the original does not give a node of that op (a region left as it was is the original's own)."""
    ops = {(f.domain, f.op_type) for spec in registry for f in spec.native}
    if not ops:
        return set()
    before = {(n.name, canonical_domain(n.domain), n.op) for n in original.nodes}
    return {
        id(n)
        for n in prepared.nodes
        if (canonical_domain(n.domain), n.op) in ops
        and (n.name, canonical_domain(n.domain), n.op) not in before
    }


def _boundary(node: gs.Node, original: Mapping[str, gs.Tensor]) -> tuple[list[str], list[str]]:
    """Names of the node's computed inputs (constants come along with the region) and of its outputs.

    An output the original does not have, read only by a ``Reshape``, is the plugin's own layout that
    replace reshapes into the model's (``Rewrite.output_shapes``): the unit ends after that Reshape.
    """
    inputs = [t.name for t in node.inputs if isinstance(t, gs.Variable) and t.name]
    outputs = []
    for tensor in node.outputs:
        if not tensor.name:
            continue
        readers = tensor.outputs
        layout = len(readers) == 1 and readers[0].op == "Reshape" and is_default_domain(readers[0].domain)
        outputs.append(readers[0].outputs[0].name if layout and tensor.name not in original else tensor.name)
    return list(dict.fromkeys(inputs)), outputs


def _unchecked(
    node: gs.Node, captured: Mapping[str, np.ndarray], why: str, region_nodes: tuple[str, ...] = ()
) -> PluginCheck:
    inputs = {t.name: captured[t.name] for t in node.inputs if t.name in captured}
    return PluginCheck(
        node=node.name,
        op=_op(node),
        inputs=feed_shapes(inputs),
        outputs=[],
        original_nodes=region_nodes,
        passed=False,
        max_abs_err=float("inf"),
        max_rel_err=float("inf"),
        note=why,
    )


def _is_constant_node(node: gs.Node) -> bool:
    """A standard ``Constant`` node: the pattern that replaced the region read its value, not its node."""
    return node.op == "Constant" and is_default_domain(node.domain)


def _op(node: gs.Node) -> str:
    return f"{node.domain}::{node.op}" if node.domain else node.op
