"""gskit.torch_export: the seed's export cases end to end (scripts/export_cases.py), checked with PyTorch."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from gskit.errors import GskitError

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "export_cases.py"
TOL = 1e-5


@pytest.fixture(scope="module")
def cases():
    """The example script as a module (so the documented examples are what the tests run)."""
    spec = importlib.util.spec_from_file_location("gskit_export_cases", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: (a.type, onnx.helper.get_attribute_value(a)) for a in node.attribute}


def _plugin_nodes(model: onnx.ModelProto, op: str) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == op]


def _check_routing(node: onnx.NodeProto, name: str) -> dict:
    attrs = _attrs(node)
    assert (node.domain, node.op_type) == ("gskit", name)
    assert attrs["plugin_namespace"] == (onnx.AttributeProto.STRING, b"gskit")
    assert attrs["plugin_version"] == (onnx.AttributeProto.STRING, b"1")
    return attrs


def _check_stages(result) -> None:
    assert result.stages, "no stage ran"
    for stage, _, _, error in result.stages:
        assert error <= TOL, f"{stage}: max error {error}"


def test_import_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['onnxscript'] = None\n"
        "import gskit.torch_export as te\n"
        "from gskit.errors import GskitError\n"
        "try:\n    te.register_symbolic('aten::asinh', onnx_op='Asinh')\n"
        "except GskitError as err:\n    print('ERR', err)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "ERR" in done.stdout and "pip install gskit[torch]" in done.stdout


@pytest.mark.torch
@pytest.mark.parametrize("dynamo", [False, True])
def test_asinh_symbolic(cases, tmp_path, dynamo):
    result = cases.case_asinh(tmp_path, dynamo)
    _check_stages(result)
    assert [n.op_type for n in result.exported.graph.node] == ["Asinh"]


@pytest.mark.torch
def test_asinh_registration_is_removed(cases, tmp_path):
    from gskit.torch_export import export, register_symbolic

    model, args = cases.Asinh().eval(), (cases.torch.randn(2, 5),)
    with register_symbolic("aten::asinh", onnx_op="Asinh", opset=9) as registration:
        export(model, args, tmp_path / "a.onnx", opset=9)
    assert not registration.active
    with pytest.raises(GskitError, match="asinh"):
        export(model, args, tmp_path / "b.onnx", opset=9)


@pytest.mark.torch
def test_wrong_symbolic_fails_validation(cases, tmp_path):
    from gskit.torch_export import export, register_symbolic

    model, args = cases.Asinh().eval(), (cases.torch.randn(2, 5),)
    with register_symbolic("aten::asinh", onnx_op="Sinh", opset=9):
        with pytest.raises(GskitError, match="differs from PyTorch"):
            export(model, args, tmp_path / "a.onnx", opset=9)


@pytest.mark.torch
@pytest.mark.parametrize("dynamo", [False, True])
def test_inlined_function_replaced(cases, tmp_path, dynamo):
    result = cases.case_inlined(tmp_path, dynamo)
    _check_stages(result)
    assert not _plugin_nodes(result.exported, "ClampSwish")  # the exporter inlined the Function
    (node,) = _plugin_nodes(result.final, "ClampSwish")
    assert set(_check_routing(node, "ClampSwish")) == {"plugin_namespace", "plugin_version"}


@pytest.mark.torch
@pytest.mark.parametrize("dynamo", [False, True])
def test_function_as_plugin(cases, tmp_path, dynamo):
    result = cases.case_function(tmp_path, dynamo)
    _check_stages(result)
    (node,) = _plugin_nodes(result.exported, "ClampSwish")  # straight out of the exporter
    _check_routing(node, "ClampSwish")
    assert {n.op_type for n in result.exported.graph.node} <= {"ClampSwish", "Mul", "Constant"}


@pytest.mark.torch
def test_function_outside_export_unchanged(cases):
    torch = cases.torch
    x = torch.randn(2, 3)
    assert torch.equal(cases.ClampSwishPlugin.apply(x), cases.ClampSwishFunction.apply(x))
    assert cases.ClampSwishPlugin.apply.__self__ is cases.ClampSwishPlugin  # how the tracer finds symbolic


@pytest.mark.torch
@pytest.mark.parametrize("dynamo", [False, True])
def test_deform_conv2d(cases, tmp_path, dynamo):
    result = cases.case_deform_conv(tmp_path, dynamo)
    _check_stages(result)
    (node,) = _plugin_nodes(result.exported, "DeformConv2d")
    attrs = _check_routing(node, "DeformConv2d")
    ints, int_ = onnx.AttributeProto.INTS, onnx.AttributeProto.INT
    assert attrs["strides"] == (ints, [1, 1])
    assert attrs["pads"] == (ints, [1, 1, 1, 1])
    assert attrs["dilations"] == (ints, [1, 1])
    assert attrs["group"] == (int_, 1)
    assert attrs["offset_group"] == (int_, 1)
    assert len(node.input) == 4  # x, weight, offset, bias; no mask (use_mask=False)
    shapes = {
        vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in result.final.graph.output
    }
    assert shapes["y"] == [1, 4, 7, 7]


@pytest.mark.torch
def test_modules_as_functions(cases, tmp_path):
    result = cases.case_modules(tmp_path)
    _check_stages(result)
    nodes = _plugin_nodes(result.exported, "LayerNorm")
    assert len(nodes) == 2
    eps = sorted(_check_routing(n, "LayerNorm")["epsilon"][1] for n in nodes)
    assert eps == pytest.approx([1e-5, 1e-3])
    assert all(_attrs(n)["epsilon"][0] == onnx.AttributeProto.FLOAT for n in nodes)
    assert [len(n.input) for n in nodes] == [3, 3]
    assert not result.exported.functions  # the MyLayerNorm function is gone


@pytest.mark.torch
def test_modules_as_functions_needs_opset_15(cases, tmp_path):
    from gskit.torch_export import export_as_plugins

    with pytest.raises(GskitError, match="opset >= 15"):
        export_as_plugins(
            cases.TwoNorms(),
            (cases.torch.randn(1, 16),),
            tmp_path / "m.onnx",
            {cases.MyLayerNorm: cases.LAYER_NORM},
            opset=13,
        )


@pytest.mark.torch
def test_plugin_attribute_checked_by_spec(cases, tmp_path):
    from gskit.errors import PluginError
    from gskit.torch_export import Call, export, register_symbolic

    def bad(*args):
        return cases.bind_deform_conv2d(*args)._replace(attrs={"group": 2**40})

    op = cases.deform_conv2d_op()
    with register_symbolic(
        op, plugin=cases.DEFORM_CONV, arg_types=cases.DEFORM_ARG_TYPES, bind=bad, opset=12
    ):
        with pytest.raises(GskitError, match="int32"):
            export(cases.DeformConv().eval(), (cases.torch.rand(1, 3, 7, 7),), tmp_path / "d.onnx", opset=12)
    assert issubclass(PluginError, GskitError) and Call
