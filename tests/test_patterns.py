"""Pattern matching and replacement: rewrites, numeric equality on onnxruntime, and the negative rules."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest

from gskit.backends import ort as gort
from gskit.errors import GskitError
from gskit.io.model import to_graph, to_model
from gskit.passes import patterns
from gskit.passes.patterns import GraphPattern, OpPattern, ReplaceReport
from gskit.plugin import Attribute, AttrType, PluginRegistry, PluginSpec
from plugins.clamp_swish.spec import SPEC as CLAMP_SWISH
from plugins.deform_conv2d.spec import SPEC as DEFORM
from plugins.layer_norm.spec import SPEC as LAYER_NORM
from plugins.rms_norm.spec import SPEC as RMS_NORM
from tests.conftest import parse_model

ALL = (LAYER_NORM, RMS_NORM, CLAMP_SWISH, DEFORM)
#: A TensorRT older than every native form (LayerNormalization 8.6, DeformConv 10.1, RMSNormalization 10.15):
#: these tests are about the patterns, so every region becomes its plugin node (tests/test_native_forms.py
#: tests the native forms).
PLUGIN_TARGET = "8.5"


def replace(graph: gs.Graph, plugins, **options) -> ReplaceReport:
    """``patterns.replace`` for the plugin target unless a test names another."""
    return patterns.replace(graph, plugins, **{"tensorrt": PLUGIN_TARGET, **options})


# TorchScript form: axes as attribute, constants from Constant nodes.
LN_OPSET17 = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3,8] x) => (float[2,3,8] y) <float[8] w = {1,2,3,4,5,6,7,8}, float[8] b = {0,1,0,1,0,1,0,1}>
{
    mean = ReduceMean <axes = [-1]> (x)
    d = Sub (x, mean)
    two = Constant <value = float {2.0}> ()
    sq = Pow (d, two)
    var = ReduceMean <axes = [-1]> (sq)
    eps = Constant <value = float {0.001}> ()
    ve = Add (var, eps)
    std = Sqrt (ve)
    n = Div (d, std)
    m = Mul (n, w)
    y = Add (m, b)
}
"""

# dynamo form: axes as an input (opset 18+), constants as initializers, commuted Mul/Add inputs.
LN_OPSET20 = """
<ir_version: 10, opset_import: ["" : 20]>
g (float[2,3,8] x) => (float[2,3,8] y)
  <float[8] w = {1,2,3,4,5,6,7,8}, float[8] b = {0,1,0,1,0,1,0,1}, int64[1] ax = {2},
   float two = {2.0}, float eps = {1e-5}>
{
    mean = ReduceMean (x, ax)
    d = Sub (x, mean)
    sq = Pow (d, two)
    var = ReduceMean (sq, ax)
    ve = Add (eps, var)
    std = Sqrt (ve)
    n = Div (d, std)
    m = Mul (w, n)
    y = Add (b, m)
}
"""


def _run_both(original: onnx.ModelProto, graph: gs.Graph, feeds: dict[str, np.ndarray]) -> None:
    replaced = to_model(graph)
    onnx.checker.check_model(replaced, full_check=True)
    want = gort.run(original, feeds)
    got = gort.run(replaced, feeds)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-6)


def _x(rng: np.random.Generator, shape=(2, 3, 8)) -> dict[str, np.ndarray]:
    return {"x": rng.standard_normal(shape).astype(np.float32)}


@pytest.mark.parametrize("text", [LN_OPSET17, LN_OPSET20], ids=["axes-attribute", "axes-input"])
def test_layer_norm_replaced_and_numerically_equal(text: str, rng: np.random.Generator) -> None:
    model = parse_model(text)
    # axes = [2] is the last axis only when the rank is known: infer shapes first (as the CLI does).
    graph = to_graph(onnx.shape_inference.infer_shapes(model))
    report = replace(graph, ALL, keep_function=True)
    assert [n.op for n in graph.nodes] == ["LayerNorm"]
    node = graph.nodes[0]
    assert (
        node.domain == "gskit"
        and node.attrs["plugin_namespace"] == "gskit"
        and node.attrs["plugin_version"] == "1"
    )
    assert node.attrs["epsilon"] == pytest.approx(1e-3 if "0.001" in text else 1e-5, rel=1e-6)
    assert [t.name for t in node.inputs] == ["x", "w", "b"]
    assert [t.name for t in node.outputs] == ["y"]  # boundary names kept
    assert report.regions[0].inputs == ("x", "w", "b") and report.regions[0].outputs == ("y",)
    assert len(report.regions[0].original_nodes) == 9
    assert ("gskit", 1) in {(o.domain, o.version) for o in to_model(graph).opset_import}
    _run_both(model, graph, _x(rng))


