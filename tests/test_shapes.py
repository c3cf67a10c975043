"""Shape inference through plugin nodes: schemas from PluginSpecs, symbolic dims, the path-based variant."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from conftest import parse_model, run_subcommand

from gskit.errors import GskitError
from gskit.io import model as gsmodel
from gskit.passes.shapes import (
    infer_graph_shapes,
    infer_shapes,
    infer_shapes_path,
    missing_shapes,
    register_schemas,
)
from gskit.plugin import load_plugins

SPEC_PY = """
from gskit.plugin.spec import Attribute, AttrType, PluginSpec, PluginError, TensorInfo, same_as_input
from .reference import duplicate, scaled_tanh


def _duplicate_shape(inputs, attrs):
    x = inputs[0]
    if x.shape is None:
        return [TensorInfo(x.dtype, None)]
    last = x.shape[-1]
    if attrs["fail"]:
        raise PluginError("Duplicate was told to fail")
    return [TensorInfo(x.dtype, (*x.shape[:-1], 2 * last if isinstance(last, int) else None))]


SPECS = [
    PluginSpec(
        name="ScaledTanh", namespace="test.gskit", inputs=("x", "bias?"),
        attributes=(Attribute("alpha", AttrType.FLOAT, 1.0, "scale"),),
        infer=same_as_input(0), reference=scaled_tanh, doc="alpha * tanh(x + bias)",
    ),
    PluginSpec(
        name="Duplicate", namespace="test.gskit",
        attributes=(Attribute("fail", AttrType.INT, 0),),
        infer=_duplicate_shape, reference=duplicate, doc="concat(x, x) on the last axis",
    ),
]
"""

REFERENCE_PY = """
import numpy as np


def scaled_tanh(x, bias=None, *, alpha):
    return (np.tanh(x if bias is None else x + bias) * alpha).astype(x.dtype)


def duplicate(x, *, fail):
    return np.concatenate([x, x], axis=-1)
