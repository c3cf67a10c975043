"""What keeps ``replace`` linear and cheap per rule: rules indexed by anchor, dtypes learnt where needed.

Behaviour tests, not timings: each node of an anchor op is looked at once, not once per rule (counted through
the matcher's own entry points); the dtypes learnt from producers are those onnx's inference gives, without
running it where the rules suffice.
"""

from __future__ import annotations

import gc
import importlib
import json
import sys

import numpy as np
import onnx_graphsurgeon as gs
import pytest

from bench.models import transformer_like
from gskit.errors import GskitError
from gskit.io.model import to_graph
from gskit.passes import patterns
from gskit.passes.patterns import GraphPattern
from gskit.passes.patterns.dtypes import DtypeLearner
from gskit.passes.patterns.match import NULL_TRACER, GraphIndex, Matcher, Tracer, graphs_of
from gskit.passes.tensor_types import elem_type, infer_tensor_types
from gskit.plugin import PluginSpec
from plugins.layer_norm.spec import SPEC as LAYER_NORM
from plugins.rms_norm.spec import SPEC as RMS_NORM
from tests.conftest import parse_model

PLUGIN_TARGET = "8.5"  # older than every native form: each region is a plugin node


def _chain_of_adds(length: int) -> gs.Graph:
    """``x -> Relu -> Add(., c) -> Relu -> Add(., c) ...``: ``length`` Add nodes, each fed by a Relu."""
    text = [
        '<ir_version: 8, opset_import: ["" : 17]>',
        "g (float[4] x) => (float[4] y) <float[4] c = {1,2,3,4}>",
    ]
    text.append("{")
    last = "x"
    for i in range(length):
        text += [f"  r{i} = Relu ({last})", f"  a{i} = Add (r{i}, c)"]
        last = f"a{i}"
    text += [f"  y = Identity ({last})", "}"]
    return to_graph(parse_model("\n".join(text)))


def _spec(rules: list[GraphPattern]) -> PluginSpec:
    return PluginSpec(name="Probe", namespace="test.probe", patterns=tuple(rules))


