"""Rules derived from exported graphs, without torch: an ONNX model read as a rule (normalized), attributes
found by comparing two exports, duplicates dropped, the JSON round trip, the rule replacing on onnxruntime.

The exports here are written in ONNX text as the exporters write them (TorchScript: Constant nodes, axes as an
attribute, no-op Casts; dynamo: initializers, axes as an input), so these tests run on any CPU without torch.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from gskit.backends import ort as gort
from gskit.errors import PluginError
from gskit.io.model import to_graph, to_model
from gskit.passes.patterns import replace
from gskit.passes.patterns.derived import Captured, DerivedPattern, Literal, RuleDescription
from gskit.passes.patterns.describe import (
    AttributeLost,
    DeriveError,
    describe_model,
    distinct,
    find_relation,
    with_attributes,
    with_dtypes,
)
from gskit.plugin import Attribute, AttrType, PluginRegistry, PluginSpec, per_channel_of
from plugins.rms_norm.reference import rms_norm
from tests.conftest import parse_model

# x * rsqrt(mean(x^2) + eps) * w as the TorchScript exporter writes it at opset 17, with HF's no-op Casts.
TORCHSCRIPT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,5,16] x, float[16] weight) => (float[2,5,16] y) {{
    c = Cast <to = 1> (x)
    i = Identity (c)
    two = Constant <value = float {{2.0}}> ()
    p = Pow (i, two)
    m = ReduceMean <axes = [-1], keepdims = 1> (p)
    eps = Constant <value = float {{{eps}}}> ()
    a = Add (m, eps)
    s = Sqrt (a)
    one = Constant <value = float {{1.0}}> ()
    r = Div (one, s)
    n = Mul (i, r)
    y = Mul (weight, n)
}}
"""

# The same computation as dynamo writes it at opset 18: initializers, axes as an input, operands swapped.
DYNAMO = """
<ir_version: 9, opset_import: ["" : 18]>
g (float[2,5,16] x, float[16] weight) => (float[2,5,16] y)
  <float two = {{2.0}}, int64[1] ax = {{-1}}, float eps = {{{eps}}}, float one = {{1.0}}> {{
    p = Pow (x, two)
    m = ReduceMean <keepdims = 1> (p, ax)
    a = Add (eps, m)
    s = Sqrt (a)
    r = Div (one, s)
    n = Mul (r, x)
    y = Mul (n, weight)
}}
"""


def _rule(text: str, eps: float, form: str = "torchscript-17:float32") -> RuleDescription:
    return describe_model(parse_model(text.format(eps=eps)), "rms_norm", form)


def _with_epsilon(text: str, form: str = "torchscript-17:float32") -> RuleDescription:
    base, other = _rule(text, 1e-5, form), _rule(text, 1.5e-5, form)
    return with_attributes(base, {"epsilon": (1e-5, 1.5e-5, other)})


def test_an_export_reads_as_a_rule_without_identity_no_op_casts_and_constant_nodes() -> None:
    rule = _rule(TORCHSCRIPT, 1e-5)
    assert [n.op for n in rule.nodes] == ["Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul", "Mul"]
    assert rule.inputs == ("x", "weight")
    pow_node = rule.nodes[0]
    assert pow_node.inputs[0].name == "x" and isinstance(pow_node.inputs[1], Literal)
    assert pow_node.inputs[1].number() == 2.0 and pow_node.inputs[1].dtype == "float32"


def test_axes_as_an_input_read_as_the_attribute_so_both_forms_are_one_rule() -> None:
    ts, dyn = _with_epsilon(TORCHSCRIPT), _with_epsilon(DYNAMO, "dynamo-18:float32")
    assert dyn.nodes[1].attrs["axes"] == [-1] and dyn.nodes[1].inputs == (dyn.nodes[1].inputs[0],)
    # commutative operands in another order, Constant nodes vs initializers: the same rule
    (one,) = distinct([ts, dyn])
    assert one.forms == ("torchscript-17:float32", "dynamo-18:float32")


def test_a_constant_that_follows_an_attribute_is_captured_with_its_relation() -> None:
    rule = _with_epsilon(TORCHSCRIPT)
    (capture,) = rule.captures
    assert (capture.attribute, capture.relation) == ("epsilon", "identity")
    add = rule.nodes[2]
    assert Captured("epsilon") in add.inputs


@pytest.mark.parametrize(
    ("pairs", "want"),
    [
        ([(1e-5, 1e-5), (1.5e-5, 1.5e-5)], ("identity", 0.0)),
        ([(2.0, -2.0), (3.0, -3.0)], ("negate", 0.0)),
        ([(4.0, 0.25), (5.0, 0.2)], ("reciprocal", 0.0)),
        ([(4.0, 2.0), (9.0, 3.0)], ("sqrt", 0.0)),
        ([(4.0, 0.5), (16.0, 0.25)], ("rsqrt", 0.0)),
        ([(2.0, 6.0), (3.0, 9.0)], ("scale", 3.0)),
        ([(2.0, 2.5), (3.0, 3.5)], ("offset", 0.5)),
    ],
)
def test_relations_between_an_attribute_and_its_constant(pairs, want) -> None:
    assert find_relation(pairs, 1e-6) == pytest.approx(want)


