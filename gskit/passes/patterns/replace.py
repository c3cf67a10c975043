"""Replacing pattern instances by plugin nodes, in one batch per call.

Steps: index every graph once (main graph and If/Loop/Scan bodies), learning the dtypes matching needs
along producers (``dtypes``); pick, per rule, the nodes of its anchor op whose producers fit it
(``rule_index``: each node looked at once, not once per rule); for each plugin, each of its rules and each
node picked, find a match, validate it (boundary rules and the rule's check) and compute its rewrite;
resolve overlaps; then rewire all accepted matches, drop the replaced nodes with one list rebuild per graph
and toposort each changed graph once.

Overlap rule (deterministic): valid matches are ranked by size (more replaced nodes first), then by the
order the plugins were given, the order of rules in a spec, the graph (main graph first) and the anchor's
position in its graph. Each is accepted if none of its nodes belongs to a match accepted before it;
otherwise it is skipped with the name of the match that won. So a LayerNorm wins over the RMSNorm-shaped
tail inside it, and the result does not depend on dict or set order.

Forms (``gskit.plugin.native``): each accepted match becomes the form its spec offers for the target TensorRT
(``tensorrt`` option): the ONNX op that version runs natively, else the plugin node, else nothing (left as it
was). A native op that needs a higher opset than the model's raises the model's opset first, with onnx's
version converter, and the graph is matched again; where the converter cannot, the region takes its plugin
node and the report says why. A match that already is the native op (a ``LayerNormalization`` node) is left
as it is and reported as kept.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from gskit.errors import PLUGIN_CODE_FAILURES, GskitError, PluginError
from gskit.passes.edit import unique_name
from gskit.passes.patterns.dtypes import DtypeLearner
from gskit.passes.patterns.match import (
    GraphIndex,
    MatchResult,
    Tracer,
    constant_value,
    elem_type_name,
    graphs_of,
    label,
    op_key,
)
from gskit.passes.patterns.rule_index import RuleIndex
from gskit.passes.patterns.rules import Match, Rewrite, Rule
from gskit.passes.tensor_types import elem_type
from gskit.passes.transform import (
    Before,
    GraphPass,
    PassContext,
    PassResult,
    StepFlag,
    ensure,
    option,
    run_pass,
)
from gskit.plugin.native import FormChoice, choose_form
from gskit.plugin.ops import DEFAULT_DOMAINS, onnx_op_since, op_label
from gskit.plugin.spec import PluginSpec, TensorInfo
from gskit.plugin.target import TensorRTTarget, resolve_target

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
    """Counts for one plugin: ``found`` structural matches, ``replaced`` (regions rewritten, as plugin nodes
    or native ops), ``native`` (regions in a native form, kept ones included), ``kept`` (regions that already
    were the native op, left as they were), and the skipped ones."""

    plugin: str
    found: int = 0
    replaced: int = 0
    skipped: list[Skip] = field(default_factory=list)
    native: int = 0
    kept: int = 0


@dataclass
class ReplacedRegion:
    """One replaced region, enough to draw the before/after picture and say which form it took and why.

    Attributes:
        form: ``plugin`` (the plugin node) or ``native`` (the ONNX op the target TensorRT runs natively).
        op: the written node's op (``gskit::LayerNorm``, ``LayerNormalization``).
        why: why this form, naming the target and the version that decided.
        kept: the region already was the native op (one node): left as it was, ``node`` is that node.
    """

    plugin: str
    rule: str
    node: str
    graph: str
    original_nodes: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    form: str = "plugin"
    op: str = ""
    why: str = ""
    kept: bool = False


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
    #: per rule with ``watches``: the nodes of those ops still in the graph (instances it did not take)
    watched_left: dict[str, list[str]] = field(default_factory=dict)
    #: the TensorRT version the forms were chosen for, and where that target came from
    target: str = ""
    target_source: str = ""
    #: ``[before, after]`` when the model's opset was raised for a native form, else None
    opset_raised: list[int] | None = None
    #: opsets the model could not be raised to (onnx's version converter failed), with the reason
    opset_refused: dict[int, str] = field(default_factory=dict)

    @property
    def replaced(self) -> int:
        return sum(p.replaced for p in self.plugins)

    @property
    def kept(self) -> int:
        return sum(p.kept for p in self.plugins)


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
        step_flag=StepFlag(
            "--only",
            "replace only these plugins' patterns (repeatable; replace.only)",
            kind="append",
            metavar="PLUGIN",
        ),
    )
    keep_function: bool = option(
        False,
        help="also keep each replaced subgraph as a local function named like the plugin "
        "(plain onnxruntime runs it)",
    )
    explain: bool = option(False, help="say which node or constant failed which check")
    tensorrt: str | None = option(
        None,
        help="the TensorRT version to prepare for (8.6, 10.3, 11, ...): each region becomes the ONNX op that "
        "version runs natively where its plugin declares one, else the plugin node (default: the installed "
        "TensorRT, else the newest gskit knows)",
        flag="--tensorrt",
        metavar="VERSION",
    )

    def __post_init__(self) -> None:
        if self.tensorrt is not None:
            resolve_target(self.tensorrt)  # a bad version is refused where it is given


_DEFAULTS = ReplaceOptions()


def replace(
    graph: gs.Graph,
    plugins: Iterable[PluginSpec],
    *,
    only: Sequence[str] | None = _DEFAULTS.only,
    keep_function: bool = _DEFAULTS.keep_function,
    explain: bool = _DEFAULTS.explain,
    tensorrt: str | None = _DEFAULTS.tensorrt,
) -> ReplaceReport:
    """Replace every instance of the plugins' patterns by one node each, in place: the plugin node, or the
    ONNX op the target TensorRT runs natively where the plugin declares one
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
        tensorrt: the TensorRT version the model is prepared for (``"10.3"``, ``"11"``); it picks each
            region's form (``gskit.plugin.native.choose_form``). None: the installed full TensorRT's
            version, else the newest gskit knows (the report says which).

    Returns:
        The report: per plugin counts and skip reasons, the replaced regions with their forms, the target,
        explanations.

    Raises:
        GskitError: a name in ``only`` is not among the plugins, or ``tensorrt`` is not a version.
        TypeError: ``graph`` is a ModelProto (the replacement would be lost).
    """
    if not isinstance(graph, gs.Graph):
        raise TypeError(
            f"replace changes a gs.Graph in place, got {type(graph).__name__}: pass gskit.to_graph(model), "
            "or use run_pass(REPLACE, model, ...).model for a new ModelProto"
        )
    options = ReplaceOptions(
        only=None if only is None else tuple(only),
        keep_function=keep_function,
        explain=explain,
        tensorrt=tensorrt,
    )
    return run_pass(REPLACE, graph, options, plugins=plugins).report


class _Replace(GraphPass[ReplaceOptions]):
    name, options, effect, takes_model = "replace", ReplaceOptions, "in_place", False

    def call(self, model: Any, options: ReplaceOptions, context: PassContext) -> PassResult:
        """A run's target (``context.target``, a recipe's or ``--tensorrt``) picks the forms."""
        specs = list(context.plugins or ())
        if context.plugins is not None and not specs:
            raise GskitError("replace: no plugins loaded; pass --plugins DIR or set GSKIT_PLUGINS")
        if context.target is not None:
            options = dataclasses.replace(options, tensorrt=str(context.target))
        report = _replace(model, specs, options)
        if context.target is not None:
            report.target_source = context.target.source
        modified = report.replaced > 0 or report.opset_raised is not None
        return PassResult(model, modified=modified, report=report, summary=summarize(report))

    def ensures(self, model: Any, options: ReplaceOptions, result: PassResult, before: Before) -> None:
        """Each replaced region is one node now (plugin or native op): its own node is there and none of its
        originals is. A kept region (already the native op) is what it was."""
        super().ensures(model, options, result, before)
        regions = [r for r in result.report.regions if not r.kept]
        if not regions:
            return
        names = {n.name for g in graphs_of(model) for n in g.nodes}
        missing = [r.node for r in regions if r.node not in names]
        ensure(not missing, self.name, f"plugin node(s) {missing[:3]} are not in the graph")
        left = [n for r in regions for n in r.original_nodes if n in names and n != r.node]
        ensure(not left, self.name, f"replaced node(s) {left[:3]} are still in the graph")


#: The replace pass: ``run_pass(REPLACE, graph, ReplaceOptions(...), plugins=specs)``.
REPLACE = _Replace()


def summarize(report: ReplaceReport) -> str:
    """One line: regions by form, skips, the target and an opset change (the step's summary in prepare; where
    the target came from is in the report)."""
    skipped = sum(len(p.skipped) for p in report.plugins)
    forms = [(p.plugin, p.replaced - (p.native - p.kept), p.native - p.kept, p.kept) for p in report.plugins]
    parts = []
    for plugin, as_plugin, as_native, kept in forms:
        said = [f"{as_plugin} plugin"] if as_plugin else []
        said += [f"{as_native} native"] if as_native else []
        said += [f"{kept} already native"] if kept else []
        if said:
            parts.append(f"{plugin}: {', '.join(said)}")
    kept = f", {report.kept} kept native" if report.kept else ""
    summary = f"{report.replaced} replaced{kept}, {skipped} skipped"
    summary += f" ({'; '.join(parts)})" if parts else ""
    summary += f"; TensorRT {report.target}"
    if report.opset_raised:
        summary += f"; opset {report.opset_raised[0]} -> {report.opset_raised[1]}"
    if report.opset_refused:
        opset, why = max(report.opset_refused.items())
        summary += f"; opset {opset} refused: {why}"
    left = report.norm_like_left
    if left:
        summary += (
            f"; {len(left)} norm-like computation(s) left unreplaced (at {', '.join(left[:3])}"
            f"{' ...' if len(left) > 3 else ''}; gskit replace --explain says why)"
        )
    for rule, nodes in report.watched_left.items():
        more = " ..." if len(nodes) > 3 else ""
        summary += f"; {len(nodes)} node(s) of what '{rule}' replaces left ({', '.join(nodes[:3])}{more})"
    return summary


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cycle collector paused while replace runs, as it was before after.

    Matching allocates many small objects that die young and hold no cycles (a binding's trail, the search's
    continuations, keys of the shared caches), and each allocation count past the collector's threshold made
    it walk young objects, and now and then every object of the graph: a quarter of replace's time on a
    10k-node graph in a fresh process, more where an earlier graph's garbage is still around. What replace
    leaves cyclic (the nodes it removed) is collected once the collector runs again.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _replace(graph: gs.Graph, plugins: Iterable[PluginSpec], options: ReplaceOptions) -> ReplaceReport:
    with _collector_paused():
        return _replace_all(graph, plugins, options)


def _replace_all(graph: gs.Graph, plugins: Iterable[PluginSpec], options: ReplaceOptions) -> ReplaceReport:
    only, keep_function, explain = options.only, options.keep_function, options.explain
    target = resolve_target(options.tensorrt)
    specs = list(plugins)
    if only is not None:
        names = {s.name for s in specs}
        unknown = sorted(set(only) - names)
        if unknown:
            raise GskitError(
                f"--only {', '.join(unknown)}: no such plugin (known: {', '.join(sorted(names))})"
            )
        specs = [s for s in specs if s.name in set(only)]
    report, accepted, indexes = _match(graph, specs, explain)
    choices = [_choose(c, target, {}) for c in accepted]
    needed = sorted(
        {c.native.opset for c in choices if c.native is not None and c.native.opset > graph.opset},
        reverse=True,
    )
    refused: dict[int, str] = {}
    if needed:
        before = graph.opset
        reached = _raise_opset(graph, needed, refused)
        if reached != before:  # the converter made new nodes: match the converted graph again
            report, accepted, indexes = _match(graph, specs, explain)
            report.opset_raised = [before, reached]
        choices = [_choose(c, target, refused) for c in accepted]
    report.target, report.target_source, report.opset_refused = str(target), target.source, refused
    if accepted:
        _apply(graph, indexes, accepted, choices, keep_function, report)
    graphs = graphs_of(graph)
    native_nodes = {r.node for r in report.regions if r.form == "native"}
    report.norm_like_left = [n for n in norm_like_left(graphs) if n not in native_nodes]
    report.watched_left = _watched_left(specs, graphs)
    log.info("replaced %d region(s) (target TensorRT %s)", report.replaced, target)
    return report


def _match(
    graph: gs.Graph, specs: list[PluginSpec], explain: bool
) -> tuple[ReplaceReport, list[_Candidate], list[GraphIndex]]:
    """A report of what matched, the accepted matches (overlaps resolved) and the index of each graph."""
    report = ReplaceReport(plugins=[PluginReport(s.qualified_name) for s in specs])
    graphs = graphs_of(graph)
    shaped = {key for spec in specs for rule in spec.patterns for key in getattr(rule, "needs_shapes_of", ())}
    dtypes = DtypeLearner.for_graph(graph, graphs, shaped)
    functions = {(f.domain or "", f.name): f for f in graph.functions}
    indexes = [GraphIndex.build(g, functions, dtypes) for g in graphs]

    rule_reports = {
        (si, ri): RuleReport(
            spec.qualified_name, getattr(rule, "name", repr(rule)), _size(rule), _origin(rule)
        )
        for si, spec in enumerate(specs)
        for ri, rule in enumerate(spec.patterns)
    }
    report.rules = list(rule_reports.values())
    rules = [(si, ri, rule) for si, spec in enumerate(specs) for ri, rule in enumerate(spec.patterns)]
    for si, _, rule in rules:
        if not isinstance(rule, Rule):
            raise PluginError(
                f"{specs[si].qualified_name}: pattern {rule!r} is not a gskit.passes.patterns rule"
            )
    by_anchor = RuleIndex([rule for _, _, rule in rules])
    candidates: list[_Candidate] = []
    for gi, index in enumerate(indexes):
        tries = by_anchor.anchors(index, every=explain)
        for (si, ri, rule), anchors in zip(rules, tries, strict=True):
            spec = specs[si]
            found = _Found(report.plugins[si], rule_reports[(si, ri)], explain, report, graph.opset)
            found.rule.anchors += len(index.by_op.get(rule.anchor, []))
            try:
                candidates.extend(_find(spec, rule, (si, ri, gi), index, anchors, found))
            except GskitError:
                raise
            # the plugin's own pattern code (a check, an attribute function)
            except PLUGIN_CODE_FAILURES as err:
                raise _pattern_error(spec, rule, err) from err
    return report, _resolve_overlaps(candidates), indexes


def _choose(cand: _Candidate, target: TensorRTTarget, refused: dict[int, str]) -> FormChoice:
    """The form of one accepted match (the plugin's attribute values with defaults and its inputs' element
    types decide a native form's checks)."""
    values = {a.name: cand.rewrite.attrs.get(a.name, a.default) for a in cand.spec.attributes}
    dtypes = [None if t is None else elem_type(t.dtype) for t in cand.rewrite.inputs]
    outs = [elem_type(t.dtype) for t in cand.match.outputs]
    return choose_form(cand.spec, target, values, opset_refused=refused, dtypes=dtypes, out_dtypes=outs)


def _raise_opset(graph: gs.Graph, needed: list[int], refused: dict[int, str]) -> int:
    """Convert the graph, in place, to the highest of ``needed`` onnx's version converter reaches.

    Each opset that fails is recorded in ``refused`` with the converter's one-line reason; the model is left
    at its opset when none is reached. Returns the opset the graph has now.
    """
    from gskit.io import model as gsmodel
    from gskit.passes.convert import convert_default_opset

    for opset in needed:  # highest first: one conversion serves every native form
        try:
            proto = convert_default_opset(gsmodel.to_model(graph), opset)
        except GskitError as err:
            refused[opset] = str(err)
            log.info("native forms needing opset %d not used: %s", opset, err)
            continue
        graph.__dict__.update(gsmodel.to_graph(proto).__dict__)  # an in-place pass keeps the caller's object
        return opset
    return graph.opset


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


def _watched_left(specs: Sequence[PluginSpec], graphs: Sequence[gs.Graph]) -> dict[str, list[str]]:
    """Per rule with ``watches``, the nodes of those ops still in the graph, in graph order (one pass over the
    nodes, not one per rule)."""
    watchers: dict[tuple[str, str], list[str]] = {}
    for spec in specs:
        for rule in spec.patterns:
            for key in set(getattr(rule, "watches", ())):
                watchers.setdefault(key, []).append(rule.name)
    left: dict[str, list[str]] = {}
    if watchers:
        for g in graphs:
            for n in g.nodes:
                for name in watchers.get(op_key(n), ()):
                    left.setdefault(name, []).append(label(n))
    ordered = dict.fromkeys(name for names in watchers.values() for name in names)
    return {name: left[name] for name in ordered if name in left}


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
    spec: PluginSpec,
    rule: Rule,
    order: tuple[int, int, int],
    index: GraphIndex,
    anchors: Sequence[gs.Node],
    seen: _Found,
) -> list[_Candidate]:
    """Try ``rule`` at ``anchors`` (the nodes of its anchor op that :class:`RuleIndex` kept)."""
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
        if index.dtypes is not None:  # checks, the rewrite and the form read the dtypes around the match
            index.dtypes.learn_nodes(match.nodes)
            index.dtypes.learn(match.inputs.values())
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
    choices: list[FormChoice],
    keep_function: bool,
    report: ReplaceReport,
) -> None:
    taken = {n.name for g in (i.graph for i in indexes) for n in g.nodes}
    bodies: dict[tuple[str, str], tuple[Any, ...]] = {}
    calls_before = _local_calls(root)
    replacement: dict[int, gs.Node] = {}  # id(anchor) -> plugin node
    added: dict[int, list[gs.Node]] = {}  # id(graph) -> Reshapes after plugin nodes (Rewrite.output_shapes)
    removed: set[int] = set()
    detached: dict[int, gs.Tensor] = {}
    changed: dict[int, gs.Graph] = {}
    plugin_domains: set[str] = set()
    written: dict[str, int] = {}  # node-name stem -> nodes named so far
    for cand, choice in sorted(
        zip(accepted, choices, strict=True), key=lambda cc: (cc[0].rank[3], cc[0].rank[4])
    ):
        spec, match, rewrite = cand.spec, cand.match, cand.rewrite
        index = indexes[cand.rank[3]]
        ordered = sorted(match.nodes, key=lambda n: index.position[id(n)])
        if choice.kind == "none":
            cand.report.skipped.append(Skip(cand.rule.name, label(match.anchor), choice.why, None))
            continue
        native = choice.native
        if native is not None and _already(match, native.domain, native.op_type):
            cand.report.native += 1
            cand.report.kept += 1
            anchor = match.anchor
            region = _region(
                spec,
                cand,
                anchor.name,
                ordered,
                rewrite,
                "native",
                native.op_type,
                native.domain,
                f"{choice.why}; already {native.op_type}: left as it was",
            )
            report.regions.append(dataclasses.replace(region, kept=True))
            continue
        if keep_function and native is None and any(s is not None for s in rewrite.output_shapes):
            cand.report.skipped.append(
                Skip(
                    cand.rule.name,
                    label(match.anchor),
                    "keep_function cannot keep a function whose outputs the plugin gives in another layout",
                    label(match.anchor),
                )
            )
            continue
        if keep_function and native is None:
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
        stem = native.op_type if native is not None else spec.name
        name = unique_name(f"{stem}_{written.get(stem, 0)}", taken)
        written[stem] = written.get(stem, 0) + 1
        for node in match.nodes:
            for tensor in node.inputs:
                detached[id(tensor)] = tensor
            list.clear(node.inputs)  # consumer lists are filtered once per batch below (shared constants)
            node.outputs.clear()
            removed.add(id(node))
        inputs = list(rewrite.inputs)
        while inputs and inputs[-1] is None:
            inputs.pop()
        if native is None:
            outputs, reshapes = _plugin_outputs(name, match.outputs, rewrite.output_shapes, taken)
            node = spec.make_node(
                [t if t is not None else gs.Variable.empty() for t in inputs],
                outputs,
                rewrite.attrs,
                name=name,
            )
            added.setdefault(id(match.graph), []).extend(reshapes)
            plugin_domains.add(spec.domain)
            form, op, domain = "plugin", spec.name, spec.domain
        else:
            values = {a.name: rewrite.attrs.get(a.name, a.default) for a in spec.attributes}
            attrs = {k: v for k, v in spec.node_attrs(values).items() if k in values}
            node = native.make_node(inputs, list(match.outputs), attrs, name=name)
            cand.report.native += 1
            form, op, domain = "native", native.op_type, native.domain
        replacement[id(ordered[-1])] = node
        _drop_dead_constants(match, index, removed, detached)
        changed[id(match.graph)] = match.graph
        cand.report.replaced += 1
        cand.rule_report.replaced += 1
        report.regions.append(_region(spec, cand, name, ordered, rewrite, form, op, domain, choice.why))
    for tensor in detached.values():
        kept = [c for c in tensor.outputs if id(c) not in removed]
        list.clear(tensor.outputs)
        list.extend(tensor.outputs, kept)
    for index in indexes:
        if id(index.graph) in changed:
            _drop_dead_producers(index, detached, removed)
    for g in changed.values():
        g.nodes = [replacement.get(id(n), n) for n in g.nodes if id(n) not in removed or id(n) in replacement]
        g.nodes.extend(added.get(id(g), []))
        _toposort(g)
    _ensure_domains(root, plugin_domains)
    _remove_unused_functions(root, calls_before, report)