def test_default_drops_subgraph_and_function_is_not_kept() -> None:
    graph = to_graph(parse_model(LN_OPSET17))
    report = replace(graph, ALL)
    model = to_model(graph)
    assert not model.functions and report.functions_kept == []
    assert [n.op_type for n in model.graph.node] == ["LayerNorm"]  # dead Constant nodes removed too


def test_overlap_larger_match_wins_deterministically() -> None:
    for order in (ALL, tuple(reversed(ALL))):
        graph = to_graph(parse_model(LN_OPSET17))
        report = replace(graph, order)
        by_name = {p.plugin: p for p in report.plugins}
        assert [n.op for n in graph.nodes] == ["LayerNorm"]
        rms = by_name[RMS_NORM.qualified_name]
        assert rms.found == 1 and rms.replaced == 0
        assert "overlaps the LayerNorm match" in rms.skipped[0].reason


def test_only_selects_plugins_and_rejects_unknown_names() -> None:
    graph = to_graph(parse_model(LN_OPSET17))
    report = replace(graph, ALL, only=["RMSNorm"])
    # Without LayerNorm, the RMSNorm-shaped tail (normalizing d = x - mean) is an RMSNorm of d.
    assert sorted(n.op for n in graph.nodes) == ["Add", "RMSNorm", "ReduceMean", "Sub"]
    assert report.replaced == 1
    with pytest.raises(GskitError, match="no such plugin"):
        replace(graph, ALL, only=["Nope"])


def test_interior_tensor_used_outside_is_not_replaced() -> None:
    text = LN_OPSET17.replace("=> (float[2,3,8] y)", "=> (float[2,3,8] y, float[2,3,1] z)").replace(
        "y = Add (m, b)", "y = Add (m, b)\n    z = Neg (std)"
    )
    graph = to_graph(parse_model(text))
    report = replace(graph, [LAYER_NORM])
    assert "LayerNorm" not in [n.op for n in graph.nodes]
    skip = report.plugins[0].skipped[0]
    assert "is also used by node" in skip.reason and "'std'" in skip.reason


def test_interior_tensor_that_is_a_graph_output_is_not_replaced() -> None:
    text = LN_OPSET17.replace("=> (float[2,3,8] y)", "=> (float[2,3,8] y, float[2,3,8] n)")
    graph = to_graph(parse_model(text))
    report = replace(graph, [LAYER_NORM])
    assert "LayerNorm" not in [n.op for n in graph.nodes]
    assert "graph output" in report.plugins[0].skipped[0].reason


def test_wrong_constant_is_explained() -> None:
    graph = to_graph(parse_model(LN_OPSET17.replace("float {2.0}", "float {3.0}")))
    report = replace(graph, [LAYER_NORM], explain=True)
    assert report.replaced == 0
    deepest = max(report.explanations, key=lambda e: e.depth)
    assert deepest.depth == 9 and deepest.reason == "constant 'two' is 3.0, pattern wants 2.0"
    assert deepest.node == "Constant(two)" and deepest.anchor == "Add(y)"
    # the hand-written rule and the one derived from the same PyTorch decomposition stop at the same place
    same = {e.rule for e in report.explanations if e.depth == 9 and e.reason == deepest.reason}
    assert "layer_norm[pow,div]" in same and any(r.startswith("layer_norm[torchscript-") for r in same)


def test_axes_other_than_last_are_not_matched() -> None:
    text = LN_OPSET20.replace("int64[1] ax = {2}", "int64[1] ax = {1}")
    graph = to_graph(parse_model(text))
    report = replace(graph, [LAYER_NORM], explain=True)
    assert report.replaced == 0
    assert any("'axes'" in e.reason and "[1]" in e.reason for e in report.explanations)


