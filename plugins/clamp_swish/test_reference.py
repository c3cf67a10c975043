"""ClampSwish reference against torch and against the exported decomposition on onnx's ReferenceEvaluator.

Tolerances: float32 results within rtol 1e-6 / atol 1e-7 of a float64 computation (one or two float32
ulps); the float32 ONNX decomposition within rtol 1e-5 / atol 1e-6; float16 within rtol 1e-3 / atol 1e-3
(half-precision rounding of the output).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

from .reference import clamp_swish

EDGES = np.array(
    [0.0, -0.0, 1e-30, -1e-30, 1e-7, -1.0, 1.0, -88.0, 88.0, 1e4, -1e4, 3.4e38, -3.4e38, np.inf, -np.inf],
    dtype=np.float32,
)


def _inputs(rng: np.random.Generator) -> list[np.ndarray]:
    return [
        EDGES,
        rng.standard_normal((2, 3, 5, 7)).astype(np.float32),
        (rng.standard_normal((3, 1, 11)) * 50).astype(np.float32),
        np.zeros((4, 4), np.float32),
        -np.abs(rng.standard_normal((9,))).astype(np.float32),
    ]


def _float64_expected(x: np.ndarray) -> np.ndarray:
    xc = np.maximum(x.astype(np.float64), 0.0)
    with np.errstate(over="ignore"):
        return xc * (1.0 / (1.0 + np.exp(-xc)))


@pytest.mark.torch
def test_matches_torch_clamp_sigmoid() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    for x in _inputs(rng):
        xt = torch.from_numpy(x).double().clamp(min=0)
        expected = (xt * torch.sigmoid(xt)).numpy()
        got = clamp_swish(x)
        assert got.dtype == np.float32 and got.shape == x.shape
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


def test_matches_float64_formula_and_keeps_nan() -> None:
    x = np.concatenate([EDGES, np.array([np.nan], np.float32)])
    got = clamp_swish(x)
    np.testing.assert_allclose(got[:-1], _float64_expected(x[:-1]), rtol=1e-6, atol=1e-7)
    assert np.isnan(got[-1])
    assert np.all(got[:-1][x[:-1] <= 0] == 0)


def test_matches_decomposition_on_reference_evaluator() -> None:
    # What the TorchScript exporter writes for x.clamp(min=0); x / (1 + exp(-x)).
    model = onnx.parser.parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 7] x) => (float[N, 7] y) {
            zero = Constant <value = float {0.0}> ()
            one = Constant <value = float {1.0}> ()
            c = Clip (x, zero)
            n = Neg (c)
            e = Exp (n)
            d = Add (e, one)
            y = Div (c, d)
        }
        """
    )
    onnx.checker.check_model(model)
    x = (np.random.default_rng(1).standard_normal((5, 7)) * 10).astype(np.float32)
    (expected,) = ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_allclose(clamp_swish(x), expected, rtol=1e-5, atol=1e-6)


def test_float16_is_computed_in_float32_and_cast_back() -> None:
    x = (np.random.default_rng(2).standard_normal((4, 33)) * 8).astype(np.float16)
    got = clamp_swish(x)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), _float64_expected(x), rtol=1e-3, atol=1e-3)
    assert np.isfinite(clamp_swish(np.array([60000.0, -60000.0], np.float16))).all()