def _counting(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count the calls of the matcher's two entry points (the real ones run)."""
    calls = {"could_match": 0, "match": 0}
    could_match, match = Matcher.could_match, Matcher.match

    def counted_could_match(self: Matcher, anchor: gs.Node) -> bool:
        calls["could_match"] += 1
        return could_match(self, anchor)

    def counted_match(self: Matcher, anchor: gs.Node):
        calls["match"] += 1
        return match(self, anchor)

    monkeypatch.setattr(Matcher, "could_match", counted_could_match)
    monkeypatch.setattr(Matcher, "match", counted_match)
    return calls


def test_each_anchor_node_is_looked_at_once_not_once_per_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """60 rules anchored at Add, none fed like the graph's Adds: no rule's matcher runs at any of the 40 Adds
    (trying each rule at each Add would be 2400 attempts), and the report still counts 40 anchors per rule."""

    def add_of_mul(op, a, b, c):  # Add(Mul(a, b), c): the graph's Adds read a Relu
        return op.Add(op.Mul(a, b), c)

    rules = [GraphPattern(add_of_mul, inputs=["a"], name=f"add_of_mul_{i}") for i in range(60)]
    graph = _chain_of_adds(40)
    calls = _counting(monkeypatch)
    report = patterns.replace(graph, [_spec(rules)], tensorrt=PLUGIN_TARGET)
    assert calls == {"could_match": 0, "match": 0}
    assert report.replaced == 0 and [r.anchors for r in report.rules] == [40] * 60


def test_rules_alike_up_to_a_deep_difference_run_the_matcher_only_where_it_can_match(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rules that fit the anchor's producers but differ deeper are pre-checked per node (answers shared by
    alike parts), and the full matcher runs only for the rule that matches, once per instance."""

    def relu_add(op, x, c):
        return op.Add(op.Relu(x), c)

    def relu_of_sigmoid_add(op, x, c):  # the Relu reads a Sigmoid: no node of the graph
        return op.Add(op.Relu(op.Sigmoid(x)), c)

    rules = [GraphPattern(relu_of_sigmoid_add, inputs=["x"], name=f"deep_{i}") for i in range(30)]
    rules.append(GraphPattern(relu_add, inputs=["x"], name="relu_add"))
    graph = _chain_of_adds(40)
    calls = _counting(monkeypatch)
    report = patterns.replace(graph, [_spec(rules)], tensorrt=PLUGIN_TARGET)
    assert report.replaced == 40
    assert calls["match"] == 40  # the one rule that matches, at its 40 anchors: no failed attempt
    assert calls["could_match"] == 31 * 40 + 40  # the pre-check per rule and node, then once more in match


def test_pre_check_answers_are_kept_per_skeleton_key_and_node() -> None:
    """Rules alike in op types share one table of pre-check answers per pattern-node structure, keyed by the
    graph node: 30 copies of one rule on 40 Adds keep 40 answers for their anchor, not 1200."""

    def relu_add(op, x, c):
        return op.Add(op.Relu(x), c)

    rules = [GraphPattern(relu_add, inputs=["x"], name=f"relu_add_{i}") for i in range(30)]
    graph = _chain_of_adds(40)
    index = GraphIndex.build(graph)
    adds = [n for n in graph.nodes if n.op == "Add"]
    assert all(Matcher.on(rule.graph, index).could_match(add) for rule in rules for add in adds)
    tables = [answers for answers in index.skeletons.values() if answers]
    assert sorted(len(answers) for answers in tables) == [40, 40, 40]  # Add, its Relu input, that Relu
    assert all(all(answers.values()) for answers in tables)


def test_explain_still_tries_every_rule_at_every_anchor(monkeypatch: pytest.MonkeyPatch) -> None:
    """``explain`` reports each failed attempt, so every rule runs its matcher at every node of its op."""

    def add_of_mul(op, a, b, c):
        return op.Add(op.Mul(a, b), c)

    rules = [GraphPattern(add_of_mul, inputs=["a"], name=f"add_of_mul_{i}") for i in range(3)]
    graph = _chain_of_adds(5)
    calls = _counting(monkeypatch)
    report = patterns.replace(graph, [_spec(rules)], tensorrt=PLUGIN_TARGET, explain=True)
    assert calls["match"] == 15
    assert len(report.explanations) == 15 and all("Relu" in e.reason for e in report.explanations)


def test_a_failed_branch_leaves_nothing_in_the_match() -> None:
    """The matcher changes one binding in place and takes a failed branch's changes back: the first order of
    the Add binds ``x``, the capture ``s``, constant ``k3`` and the left Mul, then fails on the literal 3.0
    against ``k5``; the match found in the other order holds only what that order bound."""

    def scaled_pair(op, x, y):
        return op.Add(op.Mul(x, op.capture("s")), op.Mul(y, 3.0))

    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[4] a, float[4] b) => (float[4] z) <float k3 = {3.0}, float k5 = {5.0}>
    { ma = Mul (a, k3)
      mb = Mul (b, k5)
      z = Add (ma, mb) }
    """
    graph = to_graph(parse_model(text))
    rule = GraphPattern(scaled_pair, inputs=["x", "y"])
    index = GraphIndex.build(graph)
    add = next(n for n in graph.nodes if n.op == "Add")
    for tracer in (NULL_TRACER, Tracer()):  # the pre-check first, and the full search that explains
        match = rule.find(add, index, tracer)
        assert match is not None
        assert {k: t.name for k, t in match.inputs.items()} == {"x": "b", "y": "a"}
        assert float(match.captures["s"]) == 5.0 and list(match.captures) == ["s"]
        assert [t.name for t in match.constants] == ["k3", "k5"]
        assert sorted(n.outputs[0].name for n in match.nodes) == ["ma", "mb", "z"]


def test_a_pattern_of_hundreds_of_nodes_matches() -> None:
    """The search nests a few Python frames per pattern node: a 300-node chain still matches (the recursion
    limit is raised for it while it runs, and put back)."""
    pairs = 150

    def long_chain(op, x):
        for _ in range(pairs):
            x = op.Add(op.Relu(x), 1.0)
        return x

    text = [
        '<ir_version: 8, opset_import: ["" : 17]>',
        "g (float[4] x) => (float[4] y) <float one = {1.0}>",
        "{",
    ]
    last = "x"
    for i in range(pairs):
        text += [f"  r{i} = Relu ({last})", f"  a{i} = Add (r{i}, one)"]
        last = f"a{i}"
    text += [f"  y = Identity ({last})", "}"]
    graph = to_graph(parse_model("\n".join(text)))
    rule = GraphPattern(long_chain, inputs=["x"])
    limit = sys.getrecursionlimit()
    match = rule.find(graph.nodes[-2], GraphIndex.build(graph))
    assert match is not None and len(match.nodes) == 2 * pairs and match.inputs["x"].name == "x"
    assert sys.getrecursionlimit() == limit


def test_the_cycle_collector_is_paused_while_matching_and_put_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Matching runs with Python's cycle collector paused; afterwards it is as it was (enabled, or disabled
    by the caller), also when replace fails."""
    enabled_while_matching = []
    match = Matcher.match

    def probe(self: Matcher, anchor: gs.Node):
        enabled_while_matching.append(gc.isenabled())
        return match(self, anchor)

    monkeypatch.setattr(Matcher, "match", probe)
    assert gc.isenabled()
    report = patterns.replace(transformer_like(blocks=2), [LAYER_NORM], tensorrt=PLUGIN_TARGET)
    assert report.replaced == 2 and enabled_while_matching and not any(enabled_while_matching)
    assert gc.isenabled()
    with pytest.raises(GskitError, match="no such plugin"):
        patterns.replace(transformer_like(blocks=2), [LAYER_NORM], only=["Nope"], tensorrt=PLUGIN_TARGET)
    assert gc.isenabled()
    gc.disable()
    try:
        patterns.replace(transformer_like(blocks=2), [LAYER_NORM], tensorrt=PLUGIN_TARGET)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_one_matcher_per_pattern_and_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without explain, each pattern's matcher is made once per graph and serves the pre-check and every
    attempt (it keeps nothing between matches): 3 instances of LayerNorm, the same regions either way."""
    made = []
    init = Matcher.__init__

    def counted(self: Matcher, pattern, tracer=NULL_TRACER, index=None) -> None:
        made.append(pattern)
        init(self, pattern, tracer, index)

    monkeypatch.setattr(Matcher, "__init__", counted)
    graph = transformer_like(blocks=3)
    report = patterns.replace(graph, [LAYER_NORM, RMS_NORM], tensorrt=PLUGIN_TARGET)
    assert report.replaced == 3
    assert made and len(made) == len({id(p) for p in made})  # no pattern's matcher made twice
    monkeypatch.setattr(Matcher, "__init__", init)
    explained = transformer_like(blocks=3)
    patterns.replace(explained, [LAYER_NORM, RMS_NORM], tensorrt=PLUGIN_TARGET, explain=True)
    assert [(n.name, n.op) for n in graph.nodes] == [(n.name, n.op) for n in explained.nodes]


