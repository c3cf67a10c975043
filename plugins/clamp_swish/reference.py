"""Numpy reference of ClampSwish: ``y = x' * sigmoid(x')`` with ``x' = max(x, 0)``."""

from __future__ import annotations

import numpy as np


def clamp_swish(x: np.ndarray) -> np.ndarray:
    """Swish (SiLU) of the input clamped at zero from below.

    ``x' = max(x, 0)`` and ``y = x' * sigmoid(x') = x' / (1 + exp(-x'))``. Because ``x' >= 0``,
    ``exp(-x')`` lies in ``(0, 1]`` and never overflows; NaN stays NaN. Half-precision inputs are
    computed in float32 and cast back.

    Args:
        x: any shape, a floating dtype.

    Returns:
        ``y`` with ``x``'s shape and dtype.
    """
    xf = np.maximum(np.asarray(x).astype(np.float32, copy=False), np.float32(0))
    y = xf / (np.float32(1) + np.exp(-xf))
    return y.astype(x.dtype, copy=False)
