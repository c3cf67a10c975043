"""The C++ plugin's CUDA kernel, launched on a GPU without TensorRT, against the numpy reference.

``cpp/check_kernel_cuda.cu`` calls ``launchDeformConv2d`` (the launcher ``enqueue`` calls) on inputs written
here, into an output poisoned with NaN, and hands the result back as float32. Built with ``nvcc`` for the GPU
present (``-arch=native``; ``GSKIT_CUDA_ARCH=sm_90`` names one), in float32 and float16, with groups, offset
groups, mask, bias, non-square strides, dilations and asymmetric pads. Needs nvcc and a CUDA GPU (the Docker
GPU CI image has both: ``-m "gpu or cpp"``); skipped without them. The same math is checked on a CPU by
test_cpp_kernel_math.py.

Tolerances: float32 rtol/atol 1e-4 (float32 accumulation vs the reference's float64); float16 rtol/atol
2e-3: the inputs are rounded to float16 before the reference sees them, the kernel accumulates in float32 and
rounds the result once (half a float16 ulp is 4.9e-4 relative).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from .test_cpp_kernel_math import write_case

CPP_DIR = Path(__file__).parent / "cpp"
SOURCES = ("check_kernel_cuda.cu", "deformConv2dKernel.cu")

# (x shape, C_out, kernel, attributes, with bias, with mask)
CASES: list[tuple[tuple[int, ...], int, tuple[int, int], dict[str, Any], bool, bool]] = [
    ((1, 4, 6, 7), 4, (3, 3), {"pads": [1, 1, 1, 1]}, True, True),
    ((2, 3, 9, 8), 5, (3, 2), {"strides": [2, 1], "pads": [1, 0, 2, 1], "dilations": [2, 1]}, False, True),
    ((2, 8, 10, 11), 6, (3, 3), {"strides": [3, 2], "group": 2, "offset_group": 4}, True, False),
    ((1, 2, 5, 5), 3, (1, 1), {}, False, False),
    # Every feature at once, and more outputs than one grid pass of threads covers in a block.
    (
        (2, 16, 21, 18),
        32,
        (3, 3),
        {"strides": [1, 2], "pads": [2, 1, 1, 2], "dilations": [2, 1], "group": 4, "offset_group": 2},
        True,
        True,
    ),
]
TOLERANCE = {"f32": (1e-4, 1e-4), "f16": (2e-3, 2e-3)}


def _nvcc() -> str | None:
    found = os.environ.get("CUDACXX") or shutil.which("nvcc")
    for candidate in (found, "/usr/local/cuda/bin/nvcc"):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def _gpu() -> bool:
    if importlib.util.find_spec("torch") is not None:
        import torch

        return torch.cuda.is_available()
    return Path("/dev/nvidia0").exists()


def build(out: Path, nvcc: str, arch: str = "native") -> Path:
    """Build the harness into ``out`` (``arch``: an ``-arch`` value, ``native`` for the GPU present)."""
    command = [
        nvcc,
        "-std=c++17",
        "-O3",
        f"-arch={arch}",
        "-Xcompiler=-Wall,-Wextra",
        "-Werror",
        "all-warnings",
    ]
    command += ["-I", str(CPP_DIR), *(str(CPP_DIR / s) for s in SOURCES), "-o", str(out)]
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=600)
    return out


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Path:
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("needs nvcc (CUDACXX, PATH or /usr/local/cuda/bin)")
    if not _gpu():
        pytest.skip("needs a CUDA GPU (runs in the Docker GPU CI)")
    exe = tmp_path_factory.mktemp("kernel_cuda") / "check_kernel_cuda"
    try:
        return build(exe, nvcc, os.environ.get("GSKIT_CUDA_ARCH", "native"))
    except subprocess.CalledProcessError as err:
        pytest.fail(f"nvcc failed:\n{err.stderr[-3000:]}")


def run_case(
    harness: Path, folder: Path, dtype: str, *case: Any, reps: int = 0
) -> tuple[np.ndarray, np.ndarray, float | None]:
    """Run one case of CASES: (kernel output, reference output, median ms of ``reps`` launches or None).

    The kernel sees float16 inputs as float16: the reference gets the same rounded values.
    """
    store = np.float16 if dtype == "f16" else np.float32
    written = write_case(folder, *case, seed=len(dtype), weight_scale=0.5, store=store)
    args = [str(harness), str(folder), dtype, *written.args, str(reps)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    got = np.fromfile(folder / "y.f32", dtype=np.float32).reshape(written.out_shape)
    timed = [float(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("median_ms ")]
    return got, written.expected(), (timed[0] if timed else None)


@pytest.mark.gpu
@pytest.mark.cpp
@pytest.mark.parametrize("dtype", ["f32", "f16"])
@pytest.mark.parametrize(("x_shape", "c_out", "kernel", "attrs", "with_bias", "with_mask"), CASES)
def test_cuda_kernel_matches_reference(
    harness, tmp_path, dtype, x_shape, c_out, kernel, attrs, with_bias, with_mask
) -> None:
    got, expected, _ = run_case(harness, tmp_path, dtype, x_shape, c_out, kernel, attrs, with_bias, with_mask)
    assert not np.isnan(got).any(), "the kernel left elements unwritten (NaN poison) or produced NaN"
    rtol, atol = TOLERANCE[dtype]
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol)


@pytest.mark.gpu
@pytest.mark.cpp
def test_bad_type_is_refused(harness, tmp_path) -> None:
    done = subprocess.run(
        [str(harness), str(tmp_path), "bf16", *["1"] * 19], capture_output=True, text=True, check=False
    )
    assert done.returncode == 2 and "TYPE must be f32 or f16, not 'bf16'" in done.stderr