def _toposort(graph: gs.Graph) -> None:
    """``graph.toposort(recurse_subgraphs=False, recurse_functions=False)``, computed directly where the node
    list is already in topological order (each region's node takes its last node's place) and no node holds a
    subgraph and the graph no function: graphsurgeon's order then is the stable sort by level (a node's level
    is one more than its producers' highest), which it finds through a recursive walk that took a tenth of
    replace's time on a 10k-node graph. Anything else goes to graphsurgeon."""
    levels: dict[int, int] = {}
    for node in graph.nodes if not graph.functions else ():
        level = 0
        for tensor in node.inputs:
            for source in tensor.inputs:
                have = levels.get(id(source))
                if have is None:  # produced later in the list, or outside this graph
                    graph.toposort(recurse_subgraphs=False, recurse_functions=False)
                    return
                level = max(level, have + 1)
        if node.attrs and any(  # most nodes have no attribute: no generator for them
            isinstance(a, gs.Graph) or (isinstance(a, list) and a and isinstance(a[0], gs.Graph))
            for a in node.attrs.values()
        ):
            graph.toposort(recurse_subgraphs=False, recurse_functions=False)
            return
        levels[id(node)] = level
    if graph.functions:
        graph.toposort(recurse_subgraphs=False, recurse_functions=False)
        return
    graph.nodes = sorted(graph.nodes, key=lambda n: levels[id(n)])