CLAMP_SWISH_IF = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[4] x, bool c) => (float[4] y)
{
    y = If (c) <
        then_branch = t () => (float[4] ty) {
            zero = Constant <value = float {0.0}> ()
            cl = Clip (x, zero, )
            ng = Neg (cl)
            ex = Exp (ng)
            one = Constant <value = float {1.0}> ()
            ad = Add (one, ex)
            ty = Div (cl, ad)
        },
        else_branch = e () => (float[4] ey) { ey = Identity (x) }
    >
}
"""


def test_nodes_inside_if_subgraphs_are_matched(rng: np.random.Generator) -> None:
    model = parse_model(CLAMP_SWISH_IF)
    graph = to_graph(model)
    report = replace(graph, ALL, keep_function=True)
    then_graph = graph.nodes[0].attrs["then_branch"]
    assert [n.op for n in then_graph.nodes] == ["ClampSwish"]
    assert report.regions[0].graph == then_graph.name
    x = rng.standard_normal(4).astype(np.float32)
    for cond in (True, False):
        _run_both(model, graph, {"x": x, "c": np.array(cond)})


def test_clip_with_max_is_not_clamp_swish() -> None:
    text = CLAMP_SWISH_IF.replace(
        "cl = Clip (x, zero, )", "six = Constant <value = float {6.0}> ()\n cl = Clip (x, zero, six)"
    )
    graph = to_graph(parse_model(text))
    replace(graph, ALL)
    assert "ClampSwish" not in [n.op for n in graph.nodes[0].attrs["then_branch"].nodes]


def test_commutative_inputs_match_in_either_order(rng: np.random.Generator) -> None:
    text = """
    <ir_version: 10, opset_import: ["" : 20]>
    g (float[5] x) => (float[5] y) <float zero = {0.0}>
    {
        c = Max (zero, x)
        s = Sigmoid (c)
        y = Mul (s, c)
    }
    """
    model = parse_model(text)
    graph = to_graph(model)
    replace(graph, [CLAMP_SWISH], keep_function=True)
    assert [n.op for n in graph.nodes] == ["ClampSwish"]
    _run_both(model, graph, {"x": rng.standard_normal(5).astype(np.float32)})


LOCAL_FUNCTION = """
<ir_version: 8, opset_import: ["" : 17, "my.mods" : 1]>
g (float[2,8] x) => (float[2,8] y) <float[8] w = {1,1,1,1,2,2,2,2}, float[8] b = {0,0,0,0,1,1,1,1}>
{
    h = my.mods.Norm <eps: float = 0.01> (x, w, b)
    y = my.mods.Norm <eps: float = 0.01> (h, w, b)
}
<domain: "my.mods", opset_import: ["" : 17]>
Norm <eps> (a, s, t) => (o)
{
    o = LayerNormalization <axis = -1, epsilon: float = @eps> (a, s, t)
}
"""


def test_local_function_calls_replaced_and_function_removed(rng: np.random.Generator) -> None:
    from gskit.passes.patterns import FunctionPattern

    spec = PluginSpec(
        name="LayerNorm",
        namespace="gskit",
        inputs=("x", "weight", "bias"),
        attributes=(Attribute("epsilon", AttrType.FLOAT, 1e-5),),
        patterns=(FunctionPattern("Norm", "my.mods", attrs={"epsilon": "eps"}),),
    )
    model = parse_model(LOCAL_FUNCTION)
    graph = to_graph(model)
    report = replace(graph, [spec])
    assert [n.op for n in graph.nodes] == ["LayerNorm", "LayerNorm"]
    assert graph.nodes[0].attrs["epsilon"] == pytest.approx(0.01)
    assert report.functions_removed == ["my.mods::Norm"] and not graph.functions
    # keep_function: plain onnxruntime runs the result (the new function calls the old one).
    graph = to_graph(model)
    report = replace(graph, [spec], keep_function=True)
    assert report.plugins[0].replaced == 2 and report.functions_removed == []
    _run_both(model, graph, {"x": rng.standard_normal((2, 8)).astype(np.float32)})


def test_deform_conv_single_node_attributes_mapped() -> None:
    text = """
    <ir_version: 9, opset_import: ["" : 19]>
    g (float[1,4,8,8] x, float[1,18,4,4] off) => (float[1,6,4,4] y) <float[6,4,3,3] w = {1.0}>
    {
        y = DeformConv <strides = [2, 2], pads = [1, 1, 1, 1], group = 1, offset_group = 1> (x, w, off)
    }
    """.replace("{1.0}", "{" + ",".join(["0.5"] * 216) + "}")
    graph = to_graph(parse_model(text))
    replace(graph, [DEFORM])
    node = graph.nodes[0]
    assert (node.op, node.domain) == ("DeformConv2d", "gskit")
    assert node.attrs["strides"] == [2, 2] and node.attrs["pads"] == [1, 1, 1, 1]
    assert [t.name for t in node.inputs] == ["x", "w", "off"]


def _deform_conv_mask_only(weight: str) -> onnx.ModelProto:
    return parse_model(
        f"""
        <ir_version: 9, opset_import: ["" : 19]>
        g (float[1,4,6,7] x, {weight} w, float[1,18,6,7] off, float[1,9,6,7] m) => (float[1,5,6,7] y)
        {{
            y = DeformConv <pads = [1, 1, 1, 1]> (x, w, off, , m)
        }}
        """
    )


def test_deform_conv_mask_without_bias_gets_a_zero_bias(rng: np.random.Generator) -> None:
    """No empty input between present ones (TensorRT plugins take inputs by position); same numbers."""
    model = _deform_conv_mask_only("float[5,4,3,3]")
    graph = to_graph(model)
    replace(graph, [DEFORM])
    (node,) = graph.nodes
    assert [t.name for t in node.inputs[:3]] + [node.inputs[4].name] == ["x", "w", "off", "m"]
    bias = node.inputs[3]
    assert isinstance(bias, gs.Constant) and bias.values.shape == (5,) and bias.values.dtype == np.float32
    assert not bias.values.any()
    feeds = {
        "x": rng.standard_normal((1, 4, 6, 7)).astype(np.float32),
        "w": rng.standard_normal((5, 4, 3, 3)).astype(np.float32),
        "off": rng.standard_normal((1, 18, 6, 7)).astype(np.float32),
        "m": rng.random((1, 9, 6, 7)).astype(np.float32),
    }
    replaced = to_model(graph)
    onnx.checker.check_model(replaced)
    got = gort.run(replaced, feeds, plugins=PluginRegistry([DEFORM]))["y"]
    np.testing.assert_allclose(got, gort.run(model, feeds)["y"], rtol=1e-5, atol=1e-5)


def test_deform_conv_mask_without_bias_needs_the_out_channels() -> None:
    graph = to_graph(_deform_conv_mask_only("float[C,4,3,3]"))
    report = replace(graph, [DEFORM])
    assert graph.nodes[0].op == "DeformConv"
    (skip,) = report.plugins[0].skipped
    assert "mask but no bias" in skip.reason and "output-channel dim is unknown" in skip.reason


def test_custom_domain_deform_conv2d_reordered() -> None:
    graph = gs.Graph(opset=17)
    x, w, off, mask, bias = (
        gs.Variable(n, np.float32, s)
        for n, s in [
            ("x", (1, 3, 5, 5)),
            ("w", (3, 3, 3, 3)),
            ("off", (1, 18, 3, 3)),
            ("m", (1, 9, 3, 3)),
            ("b", (3,)),
        ]
    )
    y = gs.Variable("y", np.float32)
    graph.inputs, graph.outputs = [x, w, off, mask, bias], [y]
    attrs = dict(
        stride_h=1,
        stride_w=2,
        pad_h=0,
        pad_w=1,
        dil_h=1,
        dil_w=1,
        n_weight_grps=1,
        n_offset_grps=1,
        use_mask=1,
    )
    graph.nodes.append(
        gs.Node("deform_conv2d", domain="custom", attrs=attrs, inputs=[x, w, off, mask, bias], outputs=[y])
    )
    replace(graph, [DEFORM])
    node = graph.nodes[0]
    assert node.op == "DeformConv2d" and [t.name for t in node.inputs] == ["x", "w", "off", "b", "m"]
    assert node.attrs["strides"] == [1, 2] and node.attrs["pads"] == [0, 1, 0, 1]
    # a custom domain is never implied: another domain's deform_conv2d is left alone
    graph.nodes[0] = gs.Node(
        "deform_conv2d", domain="other", attrs=attrs, inputs=[x, w, off, mask, bias], outputs=[y]
    )
    assert replace(graph, [DEFORM]).replaced == 0


def test_custom_pattern_dsl_capture_and_check() -> None:
    def scaled_relu(op, x):
        return op.Mul(op.Relu(x), op.capture("k"))

    spec = PluginSpec(
        name="ScaledRelu",
        namespace="demo",
        attributes=(Attribute("k", AttrType.FLOAT),),
        patterns=(
            GraphPattern(
                scaled_relu,
                attrs={"k": "k"},
                check=lambda m: (
                    m.scalar("k") > 0
                    or __import__("gskit.passes.patterns").passes.patterns.MatchResult.fail("k <= 0")
                ),
            ),
        ),
    )
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[3] x) => (float[3] y, float[3] z) <float k = {2.5}, float j = {-1.0}>
    { r = Relu (x)
      y = Mul (r, k)
      r2 = Relu (x)
      z = Mul (j, r2) }
    """
    graph = to_graph(parse_model(text))
    report = replace(graph, [spec])
    assert sorted(n.op for n in graph.nodes) == ["Mul", "Relu", "ScaledRelu"]
    assert report.plugins[0].skipped[0].reason == "k <= 0"


