"""``check_trt``: which nodes the TensorRT ONNX parser will not take, and why.

Three sources can answer, in this order of preference (``backend="auto"``):

* **tensorrt** (full TensorRT): the model is parsed as it is, after the plugin libraries and Python plugin
  modules found in ``plugins`` are loaded, so plugin nodes are checked against the real plugin registry.
* **tensorrt_rtx**: TensorRT-RTX has no custom plugins (and aborts the process on Python plugins), so plugin
  nodes are *cut out* before parsing: each plugin node is removed and its outputs become graph inputs with
  the dtype and shape the model records (value_info) or that the gskit plugin spec infers. The rest of the
  model is then parsed exactly as TensorRT would see it around the plugin (same shapes and dtypes flowing
  in), which is what a plugin build will need. A plugin node whose output types are unknown stays in place;
  the parser then reports "Plugin not found" for it, which is expected and not counted as unsupported.
* **static table** (:mod:`gskit.backends.trt_support`) when neither is installed, or when the installed parser
  does not fit the target.

The check answers for a **target** TensorRT version (``target``; default: the installed full TensorRT's, else
the newest gskit knows). A parser fits a target of its own line (8.x; 10.x and 11.x, which share INT64, local
functions and IPluginV3); else the target's table answers. Where the parser that answered and the target's
table differ about an op, the table corrects it: an op the target does not import is unsupported even though
the parser took it (RMSNormalization for 10.3), and a node the target imports natively but the parser has no
importer for (DeformConv on TensorRT-RTX, DFT below 11.2) is cut out before parsing, like a plugin node, and
reported as ``not checked`` with the version that imports it, not as a rejection. For targets of 11 and later,
TensorRT's own plugins removed in 11.0 are unsupported and IPluginV2-only ones restricted, each with its
replacement.

Both parsers run in a child process (:func:`gskit.backends.trt.run_worker`). The parser reports every node
its static checkers reject but stops importing at the first node that fails during import; nodes after
that one are not in any partition and may hide further problems (fix and check again).

Plugin nodes (a ``plugin_namespace`` attribute, or a custom-domain op that is neither a standard op type
nor a model-local function, which the parser also hands to its plugin importer) are reported as
``needs plugin NS::NAME vN``; their attributes are checked against what the parser can pass to a plugin
and against the gskit plugin spec when one is loaded.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import AttributeProto

from gskit.backends.trt import find_plugin_files, resolve_backend, run_worker, source_label, started_worker
from gskit.backends.trt_support import (
    RESTRICTED,
    UNSUPPORTED,
    ParserTable,
    check_node,
    first_import,
    parser_table,
    rtx_facts,
    trt_plugin_verdict,
    version_verdict,
)
from gskit.errors import GskitError, PluginError
from gskit.io import model as gsmodel
from gskit.passes.tensor_types import InferenceFailed, elem_type, gs_dtype, with_inferred_types
from gskit.plugin import libnvinfer
from gskit.plugin.discovery import implementation_paths, load_plugins
from gskit.plugin.libnvinfer import ShippedPlugin
from gskit.plugin.ops import (
    DEFAULT_VERSION,
    NAMESPACE_ATTR,
    ONNX_DOMAINS,
    VERSION_ATTR,
    has_namespace_attr,
    is_default_domain,
    onnx_op_types,
)
from gskit.plugin.registry import PluginRegistry
from gskit.plugin.spec import (
    INT32_MAX,
    INT32_MIN,
    ROUTING_ATTRIBUTES,
    TENSOR_DTYPES_PASSED_TO_PLUGINS,
    TensorInfo,
    attribute_value,
)
from gskit.plugin.stubs import describe_stubs, stub_parts
from gskit.plugin.target import TensorRTTarget, installed_tensorrt, installed_version, resolve_target

log = logging.getLogger(__name__)

#: Node statuses in a report. ``unsupported`` and ``plugin problem`` make a check fail; ``not checked``: the
#: target imports the op natively but the parser that answered has no importer for it.
NEEDS_PLUGIN = "needs plugin"
PLUGIN_PROBLEM = "plugin problem"
NOT_CHECKED = "not checked"
STATUSES = (UNSUPPORTED, PLUGIN_PROBLEM, NEEDS_PLUGIN, RESTRICTED, NOT_CHECKED)
STATIC_SOURCE = "static table"
_UNPASSABLE_KINDS = {
    AttributeProto.GRAPH: "graph",
    AttributeProto.GRAPHS: "graphs",
    AttributeProto.SPARSE_TENSOR: "sparse tensor",
    AttributeProto.SPARSE_TENSORS: "sparse tensors",
    AttributeProto.TENSORS: "tensors",
    AttributeProto.TYPE_PROTO: "type",
    AttributeProto.TYPE_PROTOS: "types",
}


@dataclass(frozen=True)
class NodeIssue:
    """One main-graph node that the parser rejects, that needs a plugin, or that has a restriction.

    Attributes:
        index: position of the node in the main graph.
        name: node name, or ``#<index> <op_type>`` when it has none.
        domain: the node's domain.
        op_type: the node's op type.
        status: one of ``STATUSES``.
        reason: one line: why, and for plugin nodes ``needs plugin NS::NAME vN`` first.
    """

    index: int
    name: str
    domain: str
    op_type: str
    status: str
    reason: str


@dataclass(frozen=True)
class Partition:
    """A run of nodes that the parser imported together (``get_subgraph_nodes``).

    Attributes:
        supported: ``is_subgraph_supported``; TensorRT sets it only when the whole model parses as one
            partition, so False here does not mean that these nodes were rejected.
        nodes: names of the nodes (original model indices, plugin cuts undone).
    """

    supported: bool
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class TrtSupportReport:
    """What ``check_trt`` found.

    Attributes:
        model: the model file.
        source: what answered: ``tensorrt 10.16``, ``tensorrt_rtx 1.7`` or ``static table``.
        target: the TensorRT version answered for (``10.3``).
        table: the parser table of the target that answered or corrected the answer (its source).
        node_count: nodes in the main graph.
        issues: nodes with something to report, in graph order.
        partitions: the parser's partitions (empty for the static table).
        model_errors: parser errors not tied to a node (inputs, graph structure).
        notes: how the answer was obtained (plugin cuts, plugins loaded).
    """

    model: Path
    source: str
    node_count: int
    issues: tuple[NodeIssue, ...] = ()
    partitions: tuple[Partition, ...] = ()
    model_errors: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())
    target: str = ""
    table: str = ""

    def nodes_with(self, status: str) -> tuple[NodeIssue, ...]:
        """Issues of one status."""
        return tuple(issue for issue in self.issues if issue.status == status)

    @property
    def rejected(self) -> tuple[NodeIssue, ...]:
        """Nodes TensorRT will not take: unsupported ones and plugin nodes with a plugin problem."""
        return tuple(issue for issue in self.issues if issue.status in (UNSUPPORTED, PLUGIN_PROBLEM))

    @property
    def ok(self) -> bool:
        """True when no node is unsupported, every plugin node is usable and the parser saw no model error."""
        return not (self.rejected or self.model_errors)


def check_trt(
    model_path: str | os.PathLike,
    plugins: Sequence[str | os.PathLike] | None = None,
    backend: str = "auto",
    target: str | TensorRTTarget | None = None,
    registry: PluginRegistry | None = None,
) -> TrtSupportReport:
    """Check which nodes of a model the TensorRT ONNX parser of ``target`` will not take.

    Args:
        model_path: the ``.onnx`` file.
        plugins: plugin folders (gskit specs, ``trt_plugin.py``, ``.so`` libraries) and library files, added
            to the default plugin sources (``gskit.plugin.discovery.plugin_sources``).
        backend: ``auto`` (full TensorRT, else TensorRT-RTX, where its parser fits the target; else the static
            table of the target), or one of them by name (``tensorrt``, ``tensorrt_rtx``, ``static``).
        target: the TensorRT version to answer for (``"10.3"``); None: the installed full TensorRT's, else the
            newest gskit knows.
        registry: the specs loaded from ``plugins`` and the default sources, when the caller has them (the
            pipeline's run): not loaded again.

    Raises:
        GskitError: the model cannot be read, a plugin file cannot be loaded, the target is not a version, or
            the parser process crashed.
    """
    path = Path(model_path)
    # The weights stay on disk: the checks read small constants only, and the parser reads the file itself
    model = gsmodel.load(path, load_weights=False)
    goal = resolve_target(target)
    table = parser_table(goal)
    flavour, notes = _answering(backend, goal)
    with started_worker(flavour):  # the parser loads while the plugins load and plugin nodes are cut
        return _check_trt(path, model, plugins, flavour, notes, goal, table, registry)


def answering_flavour(backend: str, target: TensorRTTarget) -> str:
    """What :func:`check_trt` of ``backend`` will ask for ``target``: ``tensorrt``, ``tensorrt_rtx`` or
    ``static``.

    Raises:
        GskitError: an unknown backend name, or the named one is not installed.
    """
    return _answering(backend, target)[0]


def _check_trt(
    path: Path,
    model: onnx.ModelProto,
    plugins: Sequence[str | os.PathLike] | None,
    flavour: str,
    notes: list[str],
    goal: TensorRTTarget,
    table: ParserTable,
    registry: PluginRegistry | None,
) -> TrtSupportReport:
    missing = [str(p) for p in plugins or () if not Path(p).exists()]
    if missing:
        raise GskitError(f"--plugins: no such file or folder: {', '.join(missing)}")
    if registry is None:
        registry = load_plugins(None if plugins is None else [p for p in plugins if Path(p).is_dir()])
    nodes = list(model.graph.node)
    stubs: dict[int, tuple[str, ...]] = {}  # a spec's stub parts, read once for all its nodes
    plugin_issues = {i: _plugin_issue(i, node, registry, goal, stubs) for i, node in plugin_nodes(model)}
    opset = _opset(model)
    if opset is not None and opset > table.opsets[1]:
        notes.append(
            f"the model's opset {opset} is above the opsets TensorRT {goal}'s parser states "
            f"({table.opsets[0]} to {table.opsets[1]}): its parser may refuse newer op versions"
        )
    if flavour == "static":
        issues = _static_issues(model, plugin_issues, table, goal)
        notes.append(f"answered by {table.source} for TensorRT {goal} ({goal.source})")
        return TrtSupportReport(
            path,
            STATIC_SOURCE,
            len(nodes),
            tuple(issues),
            target=str(goal),
            table=table.source,
            notes=tuple(notes),
        )
    return _parser_report(path, model, flavour, plugins, registry, plugin_issues, table, goal, notes)


#: A parser answers for a target of its own line: before 10, or 10 and later (INT64, local functions and
#: IPluginV3 came with 9.x/10.0); op-level differences inside a line are corrected from the target's table.
_LINE_START = (10, 0)


def _answering(backend: str, target: TensorRTTarget) -> tuple[str, list[str]]:
    """The source that answers for ``target`` and notes saying why (``auto`` picks a parser that fits)."""
    flavour = resolve_backend(backend)
    if flavour == "static":
        return flavour, []
    like = _parser_like(flavour)
    if like is None or (like >= _LINE_START) == target.at_least(_LINE_START):
        return flavour, []
    said = f"{flavour} (its parser is at TensorRT {'.'.join(map(str, like))}'s level)"
    if backend == "auto":
        return "static", [f"the installed {said} does not answer for TensorRT {target}: the table does"]
    return flavour, [f"{said} answers for TensorRT {target}, of another line of parsers, as asked"]


def _parser_like(flavour: str) -> tuple[int, int] | None:
    """The full TensorRT release whose parser ``flavour`` matches (TensorRT-RTX: from the data file)."""
    if flavour == "tensorrt":
        installed = installed_tensorrt()
        return TensorRTTarget.parse(installed, "").version if installed else None
    facts = rtx_facts(_package_version(flavour))
    return TensorRTTarget.parse(str(facts["like"]), "").version if facts else None


def _parser_gaps(flavour: str) -> tuple[set[str], str]:
    """Ops the answering parser has no importer for, and its table's TensorRT version (for messages)."""
    if flavour == "tensorrt":
        installed = installed_tensorrt() or ""
        return (set(), installed) if not installed else (_not_imported(parser_table(installed)), installed)
    facts = rtx_facts(_package_version(flavour))
    if facts is None:
        return set(), "?"
    like = parser_table(str(facts["like"]))
    gaps = (_not_imported(like) | set(facts["no_importer"])) - set(facts.get("extra", ()))
    return gaps, str(facts["like"])


def _not_imported(table: ParserTable) -> set[str]:
    """Every ONNX op the table's parser does not import."""
    return {op for op in onnx_op_types() if not table.supports(op)}


def parser_plugin_node(node: onnx.NodeProto, functions: set[tuple[str, str]]) -> bool:
    """True when TensorRT's parser hands this node to its plugin importer (``functions``: local functions).

    Not :func:`gskit.plugin.ops.is_plugin_node` (what onnxruntime cannot run): the parser picks importers by
    op type alone, so a custom-domain ``Relu`` is no plugin for it, and it inlines a local function of the
    same name.
    """
    if has_namespace_attr(node):
        return True
    if node.domain in ONNX_DOMAINS or node.op_type in onnx_op_types():
        return False
    return (node.domain, node.op_type) not in functions


def plugin_nodes(model: onnx.ModelProto) -> list[tuple[int, onnx.NodeProto]]:
    """The main graph's plugin nodes (see :func:`parser_plugin_node`) with their positions."""
    functions = {(f.domain, f.name) for f in model.functions}
    return [(i, node) for i, node in enumerate(model.graph.node) if parser_plugin_node(node, functions)]


def node_label(index: int, node: onnx.NodeProto) -> str:
    """The node's name, or ``#INDEX OP`` for a nameless one."""
    return node.name or f"#{index} {node.op_type}"


def plugin_key(node: onnx.NodeProto) -> tuple[str, str, str]:
    """``(namespace, name, version)`` the parser looks up for a plugin node."""
    attrs = {
        a.name: attribute_value(a) for a in node.attribute if a.name in ("plugin_namespace", "plugin_version")
    }
    return (
        str(attrs.get("plugin_namespace", node.domain)),
        node.op_type,
        str(attrs.get("plugin_version", "1")),
    )


def plugin_label(namespace: str, name: str, version: str) -> str:
    """``NS::NAME vN``, or ``NAME vN`` for TensorRT's namespace ""."""
    return f"{namespace}::{name} v{version}" if namespace else f"{name} v{version}"


def shipped_plugin_of(node: onnx.NodeProto) -> ShippedPlugin | None:
    """The ``libnvinfer_plugin`` creator TensorRT's parser finds for this node (op type, ``plugin_version``,
    ``plugin_namespace`` "" or absent: the parser looks in namespace "" first), or None."""
    if not _in_tensorrt_namespace(node):
        return None
    version = next((attribute_value(a) for a in node.attribute if a.name == VERSION_ATTR), DEFAULT_VERSION)
    return libnvinfer.shipped_plugin(node.op_type, str(version))


def _in_tensorrt_namespace(node: onnx.NodeProto) -> bool:
    """Whether the parser looks the node's creator up in TensorRT's own namespace ("", also when absent)."""
    given = next(
        (attribute_value(a) for a in node.attribute if a.name == NAMESPACE_ATTR), libnvinfer.NAMESPACE
    )
    return str(given) == libnvinfer.NAMESPACE


def _plugin_issue(
    index: int,
    node: onnx.NodeProto,
    registry: PluginRegistry,
    target: TensorRTTarget,
    stubs_of: dict[int, tuple[str, ...]] | None = None,
) -> NodeIssue:
    """The issue of one plugin node; ``stubs_of`` keeps each spec's stub parts (by ``id``) for the next node
    of the same plugin (they are read from its files: 1-2 ms a spec)."""
    namespace, name, version = plugin_key(node)
    shipped = shipped_plugin_of(node)
    # Only a node the parser looks up in TensorRT's namespace "" is TensorRT's plugin of that name.
    own = trt_plugin_verdict(name, version, target) if _in_tensorrt_namespace(node) else None
    if own is not None:  # one of TensorRT's own plugins that the target removed or deprecated
        return NodeIssue(index, node_label(index, node), node.domain, node.op_type, *own)
    problems = list(_unpassable_attributes(node))
    spec = registry.for_node(node)
    if shipped is not None:
        namespace = libnvinfer.NAMESPACE
        trouble = shipped.problem(str(target))
        if trouble:
            problems.append(trouble)
    if spec is None and shipped is not None:
        known = f"TensorRT's own plugin: {shipped.life()}; no gskit spec, so no reference for onnxruntime"
    elif spec is None and not has_namespace_attr(node):
        # Nothing says this node is meant as a plugin: no loaded spec, no plugin_namespace attribute.
        reason = (
            f"op '{node.op_type}' of unknown domain '{node.domain}': neither an ONNX op nor a loaded "
            f"plugin; TensorRT would need a plugin {plugin_label(namespace, name, version)} (load it with "
            "--plugins)"
        )
        return NodeIssue(index, node_label(index, node), node.domain, node.op_type, NEEDS_PLUGIN, reason)
    elif spec is None:
        known = "not a gskit plugin"
    else:
        known = f"gskit plugin from {spec.source or '?'}"
        if shipped is not None and spec.library is not None:
            known = f"TensorRT's own plugin: {shipped.life()}; gskit spec from {spec.source or '?'}"
        values = {a.name: a for a in node.attribute if a.name not in ROUTING_ATTRIBUTES}
        try:
            spec.node_attrs({k: attribute_value(v) for k, v in values.items()})
        except PluginError as err:
            problems.append(str(err))
        stubs_of = {} if stubs_of is None else stubs_of
        if id(spec) not in stubs_of:
            stubs_of[id(spec)] = stub_parts(spec)
        stubs = stubs_of[id(spec)]
        if stubs:
            known += f"; {describe_stubs(spec)}"
        if "trt_plugin" in stubs:  # TensorRT would load the plugin and run a kernel that raises
            problems.append("TensorRT would run its stub kernel: write kernel.py")
    reason = f"needs plugin {plugin_label(namespace, name, version)} ({known})"
    if problems:
        reason += ": " + "; ".join(problems)
    return NodeIssue(
        index,
        node_label(index, node),
        node.domain,
        node.op_type,
        PLUGIN_PROBLEM if problems else NEEDS_PLUGIN,
        reason,
    )


def _unpassable_attributes(node: onnx.NodeProto) -> Iterator[str]:
    """Attributes the parser cannot hand to a plugin (TENSORRT_NOTES.md, attribute -> PluginField)."""
    for attr in node.attribute:
        if attr.name in ROUTING_ATTRIBUTES:
            continue
        if attr.type in _UNPASSABLE_KINDS:
            kind = _UNPASSABLE_KINDS[attr.type]
            yield f"attribute '{attr.name}' is a {kind}, which TensorRT does not pass to plugins"
        elif attr.type in (AttributeProto.INT, AttributeProto.INTS):
            values = [attr.i] if attr.type == AttributeProto.INT else list(attr.ints)
            if any(not INT32_MIN <= v <= INT32_MAX for v in values):
                yield f"attribute '{attr.name}' does not fit in int32 (TensorRT narrows INT attributes)"
        elif attr.type == AttributeProto.TENSOR:
            dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(attr.t.data_type))
            bf16 = attr.t.data_type == onnx.TensorProto.BFLOAT16
            if not bf16 and dtype not in TENSOR_DTYPES_PASSED_TO_PLUGINS:
                yield f"attribute '{attr.name}' is a {dtype} tensor, which TensorRT cannot pass to plugins"