def _plugin_outputs(
    name: str, outputs: Sequence[gs.Tensor], shapes: Sequence[np.ndarray | None], taken: set[str]
) -> tuple[list[gs.Tensor], list[gs.Node]]:
    """The plugin node's outputs: the match's own, or new tensors that a Reshape turns into them."""
    tensors: list[gs.Tensor] = []
    reshapes: list[gs.Node] = []
    for i, out in enumerate(outputs):
        shape = shapes[i] if i < len(shapes) else None
        if shape is None:
            tensors.append(out)
            continue
        raw = gs.Variable(f"{out.name}__{name}", dtype=out.dtype)
        target = gs.Constant(f"{out.name}__{name}_shape", np.asarray(shape, dtype=np.int64))
        reshape_name = unique_name(f"{name}_reshape_{i}", taken)
        reshapes.append(gs.Node("Reshape", name=reshape_name, inputs=[raw, target], outputs=[out]))
        tensors.append(raw)
    return tensors, reshapes


def _drop_dead_producers(index: GraphIndex, detached: dict[int, gs.Tensor], removed: set[int]) -> None:
    """Remove nodes of ``index``'s graph that fed only replaced nodes and now feed nothing.

    A match may leave out nodes that another instance also reads (TorchScript shares a computation two
    attention calls make alike); once both instances are replaced, such nodes are dead.
    """
    own = {id(n) for n in index.graph.nodes}
    frontier = list(detached.values())
    while frontier:
        tensor = frontier.pop()
        node = tensor.inputs[0] if tensor.inputs else None
        if node is None or id(node) in removed or id(node) not in own:
            continue
        if any(t.outputs or index.external_use(t, set()) for t in node.outputs):
            continue
        removed.add(id(node))
        for source in node.inputs:
            kept = [c for c in source.outputs if c is not node]
            list.clear(source.outputs)
            list.extend(source.outputs, kept)
            frontier.append(source)
        node.outputs.clear()