def test_single_op_pattern_with_explicit_domain() -> None:
    spec = PluginSpec(
        name="GridSamplePlugin",
        namespace="demo",
        inputs=("x", "grid"),
        patterns=(OpPattern("GridSample", "com.microsoft"),),
    )
    graph = gs.Graph(opset=17)
    x, grid, y = (
        gs.Variable("x", np.float32, (1, 1, 4, 4)),
        gs.Variable("g", np.float32, (1, 2, 2, 2)),
        gs.Variable("y", np.float32),
    )
    graph.inputs, graph.outputs = [x, grid], [y]
    graph.nodes.append(gs.Node("GridSample", domain="com.microsoft", inputs=[x, grid], outputs=[y]))
    assert replace(graph, [spec]).replaced == 1
    assert (graph.nodes[0].op, graph.nodes[0].domain) == ("GridSamplePlugin", "demo")


def test_layer_norm_without_epsilon_becomes_epsilon_zero() -> None:
    text = LN_OPSET17.replace("    eps = Constant <value = float {0.001}> ()\n", "").replace(
        "    ve = Add (var, eps)\n    std = Sqrt (ve)", "    std = Sqrt (var)"
    )
    assert "Add (var" not in text
    model = parse_model(text)
    graph = to_graph(model)
    assert replace(graph, [LAYER_NORM]).replaced == 1
    (node,) = [n for n in graph.nodes if n.op == "LayerNorm"]
    assert node.attrs["epsilon"] == 0.0
    x = np.random.default_rng(1).standard_normal((2, 3, 8)).astype(np.float32)
    want = gort.run(model, {"x": x})["y"]
    got = gort.run(to_model(graph), {"x": x}, plugins=PluginRegistry([LAYER_NORM]))["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_output_count_mismatch_between_pattern_and_spec_is_skipped_with_reason() -> None:
    spec = PluginSpec(name="TwoOut", namespace="demo", outputs=("y", "z"), patterns=(OpPattern("Relu"),))
    graph = gs.Graph(opset=17)
    x, y = gs.Variable("x", np.float32, (2,)), gs.Variable("y", np.float32, (2,))
    graph.inputs, graph.outputs = [x], [y]
    graph.nodes.append(gs.Node("Relu", inputs=[x], outputs=[y]))
    report = replace(graph, [spec])
    assert report.replaced == 0 and [n.op for n in graph.nodes] == ["Relu"]
    assert "yields 1 outputs, the spec declares 2" in report.plugins[0].skipped[0].reason


def _exported_cases() -> list:
    from tests.exported_models import CASES

    return [
        pytest.param(name, dynamo, id=f"{name}-{'dynamo' if dynamo else 'torchscript'}")
        for name, case in CASES.items()
        for dynamo in case.exporters
    ]


@pytest.mark.torch
@pytest.mark.parametrize(("name", "dynamo"), _exported_cases())
def test_torch_exported_models(name: str, dynamo: bool, tmp_path) -> None:
    """Every torch-exported case: the planted plugin count, the gone ops, and (where onnxruntime runs
    the original) numeric equality of the keep_function model."""
    from gskit.io.model import load
    from tests.exported_models import CASES, ExportUnsupported, example_input

    case = CASES[name]
    try:
        path = export_case(name, tmp_path, dynamo)
    except ExportUnsupported as err:
        pytest.skip(str(err))
    model = onnx.shape_inference.infer_shapes(load(path))
    graph = to_graph(model)
    replace(graph, ALL)
    ops = [n.op for n in graph.nodes]
    assert ops.count(case.plugin) == case.planted, ops
    assert not set(case.gone) & set(ops)
    if case.onnx_twin is None:
        kept = to_graph(model)
        report = replace(kept, ALL, keep_function=True)
        if report.replaced == case.planted:  # bodies that differ (two epsilons) cannot share one function
            _run_both(model, kept, {"x": example_input(name)})


def export_case(name: str, directory, dynamo: bool):
    from tests.exported_models import export

    return export(name, directory, dynamo=dynamo)


def _hf_norms_net(dtype_name: str):
    """Two Hugging Face style RMSNorms (LLaMA's code: compute in float32, cast back, then the weight)."""
    import torch

    class HFRMSNorm(torch.nn.Module):
        def __init__(self, size: int, eps: float = 1e-6) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.rand(size) + 0.5)
            self.eps = eps

        def forward(self, hidden):
            in_dtype = hidden.dtype
            hidden = hidden.to(torch.float32)
            variance = hidden.pow(2).mean(-1, keepdim=True)
            hidden = hidden * torch.rsqrt(variance + self.eps)
            return self.weight * hidden.to(in_dtype)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(16, 16)
            self.norm1, self.norm2 = HFRMSNorm(16), HFRMSNorm(16, eps=1e-5)

        def forward(self, x):
            return self.norm2(self.proj(self.norm1(self.proj(x))))

    torch.manual_seed(0)
    return Net().to(getattr(torch, dtype_name)).eval()


