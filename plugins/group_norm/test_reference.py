"""GroupNorm reference against torch, ONNX GroupNormalization (opset 21) and the exporters' decomposition.

Tolerances: against a float64 torch computation on the same float32 inputs, rtol 1e-6 / atol 1e-6 (the
reference computes in float64, only the final float32 rounding differs); against float32 computations on
onnxruntime, rtol 1e-5 / atol 1e-5.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from .reference import group_norm

# nn.GroupNorm(2, 4) as the TorchScript exporter writes it, with weight and bias as inputs of shape (4, 1, 1).
DECOMPOSED = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 4, 3, 5] x, float[4, 1, 1] w, float[4, 1, 1] b) => (float[2, 4, 3, 5] y) {
    groups = Constant <value = int64[3] {0, 2, -1}> ()
    r = Reshape (x, groups)
    ones = Constant <value = float[2] {1.0, 1.0}> ()
    zeros = Constant <value = float[2] {0.0, 0.0}> ()
    n = InstanceNormalization <epsilon = 1e-5> (r, ones, zeros)
    s = Shape (x)
    back = Reshape (n, s)
    m = Mul (back, w)
    y = Add (m, b)
}
"""

NATIVE = """
<ir_version: 10, opset_import: ["" : 21]>
g (float[2, 4, 3, 5] x, float[4] w, float[4] b) => (float[2, 4, 3, 5] y) {
    y = GroupNormalization <epsilon = 1e-5, num_groups = 2> (x, w, b)
}
"""


def _run(text: str, feeds: dict[str, np.ndarray]) -> np.ndarray:
    model = onnx.parser.parse_model(text)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _inputs(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = (rng.standard_normal((2, 4, 3, 5)) * 3 + 1).astype(np.float32)
    return x, rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)


@pytest.mark.torch
@pytest.mark.parametrize("groups", [1, 2, 4])
def test_matches_torch_group_norm(groups: int) -> None:
    torch = pytest.importorskip("torch")
    x, w, b = _inputs(np.random.default_rng(groups))
    expected = torch.nn.functional.group_norm(
        torch.from_numpy(x).double(), groups, torch.from_numpy(w).double(), torch.from_numpy(b).double(), 1e-5
    ).numpy()
    got = group_norm(x, w, b, epsilon=1e-5, num_groups=groups)
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_matches_onnx_group_normalization_21_and_the_decomposition() -> None:
    x, w, b = _inputs(np.random.default_rng(0))
    expected = group_norm(x, w, b, epsilon=1e-5, num_groups=2)
    native = _run(NATIVE, {"x": x, "w": w, "b": b})
    decomposed = _run(DECOMPOSED, {"x": x, "w": w.reshape(4, 1, 1), "b": b.reshape(4, 1, 1)})
    np.testing.assert_allclose(native, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(decomposed, expected, rtol=1e-5, atol=1e-5)


def test_channels_that_do_not_split_are_refused() -> None:
    x = np.zeros((1, 6, 2), np.float32)
    with pytest.raises(ValueError, match="6 channels do not split into 4 groups"):
        group_norm(x, np.ones(6, np.float32), np.zeros(6, np.float32), num_groups=4)