def _already(match: Match, domain: str, op_type: str) -> bool:
    """The match is one node that already is the native op (a ``LayerNormalization`` node)."""
    return len(match.nodes) == 1 and op_key(match.anchor) == (domain, op_type)


def _region(
    spec: PluginSpec,
    cand: _Candidate,
    node: str,
    ordered: list[gs.Node],
    rewrite: Rewrite,
    form: str,
    op: str,
    domain: str,
    why: str,
) -> ReplacedRegion:
    return ReplacedRegion(
        spec.qualified_name,
        cand.rule.name,
        node,
        cand.match.graph.name,
        tuple(label(n) for n in ordered),
        tuple(t.name for t in rewrite.inputs if t is not None),
        tuple(t.name for t in cand.match.outputs),
        form=form,
        op=op_label(domain, op),
        why=why,
    )


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
    if not local:
        return counts  # no local function: nothing to count (and no walk over every node)
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
            cast = None if value is not None or id(tensor) in inside else _cast_of_input(tensor, mapping)
            if cast is not None:
                # A Cast left outside the match (its output is read outside too) between a plugin input and
                # the match: the rule takes the Cast's input, so the body casts it as the graph did.
                nodes.append(
                    gs.Node(
                        "Cast", attrs=dict(cast.attrs), inputs=[mapping[id(cast.inputs[0])]], outputs=[var]
                    )
                )
                key.append(("cast", mapping[id(cast.inputs[0])].name, cast.attrs.get("to")))
            elif value is None and id(tensor) not in inside:
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


def _cast_of_input(tensor: gs.Tensor, mapping: dict[int, gs.Tensor]) -> gs.Node | None:
    """The Cast that makes ``tensor`` from a tensor already in ``mapping`` (a plugin input), if it is one."""
    producer = tensor.inputs[0] if len(tensor.inputs) == 1 else None
    if producer is None or producer.op != "Cast" or (producer.domain or "ai.onnx") != "ai.onnx":
        return None
    return producer if producer.inputs and id(producer.inputs[0]) in mapping else None


def _attr_key(value: Any) -> Any:
    if isinstance(value, gs.Constant):
        return (str(value.values.dtype), value.values.shape, value.values.tobytes())
    if isinstance(value, (list, tuple)):
        return tuple(_attr_key(v) for v in value)
    if isinstance(value, (gs.Graph, gs.Tensor)):
        return id(value)
    return value