def _export_plain(net, x, path, dynamo: bool) -> onnx.ModelProto:
    """Export and load the file as written: no shape inference, no sanitize (what `gskit replace` reads)."""
    import torch

    from gskit.io.model import load

    torch.onnx.export(net, (x,), str(path), dynamo=dynamo, opset_version=18 if dynamo else 17)
    return load(path)


@pytest.mark.torch
@pytest.mark.parametrize("dtype_name", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_hugging_face_rms_norm_found_without_cleanup(dtype_name, dynamo, tmp_path) -> None:
    """No-op Casts (float32) and the float32 round trip (float16) sit inside HF's RMSNorm: both match."""
    import torch

    net = _hf_norms_net(dtype_name)
    x = torch.randn(2, 5, 16, dtype=getattr(torch, dtype_name))
    model = _export_plain(net, x, tmp_path / "hf.onnx", dynamo)
    graph = to_graph(model)
    report = replace(graph, ALL)
    ops = [n.op for n in graph.nodes]
    assert ops.count("RMSNorm") == 2, ops
    assert "Cast" not in ops and "ReduceMean" not in ops
    replaced = to_model(graph)
    onnx.checker.check_model(replaced, full_check=True)
    assert report.replaced == 2
    if dtype_name == "bfloat16":
        return  # numpy has no bfloat16 to feed: the match (dtype held as onnx's enum) is what is checked
    feeds = {model.graph.input[0].name: x.numpy()}
    want = gort.run(model, feeds)
    got = gort.run(replaced, feeds, plugins=PluginRegistry([RMS_NORM]))
    # float16: the plugin applies the weight before rounding to float16 once, the original rounds twice
    tol = 1e-5 if dtype_name == "float32" else 2e-3
    for name, value in want.items():
        assert got[name].dtype == value.dtype
        np.testing.assert_allclose(got[name].astype(np.float32), value.astype(np.float32), rtol=tol, atol=tol)
    assert report.replaced == 2


def test_explain_names_the_cast_that_blocks_a_match() -> None:
    """A Cast that changes the dtype inside an RMSNorm is not looked through; --explain names it. (A
    float32 x normalized and cast to float16 before a float16 weight is one RMSNorm: test_replace_explain.)"""
    model = parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2,8] x) => (float[2,8] y) <float[8] w = {1,1,1,1,1,1,1,1}> {
      sq = Mul (x, x)
      ms = ReduceMean <axes = [-1]> (sq)
      ms16 = Cast <to = 10> (ms)
      eps = Constant <value = float {1e-3}> ()
      eps16 = Cast <to = 10> (eps)
      ve = Add (ms16, eps16)
      std = Sqrt (ve)
      std32 = Cast <to = 1> (std)
      n = Div (x, std32)
      y = Mul (n, w)
    }""")
    graph = to_graph(model)
    report = replace(graph, [RMS_NORM], explain=True)
    assert report.replaced == 0
    reasons = [e.reason for e in report.explanations if e.node == "Cast(std32)"]
    assert reasons and "Cast node 'Cast(std32)' (to FLOAT, from FLOAT16)" in reasons[0]


def test_no_op_cast_between_pattern_nodes_joins_the_match(rng: np.random.Generator) -> None:
    """TorchScript's ``.to(float32)`` of a float32 tensor: matched, and the Cast goes with the match."""
    text = LN_OPSET17.replace("n = Div (d, std)", "nd = Div (d, std)\n    n = Cast <to = 1> (nd)")
    text = text.replace("d = Sub (x, mean)", "d0 = Sub (x, mean)\n    d = Cast <to = 1> (d0)")
    model = parse_model(text)
    graph = to_graph(model)
    assert replace(graph, [LAYER_NORM]).replaced == 1
    assert [n.op for n in graph.nodes] == ["LayerNorm"]
    feeds = _x(rng)
    got = gort.run(to_model(graph), feeds, plugins=PluginRegistry([LAYER_NORM]))["y"]
    np.testing.assert_allclose(got, gort.run(model, feeds)["y"], rtol=1e-5, atol=1e-5)


