"""compare on TensorRT: onnxruntime runs the original, TensorRT the prepared model or its engine.

These run in the Docker GPU CI (docker/run-gpu-tests.sh); elsewhere the ``trt``/``gpu`` markers skip them.
Tolerances: TensorRT may use TF32 for fp32 math (10-bit mantissa), so values of order 1 are compared
with rtol = atol = 1e-3; the planted faults are 100x larger than that.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

import gskit
from gskit.backends.trt_build import build_engine
from gskit.compare.layers import compare_layerwise
from gskit.compare.outputs import compare
from gskit.compare.plugins import compare_plugins
from gskit.io import model as gsmodel
from gskit.passes.fold import fold
from gskit.passes.patterns import replace
from gskit.passes.shapes import infer_graph_shapes
from gskit.plugin import load_plugins

pytestmark = [pytest.mark.trt, pytest.mark.gpu]

EXAMPLE = Path(gskit.__file__).parent / "data" / "example.onnx"
REPO_PLUGINS = Path(gskit.__file__).parent.parent / "plugins"
SHAPE = (2, 4, 8, 8)
TOL = {"atol": 1e-3, "rtol": 1e-3}


@pytest.fixture(scope="module")
def registry():
    return load_plugins([REPO_PLUGINS], entry_points=False)


@pytest.fixture(scope="module")
def prepared(registry, tmp_path_factory) -> Path:
    graph = gsmodel.to_graph(gsmodel.load(EXAMPLE))
    infer_graph_shapes(graph, registry, strict=False)
    replace(graph, registry, tensorrt="8.5")  # older than every native form: the plugins run in TensorRT
    infer_graph_shapes(graph, registry, strict=False)
    folded, _ = fold(graph, plugins=registry)
    return gsmodel.save(folded, tmp_path_factory.mktemp("trt") / "prepared.onnx")


def _planted(prepared: Path, tmp_path: Path) -> Path:
    model = gsmodel.load(prepared)
    for tensor in model.graph.initializer:
        if tensor.name == "fc1.bias":
            values = onnx.numpy_helper.to_array(tensor).copy()
            values[5] += 0.25
            tensor.CopyFrom(onnx.numpy_helper.from_array(values, tensor.name))
    return gsmodel.save(model, tmp_path / "planted.onnx")


def test_outputs_of_tensorrt_match_onnxruntime(prepared, registry):
    report = compare(
        EXAMPLE,
        prepared,
        shapes={"x": SHAPE},
        plugins=registry,
        backend="trt",
        trt_plugins=[REPO_PLUGINS],
        **TOL,
    )
    assert report.passed and report.under_test == "tensorrt"
    assert [o.name for o in report.outputs] == ["y"]


def test_engine_file_is_compared(prepared, registry, tmp_path):
    engine = tmp_path / "prepared.engine"
    build_engine(
        prepared, engine, plugins=[REPO_PLUGINS], shapes={"x": (SHAPE, SHAPE, SHAPE)}, backend="tensorrt"
    )
    report = compare(
        EXAMPLE, None, shapes={"x": SHAPE}, plugins=registry, engine=engine, trt_plugins=[REPO_PLUGINS], **TOL
    )
    assert report.passed


def test_planted_fault_fails_on_tensorrt(prepared, registry, tmp_path):
    report = compare(
        EXAMPLE,
        _planted(prepared, tmp_path),
        shapes={"x": SHAPE},
        plugins=registry,
        backend="trt",
        trt_plugins=[REPO_PLUGINS],
        **TOL,
    )
    assert not report.passed


def test_layerwise_on_tensorrt_uses_debug_tensors(prepared, registry, tmp_path):
    good = compare_layerwise(
        EXAMPLE,
        prepared,
        shapes={"x": SHAPE},
        plugins=registry,
        backend="trt",
        trt_plugins=[REPO_PLUGINS],
        chunk=2,
        **TOL,
    )
    assert good.passed and good.candidates >= 4  # at least the plugin boundaries survive fusion
    bad = compare_layerwise(
        EXAMPLE,
        _planted(prepared, tmp_path),
        shapes={"x": SHAPE},
        plugins=registry,
        backend="trt",
        trt_plugins=[REPO_PLUGINS],
        chunk=2,
        **TOL,
    )
    # the Gemm output feeds the LayerNorm plugin, so it cannot be fused away
    assert bad.first_failure is not None and bad.first_failure.tensor.name == "/fc1/Gemm_output_0"


def test_per_plugin_on_tensorrt(prepared, registry):
    report = compare_plugins(
        EXAMPLE,
        prepared,
        shapes={"x": SHAPE},
        plugins=registry,
        backend="trt",
        trt_plugins=[REPO_PLUGINS],
        **TOL,
    )
    assert report.under_test == "tensorrt" and len(report.plugins) == 3
    assert report.passed, [(p.node, p.max_abs_err, p.note) for p in report.failed]