# ----------------------------------------------------------------------------------------------------
# Static table


def _static_issues(
    model: onnx.ModelProto,
    plugin_issues: Mapping[int, NodeIssue],
    table: ParserTable,
    target: TensorRTTarget,
) -> list[NodeIssue]:
    functions = {(f.domain, f.name): f for f in model.functions}
    constants = _constants(model.graph)
    opset = _opset(model)
    issues = []
    for index, node in enumerate(model.graph.node):
        if index in plugin_issues:
            issues.append(plugin_issues[index])
            continue
        own = None if node.op_type in onnx_op_types() else trt_plugin_verdict(node.op_type, "1", target)
        if own is not None:  # TensorRT's own plugin in the default domain (the parser ignores domains)
            issues.append(NodeIssue(index, node_label(index, node), node.domain, node.op_type, *own))
            continue
        verdicts = list(_static_verdicts(node, constants, functions, set(), table, opset))
        if not verdicts:
            continue
        status = UNSUPPORTED if any(s == UNSUPPORTED for s, _ in verdicts) else RESTRICTED
        reason = "; ".join(dict.fromkeys(r for s, r in verdicts if s == status))
        issues.append(NodeIssue(index, node_label(index, node), node.domain, node.op_type, status, reason))
    return issues


def _static_verdicts(
    node: onnx.NodeProto,
    constants: Mapping[str, onnx.TensorProto],
    functions: Mapping[tuple[str, str], onnx.FunctionProto],
    seen: set[tuple[str, str]],
    table: ParserTable,
    opset: int | None,
) -> Iterator[tuple[str, str]]:
    """(status, reason) for a node, including the ops inside its subgraphs and the function it calls."""
    key = (node.domain, node.op_type)
    if key in functions and node.op_type not in onnx_op_types() and key not in seen:
        for inner in functions[key].node:
            for status, reason in _static_verdicts(inner, {}, functions, seen | {key}, table, opset):
                yield status, f"in function {node.domain}::{node.op_type}: {reason}"
        return
    verdict = check_node(node, constants, table, opset)
    if verdict is not None:
        yield (
            verdict.status,
            verdict.reason if verdict.status == RESTRICTED else f"{node.op_type}: {verdict.reason}",
        )
    for attr in node.attribute:
        for graph in [attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs):
            inner_constants = {**constants, **_constants(graph)}
            for inner in graph.node:
                for status, reason in _static_verdicts(inner, inner_constants, functions, seen, table, opset):
                    yield status, f"in subgraph '{attr.name}': {reason}"