def _report_rows(report: patterns.ReplaceReport) -> tuple:
    return (
        [(r.plugin, r.rule, r.original_nodes, r.inputs, r.outputs) for r in report.regions],
        [
            (p.plugin, p.found, p.replaced, [(s.rule, s.anchor, s.reason) for s in p.skipped])
            for p in report.plugins
        ],
        [(r.rule, r.anchors, r.found, r.replaced) for r in report.rules],
    )


def test_indexed_rules_give_the_report_of_trying_every_rule_everywhere() -> None:
    """The same regions, counts and skip rows as with ``explain`` (which tries every rule at every anchor):
    LayerNorm and the RMSNorm-shaped tail inside it, on a transformer-like graph."""
    plain, explained = transformer_like(blocks=3), transformer_like(blocks=3)
    fast = patterns.replace(plain, [LAYER_NORM, RMS_NORM], tensorrt=PLUGIN_TARGET)
    every = patterns.replace(explained, [LAYER_NORM, RMS_NORM], tensorrt=PLUGIN_TARGET, explain=True)
    assert fast.replaced == 3
    assert _report_rows(fast) == _report_rows(every)
    assert [(n.name, n.op) for n in plain.nodes] == [(n.name, n.op) for n in explained.nodes]


# ---- dtypes learnt from producers -------------------------------------------------------------------------

