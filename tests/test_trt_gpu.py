"""TensorRT on a GPU: engines built and run with full TensorRT, compared with onnxruntime.

These run in the Docker GPU CI (docker/run-gpu-tests.sh); elsewhere the ``trt``/``gpu`` markers skip them.
Tolerances: TensorRT may use TF32 for fp32 math (10-bit mantissa), so outputs are compared with
rtol = atol = 1e-3 on values of order 1.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import parse_model

from gskit.backends import ort
from gskit.backends.trt import run_engine
from gskit.backends.trt_build import build_engine
from gskit.plugin import load_spec_file

pytestmark = [pytest.mark.trt, pytest.mark.gpu]

REPO = Path(__file__).resolve().parent.parent
TRT_PLUGIN_FOLDERS = sorted(p.parent for p in (REPO / "plugins").glob("*/trt_plugin.py"))
RTOL = ATOL = 1e-3

SMALL_CNN = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[N,3,8,8] x) => (float[N,4] y)
  <float[4,3,3,3] w, float[4] b, float[4,4] m> {
  c = Conv<pads: ints = [1, 1, 1, 1]>(x, w, b)
  r = Relu(c)
  p = GlobalAveragePool(r)
  f = Flatten(p)
  y = MatMul(f, m)
}
"""


def _small_cnn(rng) -> onnx.ModelProto:
    model = parse_model(SMALL_CNN)
    for init in model.graph.initializer:
        shape = tuple(init.dims)
        init.CopyFrom(
            onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.3, init.name)
        )
    return model


def test_engine_matches_onnxruntime(tmp_path, rng):
    path = tmp_path / "cnn.onnx"
    onnx.save(_small_cnn(rng), path)
    info = build_engine(
        path, tmp_path / "cnn.engine", shapes={"x": ((1, 3, 8, 8), (2, 3, 8, 8), (4, 3, 8, 8))}
    )
    assert info.tensorrt["flavour"] == "tensorrt"
    for batch in (1, 3):
        feeds = {"x": rng.standard_normal((batch, 3, 8, 8)).astype(np.float32)}
        expected = ort.run(path, feeds)["y"]
        actual = run_engine(info.engine, feeds)["y"]
        np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL)


def test_run_engine_builds_an_onnx_model_on_the_fly(tmp_path, rng):
    path = tmp_path / "cnn.onnx"
    onnx.save(_small_cnn(rng), path)
    feeds = {"x": rng.standard_normal((2, 3, 8, 8)).astype(np.float32)}
    np.testing.assert_allclose(run_engine(path, feeds)["y"], ort.run(path, feeds)["y"], rtol=RTOL, atol=ATOL)


def _example_inputs(folder: Path, spec, rng) -> list[np.ndarray]:
    """Inputs for a one-node model: the plugin module's ``example_inputs(rng)`` if it has one, else a
    (2, 8) first input and (8,) for the others (per-channel weights of the last axis)."""
    module_spec = importlib.util.spec_from_file_location(f"_example_{folder.name}", folder / "trt_plugin.py")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    if hasattr(module, "example_inputs"):
        return list(module.example_inputs(rng))
    return [
        rng.standard_normal((2, 8) if i == 0 else (8,)).astype(np.float32) for i in range(len(spec.inputs))
    ]


@pytest.mark.parametrize(
    "folder",
    TRT_PLUGIN_FOLDERS
    or [pytest.param(None, marks=pytest.mark.skip(reason="no plugin has trt_plugin.py yet"))],
    ids=[p.name for p in TRT_PLUGIN_FOLDERS] or ["none"],
)
def test_plugin_engine_matches_its_reference(tmp_path, rng, folder):
    import onnx_graphsurgeon as gs

    from gskit import model as gsmodel

    (spec, *_) = load_spec_file(folder / "spec.py")
    arrays = _example_inputs(folder, spec, rng)
    named = zip(spec.inputs, arrays, strict=True)
    inputs = [gs.Variable(name, dtype=a.dtype, shape=a.shape) for name, a in named]
    outputs = [gs.Variable(name, dtype=arrays[0].dtype) for name in spec.outputs]
    graph = gs.Graph(nodes=[spec.make_node(inputs, outputs)], inputs=inputs, outputs=outputs, opset=17)
    graph.import_domains = [onnx.helper.make_opsetid("", 17), onnx.helper.make_opsetid(spec.domain, 1)]
    path = tmp_path / f"{folder.name}.onnx"
    gsmodel.save(gsmodel.to_model(graph), path, check=False)
    info = build_engine(path, tmp_path / f"{folder.name}.engine", plugins=[folder])
    assert info.plugins == [spec.qualified_name]
    feeds = dict(zip(spec.inputs, arrays, strict=True))
    actual = run_engine(info.engine, feeds, plugins=[folder])
    expected = spec.run_reference(arrays, {})
    for name, want in zip(spec.outputs, expected, strict=True):
        np.testing.assert_allclose(actual[name], want, rtol=RTOL, atol=ATOL)