"""


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "plugins" / "test_ops"
    folder.mkdir(parents=True)
    (folder / "spec.py").write_text(textwrap.dedent(SPEC_PY))
    (folder / "reference.py").write_text(textwrap.dedent(REFERENCE_PY))
    return tmp_path / "plugins"


@pytest.fixture
def registry(plugin_dir: Path):
    return load_plugins([plugin_dir], entry_points=False)


CHAIN = """
<ir_version: 10, opset_import: ["" : 17, "test.gskit" : 1]>
chain (float[N, 4] x) => (float z) {
    d = test.gskit.Duplicate<plugin_namespace="test.gskit", plugin_version="1">(x)
    m = MatMul(d, w)
    s = Constant<value = int64[3] {0, 3, 1}>()
    z = Reshape(m, s)
}
"""


def _chain(rng: np.random.Generator) -> onnx.ModelProto:
    model = onnx.parser.parse_model(CHAIN)
    # dims unknown: inference must find them
    model.graph.output[0].CopyFrom(
        onnx.helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [None] * 3)
    )
    w = onnx.numpy_helper.from_array(rng.standard_normal((8, 3)).astype(np.float32), "w")
    model.graph.initializer.append(w)
    onnx.checker.check_model(model)
    return model


def _dims(vi: onnx.ValueInfoProto) -> list:
    return [
        d.dim_param or (d.dim_value if d.HasField("dim_value") else None)
        for d in vi.type.tensor_type.shape.dim
    ]


def _shapes(model: onnx.ModelProto) -> dict[str, list]:
    return {vi.name: _dims(vi) for vi in (*model.graph.value_info, *model.graph.output)}


def test_symbolic_dims_flow_through_plugin_and_following_ops(registry, rng):
    model = _chain(rng)
    inferred = infer_shapes(model, registry)
    shapes = _shapes(inferred)
    assert shapes["d"] == ["N", 8]  # plugin rule ran: last dim doubled, symbolic batch kept
    assert shapes["m"] == ["N", 3]  # MatMul after the plugin
    assert shapes["z"] == ["N", 3, 1]  # Reshape with data propagation
    assert missing_shapes(inferred) == []
    assert missing_shapes(model) == ["d", "m", "s"]  # the input model is left as it was
    onnx.checker.check_model(inferred, full_check=True)


def test_missing_plugin_spec_leaves_shapes_missing(rng):
    from gskit.plugin import PluginRegistry

    model = _chain(rng)
    model.graph.node[0].domain = "other.ns"
    model.opset_import.append(onnx.helper.make_opsetid("other.ns", 1))
    inferred = infer_shapes(model, PluginRegistry(), strict=False)
    assert "d" in missing_shapes(inferred)


def test_plugin_output_of_an_input_of_unknown_type_stays_untyped(registry, rng):
    """A plugin node reading a tensor nothing defines: its rule passes on element type 0, which onnx refuses
    to set (it raised a bare ValueError); the output stays untyped instead."""
    model = _chain(rng)
    model.graph.node[0].input[0] = "ghost"
    inferred = infer_shapes(model, registry, strict=False)
    assert "d" in missing_shapes(inferred)
    with pytest.raises(GskitError, match="shape inference failed"):
        infer_shapes(model, registry)


def test_plugin_rule_error_names_the_node(registry, rng):
    model = _chain(rng)
    model.graph.node[0].name = "dup_node"
    model.graph.node[0].attribute.append(onnx.helper.make_attribute("fail", 1))
    with pytest.raises(GskitError, match="dup_node"):
        infer_shapes(model, registry)


def test_unknown_plugin_version_is_an_error(registry, rng):
    model = _chain(rng)
    for attr in model.graph.node[0].attribute:
        if attr.name == "plugin_version":
            attr.s = b"7"
    with pytest.raises(GskitError, match="plugin_version '7'"):
        infer_shapes(model, registry)


def test_optional_input_and_attribute_schema(registry):
    model = parse_model(
        """
        <ir_version: 10, opset_import: ["" : 17, "test.gskit" : 1]>
        g (float[B, T, 16] x, float[16] b) => (float[B, T, 16] y, float[B, T, 16] y2) {
            y = test.gskit.ScaledTanh<alpha = 2.0>(x, b)
            y2 = test.gskit.ScaledTanh(x)
        }
        """
    )
    register_schemas(registry)
    onnx.checker.check_model(model, full_check=True)  # schema accepts the optional input and attributes
    bad = onnx.ModelProto()
    bad.CopyFrom(model)
    bad.graph.node[0].attribute.append(onnx.helper.make_attribute("beta", 1.0))
    with pytest.raises(onnx.checker.ValidationError, match="beta"):
        onnx.checker.check_model(bad)
    assert missing_shapes(infer_shapes(model, registry)) == []


def test_registration_is_idempotent_and_follows_reloads(plugin_dir, rng):
    first = load_plugins([plugin_dir], entry_points=False)
    register_schemas(first)
    register_schemas(first)
    spec_file = plugin_dir / "test_ops" / "spec.py"
    spec_file.write_text(spec_file.read_text().replace("2 * last", "3 * last + 0"))
    second = load_plugins([plugin_dir], entry_points=False)
    model = _chain(rng)
    model.graph.initializer[0].CopyFrom(
        onnx.numpy_helper.from_array(rng.standard_normal((12, 3)).astype(np.float32), "w")
    )
    assert _shapes(infer_shapes(model, second))["d"] == ["N", 12]


def test_large_initializers_are_not_sent_but_kept(registry):
    model = onnx.parser.parse_model(
        """
        <ir_version: 10, opset_import: ["" : 17, "test.gskit" : 1]>
        g (float[N, 256] x) => (float[N, 1024] y) {
            d = test.gskit.Duplicate(x)
            y = MatMul(d, w)
        }
        """
    )
    w = np.arange(512 * 1024, dtype=np.float32).reshape(512, 1024)
    model.graph.initializer.append(onnx.numpy_helper.from_array(w, "w"))
    inferred = infer_shapes(model, registry)
    assert _shapes(inferred)["d"] == ["N", 512]
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(inferred.graph.initializer[0]), w)
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(model.graph.initializer[0]), w)  # restored
    assert model.graph.initializer[0].data_location == onnx.TensorProto.DEFAULT


def test_infer_graph_shapes_sets_shapes_on_the_same_graph(registry, rng):
    graph = gsmodel.to_graph(_chain(rng))
    tensors = graph.tensors()
    assert tensors["d"].shape is None
    same = infer_graph_shapes(graph, registry)
    assert same is graph
    assert tensors["d"].shape == ["N", 8] and tensors["d"].dtype == np.float32
    assert tensors["z"].shape == ["N", 3, 1]


def test_infer_graph_shapes_does_not_export_weights(registry, monkeypatch):
    big = gs.Constant("w", np.ones((256, 512), np.float32))
    x = gs.Variable("x", np.float32, ("N", 128))
    d, y = gs.Variable("d"), gs.Variable("y", np.float32)
    nodes = [
        gs.Node("Duplicate", domain="test.gskit", inputs=[x], outputs=[d]),
        gs.Node("MatMul", inputs=[d, big], outputs=[y]),
    ]
    graph = gs.Graph(nodes=nodes, inputs=[x], outputs=[y], opset=17)
    exported: list[int] = []
    real = gsmodel.to_model

    def spy(g: gs.Graph) -> onnx.ModelProto:
        proto = real(g)
        exported.append(proto.ByteSize())
        return proto

    monkeypatch.setattr(gsmodel, "to_model", spy)
    infer_graph_shapes(graph, registry)
    assert exported and exported[0] < 10_000  # the 512 KiB weight was exported as a stub
    assert d.shape == ["N", 256] and y.shape == ["N", 512]
    assert big.values.shape == (256, 512) and float(big.values.sum()) == 512 * 256


def test_infer_shapes_path_with_external_data(registry, rng, tmp_path):
    model = onnx.parser.parse_model(CHAIN.replace("float[N, 4] x", "float[N, 128] x"))
    model.graph.output[0].CopyFrom(
        onnx.helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [None] * 3)
    )
    w = rng.standard_normal((256, 3)).astype(np.float32)  # 3 KiB: goes to the external data file
    model.graph.initializer.append(onnx.numpy_helper.from_array(w, "w"))
    source = gsmodel.save(model, tmp_path / "in" / "chain.onnx", external_data=True)
    assert (tmp_path / "in" / "chain.onnx.data").stat().st_size >= w.nbytes
    for out in (tmp_path / "in" / "inferred.onnx", tmp_path / "elsewhere" / "inferred.onnx"):
        infer_shapes_path(source, out, registry)
        inferred = gsmodel.load(out)
        assert _shapes(inferred)["d"] == ["N", 256]
        assert _shapes(inferred)["z"] == ["N", 3, 1]
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(inferred.graph.initializer[0]), w)


def _cli(*argv: str) -> int:
    from gskit.cli import infer_shapes as command

    return run_subcommand(command, *argv)


def test_cli_infer_shapes(plugin_dir, rng, tmp_path, capsys):
    source = gsmodel.save(_chain(rng), tmp_path / "chain.onnx")
    out = tmp_path / "out.onnx"
    assert _cli("infer-shapes", str(source), "-o", str(out), "--plugins", str(plugin_dir), "--json") == 0
    assert '"missing_shapes": []' in capsys.readouterr().out
    assert _shapes(gsmodel.load(out))["z"] == ["N", 3, 1]
    assert _cli("infer-shapes", str(source), "-o", str(source), "--plugins", str(plugin_dir)) == 2


def test_plugin_named_like_an_onnx_op_does_not_break_onnx_reference() -> None:
    """A plugin may share an ONNX op's name (acme::Swish); onnx.reference must still import afterwards."""
    import subprocess
    import sys

    code = (
        "from gskit.plugin import PluginRegistry, PluginSpec\n"
        "from gskit.passes.shapes import register_schemas\n"
        "register_schemas(PluginRegistry([PluginSpec(name='Swish', namespace='acme')]))\n"
        "import onnx.reference\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_onnx_op_types_are_every_name_of_every_version() -> None:
    """Made from the newest schema of each op: the same names as every version's schemas give."""
    from gskit.plugin import ops

    listed = frozenset(
        s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain in ops.ONNX_DOMAINS
    )
    assert ops.onnx_op_types() == listed and {"Relu", "Upsample", "Scatter", "LabelEncoder"} <= listed


@pytest.mark.parametrize(
    ("plugins", "indexed_first"),
    [
        ("[PluginSpec(name='Swish2', namespace='acme')]", False),  # a name of its own: not imported
        ("[PluginSpec(name='Swish', namespace='acme')]", True),  # named like an ONNX op
        (
            "[PluginSpec(name='Norm', namespace='a'), PluginSpec(name='Norm', namespace='b')]",
            True,
        ),  # one name
    ],
)
def test_onnx_reference_indexes_first_only_where_two_schemas_would_share_a_name(
    plugins, indexed_first
) -> None:
    """onnx.reference refuses two schemas of one name in different domains when it indexes them on its
    first import: register_schemas imports it first where its plugins would make such a pair, and
    onnx.reference imports afterwards either way."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from gskit.plugin import PluginRegistry, PluginSpec\n"
        "from gskit.passes.shapes import register_schemas\n"
        f"register_schemas(PluginRegistry({plugins}))\n"
        "print('indexed' if 'onnx.reference.op_run' in sys.modules else 'not indexed')\n"
        "import onnx.reference\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-800:]
    assert result.stdout.strip() == ("indexed" if indexed_first else "not indexed")


LN_AFTER_RESHAPE = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 6, 8] x, int64[{k}] s) => (float[N, 48] y)
  <float[8] w = {{1, 2, 1, 2, 1, 2, 1, 2}}, float[8] b = {{0, 1, 0, 1, 0, 1, 0, 1}}> {{
  r = Reshape(x, s)
  mean = ReduceMean <axes = [-1]> (r)
  d = Sub(r, mean)
  two = Constant <value = float {{2.0}}> ()
  sq = Pow(d, two)
  var = ReduceMean <axes = [-1]> (sq)
  eps = Constant <value = float {{0.001}}> ()
  ve = Add(var, eps)
  std = Sqrt(ve)
  nd = Div(d, std)
  nw = Mul(nd, w)
  n = Add(nw, b)
  y = Flatten(n)
}}
"""


@pytest.mark.parametrize("k", ["3", "K"], ids=["rank-known", "rank-unknown"])
def test_plugin_after_op_of_unknown_dims_keeps_what_is_known(k, tmp_path, rng):
    """A LayerNorm after a Reshape whose target shape is data: onnx knows the rank only when the shape
    input has a fixed length. Either way prepare runs through; an unknown rank is named where it was lost."""
    from gskit.pipeline.prepare import prepare
    from gskit.pipeline.recipe import load_recipe

    src = tmp_path / "m.onnx"
    gsmodel.save(parse_model(LN_AFTER_RESHAPE.format(k=k)), src)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        'target: {tensorrt: "8.5"}\n'  # older than LayerNormalization's 8.6: the LayerNorm plugin node
        "steps:\n  - replace\n  - infer_shapes\n  - validate: {shapes: {x: [2, 6, 8]}, inputs: feeds.npz}\n"
    )
    np.savez(
        tmp_path / "feeds.npz", x=rng.standard_normal((2, 6, 8)).astype(np.float32), s=np.array([2, 6, 8])
    )
    report = prepare(src, tmp_path / "out", recipe=load_recipe(recipe))
    step = next(s for s in report.steps if s.name == "infer_shapes")
    assert report.passed and step.status == "ok", step.summary
    prepared = onnx.load(tmp_path / "out" / "model.onnx")
    assert [n.op_type for n in prepared.graph.node] == ["Reshape", "LayerNorm", "Flatten"]
    if k == "3":
        assert step.summary == "every plugin output has a rank"
        (info,) = [v for v in prepared.graph.value_info if v.name == "n"]
        assert info.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
        dims = info.type.tensor_type.shape.dim
        assert len(dims) == 3 and dims[2].dim_value == 8  # the last dim from the weight's size
    else:
        assert "shape lost at 'r' (Reshape)" in step.summary


def test_plugin_rule_that_loses_the_rank_stops_infer_shapes(tmp_path):
    """Inputs with a rank and a plugin rule giving none: the run stops and names the plugin node."""
    from gskit.passes.shapes import unshaped_plugin_outputs
    from gskit.plugin import PluginRegistry, PluginSpec, TensorInfo

    spec = PluginSpec(name="Blind", namespace="test.gskit", infer=lambda i, a: [TensorInfo(i[0].dtype, None)])
    graph = gsmodel.to_graph(
        parse_model("""
        <ir_version: 8, opset_import: ["" : 17, "test.gskit" : 1]>
        g (float[2, 3] x) => (float[2, 3] y) { b = test.gskit.Blind (x)  y = Relu(b) }""")
    )
    registry = PluginRegistry([spec])
    infer_graph_shapes(graph, registry)
    (lost,) = unshaped_plugin_outputs(graph, registry)
    assert lost.origin is None and "output rule (spec.infer) must give a rank" in lost.describe()
