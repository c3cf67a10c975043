"""DeformConv2d Triton kernel against the numpy reference.

On a CUDA GPU the ``gpu`` tests run the compiled kernel; without one, Triton's interpreter
(``TRITON_INTERPRET=1``, set here before Triton is imported) runs the same kernel on CPU tensors.
The output is NaN-filled before each run, so an element the kernel does not write fails the comparison.
Cases cover odd sizes, strides, asymmetric pads, dilations, groups, offset groups, no bias / no mask,
and offsets that push samples outside the image; every tile configuration the tuning sweep may pick
(``dcn_candidates``) runs on a case whose groups span two offset groups each and whose channel counts are no
multiple of the tiles. Tolerances: float32 rtol 1e-4 / atol 1e-4 (float32
sums of up to C*kH*kW products vs the reference's float64); float16 rtol 3e-3 / atol 3e-3 (about one
float16 ulp of the result; both sides accumulate in float32 or wider and round once).
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

from .kernel import IM2COL_LAUNCH, DcnLaunch, dcn_candidates, dcn_launch, deform_conv2d  # noqa: E402
from .reference import deform_conv2d as reference  # noqa: E402
from .reference import output_size  # noqa: E402

# (x shape, weight shape, attrs, with bias, with mask, offset scale)
CASES = [
    ((1, 2, 5, 5), (3, 2, 3, 3), {}, True, True, 0.5),
    ((2, 4, 7, 9), (6, 2, 3, 3), {"pads": [1, 1, 1, 1], "group": 2, "offset_group": 2}, True, True, 2.0),
    (
        (1, 3, 9, 8),
        (5, 3, 3, 2),
        {"strides": [2, 1], "pads": [1, 0, 2, 1], "dilations": [2, 1]},
        False,
        True,
        1.0,
    ),
    ((2, 2, 6, 7), (4, 1, 1, 3), {"group": 2, "pads": [0, 1, 0, 1]}, True, False, 8.0),
    ((1, 3, 4, 4), (33, 3, 2, 2), {"strides": [1, 2], "offset_group": 3}, False, False, 1.5),
]
TOLERANCE = {np.float32: (1e-4, 1e-4), np.float16: (3e-3, 3e-3)}
#: Two groups of 20 channels, each spanning two offset groups of 10; 65 output channels per group.
LAUNCH_CASE = (
    (1, 40, 6, 7),
    (130, 20, 3, 3),
    {"pads": [1, 1, 1, 1], "group": 2, "offset_group": 4},
    True,
    True,
    2.0,
)
LAUNCHES = dcn_candidates(65, 20)


def _launch_id(launch: DcnLaunch) -> str:
    return (
        f"{launch.method}-co{launch.block_co}-p{launch.block_p}-c{launch.block_c}-w{launch.num_warps}-"
        f"s{launch.num_stages}-{launch.precision}"
    )


def _inputs(case: tuple, dtype: type) -> tuple[list[np.ndarray | None], dict]:
    x_shape, w_shape, attrs, with_bias, with_mask, scale = case
    attrs = {
        "strides": [1, 1],
        "pads": [0, 0, 0, 0],
        "dilations": [1, 1],
        "group": 1,
        "offset_group": 1,
        **attrs,
    }
    rng = np.random.default_rng(x_shape[2] * 31 + w_shape[0])
    n, _, h, w = x_shape
    k = w_shape[2] * w_shape[3]
    oh = output_size(
        h, w_shape[2], attrs["strides"][0], attrs["pads"][0], attrs["pads"][2], attrs["dilations"][0]
    )
    ow = output_size(
        w, w_shape[3], attrs["strides"][1], attrs["pads"][1], attrs["pads"][3], attrs["dilations"][1]
    )
    og = attrs["offset_group"]
    arrays = [
        rng.standard_normal(x_shape),
        rng.standard_normal(w_shape) * 0.5,
        rng.standard_normal((n, og * k * 2, oh, ow)) * scale,
        rng.standard_normal(w_shape[0]) if with_bias else None,
        rng.random((n, og * k, oh, ow)) if with_mask else None,
    ]
    return [None if a is None else a.astype(dtype) for a in arrays], attrs


def _check(device: str, case: tuple, dtype: type, launch: DcnLaunch | None = None) -> None:
    arrays, attrs = _inputs(case, dtype)
    expected = reference(*arrays, **attrs)
    tensors = [None if a is None else torch.from_numpy(a).to(device) for a in arrays]
    out = torch.full(expected.shape, float("nan"), dtype=getattr(torch, np.dtype(dtype).name), device=device)
    deform_conv2d(*tensors, out, **attrs, launch=launch)
    rtol, atol = TOLERANCE[dtype]
    np.testing.assert_allclose(out.cpu().numpy(), expected, rtol=rtol, atol=atol)


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRETED or not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("case", CASES)
def test_gpu_matches_reference(case: tuple, dtype: type) -> None:
    _check("cuda", case, dtype)


@pytest.mark.skipif(not INTERPRETED, reason="runs under TRITON_INTERPRET=1 (the default without a GPU)")
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("case", CASES)
def test_interpreter_matches_reference(case: tuple, dtype: type) -> None:
    _check("cpu", case, dtype)


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRETED or not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("launch", LAUNCHES, ids=_launch_id)
def test_gpu_launch_configurations(launch: DcnLaunch, dtype: type) -> None:
    _check("cuda", LAUNCH_CASE, dtype, launch)


@pytest.mark.skipif(not INTERPRETED, reason="runs under TRITON_INTERPRET=1 (the default without a GPU)")
@pytest.mark.parametrize(
    "launch",
    sorted(
        {DcnLaunch(c.block_co, c.block_p, c.block_c, 4, method=c.method) for c in LAUNCHES}, key=_launch_id
    ),
    ids=_launch_id,
)
def test_interpreter_launch_configurations(launch: DcnLaunch) -> None:
    _check("cpu", LAUNCH_CASE, np.float32, launch)


@pytest.mark.skipif(not INTERPRETED, reason="runs under TRITON_INTERPRET=1 (the default without a GPU)")
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_interpreter_im2col_one_image_at_a_time(monkeypatch: pytest.MonkeyPatch, dtype: type) -> None:
    """The im2col path in chunks of one image (a limit of 1 element), with groups and offset groups."""
    from . import kernel

    monkeypatch.setattr(kernel, "IM2COL_MAX_ELEMENTS", 1)
    _check("cpu", CASES[1], dtype, DcnLaunch(0, 64, 16, 4, method="im2col"))


@pytest.mark.parametrize("itemsize", [4, 2])
@pytest.mark.parametrize("c_out, c", [(3, 3), (6, 2), (127, 256), (256, 64), (128, 128), (512, 512)])
def test_rule_picks_im2col_for_wide_groups_only(c_out: int, c: int, itemsize: int) -> None:
    """The JIT rule: im2col from 128 channels in and out (where the H100 sweep timed it fastest), else the
    fused kernel; its pick is always one of the sweep's candidates."""
    launch = dcn_launch(c_out, c, itemsize)
    assert launch.method == ("im2col" if min(c_out, c) >= 128 else "fused")
    assert launch in dcn_candidates(c_out, c, itemsize)


@pytest.mark.skipif(not INTERPRETED, reason="runs under TRITON_INTERPRET=1 (the default without a GPU)")
def test_interpreter_wide_group_default_launch_is_im2col() -> None:
    """A 128-channel layer without ``launch=`` runs the rule's im2col path, with bias, mask and padding."""
    assert dcn_launch(128, 128) == IM2COL_LAUNCH
    _check("cpu", ((2, 128, 4, 5), (128, 128, 3, 3), {"pads": [1, 1, 1, 1]}, True, True, 1.0), np.float32)


def test_mismatched_offset_is_refused() -> None:
    with pytest.raises(ValueError, match="offset is"):
        deform_conv2d(torch.zeros(1, 2, 5, 5), torch.zeros(3, 2, 3, 3), torch.zeros(1, 18, 5, 5))
