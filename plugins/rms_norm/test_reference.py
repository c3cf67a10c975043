"""RMSNorm reference against torch, ONNX RMSNormalization (opset 23) and the hand-written decomposition.

Tolerances: against a float64 torch computation on the same float32 inputs, rtol 1e-6 / atol 1e-6
(the reference computes in float64, so only the final float32 rounding differs); against float32
ONNX computations (ReferenceEvaluator, onnxruntime), rtol 1e-5 / atol 1e-5; float16 inputs within
rtol 1e-2 / atol 1e-2 of the float32 answer.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx.reference import ReferenceEvaluator

from .reference import rms_norm

# x * rsqrt(mean(x^2) + eps) * w, as the TorchScript exporter writes it.
DECOMPOSED = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, T, 6] x, float[6] w) => (float[N, T, 6] y) {
    two = Constant <value = float {2.0}> ()
    eps = Constant <value = float {1e-6}> ()
    sq = Pow (x, two)
    ms = ReduceMean <axes = [-1], keepdims = 1> (sq)
    me = Add (ms, eps)
    r = Sqrt (me)
    inv = Reciprocal (r)
    n = Mul (x, inv)
    y = Mul (n, w)
}
"""


def _cases(rng: np.random.Generator) -> list[tuple[np.ndarray, float]]:
    return [
        (rng.standard_normal((2, 3, 8)).astype(np.float32), 1e-6),
        (rng.standard_normal((1, 7)).astype(np.float32), 1e-5),  # odd size
        (rng.standard_normal((5, 1)).astype(np.float32), 1e-5),  # one element
        (np.zeros((3, 4), np.float32), 1e-5),  # all zeros: output zeros
        ((rng.standard_normal((4, 16)) * 1e4).astype(np.float32), 1e-5),  # large magnitudes
        ((-rng.random((2, 9)) * 1e-3).astype(np.float32), 1e-12),  # tiny eps, small negatives
        (rng.standard_normal((3, 5)).astype(np.float32), 1.0),  # large eps
    ]


@pytest.mark.torch
def test_matches_torch_rms_norm() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    for x, eps in _cases(rng):
        c = x.shape[-1]
        w = rng.standard_normal(c).astype(np.float32)
        expected = torch.nn.functional.rms_norm(
            torch.from_numpy(x).double(), (c,), torch.from_numpy(w).double(), eps=float(np.float32(eps))
        ).numpy()
        got = rms_norm(x, w, epsilon=eps)
        assert got.dtype == np.float32 and got.shape == x.shape
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6, err_msg=f"shape {x.shape} eps {eps}")


def test_matches_onnx_rms_normalization() -> None:
    model = onnx.parser.parse_model(
        """
        <ir_version: 10, opset_import: ["" : 23]>
        g (float[N, 5, 11] x, float[11] w) => (float[N, 5, 11] y) {
            y = RMSNormalization <axis = -1, epsilon = 0.001> (x, w)
        }
        """
    )
    onnx.checker.check_model(model)
    rng = np.random.default_rng(1)
    feeds = {
        "x": (rng.standard_normal((3, 5, 11)) * 3 + 2).astype(np.float32),
        "w": rng.standard_normal(11).astype(np.float32),
    }
    got = rms_norm(feeds["x"], feeds["w"], epsilon=1e-3)
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
    }
    got = rms_norm(feeds["x"], feeds["w"], epsilon=1e-6)
    (evaluator,) = ReferenceEvaluator(model).run(None, feeds)
    np.testing.assert_allclose(got, evaluator, rtol=1e-5, atol=1e-5)


def test_float16_is_computed_in_float32_and_cast_back() -> None:
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((4, 32)) * 300).astype(np.float16)  # squares overflow float16
    w = np.ones(32, np.float16)
    got = rms_norm(x, w, epsilon=1e-5)
    assert got.dtype == np.float16 and np.isfinite(got).all()
    expected = rms_norm(x.astype(np.float32), w.astype(np.float32), epsilon=1e-5)
    np.testing.assert_allclose(got.astype(np.float32), expected, rtol=1e-2, atol=1e-2)