MIXED = """
<ir_version: 8, opset_import: ["" : 17]>
g (float16[2,3,8] x, int64[2] idx) => (float[2,3,8] y, bool[2,3,8] z)
{
    s = Shape (x)
    g0 = Gather <axis = 0> (s, idx)
    f = Cast <to = 1> (g0)
    xf = Cast <to = 1> (x)
    r = Relu (xf)
    m = Mul (r, r)
    half = Cast <to = 10> (m)
    back = Cast <to = 1> (half)
    c = Constant <value = float {2.0}> ()
    k = ConstantOfShape (s)
    kc = Cast <to = 1> (k)
    e = Equal (back, c)
    w = Where (e, back, kc)
    p1, p2 = Split <axis = 2> (w)
    q = Concat <axis = 2> (p1, p2)
    y = Add (q, f)
    z = Cast <to = 9> (e)
}
"""


def test_learnt_dtypes_are_those_onnx_inference_gives() -> None:
    """Every dtype the learner writes is the one onnx's inference writes, and onnx's inference never ran."""
    graph, reference = to_graph(parse_model(MIXED)), to_graph(parse_model(MIXED))
    infer_tensor_types(reference, dtypes_only=True, symbolic=False)
    learner = DtypeLearner.for_graph(graph, [graph])
    tensors = graph.tensors()
    learner.learn(tensors.values())
    assert not learner.inferred
    want = {n: elem_type(t.dtype) for n, t in reference.tensors().items()}
    have = {n: elem_type(t.dtype) for n, t in tensors.items()}
    assert have == want
    assert have["w"] is not None and have["g0"] is not None  # Where, Gather typed from their inputs


def test_only_needed_dtypes_are_learnt() -> None:
    """Learning a Cast's input walks its producers, not the whole graph: what no Cast reads stays unknown."""
    graph = to_graph(parse_model(MIXED))
    DtypeLearner.for_graph(graph, [graph])  # learns the inputs of every Cast whose input dtype is unknown
    tensors = graph.tensors()
    assert elem_type(tensors["g0"].dtype) is not None and elem_type(tensors["m"].dtype) is not None
    assert tensors["w"].dtype is None and tensors["q"].dtype is None  # no Cast reads them


def test_op_without_a_rule_falls_back_to_onnx_inference_once() -> None:
    """A Cast after an op the rules do not know (a custom domain): onnx's inference runs, once."""
    text = """
    <ir_version: 8, opset_import: ["" : 17, "custom" : 1]>
    g (float[4] x) => (float[4] y)
    {
        a = custom.Thing (x)
        b = Cast <to = 1> (a)
        y = Relu (b)
    }
    """
    graph = to_graph(parse_model(text))
    learner = DtypeLearner.for_graph(graph, [graph])
    assert learner.inferred
    assert graph.tensors()["a"].dtype is None  # onnx cannot type a custom op either


