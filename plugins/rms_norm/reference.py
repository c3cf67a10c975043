"""Numpy reference of RMSNorm over the last axis."""

from __future__ import annotations

import numpy as np


def rms_norm(x: np.ndarray, weight: np.ndarray, *, epsilon: float = 1e-5) -> np.ndarray:
    """Root-mean-square normalization over the last axis (no centering, no bias).

    ``y = x / sqrt(mean(x^2, -1) + epsilon) * weight``.

    The mean of squares and the scaling are computed in float64 from float32 values (half-precision
    inputs are widened first), then cast to the weight's dtype (``x``'s, except for a float32 ``x`` with a
    float16 weight: the mixed-precision form). ``epsilon`` is rounded to float32 first, as an ONNX attribute
    is.

    Args:
        x: ``(..., C)``.
        weight: ``(C,)`` (anything that broadcasts against ``x``).
        epsilon: added to the mean of squares before the square root.

    Returns:
        ``y`` with ``x``'s shape and the weight's dtype.
    """
    xf = np.asarray(x).astype(np.float32, copy=False).astype(np.float64)
    mean_square = np.mean(xf * xf, axis=-1, keepdims=True)
    eps = float(np.float32(epsilon))
    w = np.asarray(weight).astype(np.float32, copy=False).astype(np.float64)
    return (xf / np.sqrt(mean_square + eps) * w).astype(np.asarray(weight).dtype)
