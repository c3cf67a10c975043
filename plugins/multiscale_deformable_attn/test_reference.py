"""MultiscaleDeformableAttnPlugin_TRT reference against transformers' PyTorch multi-scale deformable attention
(``MultiScaleDeformableAttention``, the grid_sample form Deformable DETR and RT-DETR run without their CUDA
kernel) and, without transformers, against ``torch.nn.functional.grid_sample`` composed as that code does.

torch computes in float32, the reference in float64: atol 1e-5 on outputs of magnitude ~1. Sampling locations
run from -0.1 to 1.1, so samples fall on and past every border.
"""

from __future__ import annotations

import numpy as np
import pytest

from .reference import multiscale_deformable_attn
from .spec import SPEC, example_inputs

LEVELS = [(8, 8), (4, 5), (2, 3), (1, 1)]


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


def _inputs(rng, levels=LEVELS, batch=2, queries=9, heads=3, dim=5, points=4):
    shapes = np.asarray(levels, dtype=np.int32)
    starts = np.concatenate([[0], np.cumsum(shapes.prod(1))[:-1]]).astype(np.int32)
    total = int(shapes.prod(1).sum())
    return (
        rng.standard_normal((batch, total, heads, dim)).astype(np.float32),
        shapes,
        starts,
        rng.uniform(-0.1, 1.1, (batch, queries, heads, len(levels), points, 2)).astype(np.float32),
        rng.random((batch, queries, heads, len(levels), points)).astype(np.float32),
    )


def test_matches_transformers_multi_scale_deformable_attention(rng) -> None:
    torch = pytest.importorskip("torch")
    modeling = pytest.importorskip("transformers.models.deformable_detr.modeling_deformable_detr")
    value, shapes, starts, locations, weights = _inputs(rng)
    want = modeling.MultiScaleDeformableAttention()(
        torch.from_numpy(value),
        torch.from_numpy(shapes),
        [tuple(s) for s in shapes.tolist()],
        torch.from_numpy(starts),
        torch.from_numpy(locations),
        torch.from_numpy(weights),
        64,
    ).numpy()
    got = multiscale_deformable_attn(value, shapes, starts, locations, weights)
    assert got.shape == (2, 9, 3, 5) and got.dtype == np.float32
    np.testing.assert_allclose(got.reshape(2, 9, 15), want, rtol=0, atol=1e-5)


def test_matches_grid_sample(rng) -> None:
    """The same computation written with torch's grid_sample, level by level (no transformers needed)."""
    torch = pytest.importorskip("torch")
    value, shapes, starts, locations, weights = _inputs(rng)
    batch, _, heads, dim = value.shape
    queries, points = locations.shape[1], locations.shape[4]
    total = torch.zeros(batch, heads, dim, queries)
    for level, (height, width) in enumerate(shapes.tolist()):
        rows = torch.from_numpy(value[:, starts[level] : starts[level] + height * width])
        maps = rows.permute(0, 2, 3, 1).reshape(batch * heads, dim, height, width)
        grid = (
            torch.from_numpy(2 * locations[:, :, :, level] - 1)
            .transpose(1, 2)
            .reshape(batch * heads, queries, points, 2)
        )
        sampled = torch.nn.functional.grid_sample(maps, grid, align_corners=False).reshape(
            batch, heads, dim, queries, points
        )
        share = torch.from_numpy(weights[:, :, :, level]).permute(0, 2, 1, 3)[:, :, None]
        total += (sampled * share).sum(-1)
    want = total.permute(0, 3, 1, 2).numpy()
    got = multiscale_deformable_attn(value, shapes, starts, locations, weights)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_example_inputs_and_float16(rng) -> None:
    arrays = example_inputs(rng)
    wide = SPEC.run_reference(arrays, {})[0]
    half = multiscale_deformable_attn(
        arrays[0].astype(np.float16),
        arrays[1],
        arrays[2],
        arrays[3].astype(np.float16),
        arrays[4].astype(np.float16),
    )
    assert half.dtype == np.float16 and wide.shape == (2, 7, 2, 4)
    np.testing.assert_allclose(half.astype(np.float32), wide, rtol=1e-2, atol=1e-2)


def test_level_overrunning_value_is_refused(rng) -> None:
    value, shapes, starts, locations, weights = _inputs(rng)
    with pytest.raises(ValueError, match="overruns"):
        multiscale_deformable_attn(value[:, :50], shapes, starts, locations, weights)
