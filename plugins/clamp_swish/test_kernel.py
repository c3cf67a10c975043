"""ClampSwish Triton kernel against the numpy reference.

On a CUDA GPU the ``gpu`` tests run the compiled kernel; without one, Triton's interpreter
(``TRITON_INTERPRET=1``, set here before Triton is imported) runs the same kernel on CPU tensors.
The output is NaN-filled before each run, so an element the kernel does not write fails the comparison.
Tolerances: float32 rtol 1e-5 / atol 1e-6 (exp's last-bit differences); float16 rtol 1e-3 / atol 1e-3
(one float16 ulp: kernel and reference both round a float32 result).
"""

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

from .kernel import clamp_swish  # noqa: E402
from .reference import clamp_swish as reference  # noqa: E402

SHAPES = [(1,), (7,), (3, 5, 11), (1025,), (2, 3, 4, 129)]
TOLERANCE = {np.float32: (1e-5, 1e-6), np.float16: (1e-3, 1e-3)}


def _check(device: str, shape: tuple[int, ...], dtype: type) -> None:
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 4).astype(dtype)
    x.flat[0] = -0.0
    out = torch.full(shape, float("nan"), dtype=getattr(torch, np.dtype(dtype).name), device=device)
    clamp_swish(torch.from_numpy(x).to(device), out)
    rtol, atol = TOLERANCE[dtype]
    np.testing.assert_allclose(out.cpu().numpy(), reference(x), rtol=rtol, atol=atol)


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRETED or not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_gpu_matches_reference(shape: tuple[int, ...], dtype: type) -> None:
    _check("cuda", shape, dtype)


@pytest.mark.skipif(not INTERPRETED, reason="runs under TRITON_INTERPRET=1 (the default without a GPU)")
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_interpreter_matches_reference(shape: tuple[int, ...], dtype: type) -> None:
    _check("cpu", shape, dtype)


def test_nan_stays_nan_and_large_inputs_are_finite() -> None:
    device = "cpu" if INTERPRETED else "cuda"
    if not (INTERPRETED or CUDA):
        pytest.skip("needs a GPU or TRITON_INTERPRET=1")
    x = np.array([np.nan, -1e30, 1e30, 88.0, -0.5], np.float32)
    got = clamp_swish(torch.from_numpy(x).to(device)).cpu().numpy()
    np.testing.assert_allclose(got, reference(x), rtol=1e-6, equal_nan=True)
