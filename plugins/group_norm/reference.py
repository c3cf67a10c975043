"""Numpy reference of GroupNorm: group normalization over the channel axis (axis 1)."""

from __future__ import annotations

import numpy as np


def group_norm(
    x: np.ndarray, weight: np.ndarray, bias: np.ndarray, *, epsilon: float = 1e-5, num_groups: int = 1
) -> np.ndarray:
    """Group normalization: the channels of ``x`` (axis 1) in ``num_groups`` groups, each group normalized
    over its channels and all spatial positions, then a per-channel scale and shift.

    ``y[n, c, ...] = (x[n, c, ...] - mean[n, g]) / sqrt(var[n, g] + epsilon) * weight[c] + bias[c]`` with
    ``g = c // (C / num_groups)`` and the biased variance. Computed in float64 from float32 values (half
    precision widened first), cast back to ``x``'s dtype; ``epsilon`` rounded to float32 first, as an ONNX
    attribute is.

    Args:
        x: ``(N, C, ...)`` with ``C`` a multiple of ``num_groups``.
        weight: ``(C,)``.
        bias: ``(C,)``.
        epsilon: added to the variance before the square root.
        num_groups: how many groups the channels form.

    Returns:
        ``y`` with ``x``'s shape and dtype.
    """
    x = np.asarray(x)
    n, c = x.shape[0], x.shape[1]
    if num_groups < 1 or c % num_groups:
        raise ValueError(f"GroupNorm: {c} channels do not split into {num_groups} groups")
    xf = x.astype(np.float32, copy=False).astype(np.float64)
    grouped = xf.reshape(n, num_groups, -1)
    mean = grouped.mean(axis=-1, keepdims=True)
    var = ((grouped - mean) ** 2).mean(axis=-1, keepdims=True)
    normed = ((grouped - mean) / np.sqrt(var + float(np.float32(epsilon)))).reshape(x.shape)
    channel = (1, c) + (1,) * (x.ndim - 2)
    w = np.asarray(weight).astype(np.float32, copy=False).astype(np.float64).reshape(channel)
    b = np.asarray(bias).astype(np.float32, copy=False).astype(np.float64).reshape(channel)
    return (normed * w + b).astype(x.dtype)