def _opset(model: onnx.ModelProto) -> int | None:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


def _constants(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    found = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and is_default_domain(node.domain):
            for attr in node.attribute:
                if attr.name == "value" and attr.type == AttributeProto.TENSOR:
                    found[node.output[0]] = attr.t
    return found


# ----------------------------------------------------------------------------------------------------
# Real parser


def _parser_report(
    path: Path,
    model: onnx.ModelProto,
    flavour: str,
    plugins: Sequence[str | os.PathLike] | None,
    registry: PluginRegistry,
    plugin_issues: dict[int, NodeIssue],
    table: ParserTable,
    target: TensorRTTarget,
    notes: list[str],
) -> TrtSupportReport:
    nodes = list(model.graph.node)
    label = source_label(flavour, _package_version(flavour))
    gaps, like = _parser_gaps(flavour)
    # Nodes the target imports natively and the parser cannot: cut out like plugin nodes, reported, not
    # rejected.
    unchecked = {
        i: node
        for i, node in enumerate(nodes)
        if i not in plugin_issues and node.op_type in gaps and table.supports(node.op_type)
    }
    request: dict[str, Any] = {}
    to_cut = set(unchecked) | (set(plugin_issues) if flavour == "tensorrt_rtx" else set())
    parsed, kept, cut = _cut_plugin_nodes(model, to_cut, registry)
    cut_plugins = [i for i in cut if i in plugin_issues]
    if cut_plugins:
        notes.append(
            f"TensorRT-RTX has no custom plugins: {len(cut_plugins)} plugin or custom node(s) cut out before "
            "parsing, their outputs fed as graph inputs"
        )
    if flavour == "tensorrt_rtx":
        left = sorted(set(plugin_issues) - set(cut))
        if left:
            notes.append(
                f"{len(left)} plugin node(s) left in place (output types unknown): the parser "
                f"reports 'Plugin not found' for them"
            )
    else:
        files = find_plugin_files(implementation_paths(registry, plugins or ()))
        shipped = sorted({p.label for _, node in plugin_nodes(model) if (p := shipped_plugin_of(node))})
        request = {
            "plugin_libraries": [str(p) for p in files.libraries],
            "plugin_modules": [str(p) for p in files.modules],
            "tensorrt_plugins": bool(shipped),
        }
        if files:
            notes.append(
                f"loaded {len(files.libraries)} plugin libraries, {len(files.modules)} Python plugin modules"
            )
        if shipped:
            notes.append(f"loaded TensorRT's own plugins ({libnvinfer.LIBRARY}) for {', '.join(shipped)}")
    issues_by_index = {i: _not_checked(i, node, table, label, i in cut) for i, node in unchecked.items()}
    if cut and not parsed.graph.output:
        # Cut nodes straight on the graph inputs and nothing else: the parser has nothing to see.
        parser = "TensorRT-RTX" if flavour == "tensorrt_rtx" else "TensorRT"
        notes.append(
            "only plugin, custom or uncheckable nodes on the graph inputs: "
            f"nothing for {parser}'s parser to check"
        )
        issues_by_index.update(plugin_issues)
        return TrtSupportReport(
            path,
            label,
            len(nodes),
            tuple(issues_by_index[i] for i in sorted(issues_by_index)),
            notes=tuple(notes),
            target=str(target),
            table=table.source,
        )
    if parsed is model:  # nothing cut: the parser reads the file as it is
        answer = run_worker("check", flavour, {**request, "model": str(path.resolve())})
    else:
        with tempfile.TemporaryDirectory(prefix="gskit-check-") as tmp:
            parsed_path = gsmodel.save_beside_weights(parsed, Path(tmp) / path.name)
            answer = run_worker("check", flavour, {**request, "model": str(parsed_path)})
    errors_by_node: dict[int, list[str]] = {}
    model_errors = []
    for error in answer["errors"]:
        if 0 <= error["node"] < len(kept):
            desc, func = error["desc"], error["func"]
            message = f"{func}: {desc}" if desc not in ("", "false") else f"rejected by the parser's {func}"
            errors_by_node.setdefault(kept[error["node"]], []).append(message)
        else:
            model_errors.append(f"{error['code']}: {error['desc']}")
    older = not target.at_least(like) if like not in ("", "?") else False
    constants, opset = _constants(model.graph), _opset(model)
    for index, node in enumerate(nodes):
        messages = errors_by_node.get(index, [])
        if index in plugin_issues:
            issue = plugin_issues[index]
            if messages and flavour == "tensorrt":
                issue = NodeIssue(
                    issue.index,
                    issue.name,
                    issue.domain,
                    issue.op_type,
                    PLUGIN_PROBLEM,
                    f"{issue.reason}; TensorRT: {'; '.join(messages)}",
                )
            issues_by_index[index] = issue
        elif messages:
            hint = "" if table.supports(node.op_type) else table.missing_reason(node.op_type)
            reason = "; ".join(messages) + (f" ({hint})" if hint else "")
            issues_by_index[index] = NodeIssue(
                index, node_label(index, node), node.domain, node.op_type, UNSUPPORTED, reason
            )
        elif index not in issues_by_index and older:
            # The parser is newer than the target: an op it took, the target's version may not import.
            verdict = version_verdict(node, constants, table, opset)
            if verdict is not None:
                issues_by_index[index] = NodeIssue(
                    index,
                    node_label(index, node),
                    node.domain,
                    node.op_type,
                    UNSUPPORTED,
                    f"{verdict.reason}; {label}'s parser takes it, TensorRT {target} does not",
                )
    if older or unchecked:
        notes.append(f"answered for TensorRT {target} ({target.source}), corrected by {table.source}")
    partitions = tuple(
        Partition(
            sub["supported"],
            tuple(node_label(kept[i], nodes[kept[i]]) for i in sub["nodes"] if i < len(kept)),
        )
        for sub in answer["subgraphs"]
    )
    return TrtSupportReport(
        path,
        source_label(answer["flavour"], answer["version"]),
        len(nodes),
        tuple(issues_by_index[i] for i in sorted(issues_by_index)),
        partitions,
        tuple(model_errors),
        tuple(notes),
        target=str(target),
        table=table.source,
    )


def _not_checked(index: int, node: onnx.NodeProto, table: ParserTable, parser: str, cut: bool) -> NodeIssue:
    """A node the target imports natively that the answering parser has no importer for."""
    since = first_import(node.op_type) or table.target
    how = "cut out before parsing" if cut else "left in place (its output types are unknown)"
    return NodeIssue(
        index,
        node_label(index, node),
        node.domain,
        node.op_type,
        NOT_CHECKED,
        f"full TensorRT >= {since} imports {node.op_type} natively ({table.source}); {parser} has no "
        f"importer for it, so it was {how} and not checked here",
    )


def _package_version(flavour: str) -> str:
    """The installed version of TensorRT or TensorRT-RTX, read without importing it (no worker needed)."""
    return installed_version(flavour) or "?"


def _cut_plugin_nodes(
    model: onnx.ModelProto, plugin_indices: set[int], registry: PluginRegistry
) -> tuple[onnx.ModelProto, list[int], list[int]]:
    """A copy of the model without the plugin nodes whose output types are known.

    Returns:
        The model to parse, the original index of each of its nodes, and the indices cut out.
    """
    if not plugin_indices:
        return model, list(range(len(model.graph.node))), []
    try:
        inferred = with_inferred_types(model)
    except InferenceFailed as err:  # the model's own types; plugin outputs below still come from the specs
        log.info("%s", err)
        inferred = model
    graph = gsmodel.to_graph(inferred)
    cut = []
    feeding: list[gs.Variable] = []
    for index in sorted(plugin_indices):
        node = graph.nodes[index]
        if not _give_output_types(node, registry):
            continue
        feeding.extend(t for t in node.inputs if isinstance(t, gs.Variable) and t.inputs)
        # A copy: clearing a tensor's producer also drops it from node.outputs (graphsurgeon keeps both
        # lists in step), which skipped every second output of a multi-output plugin.
        for tensor in list(node.outputs):
            tensor.inputs.clear()
            if tensor in graph.outputs:
                graph.outputs.remove(tensor)
            graph.inputs.append(tensor)
        cut.append(index)
    # What fed a cut plugin node becomes a graph output: else TensorRT drops the nodes that compute it as
    # dead code (and a model whose outputs all come from plugins would leave nothing to check at all).
    for tensor in {t.name: t for t in feeding}.values():
        if tensor not in graph.outputs and tensor not in graph.inputs and tensor.dtype is not None:
            graph.outputs.append(tensor)
    cut_set = set(cut)
    graph.nodes = [n for i, n in enumerate(graph.nodes) if i not in cut_set]
    kept = [i for i in range(len(model.graph.node)) if i not in cut_set]
    return gsmodel.to_model(graph), kept, cut


def _give_output_types(node: gs.Node, registry: PluginRegistry) -> bool:
    """Make sure every output of a plugin node has a dtype and a rank; False when that is not known."""
    if all(t.dtype is not None and t.shape is not None for t in node.outputs):
        return True
    spec = registry.for_node(node)
    if spec is None:
        return False
    infos = [
        None
        if not t.name
        else TensorInfo(elem_type(t.dtype) or 0, None if t.shape is None else tuple(t.shape))
        for t in node.inputs
    ]
    try:
        outputs = spec.infer(infos, {k: attribute_value(v) for k, v in node.attrs.items()})
    except (PluginError, TypeError, ValueError, IndexError) as err:
        log.info("cannot infer the outputs of %s: %s", node.name, err)
        return False
    for tensor, info in zip(node.outputs, outputs, strict=False):
        if not info.dtype or info.shape is None:
            return False
        tensor.dtype = gs_dtype(elem_type(info.dtype) or 0)
        tensor.shape = list(info.shape)
    return True


def _tensor_info(tensor: gs.Tensor) -> TensorInfo:
    return TensorInfo(elem_type(tensor.dtype) or 0, None if tensor.shape is None else tuple(tensor.shape))