def test_graph_outputs_and_subgraph_tensors_are_typed_as_onnx_types_them() -> None:
    """Outputs of unknown dtype of If branches (whose nodes read an outer-scope tensor) get the dtype onnx's
    inference gives them; the If node's own output (no rule for If) is onnx's to type."""
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[4] x, bool c) => (float[4] y)
    {
        y = If (c) <then_branch = g1 () => (float[4] t) { r1 = Relu (x)
          t = Cast <to = 1> (r1) }, else_branch = g2 () => (float[4] e) { r2 = Neg (x)
          e = Cast <to = 1> (r2) }>
    }
    """
    graph, reference = to_graph(parse_model(text)), to_graph(parse_model(text))
    for g in (graph, reference):
        for sub in (g, *g.subgraphs(recursive=True)):
            for t in sub.outputs:
                t.dtype = None
    infer_tensor_types(reference, dtypes_only=True, symbolic=False)
    branches = list(graph.subgraphs(recursive=True))
    learner = DtypeLearner.for_graph(graph, [graph, *branches])
    for sub in branches:
        learner.learn(sub.tensors().values())
    assert not learner.inferred

    def types(g: gs.Graph) -> list[dict[str, int | None]]:
        return [{n: elem_type(t.dtype) for n, t in s.tensors().items()} for s in g.subgraphs(recursive=True)]

    assert types(graph) == types(reference)
    assert types(graph)[0]["t"] == elem_type(np.float32) == types(graph)[1]["e"]
    learner.learn(graph.outputs)
    assert learner.inferred and graph.outputs[0].dtype == reference.outputs[0].dtype


def test_learning_around_nodes_learns_once_what_learning_each_tensor_learns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``learn_nodes`` gives the inputs and outputs of the nodes the dtypes ``learn`` gives them, and asking
    about the same nodes again (the next rule matching the same instance) walks nothing."""
    graph, reference = to_graph(parse_model(MIXED)), to_graph(parse_model(MIXED))
    learner = DtypeLearner.for_graph(graph, [graph])
    reference_learner = DtypeLearner.for_graph(reference, [reference])
    learner.learn_nodes(graph.nodes)
    reference_learner.learn(t for n in reference.nodes for t in (*n.inputs, *n.outputs))
    have = {n: elem_type(t.dtype) for n, t in graph.tensors().items()}
    assert have == {n: elem_type(t.dtype) for n, t in reference.tensors().items()}
    assert have["w"] is not None and not learner.inferred
    walks = []
    monkeypatch.setattr(DtypeLearner, "_walk", lambda self, tensor: walks.append(tensor))
    learner.learn_nodes(graph.nodes)
    assert walks == []


def test_graphs_of_lists_the_graphs_graphsurgeon_lists() -> None:
    """The main graph, then every If branch, nested ones included, in graphsurgeon's order."""
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[4] x, bool c) => (float[4] y, float[4] z)
    {
        r = Relu (x)
        y = If (c) <then_branch = g1 () => (float[4] t) {
          t = If (c) <then_branch = g3 () => (float[4] u) { u = Neg (r) },
                      else_branch = g4 () => (float[4] v) { v = Abs (r) }> },
          else_branch = g2 () => (float[4] e) { e = Sigmoid (x) }>
        z = If (c) <then_branch = g5 () => (float[4] p) { p = Relu (r) },
                    else_branch = g6 () => (float[4] q) { q = Tanh (r) }>
    }
    """
    graph = to_graph(parse_model(text))
    want = [graph, *graph.subgraphs(recursive=True)]
    assert len(want) == 7
    assert [id(g) for g in graphs_of(graph)] == [id(g) for g in want]


def test_node_order_after_replace_is_graphsurgeons_toposort(monkeypatch: pytest.MonkeyPatch) -> None:
    """The replaced graph's node order is the one graphsurgeon's toposort gives (computed directly when the
    list is in order), here with nodes of several levels between the regions."""
    replace_module = importlib.import_module(
        "gskit.passes.patterns.replace"
    )  # the package exports the function
    fast = transformer_like(blocks=4)
    patterns.replace(fast, [LAYER_NORM, RMS_NORM], tensorrt=PLUGIN_TARGET)
    monkeypatch.setattr(
        replace_module, "_toposort", lambda g: g.toposort(recurse_subgraphs=False, recurse_functions=False)
    )
    reference = transformer_like(blocks=4)
    patterns.replace(reference, [LAYER_NORM, RMS_NORM], tensorrt=PLUGIN_TARGET)
    assert [n.name for n in fast.nodes] == [n.name for n in reference.nodes]


def test_scaling_bench_takes_runs_and_the_goal_graph(capsys: pytest.CaptureFixture[str]) -> None:
    """``bench/replace_scaling.py --blocks ... --runs N``: bench/run.py's graph (one LayerNorm per 26-node
    block), each size N times, the median reported with every run's time."""
    from bench import replace_scaling

    assert replace_scaling.main(["--blocks", "2", "3", "--runs", "3", "--all-plugins", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["nodes"], r["instances_replaced"]) for r in rows] == [(52, 2), (78, 3)]
    assert all(len(r["all"]) == 3 and r["seconds"] == sorted(r["all"])[1] for r in rows)