def _ln_forms_net():
    """nn.LayerNorm without bias, and a Flax-style layer norm with the variance as E[x^2] - E[x]^2."""
    import torch

    class FlaxLayerNorm(torch.nn.Module):
        def __init__(self, size: int, eps: float = 1e-6) -> None:
            super().__init__()
            self.scale = torch.nn.Parameter(torch.rand(size) + 0.5)
            self.bias = torch.nn.Parameter(torch.rand(size))
            self.eps = eps

        def forward(self, x):
            mean = x.mean(-1, keepdim=True)
            var = (x * x).mean(-1, keepdim=True) - mean * mean
            return (x - mean) * torch.rsqrt(var + self.eps) * self.scale + self.bias

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(16, 16)
            self.plain, self.flax = torch.nn.LayerNorm(16, bias=False), FlaxLayerNorm(16)
            with torch.no_grad():
                self.plain.weight.uniform_(0.5, 1.5)

        def forward(self, x):
            return self.flax(self.proj(self.plain(self.proj(x))))

    torch.manual_seed(0)
    return Net().eval()


@pytest.mark.torch
@pytest.mark.parametrize(("dynamo", "opset"), [(False, 16), (False, 17), (True, 18)])
def test_layer_norm_without_bias_and_variance_form_found(dynamo, opset, tmp_path) -> None:
    """Both norms are found on every export (LayerNormalization without bias from opset 17 on, the
    decomposed form before): the bias-free one gets a zero bias."""
    import torch

    x = torch.randn(2, 5, 16)
    path = tmp_path / "ln.onnx"
    torch.onnx.export(_ln_forms_net(), (x,), str(path), dynamo=dynamo, opset_version=opset)
    model = onnx.load(path)
    graph = to_graph(model)
    report = replace(graph, ALL)
    ops = [n.op for n in graph.nodes]
    assert ops.count("LayerNorm") == 2 and "ReduceMean" not in ops and "LayerNormalization" not in ops, ops
    by_name = {p.plugin: p for p in report.plugins}
    assert by_name[LAYER_NORM.qualified_name].found == 2
    assert all(len(n.inputs) == 3 for n in graph.nodes if n.op == "LayerNorm")
    replaced = to_model(graph)
    onnx.checker.check_model(replaced, full_check=True)
    feeds = {model.graph.input[0].name: x.numpy()}
    want = gort.run(model, feeds)
    got = gort.run(replaced, feeds, plugins=PluginRegistry([LAYER_NORM]))
    for name, value in want.items():  # E[x^2] - E[x]^2 loses digits in float32; the plugin does not
        np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-4)


