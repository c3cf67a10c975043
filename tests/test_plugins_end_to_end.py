"""Each plugin on each exported form of its pattern: ``gskit replace``, then ``gskit compare`` and checks.

For every case of ``exported_models.CASES`` and each exporter (TorchScript opset 17, dynamo): the
replacement writes exactly the planted number of plugin nodes, leaves none of the pattern's standard ops,
every tensor of the prepared model has an inferred dtype and shape, and the prepared model (plugin nodes
run through their numpy references) matches the original on onnxruntime within atol = rtol = 1e-5 (fp32).
The custom-domain DeformConv export cannot run on onnxruntime, so it is compared with its ONNX twin
(same weights, standard DeformConv node). The bundled example model gets the same treatment.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import exported_models as em
import numpy as np
import onnx
import pytest

from gskit.cli import main
from gskit.io import model as gsmodel
from gskit.passes.shapes import infer_shapes, missing_shapes
from gskit.plugin import load_plugins

PLUGINS_DIR = Path(__file__).resolve().parents[1] / "plugins"
EXAMPLE = Path(__file__).resolve().parents[1] / "gskit" / "data" / "example.onnx"
TOLERANCE = ["--atol", "1e-5", "--rtol", "1e-5"]


def _marks(case: em.Case) -> list[pytest.MarkDecorator]:
    return [] if case.name == "deform_conv_onnx" else [pytest.mark.torch, pytest.mark.slow]


PARAMS = [
    pytest.param(name, dynamo, id=f"{name}-{'dynamo' if dynamo else 'torchscript'}", marks=_marks(case))
    for name, case in em.CASES.items()
    for dynamo in case.exporters
]


@pytest.fixture(scope="module")
def registry():
    return load_plugins([PLUGINS_DIR], entry_points=False)


def _ops(model: onnx.ModelProto) -> Counter:
    return Counter((node.domain, node.op_type) for node in model.graph.node)


#: A TensorRT older than every native form (LayerNormalization 8.6, DeformConv 10.1, RMSNormalization 10.15):
#: these tests are about the plugin nodes (tests/test_native_forms.py tests the native forms).
PLUGIN_TARGET = "8.5"


def _replace(original: Path, prepared: Path) -> onnx.ModelProto:
    argv = ["replace", str(original), "-o", str(prepared), "--plugins", str(PLUGINS_DIR)]
    assert main([*argv, "--tensorrt", PLUGIN_TARGET]) == 0
    return gsmodel.load(prepared)


def _compare(original: Path, prepared: Path, batch: int = 3) -> None:
    # A batch other than the exported one checks that the dynamic axis survived.
    shape = ["--shape", f"x:{'x'.join(str(d) for d in (batch, *_input_dims(original)[1:]))}"]
    rc = main(["compare", str(original), str(prepared), "--plugins", str(PLUGINS_DIR), *TOLERANCE, *shape])
    assert rc == 0, f"outputs of {prepared.name} differ from {original.name} beyond 1e-5"


def _input_dims(path: Path) -> list[int | str]:
    (x,) = [i for i in gsmodel.load(path).graph.input if i.name == "x"]
    return [d.dim_param or d.dim_value for d in x.type.tensor_type.shape.dim]


def _check_shapes(prepared: onnx.ModelProto, registry) -> None:
    inferred = infer_shapes(prepared, registry, strict=True)
    assert missing_shapes(inferred) == []
    (y,) = [o for o in inferred.graph.output if o.name == "y"]
    first = y.type.tensor_type.shape.dim[0]
    assert first.dim_param, f"batch axis of y lost its symbol: {first}"


@pytest.mark.parametrize(("name", "dynamo"), PARAMS)
def test_replace_and_compare(name: str, dynamo: bool, tmp_path: Path, registry) -> None:
    case = em.CASES[name]
    try:
        original = em.export(name, tmp_path, dynamo=dynamo)
    except em.ExportUnsupported as err:
        pytest.skip(str(err))
    before = _ops(gsmodel.load(original))
    prepared = _replace(original, tmp_path / f"{original.stem}.prepared.onnx")
    after = _ops(prepared)

    assert after[("gskit", case.plugin)] == case.planted, f"plugin nodes: {dict(after)}"
    left = {key: n for key, n in after.items() if key[1] in case.gone and key[0] != "gskit"}
    assert not left, f"pattern ops left after replace: {left} (before: {dict(before)})"
    for node in prepared.graph.node:
        if node.domain == "gskit":
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            assert attrs["plugin_namespace"] == b"gskit" and attrs["plugin_version"] == b"1"
    _check_shapes(prepared, registry)
    reference = em.export(case.onnx_twin, tmp_path, dynamo=False) if case.onnx_twin else original
    _compare(reference, tmp_path / f"{original.stem}.prepared.onnx")


@pytest.mark.torch
@pytest.mark.slow
def test_custom_deform_conv_export_computes_what_its_onnx_twin_does(tmp_path: Path) -> None:
    """The twin used as the comparison reference is a faithful one: torch forward == twin on onnxruntime."""
    import torch

    from gskit.backends import ort as gort

    twin = em.export("deform_conv_onnx", tmp_path, dynamo=False)
    x = em.example_input("deform_conv_custom")
    (expected,) = gort.run(twin, {"x": x}).values()
    module = em._deform_conv_module(False).eval()
    with torch.no_grad():
        got = module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_example_model(tmp_path: Path, registry) -> None:
    """The bundled example: two ClampSwish and one LayerNorm replaced; shape computation left for folding."""
    before = _ops(gsmodel.load(EXAMPLE))
    assert before[("", "Shape")] == 1 and before[("", "Reshape")] == 1
    prepared_path = tmp_path / "example.prepared.onnx"
    prepared = _replace(EXAMPLE, prepared_path)
    after = _ops(prepared)
    assert after[("gskit", "ClampSwish")] == 2
    assert after[("gskit", "LayerNorm")] == 1
    assert not {k for k in after if k[1] in ("Exp", "Clip", "ReduceMean", "Sqrt")}
    _check_shapes(prepared, registry)
    _compare(EXAMPLE, prepared_path)
    assert EXAMPLE.stat().st_size < 200_000


def test_deform_conv_without_bias_and_mask(tmp_path: Path, registry) -> None:
    """Optional inputs left out (DCNv1): the plugin node has three inputs and still matches DeformConv."""
    weight = np.random.default_rng(0).standard_normal((6, 4, 3, 3)).astype(np.float32)
    node = onnx.helper.make_node(
        "DeformConv", ["x", "w", "offset"], ["y"], pads=[1, 2, 1, 0], strides=[1, 2], kernel_shape=[3, 3]
    )
    graph = onnx.helper.make_graph(
        [node],
        "dcn_v1",
        [
            onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 4, 5, 6]),
            onnx.helper.make_tensor_value_info("offset", onnx.TensorProto.FLOAT, ["batch", 18, 5, 3]),
        ],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 6, 5, 3])],
        initializer=[onnx.numpy_helper.from_array(weight, "w")],
    )
    original = tmp_path / "dcn_v1.onnx"
    gsmodel.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 19)]), original)
    prepared_path = tmp_path / "dcn_v1.prepared.onnx"
    prepared = _replace(original, prepared_path)
    (plugin,) = prepared.graph.node
    assert (plugin.domain, plugin.op_type, len([i for i in plugin.input if i])) == (
        "gskit",
        "DeformConv2d",
        3,
    )
    _check_shapes(prepared, registry)
    shapes = ["--shape", "x:3x4x5x6", "--shape", "offset:3x18x5x3"]
    rc = main(
        ["compare", str(original), str(prepared_path), "--plugins", str(PLUGINS_DIR), *TOLERANCE, *shapes]
    )
    assert rc == 0
