"""LayerNorm reference against torch, ONNX LayerNormalization and the exported decomposition.

Tolerances: against a float64 torch computation on the same float32 inputs, rtol 1e-6 / atol 1e-6
(the reference computes in float64, so only the final float32 rounding differs); against float32
ONNX computations (ReferenceEvaluator, onnxruntime), rtol 1e-5 / atol 1e-5; float16 inputs within
rtol 1e-2 / atol 1e-2 of the float32 answer (half-precision output rounding).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx.reference import ReferenceEvaluator

from .reference import layer_norm

DECOMPOSED = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, T, 6] x, float[6] w, float[6] b) => (float[N, T, 6] y) {
    two = Constant <value = float {2.0}> ()
    eps = Constant <value = float {1e-5}> ()
    mean = ReduceMean <axes = [-1], keepdims = 1> (x)
    d = Sub (x, mean)
    sq = Pow (d, two)
    var = ReduceMean <axes = [-1], keepdims = 1> (sq)
    ve = Add (var, eps)
    std = Sqrt (ve)
    n = Div (d, std)
    s = Mul (n, w)
    y = Add (s, b)
}
"""


def _cases(rng: np.random.Generator) -> list[tuple[np.ndarray, float]]:
    return [
        (rng.standard_normal((2, 3, 8)).astype(np.float32), 1e-5),
        (rng.standard_normal((1, 7)).astype(np.float32), 1e-5),  # odd size
        (rng.standard_normal((5, 1)).astype(np.float32), 1e-5),  # one element: output is the bias
        (np.zeros((3, 4), np.float32), 1e-5),  # zero variance
        ((rng.standard_normal((4, 16)) * 1e4).astype(np.float32), 1e-5),  # large magnitudes
        ((1e4 + rng.standard_normal((4, 16))).astype(np.float32), 1e-5),  # large mean, small spread
        ((-rng.random((2, 9)) * 1e-3).astype(np.float32), 1e-12),  # tiny eps, small negatives
        (rng.standard_normal((3, 5)).astype(np.float32), 1.0),  # large eps
    ]


@pytest.mark.torch
def test_matches_torch_layer_norm() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    for x, eps in _cases(rng):
        c = x.shape[-1]
        w = rng.standard_normal(c).astype(np.float32)
        b = rng.standard_normal(c).astype(np.float32)
        expected = torch.nn.functional.layer_norm(
            torch.from_numpy(x).double(),
            (c,),
            torch.from_numpy(w).double(),
            torch.from_numpy(b).double(),
            eps=float(np.float32(eps)),
        ).numpy()
        got = layer_norm(x, w, b, epsilon=eps)
        assert got.dtype == np.float32 and got.shape == x.shape
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6, err_msg=f"shape {x.shape} eps {eps}")


@pytest.mark.parametrize("opset", [17, 18])
def test_matches_onnx_layer_normalization(opset: int) -> None:
    model = onnx.parser.parse_model(
        f"""
        <ir_version: 8, opset_import: ["" : {opset}]>
        g (float[N, 5, 11] x, float[11] w, float[11] b) => (float[N, 5, 11] y) {{
            y = LayerNormalization <axis = -1, epsilon = 0.001> (x, w, b)
        }}
        """
    )
    onnx.checker.check_model(model)
    rng = np.random.default_rng(1)
    feeds = {
        "x": (rng.standard_normal((3, 5, 11)) * 3 + 2).astype(np.float32),
        "w": rng.standard_normal(11).astype(np.float32),
        "b": rng.standard_normal(11).astype(np.float32),
    }
    got = layer_norm(feeds["x"], feeds["w"], feeds["b"], epsilon=1e-3)
    (evaluator,) = ReferenceEvaluator(model).run(None, feeds)
    np.testing.assert_allclose(got, evaluator, rtol=1e-5, atol=1e-5)
    (runtime,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    np.testing.assert_allclose(got, runtime, rtol=1e-5, atol=1e-5)


def test_matches_decomposition() -> None:
    model = onnx.parser.parse_model(DECOMPOSED)
    onnx.checker.check_model(model)
    rng = np.random.default_rng(2)
    feeds = {
        "x": (rng.standard_normal((2, 3, 6)) * 4 - 1).astype(np.float32),
        "w": rng.standard_normal(6).astype(np.float32),
        "b": rng.standard_normal(6).astype(np.float32),
    }
    got = layer_norm(feeds["x"], feeds["w"], feeds["b"], epsilon=1e-5)
    (evaluator,) = ReferenceEvaluator(model).run(None, feeds)
    np.testing.assert_allclose(got, evaluator, rtol=1e-5, atol=1e-5)


def test_float16_is_computed_in_float32_and_cast_back() -> None:
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((4, 32)) * 100).astype(np.float16)  # squares overflow float16
    w = np.ones(32, np.float16)
    b = np.zeros(32, np.float16)
    got = layer_norm(x, w, b, epsilon=1e-5)
    assert got.dtype == np.float16 and np.isfinite(got).all()
    expected = layer_norm(x.astype(np.float32), w.astype(np.float32), b.astype(np.float32), epsilon=1e-5)
    np.testing.assert_allclose(got.astype(np.float32), expected, rtol=1e-2, atol=1e-2)