# ---- the op-type pre-check against the full search -------------------------------------------------------

NORMS_WITH_CASTS = """
<ir_version: 8, opset_import: ["" : 18]>
g (float16[2,3,8] x, float[2,3,8] u) => (float16[2,3,8] y, float[2,3,8] v)
<float16[8] w = {1,1,1,1,1,1,1,1}, float[8] wf = {1,1,1,1,1,1,1,1}, float eps = {1e-5}, float two = {2.0},
 int64[1] axes = {-1}>
{
    xf = Cast <to = 1> (x)
    p = Pow (xf, two)
    m = ReduceMean <keepdims = 1> (p, axes)
    a = Add (m, eps)
    s = Sqrt (a)
    d = Div (xf, s)
    h = Cast <to = 10> (d)
    y = Mul (w, h)
    uu = Cast <to = 1> (u)
    p2 = Pow (uu, two)
    m2 = ReduceMean <keepdims = 1> (p2, axes)
    a2 = Add (m2, eps)
    s2 = Sqrt (a2)
    d2 = Div (u, s2)
    v = Mul (d2, wf)
}
"""


def test_pre_check_rules_out_only_anchors_where_the_full_search_finds_nothing() -> None:
    """Every rule of every plugin at every node of its anchor op, on a transformer-like graph and on norms
    that read their input through a Cast the model needs and through one it does not: where the full search
    (a tracer: no pre-check) finds a match, the pre-check lets the rule through, and each answer is the one a
    matcher alone on a fresh index gives (answers shared between rules change none)."""
    from gskit.plugin import load_plugins

    rules = [r for spec in load_plugins() for r in spec.patterns if isinstance(r, GraphPattern)]
    graphs = [transformer_like(blocks=2), to_graph(parse_model(NORMS_WITH_CASTS))]
    found = []
    for graph in graphs:
        learner = DtypeLearner.for_graph(graph, [graph])
        shared = GraphIndex.build(graph, dtypes=learner)
        for rule in rules:
            for node in shared.by_op.get(rule.anchor, []):
                full = Matcher(rule.graph, Tracer(), shared).match(node)
                fits = Matcher.on(rule.graph, shared).could_match(node)
                alone = GraphIndex.build(graph, dtypes=learner)
                assert fits == Matcher.on(rule.graph, alone).could_match(node), (rule.name, node.name)
                assert fits or full is None, (rule.name, node.name)
                if full is not None:
                    found.append((graph is graphs[1], rule.name))
    assert sum(not cast for cast, _ in found) == 2 * 7  # 7 rules at each of the 2 LayerNorms
    assert (True, "rms_norm[pow,div,float32]") in found  # through the Cast the float16 input needs


def test_success_is_one_shared_frozen_result() -> None:
    """``MatchResult.success()`` gives one shared instance (checks return it for every match): true, frozen,
    with no reason; a subclass still gets its own."""
    import dataclasses

    from gskit.passes.patterns.match import MatchResult

    class Result(MatchResult):
        pass

    first = MatchResult.success()
    assert first is MatchResult.success() and first and first.reason == "" and first.culprit is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.ok = False  # type: ignore[misc]
    assert type(Result.success()) is Result and Result.success() is not first
