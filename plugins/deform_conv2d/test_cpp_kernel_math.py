"""The C++ plugin's kernel math (``cpp/deformConv2dMath.h``, the CUDA kernel's per-element body) against
the numpy reference, on a CPU: ``cpp/check_kernel_math.cpp`` builds that header with the host compiler
and computes whole outputs. Tolerance: rtol/atol 1e-5 (float32 accumulation vs the reference's float64).
Only a C++ compiler is needed; the CUDA launch around it is checked in the GPU CI.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from .reference import deform_conv2d, output_size

CPP_DIR = Path(__file__).parent / "cpp"
CXX = shutil.which("g++") or shutil.which("c++")

# (x shape, C_out, kernel, attributes, with bias, with mask)
CASES: list[tuple[tuple[int, ...], int, tuple[int, int], dict[str, Any], bool, bool]] = [
    ((1, 4, 6, 7), 4, (3, 3), {"pads": [1, 1, 1, 1]}, True, True),
    ((2, 3, 9, 8), 5, (3, 2), {"strides": [2, 1], "pads": [1, 0, 2, 1], "dilations": [2, 1]}, False, True),
    ((2, 8, 10, 11), 6, (3, 3), {"strides": [3, 2], "group": 2, "offset_group": 4}, True, False),
    ((1, 2, 5, 5), 3, (1, 1), {}, False, False),
]


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if CXX is None:
        pytest.skip("needs a C++ compiler (g++)")
    exe = tmp_path_factory.mktemp("kernel_math") / "check_kernel_math"
    command = [CXX, "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", "-I", str(CPP_DIR)]
    subprocess.run([*command, str(CPP_DIR / "check_kernel_math.cpp"), "-o", str(exe)], check=True)
    return exe


@dataclass(frozen=True)
class WrittenCase:
    """One case's inputs as the harnesses read them, and what they take on the command line."""

    arrays: dict[str, np.ndarray]
    attrs: dict[str, Any]
    out_shape: tuple[int, int, int, int]
    #: The sizes, attributes and flags after the harnesses' DIR (and TYPE) arguments, in their order.
    args: list[str]

    def expected(self) -> np.ndarray:
        a = self.arrays
        return deform_conv2d(a["x"], a["weight"], a["offset"], a.get("bias"), a.get("mask"), **self.attrs)


def write_case(
    folder: Path,
    x_shape: tuple[int, ...],
    c_out: int,
    kernel: tuple[int, int],
    attrs: dict[str, Any],
    with_bias: bool,
    with_mask: bool,
    *,
    seed: int = 0,
    weight_scale: float = 1.0,
    store: type = np.float32,
) -> WrittenCase:
    """Random inputs for a case written to ``folder/{name}.f32`` (values rounded to ``store`` first)."""
    full = {"strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1, "offset_group": 1}
    full.update(attrs)
    n, c, h, w = x_shape
    kh, kw = kernel
    (sh, sw), (pt, pl, pb, pr), (dh, dw) = full["strides"], full["pads"], full["dilations"]
    oh, ow = output_size(h, kh, sh, pt, pb, dh), output_size(w, kw, sw, pl, pr, dw)
    groups, offset_groups = full["group"], full["offset_group"]
    rng = np.random.default_rng(sum(x_shape) + c_out + seed)
    arrays = {
        "x": rng.standard_normal(x_shape),
        "weight": rng.standard_normal((c_out, c // groups, kh, kw)) * weight_scale,
        # Offsets of a few pixels: samples land between pixels, on borders and outside the image.
        "offset": rng.standard_normal((n, offset_groups * kh * kw * 2, oh, ow)) * 3,
    }
    if with_bias:
        arrays["bias"] = rng.standard_normal(c_out)
    if with_mask:
        arrays["mask"] = rng.random((n, offset_groups * kh * kw, oh, ow))
    arrays = {name: a.astype(store).astype(np.float32) for name, a in arrays.items()}
    for name, array in arrays.items():
        array.tofile(folder / f"{name}.f32")
    sizes = [n, c, h, w, c_out, kh, kw, oh, ow, sh, sw, pt, pl, dh, dw, groups, offset_groups]
    args = [str(v) for v in [*sizes, int(with_bias), int(with_mask)]]
    return WrittenCase(arrays, full, (n, c_out, oh, ow), args)


@pytest.mark.parametrize(("x_shape", "c_out", "kernel", "attrs", "with_bias", "with_mask"), CASES)
def test_kernel_math_matches_reference(
    harness, tmp_path, x_shape, c_out, kernel, attrs, with_bias, with_mask
) -> None:
    case = write_case(tmp_path, x_shape, c_out, kernel, attrs, with_bias, with_mask)
    subprocess.run([str(harness), str(tmp_path), *case.args], check=True)
    got = np.fromfile(tmp_path / "y.f32", dtype=np.float32).reshape(case.out_shape)
    np.testing.assert_allclose(got, case.expected(), rtol=1e-5, atol=1e-5)


def test_bad_input_file_is_refused(harness, tmp_path):
    np.zeros(3, np.float32).tofile(tmp_path / "x.f32")
    done = subprocess.run(
        [str(harness), str(tmp_path), *["1"] * 19], capture_output=True, text=True, check=False
    )
    assert done.returncode == 2 and "x.f32: expected exactly 1 float32 values" in done.stderr