def test_norms_left_unreplaced_are_counted_and_prepare_says_so(tmp_path) -> None:
    """A norm over another axis is not replaced: the report and prepare's replace summary count it."""
    text = LN_OPSET20.replace("int64[1] ax = {2}", "int64[1] ax = {1}")
    graph = to_graph(parse_model(text))
    report = replace(graph, [LAYER_NORM, RMS_NORM])
    assert report.replaced == 0 and report.norm_like_left == ["Sqrt(std)"]
    replaced = to_graph(parse_model(LN_OPSET17))
    assert replace(replaced, ALL).norm_like_left == []

    from gskit.io.model import save
    from gskit.pipeline.prepare import prepare
    from gskit.pipeline.recipe import load_recipe

    save(parse_model(text), tmp_path / "m.onnx")
    (tmp_path / "r.yaml").write_text("steps:\n  - replace\n")
    result = prepare(tmp_path / "m.onnx", tmp_path / "out", recipe=load_recipe(tmp_path / "r.yaml"))
    (step,) = result.steps
    assert "1 norm-like computation(s) left unreplaced (at Sqrt(std)" in step.summary


KERAS_LN = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[{shape}] x) => (float[{shape}] y)
  <float[8] w = {{1,2,3,4,5,6,7,8}}, float[8] b = {{0,1,0,1,0,1,0,1}}> {{
    mean = GlobalAveragePool (x)
    d = Sub (x, mean)
    sq = Mul (d, d)
    var = GlobalAveragePool (sq)
    eps = Constant <value = float {{0.001}}> ()
    ve = Add (var, eps)
    std = Sqrt (ve)
    inv = Reciprocal (std)
    s = Mul (inv, w)
    xs = Mul (x, s)
    ms = Mul (mean, s)
    shift = Sub (b, ms)
    y = Add (xs, shift)
}}
"""


def test_keras_layer_norm_from_tf2onnx(rng: np.random.Generator) -> None:
    """tf2onnx's Keras LayerNormalization (scale folded into both terms, means as GlobalAveragePool) is a
    LayerNorm for a 3-D input; for a 4-D input GlobalAveragePool averages two axes and it is not."""
    model = parse_model(KERAS_LN.format(shape="2,3,8"))
    graph = to_graph(model)
    assert replace(graph, ALL).replaced == 1 and [n.op for n in graph.nodes] == ["LayerNorm"]
    assert graph.nodes[0].attrs["epsilon"] == pytest.approx(1e-3)
    feeds = _x(rng)
    got = gort.run(to_model(graph), feeds, plugins=PluginRegistry([LAYER_NORM]))["y"]
    np.testing.assert_allclose(got, gort.run(model, feeds)["y"], rtol=1e-5, atol=1e-5)
    four_d = to_graph(parse_model(KERAS_LN.format(shape="2,3,4,8")))
    report = replace(four_d, ALL)
    assert report.replaced == 0 and report.norm_like_left == ["Sqrt(std)"]
    assert "only for a 3-D input" in report.plugins[0].skipped[0].reason


@pytest.mark.torch
@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_float16_layer_norm_validates_with_the_dtype_tolerance(dynamo, tmp_path) -> None:
    """A float16 nn.LayerNorm (LayerNormalization on onnxruntime) against the plugin: within the float16
    tolerance gskit's comparison uses, which the float32 default would not be."""
    import torch

    from gskit.compare.outputs import compare

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64)).half().eval()
    with torch.no_grad():
        net[1].weight.uniform_(0.5, 3.0)
    x = torch.randn(4, 16, 64, dtype=torch.float16)
    model = _export_plain(net, x, tmp_path / "ln16.onnx", dynamo)
    graph = to_graph(model)
    assert replace(graph, [LAYER_NORM]).replaced == 1
    feeds = {model.graph.input[0].name: x.numpy()}
    report = compare(model, to_model(graph), feeds=feeds, plugins=PluginRegistry([LAYER_NORM]))
    assert report.passed, report.outputs
    assert report.outputs[0].dtype == "float16" and report.outputs[0].atol == 4e-3


