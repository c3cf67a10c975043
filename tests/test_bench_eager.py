"""The benchmark's PyTorch eager DeformConv2d computes what the plugin's numpy reference computes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from bench.eager import deform_conv2d  # noqa: E402

_REFERENCE = Path(__file__).resolve().parents[1] / "plugins" / "deform_conv2d" / "reference.py"
_spec = importlib.util.spec_from_file_location("_bench_eager_reference", _REFERENCE)
reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference)

CASES = [
    # (N, C, H, W), C_out, kernel, attributes, with mask, with bias
    ((1, 4, 6, 7), 4, (3, 3), {}, True, True),
    ((2, 6, 9, 5), 4, (3, 2), {"strides": [2, 1], "pads": [1, 0, 2, 1], "dilations": [1, 2]}, True, False),
    ((1, 8, 7, 7), 6, (3, 3), {"pads": [1, 1, 1, 1], "group": 2, "offset_group": 4}, False, True),
]


@pytest.mark.torch
@pytest.mark.parametrize(("x_shape", "c_out", "kernel", "attrs", "with_mask", "with_bias"), CASES)
def test_eager_deform_conv2d_matches_reference(x_shape, c_out, kernel, attrs, with_mask, with_bias) -> None:
    """float32, rtol/atol 1e-4 (float32 sums vs the reference's float64); offsets reach outside the image."""
    rng = np.random.default_rng(sum(x_shape))
    n, c, h, w = x_shape
    kh, kw = kernel
    full = {"strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1, "offset_group": 1}
    full.update(attrs)
    (sh, sw), (pt, pl, pb, pr), (dh, dw) = full["strides"], full["pads"], full["dilations"]
    oh = reference.output_size(h, kh, sh, pt, pb, dh)
    ow = reference.output_size(w, kw, sw, pl, pr, dw)
    groups, offset_groups = full["group"], full["offset_group"]
    x = rng.standard_normal(x_shape).astype(np.float32)
    weight = rng.standard_normal((c_out, c // groups, kh, kw)).astype(np.float32)
    offset = (rng.standard_normal((n, offset_groups * kh * kw * 2, oh, ow)) * 2.5).astype(np.float32)
    bias = rng.standard_normal(c_out).astype(np.float32) if with_bias else None
    mask = rng.random((n, offset_groups * kh * kw, oh, ow)).astype(np.float32) if with_mask else None
    expected = reference.deform_conv2d(x, weight, offset, bias, mask, **full)
    tensors = [None if a is None else torch.from_numpy(a) for a in (x, weight, offset, bias, mask)]
    got = deform_conv2d(*tensors, **full).numpy()
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.torch
def test_eager_deform_conv2d_float16_gathers_inside_images_over_2048_pixels() -> None:
    """float16 holds integers exactly only up to 2048: a gather index computed in float16 on a 64x64 image
    rounded 4095 to 4096 and read past the image (a CUDA assertion on the GPU, an error on the CPU).
    Compared with the float64 reference within float16's error (atol 5e-2 over 9 taps of 4 channels)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 4, 64, 64)).astype(np.float32)
    weight = (rng.standard_normal((4, 4, 3, 3)) * 0.1).astype(np.float32)
    offset = (rng.standard_normal((1, 18, 64, 64)) * 2.5).astype(np.float32)
    full = {"strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1], "group": 1, "offset_group": 1}
    expected = reference.deform_conv2d(x, weight, offset, None, None, **full)
    got = deform_conv2d(*(torch.from_numpy(a).half() for a in (x, weight, offset)), **full).float().numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-2, atol=5e-2)


def test_kernel_goals_judge_floor_only_for_memory_bound_kernels() -> None:
    from bench.kernels import goal_verdict

    row = {"memory_bound": True, "gskit_over_floor": 1.4, "gskit_over_torch": 0.8}
    assert goal_verdict(row) == "ok"
    assert goal_verdict({**row, "gskit_over_floor": 1.6}) == "> 1.5x floor"
    assert goal_verdict({**row, "gskit_over_floor": 1.6, "gskit_over_torch": 1.2}) == (
        "> 1.5x floor; slower than torch"
    )
    assert goal_verdict({**row, "memory_bound": False, "gskit_over_floor": 9.0}) == "ok"


@pytest.mark.slow
@pytest.mark.torch
def test_kernel_benchmark_runs_end_to_end_on_a_cpu() -> None:
    """``bench/kernels.py --smoke``: every case, both dtypes, through the Triton interpreter (about 20 s).

    The kernels' outputs (NaN-filled first) agree with PyTorch eager: float32 within 1e-4, float16 within
    0.05 (the eager DeformConv2d sums 54 products in float16).
    """
    import json
    import subprocess
    import sys

    pytest.importorskip("triton")
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, str(root / "bench" / "kernels.py"), "--smoke", "--reps", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode in (0, 1), done.stderr[-2000:]  # 1: goals missed, as they are on a CPU
    rows = json.loads(done.stdout)["results"]
    assert sorted({(r["kernel"], r["dtype"]) for r in rows}) == sorted(
        (k, d) for k in ("ClampSwish", "DeformConv2d", "LayerNorm", "RMSNorm") for d in ("float16", "float32")
    )
    for row in rows:
        limit = 1e-4 if row["dtype"] == "float32" else 5e-2
        assert row["max_abs_diff_torch"] <= limit, row
        assert row["goal"] != "ok" or row["gskit_over_torch"] <= 1.0


#: The GPU runs behind the README's kernel rows (bench/gpu_lease.sh on an H100), oldest first.
GPU_RUNS = Path(__file__).resolve().parents[1] / "bench" / "gpu_runs"


def test_shipped_launch_rules_pick_configurations_the_sweep_timed() -> None:
    """Every pick of ``row_launch``/``dcn_launch`` on the committed runs' shapes was timed by the newest run
    of that shape, and each DeformConv2d pick is of the method (fused or im2col) that run found fastest.

    A rule edited without a new sweep would pick an untimed configuration (``ms`` None) and the README's
    numbers would no longer be the shipped kernels'. The norms' picks also stay within the goals the
    README states for them, and DeformConv2d's within "no slower than torchvision" on the corpus's shapes.
    """
    import json

    pytest.importorskip("triton")
    from bench.tune_kernels import COMMITTED_RUNS, newest_picks

    assert sorted(p.name for p in GPU_RUNS.iterdir() if (p / "tune.json").exists()) == sorted(COMMITTED_RUNS)
    runs = [(name, json.loads((GPU_RUNS / name / "tune.json").read_text())) for name in COMMITTED_RUNS]
    picks = newest_picks(runs)
    assert len(picks["norm"]) == 2 * 3 * 4 * 3 and len(picks["dcn"]) == 14
    assert [p for p in picks["norm"] + picks["dcn"] if p["ms"] is None] == []
    assert [p for p in picks["dcn"] if p["aot_ms"] is None] == []
    for pick in picks["norm"]:
        assert pick["over_eager"] <= 1.0, pick
        if pick["rows"] == 16384 and pick["cols"] >= 4096:
            assert pick["over_floor"] <= 1.3, pick
    assert {p["run"] for p in picks["dcn"]} == {"h100-2026-11-27-dcn"}
    sweeps = {(r["shape"]["name"], r["dtype"]): r for r in dict(runs)["h100-2026-11-27-dcn"]["dcn"]}
    for pick in picks["dcn"]:
        assert pick["rule"]["method"] == sweeps[pick["shape"], pick["dtype"]]["best"]["method"], pick
        if not pick["shape"].startswith("r50-"):
            assert pick["over_torchvision"] <= 1.0, pick


@pytest.mark.slow
@pytest.mark.torch
def test_tuning_sweep_runs_end_to_end_on_a_cpu(tmp_path: Path) -> None:
    """``bench/tune_kernels.py --smoke``: the sweep's checks pass and each phase writes rows (about 20 s)."""
    import json
    import subprocess
    import sys

    pytest.importorskip("triton")
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, str(root / "bench" / "tune_kernels.py"), "--smoke", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads((tmp_path / "tune.json").read_text())
    assert data["checks"] and all(c["ok"] for c in data["checks"]), data["checks"]
    assert {(r["kernel"], r["rows"]) for r in data["norm"]} == {
        (k, n) for k in ("rms_norm", "layer_norm") for n in (1, 5)
    }
    assert all(r["rule"] is not None for r in data["norm"])
    assert data["dcn"] and all("best" in r for r in data["dcn"]) and data["clamp_swish"]
