"""gskit.plugin.ops: standard domains, op labels and what a plugin node is, keyed with its version
everywhere."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from conftest import parse_model

from gskit.backends.trt_check import parser_plugin_node
from gskit.io import model as gsmodel
from gskit.passes.convert import to_fp16
from gskit.passes.fold import fold
from gskit.plugin import PluginRegistry, PluginSpec, ops


def _node(op: str, domain: str = "", **attrs) -> gs.Node:
    return gs.Node(op=op, domain=domain, attrs=attrs)


def test_domain_sets_nest() -> None:
    assert ops.DEFAULT_DOMAINS < ops.ONNX_DOMAINS < ops.ORT_DOMAINS
    assert "ai.onnx.ml" in ops.ONNX_DOMAINS and "com.microsoft" not in ops.ONNX_DOMAINS
    assert "com.microsoft" in ops.ORT_DOMAINS and "gskit" not in ops.ORT_DOMAINS
    assert "Relu" in ops.ONNX_OP_TYPES and "LayerNorm" not in ops.ONNX_OP_TYPES


@pytest.mark.parametrize(
    ("domain", "default", "canonical", "label"),
    [
        ("", True, "", "Relu"),
        (None, True, "", "Relu"),
        ("ai.onnx", True, "", "Relu"),
        ("ai.onnx.ml", False, "ai.onnx.ml", "ai.onnx.ml::Relu"),
        ("gskit", False, "gskit", "gskit::Relu"),
    ],
)
def test_default_domain_and_labels(domain, default, canonical, label) -> None:
    assert ops.is_default_domain(domain) is default
    assert ops.canonical_domain(domain) == canonical
    assert ops.op_label(domain, "Relu") == label


def test_node_key_reads_the_version_from_either_node_kind() -> None:
    assert ops.node_key(_node("LayerNorm", "gskit")) == ("gskit", "LayerNorm", "1")
    assert ops.node_key(_node("LayerNorm", "gskit", plugin_version="2")) == ("gskit", "LayerNorm", "2")
    proto = onnx.helper.make_node("LayerNorm", ["x"], ["y"], domain="gskit", plugin_version="3")
    assert ops.node_key(proto) == ("gskit", "LayerNorm", "3")
    assert ops.node_key(onnx.helper.make_node("Relu", ["x"], ["y"])) == ("", "Relu", "1")


def test_is_plugin_node() -> None:
    assert ops.is_plugin_node(_node("LayerNorm", "gskit"))
    assert ops.is_plugin_node(_node("Relu", "", plugin_namespace="gskit"))  # TensorRT looks for a plugin
    assert not ops.is_plugin_node(_node("Relu"))
    assert not ops.is_plugin_node(_node("FusedGemm", "com.microsoft"))  # onnxruntime runs it
    known = {("com.microsoft", "MyOp", "2")}
    assert ops.is_plugin_node(_node("MyOp", "com.microsoft", plugin_version="2"), known)
    assert not ops.is_plugin_node(_node("MyOp", "com.microsoft"), known)  # version 1 is not that plugin


def test_the_parser_view_differs_where_tensorrt_picks_by_op_type() -> None:
    """A custom-domain Relu is a plugin node for gskit, but TensorRT imports it as its own Relu."""
    relu = onnx.helper.make_node("Relu", ["x"], ["y"], domain="my.ns")
    assert ops.is_plugin_node(relu) and not parser_plugin_node(relu, set())
    local = onnx.helper.make_node("Fused", ["x"], ["y"], domain="my.ns")
    assert parser_plugin_node(local, set()) and not parser_plugin_node(local, {("my.ns", "Fused")})


def _spec(version: str, fp16: bool) -> PluginSpec:
    return PluginSpec(
        name="Scale", namespace="gskit", version=version, inputs=("x",), outputs=("y",), supports_fp16=fp16
    )


def test_fp16_support_is_taken_from_the_nodes_own_version() -> None:
    """v1 supports fp16, v2 does not: a v2 node stays fp32 (keyed without its version, it went fp16)."""
    x = gs.Variable("x", dtype=np.float32, shape=[4])
    y = gs.Variable("y", dtype=np.float32, shape=[4])
    node = gs.Node(
        "Scale", name="scale", domain="gskit", attrs={"plugin_version": "2"}, inputs=[x], outputs=[y]
    )
    graph = gs.Graph(nodes=[node], inputs=[x], outputs=[y], opset=17)
    graph.import_domains = [onnx.helper.make_opsetid("", 17), onnx.helper.make_opsetid("gskit", 1)]
    registry = PluginRegistry([_spec("1", True), _spec("2", False)])
    _, report = to_fp16(graph, plugins=registry)
    assert report.kept_fp32 == {"scale": "plugin node (spec does not declare fp16 support)"}


FOLDABLE_IN_ORT_DOMAIN = """
<ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>
g (float[2] x) => (float[2] y) <float[2] c = {1.0, 2.0}> {
    g1 = com.microsoft.Gelu (c)
    y = Add (x, g1)
}
"""


def test_fold_excludes_a_known_plugin_only_at_its_version() -> None:
    """A spec ``com.microsoft::Gelu`` v2 is no reason to keep onnxruntime's own Gelu (v1) unfolded."""
    model = parse_model(FOLDABLE_IN_ORT_DOMAIN)
    spec = PluginSpec(name="Gelu", namespace="com.microsoft", version="2", inputs=("x",), outputs=("y",))
    folded, report = fold(model, plugins=[spec])
    assert [n.op_type for n in folded.graph.node] == ["Add"] and report.excluded == {}
    model.graph.node[0].attribute.append(onnx.helper.make_attribute("plugin_version", "2"))
    folded, report = fold(model, plugins=[spec])
    assert [n.op_type for n in folded.graph.node] == ["Gelu", "Add"]
    assert list(report.excluded.values()) == ["plugin node (com.microsoft::Gelu)"]
    assert gsmodel.count_nodes(gsmodel.to_graph(folded)) == 2


def test_is_onnx_op_answers_as_onnx_does_in_every_domain():
    """ONNX's domains are answered from its schema list (onnx.defs.has cost 50 us a call); the answers are
    onnx's own, for every op type it knows, in every ONNX domain, and for names that are none."""
    from gskit.plugin.ops import ONNX_DOMAINS, is_onnx_op

    names = {s.name for s in onnx.defs.get_all_schemas_with_history()} | {"relu", "Foo", ""}
    for domain in (*sorted(ONNX_DOMAINS), None, "com.microsoft", "my.ns"):
        canonical = "" if domain in (None, "ai.onnx") else domain
        assert {n for n in names if is_onnx_op(domain, n)} == {
            n for n in names if onnx.defs.has(n, canonical)
        }