# HF's LlamaRMSNorm as torch.onnx.export writes it: the input is cast to float first, and the residual Add
# reads that Cast's output too, so the Cast stays outside the match and the plugin takes the Cast's input.
RMS_CAST_READ_OUTSIDE = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3,8] x) => (float[2,3,8] y, float[2,3,8] r) <float[8] w = {1,2,3,4,5,6,7,8}>
{
    c = Cast <to = 1> (x)
    two = Constant <value = float {2.0}> ()
    p = Pow (c, two)
    m = ReduceMean <axes = [-1], keepdims = 1> (p)
    eps = Constant <value = float {1e-6}> ()
    a = Add (m, eps)
    s = Sqrt (a)
    one = Constant <value = float {1.0}> ()
    inv = Div (one, s)
    n = Mul (c, inv)
    n2 = Cast <to = 1> (n)
    y = Mul (w, n2)
    r = Add (c, y)
}
"""


def test_keep_function_casts_a_plugin_input_the_match_reads_through_a_cast(rng: np.random.Generator) -> None:
    model = parse_model(RMS_CAST_READ_OUTSIDE)
    graph = to_graph(model)
    report = replace(graph, [RMS_NORM], keep_function=True)
    assert report.replaced == 1
    (function,) = graph.functions
    assert function.nodes[0].op == "Cast" and function.nodes[0].inputs[0].name == "x"
    _run_both(model, graph, {"x": rng.standard_normal((2, 3, 8)).astype(np.float32)})


def test_pattern_nodes_give_one_output_or_a_tuple_of_them() -> None:
    """op.X(...) returns its output for a one-output node (without building a tuple) and a tuple of
    ``_outputs`` outputs otherwise, however the count is spelled; each output knows its node and index."""
    from gskit.passes.patterns.dsl import NodeOutput, OpBuilder

    op = OpBuilder()
    one = op.Relu(None)
    assert isinstance(one, NodeOutput) and one.index == 0 and one.node.num_outputs == 1
    two = op.Split(one, _outputs=2)
    assert isinstance(two, tuple) and [o.index for o in two] == [0, 1] and two[0].node is two[1].node
    numpy_one = op.Neg(one, _outputs=np.int64(1))
    assert isinstance(numpy_one, NodeOutput) and numpy_one.index == 0
    assert op.Identity(one, _outputs=0) == ()
    with pytest.raises(TypeError):
        op.Abs(one, _outputs=1.5)
    assert [n.index for n in op.nodes] == [0, 1, 2, 3, 4]
