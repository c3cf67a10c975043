"""Replacing pattern instances by plugin nodes, in one batch per call.

Steps: index every graph once (main graph and If/Loop/Scan bodies); for each plugin, each of its
rules and each anchor candidate of the rule's op, find a match, validate it (boundary rules and the
rule's check) and compute its rewrite; resolve overlaps; then rewire all accepted matches, drop the
replaced nodes with one list rebuild per graph and toposort each changed graph once.

Overlap rule (deterministic): valid matches are ranked by size (more replaced nodes first), then by the
order the plugins were given, the order of rules in a spec, the graph (main graph first) and the anchor's
position in its graph. Each is accepted if none of its nodes belongs to a match accepted before it;
otherwise it is skipped with the name of the match that won. So a LayerNorm wins over the RMSNorm-shaped
tail inside it, and the result does not depend on dict or set order.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from gskit.errors import GskitError, PluginError
from gskit.passes.edit import unique_name
from gskit.passes.patterns.match import (
    GraphIndex,
    MatchResult,
    Tracer,
    constant_value,
    elem_type,
    elem_type_name,
    label,
    op_key,
)
from gskit.passes.patterns.rules import Match, Rewrite, Rule
from gskit.passes.transform import Before, GraphPass, PassResult, ensure, option, run_pass
from gskit.plugin.ops import DEFAULT_DOMAINS, onnx_op_since
from gskit.plugin.spec import PluginSpec, TensorInfo

log = logging.getLogger(__name__)


@dataclass
class Skip:
    """A match that was found but not replaced."""

    rule: str
    anchor: str
    reason: str
    culprit: str | None = None


@dataclass
class Explanation:
    """Why a rule did not match at one anchor: the deepest check that failed (``--explain``).

    ``depth`` is the number of pattern nodes matched before it failed, of the ``size`` the rule has.
    """

    plugin: str
    rule: str
    anchor: str | None
    depth: int
    node: str | None
    reason: str
    size: int = 0


@dataclass
class RuleReport:
    """One rule of one plugin on the model: how often it matched, and its best partial match.

    Attributes:
        plugin: the plugin's qualified name.
        rule: the rule's name.
        size: pattern nodes of the rule.
        origin: ``hand-written``, or where a derived rule came from (``from_torch(fn): torchscript-17:...``).
        anchors: nodes of the rule's last op in the model (each one an attempt).
        found: structural matches.
        replaced: matches replaced by a plugin node.
        best: with ``explain``, the attempt that got furthest without replacing (None when none failed).
    """

    plugin: str
    rule: str
    size: int
    origin: str
    anchors: int = 0
    found: int = 0
    replaced: int = 0
    best: Explanation | None = None


@dataclass
class PluginReport:
    """Counts for one plugin: ``found`` structural matches, ``replaced``, and the skipped ones."""

    plugin: str
    found: int = 0
    replaced: int = 0
    skipped: list[Skip] = field(default_factory=list)


@dataclass
class ReplacedRegion:
    """One replacement, enough to draw the before/after picture."""

    plugin: str
    rule: str
    node: str
    graph: str
    original_nodes: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass
class ReplaceReport:
    """Result of :func:`replace`."""

    plugins: list[PluginReport] = field(default_factory=list)
    regions: list[ReplacedRegion] = field(default_factory=list)
    explanations: list[Explanation] = field(default_factory=list)
    functions_removed: list[str] = field(default_factory=list)
    functions_kept: list[str] = field(default_factory=list)
    #: norm-like computations still in the graph after replacement (see :func:`norm_like_left`)
    norm_like_left: list[str] = field(default_factory=list)
    #: one entry per plugin and rule, in the order they were tried
    rules: list[RuleReport] = field(default_factory=list)

    @property
    def replaced(self) -> int:
        return sum(p.replaced for p in self.plugins)


@dataclass
class _Candidate:
    spec: PluginSpec
    rule: Rule
    match: Match
    rewrite: Rewrite
    rank: tuple[int, ...]
    report: PluginReport
    rule_report: RuleReport


@dataclass(frozen=True)
class ReplaceOptions:
    """Replace plugin patterns by plugin nodes (``replace``'s options: the single source of their defaults
    for the library call, the CLI flags and the recipe)."""

    only: tuple[str, ...] | None = option(
        None,
        help="use only these plugins (spec names; all known plugins by default)",
        metavar="NAME",
        nargs="+",
    )
    keep_function: bool = option(
        False,
        help="also keep each replaced subgraph as a local function named like the plugin "
        "(plain onnxruntime runs it)",
    )
    explain: bool = option(False, help="say which node or constant failed which check")


_DEFAULTS = ReplaceOptions()


def replace(
    graph: gs.Graph,
    plugins: Iterable[PluginSpec],
    *,
    only: Sequence[str] | None = _DEFAULTS.only,
    keep_function: bool = _DEFAULTS.keep_function,
    explain: bool = _DEFAULTS.explain,
) -> ReplaceReport:
    """Replace every instance of the plugins' patterns by one plugin node each, in place
    (``run_pass(REPLACE, graph, ReplaceOptions(...), plugins=plugins).report``).

    Args:
        graph: the model graph; nodes inside If/Loop/Scan bodies are matched too.
        plugins: the specs whose ``patterns`` are tried, in this order (it breaks overlap ties).
        only: plugin names (``spec.name``) to use; None uses all.
        keep_function: also write each replaced computation as a model-local function named like the
            plugin (same domain), so plain onnxruntime runs the file. Default False: the written model is
            then what TensorRT gets without ambiguity (TensorRT 10.15+ inlines a same-named local function
            instead of calling the plugin unless ``plugin_namespace`` is set, which gskit sets; older
            parsers differ), and no dead copy of the subgraph is shipped. Instances whose body differs
            from the first one's (other constants, other exporter form) are skipped with a reason, since
            one function name can have only one body.
        explain: record, for each rule and anchor that did not match, the deepest failed check.

    Returns:
        The report: per plugin counts and skip reasons, the replaced regions, explanations.

    Raises:
        GskitError: a name in ``only`` is not among the plugins.
        TypeError: ``graph`` is a ModelProto (the replacement would be lost).
    """
    if not isinstance(graph, gs.Graph):
        raise TypeError(
            f"replace changes a gs.Graph in place, got {type(graph).__name__}: pass gskit.to_graph(model), "
            "or use run_pass(REPLACE, model, ...).model for a new ModelProto"
        )
    options = ReplaceOptions(
        only=None if only is None else tuple(only), keep_function=keep_function, explain=explain
    )
    return run_pass(REPLACE, graph, options, plugins=plugins).report


class _Replace(GraphPass[ReplaceOptions]):
    name, options, effect, takes_model = "replace", ReplaceOptions, "in_place", False

    def call(self, model: Any, options: ReplaceOptions, **context: Any) -> PassResult:
        report = _replace(model, context.get("plugins") or (), options)
        skipped = sum(len(p.skipped) for p in report.plugins)
        per_plugin = ", ".join(f"{p.plugin}: {p.replaced}" for p in report.plugins if p.found)
        left = report.norm_like_left
        missed = (
            f"; {len(left)} norm-like computation(s) left unreplaced (at {', '.join(left[:3])}"
            f"{' ...' if len(left) > 3 else ''}; gskit replace --explain says why)"
            if left
            else ""
        )
        summary = f"{report.replaced} replaced, {skipped} skipped"
        summary += f" ({per_plugin})" if per_plugin else ""
        return PassResult(model, modified=report.replaced > 0, report=report, summary=summary + missed)

    def ensures(self, model: Any, options: ReplaceOptions, result: PassResult, before: Before) -> None:
        """Each replaced region is one plugin node now: its own node is there and none of its originals is."""
        super().ensures(model, options, result, before)
        regions = result.report.regions
        if not regions:
            return
        names = {n.name for g in (model, *model.subgraphs(recursive=True)) for n in g.nodes}
        missing = [r.node for r in regions if r.node not in names]
        ensure(not missing, self.name, f"plugin node(s) {missing[:3]} are not in the graph")
        left = [n for r in regions for n in r.original_nodes if n in names and n != r.node]
        ensure(not left, self.name, f"replaced node(s) {left[:3]} are still in the graph")


#: The replace pass: ``run_pass(REPLACE, graph, ReplaceOptions(...), plugins=specs)``.
REPLACE = _Replace()


def _replace(graph: gs.Graph, plugins: Iterable[PluginSpec], options: ReplaceOptions) -> ReplaceReport:
    only, keep_function, explain = options.only, options.keep_function, options.explain
    specs = list(plugins)
    if only is not None:
        names = {s.name for s in specs}
        unknown = sorted(set(only) - names)
        if unknown:
            raise GskitError(
                f"--only {', '.join(unknown)}: no such plugin (known: {', '.join(sorted(names))})"
            )
        specs = [s for s in specs if s.name in set(only)]
    report = ReplaceReport(plugins=[PluginReport(s.qualified_name) for s in specs])
    graphs = [graph, *graph.subgraphs(recursive=True)]
    _infer_cast_dtypes(graph, graphs)
    functions = {(f.domain or "", f.name): f for f in graph.functions}
    indexes = [GraphIndex.build(g, functions) for g in graphs]

    rule_reports = {
        (si, ri): RuleReport(
            spec.qualified_name, getattr(rule, "name", repr(rule)), _size(rule), _origin(rule)
        )
        for si, spec in enumerate(specs)
        for ri, rule in enumerate(spec.patterns)
    }
    report.rules = list(rule_reports.values())
    candidates: list[_Candidate] = []
    for gi, index in enumerate(indexes):
        for si, (spec, preport) in enumerate(zip(specs, report.plugins, strict=True)):
            for ri, rule in enumerate(spec.patterns):
                found = _Found(preport, rule_reports[(si, ri)], explain, report, graph.opset)
                try:
                    candidates.extend(_find(spec, rule, (si, ri, gi), index, found))
                except GskitError:
                    raise
                except Exception as err:  # the plugin's own pattern code (a check, an attribute function)
                    raise _pattern_error(spec, rule, err) from err
    accepted = _resolve_overlaps(candidates)
    if accepted:
        _apply(graph, indexes, accepted, keep_function, report)
    report.norm_like_left = norm_like_left(graphs)
    log.info("replaced %d region(s) with plugin nodes", report.replaced)
    return report


def _size(rule: Any) -> int:
    return int(getattr(rule, "size", 1))


def _origin(rule: Any) -> str:
    """``hand-written``, or ``from_torch(fn): torchscript-17:float32, ...`` for a derived rule."""
    forms = getattr(rule, "forms", None)
    if forms is None:
        return "hand-written"
    return f"{getattr(rule, 'source', '') or 'derived'}: {', '.join(forms)}"


def _pattern_error(spec: PluginSpec, rule: Any, err: Exception) -> PluginError:
    text = str(err).strip().splitlines()
    where = spec.source.parent / "patterns.py" if spec.source is not None else "its patterns"
    return PluginError(
        f"plugin {spec.qualified_name}: pattern '{getattr(rule, 'name', rule)}' raised {type(err).__name__}"
        f"{': ' + text[0] if text else ''} while matching; check {where} (--debug shows where)"
    )


#: ONNX's own normalization ops; left in the graph they are norms no pattern took.
_NORM_OPS = frozenset(
    {("", "LayerNormalization"), ("", "RMSNormalization"), ("", "SimplifiedLayerNormalization")}
)
#: Means a norm takes; tf2onnx writes the mean over the last axis of a 3-D tensor as GlobalAveragePool.
_MEAN_OPS = frozenset({("", "ReduceMean"), ("", "GlobalAveragePool")})
#: Ops between a mean and the square root in the norms exporters write (epsilon, E[x^2] - E[x]^2, casts).
_VARIANCE_STEPS = frozenset({("", "Add"), ("", "Sub"), ("", "Cast")})


def norm_like_left(graphs: Sequence[gs.Graph]) -> list[str]:
    """Names of norm-like computations in ``graphs``: a ``Sqrt`` of a mean (through at most three
    Add/Sub/Cast steps) and ONNX's own normalization ops. One check per Sqrt node, so it is cheap.

    After :func:`replace` these are the norms no pattern matched (``gskit replace --explain`` says why).
    """
    left = []
    for g in graphs:
        for node in g.nodes:
            key = op_key(node)
            if key in _NORM_OPS:
                left.append(label(node))
            elif key == ("", "Sqrt") and _reads_a_mean(node):
                left.append(label(node))
    return left


def _reads_a_mean(node: gs.Node) -> bool:
    frontier = [node]
    for _ in range(4):
        producers = [t.inputs[0] for n in frontier for t in n.inputs if t.inputs]
        if any(op_key(p) in _MEAN_OPS for p in producers):
            return True
        frontier = [p for p in producers if op_key(p) in _VARIANCE_STEPS]
    return False


def _infer_cast_dtypes(graph: gs.Graph, graphs: Sequence[gs.Graph]) -> None:
    """Give Cast inputs their dtypes when some are unknown, so the matcher can tell no-op Casts.

    Exports without value_info (TorchScript's) leave intermediate dtypes unknown. One best-effort onnx
    inference fills dtypes only, and only when some Cast needs it; shapes too when a ``GlobalAveragePool``
    (a mean over the last axis only for a 3-D input) reads a tensor of unknown rank.
    """
    nodes = [n for g in graphs for n in g.nodes]
    casts = any(op_key(n) == ("", "Cast") and n.inputs and n.inputs[0].dtype is None for n in nodes)
    pools = any(
        op_key(n) == ("", "GlobalAveragePool") and n.inputs and n.inputs[0].shape is None for n in nodes
    )
    if casts or pools:
        from gskit.passes.tensor_types import (
            infer_tensor_types,  # imports onnxruntime's inference: only when needed
        )

        infer_tensor_types(graph, dtypes_only=not pools, symbolic=False)


@dataclass
class _Found:
    """Where ``_find`` records what it saw for one rule."""

    plugin: PluginReport
    rule: RuleReport
    explain: bool
    report: ReplaceReport
    opset: int | None

    def explanation(self, explanation: Explanation) -> None:
        self.report.explanations.append(explanation)
        best = self.rule.best
        if best is None or explanation.depth > best.depth:
            self.rule.best = explanation


def _find(
    spec: PluginSpec, rule: Rule, order: tuple[int, int, int], index: GraphIndex, seen: _Found
) -> list[_Candidate]:
    if not isinstance(rule, Rule):
        raise PluginError(f"{spec.qualified_name}: pattern {rule!r} is not a gskit.passes.patterns rule")
    anchors = index.by_op.get(rule.anchor, [])
    seen.rule.anchors += len(anchors)
    size = _size(rule)
    if seen.explain and not anchors and order[2] == 0:
        seen.explanation(
            Explanation(spec.qualified_name, rule.name, None, 0, None, _no_anchor(rule, seen.opset), size)
        )
    found: list[_Candidate] = []
    for anchor in anchors:
        tracer = Tracer() if seen.explain else None
        match = rule.find(anchor, index, tracer) if tracer else rule.find(anchor, index)
        if match is None:
            if tracer is not None and tracer.best is not None:
                best = tracer.best
                seen.explanation(
                    Explanation(
                        spec.qualified_name,
                        rule.name,
                        label(anchor),
                        best.depth,
                        best.node,
                        best.reason,
                        size,
                    )
                )
            continue
        seen.plugin.found += 1
        seen.rule.found += 1
        result = rule.validate(match, index)
        if result:
            try:
                rewrite = rule.rewrite(match)
                _check_rewrite(spec, rewrite, match)
                spec.node_attrs(rewrite.attrs)
            except PluginError as err:
                result = MatchResult.fail(f"rewrite failed: {err}", anchor)
            else:
                result = _check_output_dtypes(spec, rewrite, match)
        if not result:
            seen.plugin.skipped.append(Skip(rule.name, label(anchor), result.reason, result.culprit))
            if seen.explain:
                seen.explanation(
                    Explanation(
                        spec.qualified_name,
                        rule.name,
                        label(anchor),
                        len(match.nodes),
                        result.culprit,
                        result.reason,
                        size,
                    )
                )
            continue
        rank = (-len(match.nodes), order[0], order[1], order[2], index.position[id(anchor)])
        found.append(_Candidate(spec, rule, match, rewrite, rank, seen.plugin, seen.rule))
    return found


def _no_anchor(rule: Rule, opset: int | None) -> str:
    """Why a rule had nothing to start from: an op the model's opset does not have, or no such node."""
    if opset is not None:
        for domain, op in sorted(rule.ops()):
            if domain in DEFAULT_DOMAINS:
                since = onnx_op_since(domain, op, opset)
                if since is not None:
                    when = f"it is from opset {since}" if since else "no opset has it"
                    return f"{op} is not an ONNX op at the model's opset {opset} ({when})"
    what = f"{rule.anchor[0]}::{rule.anchor[1]}" if rule.anchor[0] else rule.anchor[1]
    return f"no {what} node in the graph"


def _check_output_dtypes(spec: PluginSpec, rewrite: Rewrite, match: Match) -> MatchResult:
    """The plugin's output rule gives each output the dtype the model has there (when both are known).

    A plugin node must write what the replaced nodes wrote; the spec's ``infer`` declares the output dtype
    (RMSNorm: the weight's, so a float32 input cast to float16 at the end is one node).
    """
    infos: list[TensorInfo | None] = [
        None if t is None else TensorInfo(elem_type(t.dtype) or 0, _shape_of(t)) for t in rewrite.inputs
    ]
    infos += [None] * (len(spec.inputs) - len(infos))
    attrs = {a.name: rewrite.attrs.get(a.name, a.default) for a in spec.attributes}
    try:
        outputs = list(spec.infer(infos, attrs))
    except PluginError:
        return MatchResult.success()  # the output rule cannot tell; shape inference reports it later
    for info, tensor in zip(outputs, match.outputs, strict=False):
        want, have = info.dtype, elem_type(tensor.dtype)
        if want and have is not None and want != have:
            return MatchResult.fail(
                f"the plugin's output rule gives {elem_type_name(want)} for '{tensor.name}', which is "
                f"{elem_type_name(have)} in the model",
                match.anchor,
            )
    return MatchResult.success()


def _shape_of(tensor: gs.Tensor) -> tuple[int | str | None, ...] | None:
    shape = getattr(tensor, "shape", None)
    if shape is None:
        return None
    return tuple(d if isinstance(d, (int, str)) else None for d in shape)


def _check_rewrite(spec: PluginSpec, rewrite: Rewrite, match: Match) -> None:
    if len(match.outputs) != len(spec.outputs):
        raise PluginError(
            f"{spec.qualified_name}: the pattern yields {len(match.outputs)} outputs, the spec declares "
            f"{len(spec.outputs)}; fix the pattern or the spec's outputs"
        )
    if len(rewrite.inputs) > len(spec.inputs):
        raise PluginError(
            f"{spec.qualified_name}: rewrite gives {len(rewrite.inputs)} inputs, spec has {len(spec.inputs)}"
        )
    for name, tensor in zip(spec.inputs, rewrite.inputs, strict=False):
        if tensor is None and not name.endswith("?"):
            raise PluginError(f"{spec.qualified_name}: required input '{name}' is absent")
    for name in spec.inputs[len(rewrite.inputs) :]:
        if not name.endswith("?"):
            raise PluginError(f"{spec.qualified_name}: required input '{name}' is absent")


def _resolve_overlaps(candidates: list[_Candidate]) -> list[_Candidate]:
    claimed: dict[int, _Candidate] = {}
    accepted: list[_Candidate] = []
    refused: set[tuple[int, int]] = set()  # (spec, anchor) already reported as overlapping
    for cand in sorted(candidates, key=lambda c: c.rank):
        winner = next((claimed[id(n)] for n in cand.match.nodes if id(n) in claimed), None)
        seen = (id(cand.spec), id(cand.match.anchor))
        if winner is not None and ((winner.spec is cand.spec and _inside(cand, winner)) or seen in refused):
            cand.report.found -= 1  # the same instance, seen by another form of the same plugin
            cand.rule_report.found -= 1
            continue
        if winner is not None:
            refused.add(seen)
            cand.report.skipped.append(
                Skip(
                    cand.rule.name,
                    label(cand.match.anchor),
                    f"overlaps the {winner.spec.name} match at node '{label(winner.match.anchor)}' "
                    f"({len(winner.match.nodes)} nodes, ranked first)",
                    label(winner.match.anchor),
                )
            )
            continue
        for node in cand.match.nodes:
            claimed[id(node)] = cand
        accepted.append(cand)
    return accepted


def _inside(small: _Candidate, large: _Candidate) -> bool:
    nodes = {id(n) for n in large.match.nodes}
    return all(id(n) in nodes for n in small.match.nodes)


def _apply(
    root: gs.Graph,
    indexes: list[GraphIndex],
    accepted: list[_Candidate],
    keep_function: bool,
    report: ReplaceReport,
) -> None:
    taken = {n.name for g in (i.graph for i in indexes) for n in g.nodes}
    bodies: dict[tuple[str, str], tuple[Any, ...]] = {}
    calls_before = _local_calls(root)
    replacement: dict[int, gs.Node] = {}  # id(anchor) -> plugin node
    removed: set[int] = set()
    detached: dict[int, gs.Tensor] = {}
    changed: dict[int, gs.Graph] = {}
    accepted.sort(key=lambda c: (c.rank[3], c.rank[4]))
    for cand in accepted:
        spec, match, rewrite = cand.spec, cand.match, cand.rewrite
        index = indexes[cand.rank[3]]
        ordered = sorted(match.nodes, key=lambda n: index.position[id(n)])
        if keep_function:
            body = _function_body(spec, match, rewrite, ordered)
            key = (spec.domain, spec.name)
            if key not in bodies:
                bodies[key] = body[1]
                root.functions.append(body[0])
                report.functions_kept.append(f"{spec.domain}::{spec.name}")
            elif bodies[key] != body[1]:
                cand.report.skipped.append(
                    Skip(
                        cand.rule.name,
                        label(match.anchor),
                        "body differs from the local function kept for the first "
                        f"{spec.name} instance (keep_function)",
                        label(match.anchor),
                    )
                )
                continue
        name = unique_name(f"{spec.name}_{cand.report.replaced}", taken)
        region = ReplacedRegion(
            spec.qualified_name,
            cand.rule.name,
            name,
            match.graph.name,
            tuple(label(n) for n in ordered),
            tuple(t.name for t in rewrite.inputs if t is not None),
            tuple(t.name for t in match.outputs),
        )
        for node in match.nodes:
            for tensor in node.inputs:
                detached[id(tensor)] = tensor
            list.clear(node.inputs)  # consumer lists are filtered once per batch below (shared constants)
            node.outputs.clear()
            removed.add(id(node))
        inputs = list(rewrite.inputs)
        while inputs and inputs[-1] is None:
            inputs.pop()
        plugin = spec.make_node(
            [t if t is not None else gs.Variable.empty() for t in inputs],
            list(match.outputs),
            rewrite.attrs,
            name=name,
        )
        replacement[id(ordered[-1])] = plugin
        _drop_dead_constants(match, index, removed, detached)
        changed[id(match.graph)] = match.graph
        cand.report.replaced += 1
        cand.rule_report.replaced += 1
        report.regions.append(region)
    for tensor in detached.values():
        kept = [c for c in tensor.outputs if id(c) not in removed]
        list.clear(tensor.outputs)
        list.extend(tensor.outputs, kept)
    for g in changed.values():
        g.nodes = [replacement.get(id(n), n) for n in g.nodes if id(n) not in removed or id(n) in replacement]
        g.toposort(recurse_subgraphs=False, recurse_functions=False)
    _ensure_domains(root, {c.spec.domain for c in accepted})
    _remove_unused_functions(root, calls_before, report)


def _drop_dead_constants(
    match: Match, index: GraphIndex, removed: set[int], detached: dict[int, gs.Tensor]
) -> None:
    """Remove Constant nodes that only fed replaced nodes."""
    for tensor in match.constants:
        node = tensor.inputs[0] if tensor.inputs else None
        if node is None or id(node) in removed or op_key(node) != ("", "Constant"):
            continue
        if (
            all(id(c) in removed for c in tensor.outputs)
            and index.external_use(tensor, {id(c) for c in tensor.outputs}) is None
        ):
            node.outputs.clear()
            removed.add(id(node))


def _ensure_domains(root: gs.Graph, domains: set[str]) -> None:
    if root.import_domains is None:
        root.import_domains = [onnx.helper.make_opsetid("", root.opset)]
    have = {d.domain for d in root.import_domains}
    for domain in sorted(domains - have):
        root.import_domains.append(onnx.helper.make_opsetid(domain, 1))


def _local_calls(root: gs.Graph) -> dict[tuple[str, str], int]:
    counts: dict[tuple[str, str], int] = {}
    local = {(f.domain or "", f.name) for f in root.functions}
    for g in (root, *root.subgraphs(recursive=True), *root.functions):
        for node in g.nodes:
            key = op_key(node)
            if key in local:
                counts[key] = counts.get(key, 0) + 1
    return counts


def _remove_unused_functions(
    root: gs.Graph, before: dict[tuple[str, str], int], report: ReplaceReport
) -> None:
    after = _local_calls(root)
    gone = {key for key, n in before.items() if n and not after.get(key)}
    if gone:
        root.functions = [f for f in root.functions if (f.domain or "", f.name) not in gone]
        report.functions_removed.extend(sorted(f"{d}::{n}" for d, n in gone))


def _function_body(
    spec: PluginSpec, match: Match, rewrite: Rewrite, ordered: list[gs.Node]
) -> tuple[gs.Function, tuple[Any, ...]]:
    """The matched nodes as a local function named like the plugin, and a key comparing bodies."""
    mapping: dict[int, gs.Tensor] = {}
    fn_inputs: list[gs.Tensor] = []
    for port, tensor in zip(spec.inputs, rewrite.inputs, strict=False):
        if tensor is not None:
            var = gs.Variable(port.rstrip("?"), dtype=tensor.dtype)
            mapping[id(tensor)] = var
            fn_inputs.append(var)
    fn_outputs = []
    for port, tensor in zip(spec.outputs, match.outputs, strict=False):
        var = gs.Variable(port, dtype=tensor.dtype)
        mapping[id(tensor)] = var
        fn_outputs.append(var)
    inside = {id(t) for n in ordered for t in n.outputs}
    nodes: list[gs.Node] = []
    key: list[Any] = []

    def local(tensor: gs.Tensor) -> gs.Tensor:
        if not tensor.name:
            return gs.Variable.empty()
        if id(tensor) not in mapping:
            k = len(mapping)
            var = gs.Variable(f"t{k}")
            mapping[id(tensor)] = var
            value = None if id(tensor) in inside else constant_value(tensor)
            if value is None and id(tensor) not in inside:
                raise PluginError(
                    f"{spec.qualified_name}: tensor '{tensor.name}' enters the match but is not a plugin "
                    "input"
                )
            if value is not None:
                nodes.append(
                    gs.Node(
                        "Constant",
                        attrs={"value": gs.Constant(f"t{k}_value", np.asarray(value))},
                        outputs=[var],
                    )
                )
                key.append(("const", str(value.dtype), value.shape, value.tobytes()))
        return mapping[id(tensor)]

    for node in ordered:
        new = gs.Node(
            node.op,
            domain=node.domain,
            attrs=dict(node.attrs),
            inputs=[local(t) for t in node.inputs],
            outputs=[local(t) for t in node.outputs],
        )
        nodes.append(new)
        key.append(
            (
                op_key(node),
                tuple(t.name for t in new.inputs),
                tuple(t.name for t in new.outputs),
                tuple(sorted((k, _attr_key(v)) for k, v in node.attrs.items())),
            )
        )
    graph = match.graph
    function = gs.Function(
        spec.name,
        domain=spec.domain,
        nodes=nodes,
        inputs=fn_inputs,
        outputs=fn_outputs,
        opset=graph.opset,
        import_domains=None,
    )
    return function, tuple(key)


def _attr_key(value: Any) -> Any:
    if isinstance(value, gs.Constant):
        return (str(value.values.dtype), value.values.shape, value.values.tobytes())
    if isinstance(value, (list, tuple)):
        return tuple(_attr_key(v) for v in value)
    if isinstance(value, (gs.Graph, gs.Tensor)):
        return id(value)
    return value
