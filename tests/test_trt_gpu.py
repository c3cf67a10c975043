"""TensorRT on a GPU: engines built and run with full TensorRT, compared with onnxruntime.

These run in the Docker GPU CI (docker/run-gpu-tests.sh); elsewhere the ``trt``/``gpu`` markers skip them.
Tolerances: TensorRT may use TF32 for fp32 math (10-bit mantissa), so outputs are compared with
rtol = atol = 1e-3 on values of order 1.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import parse_model
from plugin_folders import example_inputs, input_names, one_node_model, plugin_folders

from gskit.backends import ort
from gskit.backends.trt import run_engine
from gskit.backends.trt_build import build_engine
from gskit.plugin import load_spec_file

pytestmark = [pytest.mark.trt, pytest.mark.gpu]

TRT_PLUGIN_FOLDERS = plugin_folders("trt_plugin.py")
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


@pytest.mark.parametrize(
    "folder",
    TRT_PLUGIN_FOLDERS
    or [pytest.param(None, marks=pytest.mark.skip(reason="no plugin has trt_plugin.py yet"))],
    ids=[p.name for p in TRT_PLUGIN_FOLDERS] or ["none"],
)
def test_plugin_engine_matches_its_reference(tmp_path, rng, folder):
    from gskit.io import model as gsmodel

    (spec, *_) = load_spec_file(folder / "spec.py")
    arrays = example_inputs(folder, rng)
    path = tmp_path / f"{folder.name}.onnx"
    gsmodel.save(one_node_model(spec, arrays), path, check=False)
    info = build_engine(path, tmp_path / f"{folder.name}.engine", plugins=[folder])
    assert info.plugins == [spec.qualified_name]
    feeds = dict(zip(input_names(spec), arrays, strict=True))
    actual = run_engine(info.engine, feeds, plugins=[folder])
    expected = spec.run_reference(arrays, {})
    for name, want in zip(spec.outputs, expected, strict=True):
        np.testing.assert_allclose(actual[name], want, rtol=RTOL, atol=ATOL)


def test_rms_norm_engine_reads_float32_and_writes_the_float16_weight_dtype(tmp_path, rng):
    """The fp16 TorchScript form of Hugging Face norms: a float32 x, a float16 weight, a float16 output."""
    import onnx_graphsurgeon as gs

    from gskit.io import model as gsmodel

    folder = next(f for f in TRT_PLUGIN_FOLDERS if f.name == "rms_norm")
    (spec, *_) = load_spec_file(folder / "spec.py")
    x = gs.Variable("x", dtype=np.float32, shape=(2, 8, 64))
    w = gs.Constant("w", rng.standard_normal(64).astype(np.float16))
    y = gs.Variable("y", dtype=np.float16, shape=(2, 8, 64))
    graph = gs.Graph(
        nodes=[spec.make_node([x, w], [y], {"epsilon": 1e-6})], inputs=[x], outputs=[y], opset=17
    )
    path = tmp_path / "mixed.onnx"
    gsmodel.save(graph, path, check=False)
    info = build_engine(path, tmp_path / "mixed.engine", plugins=[folder])
    feeds = {"x": (rng.standard_normal((2, 8, 64)) * 3).astype(np.float32)}
    actual = run_engine(info.engine, feeds, plugins=[folder])["y"]
    (want,) = spec.run_reference([feeds["x"], w.values], {"epsilon": 1e-6})
    assert actual.dtype == want.dtype == np.float16
    np.testing.assert_allclose(actual.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3)


def _own_plugin_folders() -> list:
    return [f for f in plugin_folders() if load_spec_file(f / "spec.py")[0].library is not None]


OWN_PLUGIN_FOLDERS = _own_plugin_folders()


@pytest.mark.parametrize("folder", OWN_PLUGIN_FOLDERS, ids=[p.name for p in OWN_PLUGIN_FOLDERS])
def test_tensorrt_own_plugin_matches_its_reference(tmp_path, rng, folder):
    """TensorRT's own plugin (libnvinfer_plugin, no plugin files given) against the folder's reference."""
    from gskit.io import model as gsmodel

    (spec, *_) = load_spec_file(folder / "spec.py")
    arrays = example_inputs(folder, rng)
    path = tmp_path / f"{folder.name}.onnx"
    gsmodel.save(one_node_model(spec, arrays), path, check=False)
    info = build_engine(path, tmp_path / f"{folder.name}.engine")
    assert info.plugins == [f"{spec.name} v{spec.version}"] and info.plugin_files == []
    feeds = dict(zip(input_names(spec), arrays, strict=True))
    actual = run_engine(info.engine, feeds)
    expected = spec.run_reference(arrays, {})
    for name, want in zip(spec.outputs, expected, strict=True):
        np.testing.assert_allclose(actual[name], want, rtol=RTOL, atol=ATOL)