def test_a_relation_no_simple_function_explains_is_refused() -> None:
    assert find_relation([(2.0, 5.0), (3.0, 11.0)], 1e-6) is None  # 2a^2 - 3
    base, other = _rule(TORCHSCRIPT, 2.0), _rule(TORCHSCRIPT, 11.0)
    with pytest.raises(DeriveError, match="no simple relation"):
        with_attributes(base, {"epsilon": (2.0, 3.0, other)})


def test_an_attribute_that_changes_the_graph_is_refused() -> None:
    base = _rule(TORCHSCRIPT, 1e-5)
    other = describe_model(
        parse_model(DYNAMO.format(eps=1e-5).replace("n = Mul (r, x)", "n = Mul (r, p)")), "rms_norm", "x"
    )
    with pytest.raises(DeriveError, match="other nodes"):
        with_attributes(base, {"epsilon": (1e-5, 1.5e-5, other)})


def test_an_attribute_that_changes_nothing_is_reported_lost() -> None:
    base = _rule(TORCHSCRIPT, 1e-5)
    with pytest.raises(AttributeLost, match="same graph"):
        with_attributes(base, {"epsilon": (1e-5, 1.5e-5, _rule(TORCHSCRIPT, 1e-5))})


def test_cast_targets_that_follow_the_input_dtype_become_dtype_captures() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g ({t}[4,8] x) => ({t}[4,8] y) {{
        w = Cast <to = 1> (x)
        r = Relu (w)
        y = Cast <to = {to}> (r)
    }}"""
    half = describe_model(parse_model(text.format(t="float16", to=10)), "f", "ts-17:float16")
    bf16 = describe_model(parse_model(text.format(t="bfloat16", to=16)), "f", "ts-17:bfloat16")
    merged = with_dtypes([("float16", half), ("bfloat16", bf16)])
    assert merged is not None
    assert merged.nodes[0].attrs["to"] == 1  # the widening Cast stays a literal
    assert isinstance(merged.nodes[2].attrs["to"], Captured)
    assert [c.relation for c in merged.captures] == ["dtype"]


def test_the_description_survives_json() -> None:
    rule = _with_epsilon(TORCHSCRIPT)
    again = RuleDescription.from_json(json.loads(json.dumps(rule.to_json())))
    assert again.canonical() == rule.canonical() and again.captures == rule.captures
    with pytest.raises(PluginError, match="not a derived rule"):
        RuleDescription.from_json({"name": "x"})


RMS_SPEC = PluginSpec(
    name="RMSNorm",
    namespace="test.derived",
    inputs=("x", "weight"),
    attributes=(Attribute("epsilon", AttrType.FLOAT, 1e-5),),
    infer=per_channel_of(0, 1, dtype_of=1),
    reference=rms_norm,
)


@pytest.mark.parametrize("text", [TORCHSCRIPT, DYNAMO], ids=["torchscript", "dynamo"])
def test_a_derived_rule_replaces_both_forms_with_the_model_epsilon(text: str, rng) -> None:
    import dataclasses

    spec = dataclasses.replace(RMS_SPEC, patterns=(DerivedPattern(_with_epsilon(TORCHSCRIPT)),))
    model = parse_model(text.format(eps=3e-4))  # another epsilon than the export's
    model.graph.initializer.append(
        onnx.numpy_helper.from_array(rng.standard_normal(16).astype("f"), "weight")
    )
    graph = to_graph(model)
    report = replace(graph, [spec])
    ops = [n.op for n in graph.nodes]
    assert report.replaced == 1 and ops.count("RMSNorm") == 1 and "ReduceMean" not in ops
    assert report.rules[0].origin == "derived: torchscript-17:float32"
    (node,) = [n for n in graph.nodes if n.op == "RMSNorm"]
    assert node.attrs["epsilon"] == pytest.approx(3e-4, rel=1e-6)
    x = rng.standard_normal((2, 5, 16)).astype(np.float32)
    got = gort.run(to_model(graph), {"x": x}, plugins=PluginRegistry([spec]))["y"]
    np.testing.assert_allclose(got, gort.run(model, {"x": x})["y"], rtol=1e-5, atol=1e-5)


def test_a_tensor_where_one_epsilon_is_expected_is_not_replaced() -> None:
    import dataclasses

    spec = dataclasses.replace(RMS_SPEC, patterns=(DerivedPattern(_with_epsilon(TORCHSCRIPT)),))
    text = DYNAMO.format(eps=1e-5).replace(
        "float eps = {1e-05}", "float[16] eps = {" + ",".join(["1e-5"] * 15) + ",2e-5}"
    )
    graph = to_graph(parse_model(text))
    report = replace(graph, [spec])
    assert report.replaced == 0
    (skip,) = report.plugins[0].skipped
    assert skip.reason == "'epsilon' (attribute epsilon) is a tensor of 16 values, not all equal"
