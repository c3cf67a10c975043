"""Numpy reference of LayerNorm over the last axis."""

from __future__ import annotations

import numpy as np


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, *, epsilon: float = 1e-5) -> np.ndarray:
    """Layer normalization over the last axis.

    ``mean = mean(x, -1)``, ``var = mean((x - mean)^2, -1)`` (biased, as torch and ONNX compute it),
    ``y = (x - mean) / sqrt(var + epsilon) * weight + bias``.

    The statistics and the normalization are computed in float64 from float32 values (half-precision
    inputs are widened first), so the result is the correctly rounded float32 answer up to one ulp; it is
    cast back to ``x``'s dtype. ``epsilon`` is rounded to float32 first, as an ONNX attribute is.

    Args:
        x: ``(..., C)``.
        weight: ``(C,)`` (anything that broadcasts against ``x``).
        bias: ``(C,)`` (likewise).
        epsilon: added to the variance before the square root.

    Returns:
        ``y`` with ``x``'s shape and dtype.
    """
    xf = np.asarray(x).astype(np.float32, copy=False).astype(np.float64)
    mean = xf.mean(axis=-1, keepdims=True)
    centered = xf - mean
    var = np.mean(centered * centered, axis=-1, keepdims=True)
    eps = float(np.float32(epsilon))
    normalized = centered / np.sqrt(var + eps)
    w = np.asarray(weight).astype(np.float32, copy=False).astype(np.float64)
    b = np.asarray(bias).astype(np.float32, copy=False).astype(np.float64)
    return (normalized * w + b).astype(x.dtype)
