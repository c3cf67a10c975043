"""Numpy reference of TensorRT's ``MultiscaleDeformableAttnPlugin_TRT``, as its CUDA source computes it.

Source: NVIDIA/TensorRT ``plugin/multiscaleDeformableAttnPlugin/multiscaleDeformableIm2ColCuda.cuh`` at
82d1dca801c8318a5605399d5240780d0679e4e1 (11.1): ``ms_deformable_im2col_gpu_kernel`` and
``ms_deform_attn_im2col_bilinear``.
"""

from __future__ import annotations

import numpy as np


def multiscale_deformable_attn(
    value: np.ndarray,
    spatial_shapes: np.ndarray,
    level_start_index: np.ndarray,
    sampling_locations: np.ndarray,
    attention_weights: np.ndarray,
) -> np.ndarray:
    """Multi-scale deformable attention (Deformable DETR): per query and head, a weighted sum of bilinear
    samples of each level's value map at a few sampling locations.

    For batch ``n``, query ``q``, head ``m``, level ``l`` (an ``H_l x W_l`` map whose rows start at
    ``level_start_index[l]`` in ``value``'s second axis) and point ``p``, with ``(x, y) =
    sampling_locations[n, q, m, l, p]`` in ``[0, 1]`` coordinates, the sample is taken at pixel
    ``(h, w) = (y * H_l - 0.5, x * W_l - 0.5)``: zero unless ``-1 < h < H_l`` and ``-1 < w < W_l``, otherwise
    bilinear with neighbours outside the map reading zero (``grid_sample`` with ``align_corners=False`` and
    zero padding, on the grid ``2 * location - 1``). The output is ``sum over l, p of
    attention_weights[n, q, m, l, p] * sample``. Computed in float64, returned in ``value``'s dtype.

    Args:
        value: ``[N, S, M, D]``, the levels' maps flattened row by row and concatenated (``S = sum H_l W_l``).
        spatial_shapes: ``[L, 2]`` int32, ``(H_l, W_l)``.
        level_start_index: ``[L]`` int32, where each level starts in ``S``.
        sampling_locations: ``[N, Lq, M, L, P, 2]``, ``(x, y)`` in ``[0, 1]``.
        attention_weights: ``[N, Lq, M, L, P]``.

    Returns:
        ``[N, Lq, M, D]``.

    Raises:
        ValueError: shapes that do not fit together.
    """
    n, total, heads, dim = value.shape
    _, queries, _, levels, points, _ = sampling_locations.shape
    if spatial_shapes.shape != (levels, 2) or level_start_index.shape != (levels,):
        raise ValueError(
            f"spatial_shapes {spatial_shapes.shape} and level_start_index {level_start_index.shape} do not "
            f"fit {levels} levels"
        )
    if attention_weights.shape != (n, queries, heads, levels, points):
        raise ValueError(f"attention_weights {attention_weights.shape} do not fit {sampling_locations.shape}")
    flat = value.astype(np.float64).transpose(0, 2, 1, 3)  # [N, M, S, D]
    where = sampling_locations.astype(np.float64)
    weights = attention_weights.astype(np.float64)
    out = np.zeros((n, heads, queries, dim))
    for level in range(levels):
        height, width = (int(v) for v in spatial_shapes[level])
        start = int(level_start_index[level])
        if start + height * width > total:
            raise ValueError(f"level {level} ({height}x{width} from {start}) overruns value's {total} rows")
        rows = flat[:, :, start : start + height * width]  # [N, M, H*W, D]
        h = where[:, :, :, level, :, 1].transpose(0, 2, 1, 3) * height - 0.5  # [N, M, Lq, P]
        w = where[:, :, :, level, :, 0].transpose(0, 2, 1, 3) * width - 0.5
        share = weights[:, :, :, level].transpose(0, 2, 1, 3)
        inside = (h > -1) & (w > -1) & (h < height) & (w < width)
        top, left = np.floor(h), np.floor(w)
        dh, dw = h - top, w - left
        for row, col, part in (
            (top, left, (1 - dh) * (1 - dw)),
            (top, left + 1, (1 - dh) * dw),
            (top + 1, left, dh * (1 - dw)),
            (top + 1, left + 1, dh * dw),
        ):
            valid = inside & (row >= 0) & (row <= height - 1) & (col >= 0) & (col <= width - 1)
            index = np.where(valid, row * width + col, 0).astype(np.intp).reshape(n, heads, -1, 1)
            picked = np.take_along_axis(rows, index, axis=2).reshape(n, heads, queries, points, dim)
            out += np.einsum("nmqp,nmqpd->nmqd", np.where(valid, part, 0) * share, picked)
    return out.transpose(0, 2, 1, 3).astype(value.dtype)
