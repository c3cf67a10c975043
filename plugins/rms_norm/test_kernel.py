"""RMSNorm Triton kernel against the numpy reference.

On a CUDA GPU the ``gpu`` tests run the compiled kernel; without one, Triton's interpreter
(``TRITON_INTERPRET=1``, set here before Triton is imported) runs the same kernel on CPU tensors.
The output is NaN-filled before each run, so an element the kernel does not write fails the comparison.
Odd lengths and rows longer than MAX_FIT (read in chunks) are included. Every launch configuration the tuning
sweep may pick (``gskit.backends.row_launch.row_candidates``) runs on row counts that leave the last program
partly empty, so a configuration a rule picks later is checked already. Tolerances: float32 rtol/atol 1e-5
(float32 accumulation vs the reference's float64); float16 rtol/atol 2e-3 (one ulp); bfloat16 rtol/atol
1.6e-2 (two bfloat16 ulps: the reference rounds its float64 result once, the kernel its float32 one).
"""

import os
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

from gskit.backends.row_launch import RowLaunch, row_candidates  # noqa: E402

from .kernel import rms_norm  # noqa: E402
from .reference import rms_norm as reference  # noqa: E402

CASES = [((1, 1), 1e-5), ((3, 7), 1e-6), ((2, 5, 64), 1e-5), ((4, 1000), 1e-3), ((2, 2051), 1e-5)]
TOLERANCE = {np.float32: (1e-5, 1e-5), np.float16: (2e-3, 2e-3)}
TORCH_TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


def _check(device: str, shape: tuple[int, ...], epsilon: float, dtype: type) -> None:
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 3 + 1).astype(dtype)
    w = rng.standard_normal(shape[-1]).astype(dtype)
    out = torch.full(shape, float("nan"), dtype=getattr(torch, np.dtype(dtype).name), device=device)
    rms_norm(torch.from_numpy(x).to(device), torch.from_numpy(w).to(device), out, epsilon=epsilon)
    rtol, atol = TOLERANCE[dtype]
    np.testing.assert_allclose(out.cpu().numpy(), reference(x, w, epsilon=epsilon), rtol=rtol, atol=atol)


#: (rows, cols): rows not a multiple of any ROWS > 1; cols below, at and above a power of two, and past
#: MAX_FIT (read in chunks).
LAUNCH_SHAPES = [(5, 77), (9, 1030), (3, 4096), (2, 5000), (2, 20000)]
LAUNCH_CASES = [
    (rows, cols, launch)
    for rows, cols in LAUNCH_SHAPES
    for launch in {RowLaunch(c.block, c.rows, 4, c.fits) for c in row_candidates(cols, 4)}
]


def _check_torch(device: str, rows: int, cols: int, launch: RowLaunch | None, dtype: Any) -> None:
    """Like ``_check`` in a torch dtype (bfloat16 too) with a given launch configuration."""
    generator = torch.Generator().manual_seed(rows * 7919 + cols)
    x = (torch.randn(rows, cols, generator=generator) * 3 + 1).to(dtype)
    w = torch.randn(cols, generator=generator).to(dtype)
    out = torch.full((rows, cols), float("nan"), dtype=dtype, device=device)
    rms_norm(x.to(device), w.to(device), out, epsilon=1e-5, launch=launch)
    expected = reference(x.float().numpy(), w.float().numpy(), epsilon=1e-5)
    rtol, atol = TORCH_TOLERANCE[dtype]
    np.testing.assert_allclose(out.float().cpu().numpy(), expected, rtol=rtol, atol=atol)


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


def _launch_id(case: tuple[int, int, RowLaunch]) -> str:
    rows, cols, launch = case
    return f"{rows}x{cols}-block{launch.block}-rows{launch.rows}" + ("" if launch.fits else "-chunked")


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRETED or not CUDA, reason="needs a CUDA GPU")
def test_gpu_float32_input_float16_weight_writes_float16() -> None:
    _check_mixed("cuda")


@pytest.mark.skipif(not INTERPRETED, reason="runs under TRITON_INTERPRET=1 (the default without a GPU)")
def test_interpreter_float32_input_float16_weight_writes_float16() -> None:
    _check_mixed("cpu")


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRETED or not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", LAUNCH_CASES, ids=_launch_id)
def test_gpu_launch_configurations(case: tuple[int, int, RowLaunch], dtype: Any) -> None:
    _check_torch("cuda", *case, dtype)


@pytest.mark.skipif(not INTERPRETED, reason="runs under TRITON_INTERPRET=1 (the default without a GPU)")
@pytest.mark.parametrize("case", LAUNCH_CASES, ids=_launch_id)
def test_interpreter_launch_configurations(case: tuple[int, int, RowLaunch]) -> None:
    _check_torch("cpu", *case, torch.float32)


@pytest.mark.skipif(not INTERPRETED, reason="runs under TRITON_INTERPRET=1 (the default without a GPU)")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_interpreter_half_types_with_the_shipped_rule(dtype: Any) -> None:
    _check_torch("cpu", 6, 300, None, dtype)


def test_wrong_weight_is_refused() -> None:
    with pytest.raises(ValueError, match="weight has 3 elements"):
        rms_norm(torch.zeros(2, 4), torch.zeros(3))
