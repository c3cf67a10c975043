"""RMSNorm Triton kernel against the numpy reference.

On a CUDA GPU the ``gpu`` tests run the compiled kernel; without one, Triton's interpreter
(``TRITON_INTERPRET=1``, set here before Triton is imported) runs the same kernel on CPU tensors.
The output is NaN-filled before each run, so an element the kernel does not write fails the comparison.
Rows longer than the kernel's chunk (1024) and odd lengths are included. Tolerances: float32 rtol 1e-5 /
atol 1e-5 (float32 accumulation vs the reference's float64); float16 rtol 2e-3 / atol 2e-3 (one ulp).
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

from .kernel import rms_norm  # noqa: E402
from .reference import rms_norm as reference  # noqa: E402

CASES = [((1, 1), 1e-5), ((3, 7), 1e-6), ((2, 5, 64), 1e-5), ((4, 1000), 1e-3), ((2, 2051), 1e-5)]
TOLERANCE = {np.float32: (1e-5, 1e-5), np.float16: (2e-3, 2e-3)}


def _check(device: str, shape: tuple[int, ...], epsilon: float, dtype: type) -> None:
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 3 + 1).astype(dtype)
    w = rng.standard_normal(shape[-1]).astype(dtype)
    out = torch.full(shape, float("nan"), dtype=getattr(torch, np.dtype(dtype).name), device=device)
    rms_norm(torch.from_numpy(x).to(device), torch.from_numpy(w).to(device), out, epsilon=epsilon)
    rtol, atol = TOLERANCE[dtype]
    np.testing.assert_allclose(out.cpu().numpy(), reference(x, w, epsilon=epsilon), rtol=rtol, atol=atol)


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRETED or not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize(("shape", "epsilon"), CASES)
def test_gpu_matches_reference(shape: tuple[int, ...], epsilon: float, dtype: type) -> None:
    _check("cuda", shape, epsilon, dtype)


@pytest.mark.skipif(not INTERPRETED, reason="runs under TRITON_INTERPRET=1 (the default without a GPU)")
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize(("shape", "epsilon"), CASES)
def test_interpreter_matches_reference(shape: tuple[int, ...], epsilon: float, dtype: type) -> None:
    _check("cpu", shape, epsilon, dtype)


def _check_mixed(device: str) -> None:
    """float32 x, float16 weight: the output is float16 (the fp16 TorchScript form of Hugging Face norms)."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((3, 2051)) * 3 + 1).astype(np.float32)
    w = rng.standard_normal(2051).astype(np.float16)
    out = rms_norm(torch.from_numpy(x).to(device), torch.from_numpy(w).to(device), epsilon=1e-6)
    want = reference(x, w, epsilon=1e-6)
    assert out.dtype == torch.float16 and want.dtype == np.float16
    np.testing.assert_allclose(out.cpu().numpy(), want, rtol=2e-3, atol=2e-3)


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRETED or not CUDA, reason="needs a CUDA GPU")
def test_gpu_float32_input_float16_weight_writes_float16() -> None:
    _check_mixed("cuda")


@pytest.mark.skipif(not INTERPRETED, reason="runs under TRITON_INTERPRET=1 (the default without a GPU)")
def test_interpreter_float32_input_float16_weight_writes_float16() -> None:
    _check_mixed("cpu")


def test_wrong_weight_is_refused() -> None:
    with pytest.raises(ValueError, match="weight has 3 elements"):
        rms_norm(torch.zeros(2, 4), torch.zeros(3))
