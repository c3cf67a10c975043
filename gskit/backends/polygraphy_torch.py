"""Polygraphy without importing torch for numpy data.

Polygraphy asks ``util.array.is_torch(obj)`` of every array it touches (runner feeds and outputs, the
comparator's checks), and that question imports torch where it is installed: a second and 170 MB per run of
``prepare``'s validate or ``compare``, for a type gskit never passes. An object can only be a ``torch.Tensor``
once torch has been imported, so the answer is the same without the import.
"""

from __future__ import annotations

import sys
from typing import Any


def _is_torch(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def use_without_torch() -> None:
    """Make Polygraphy's torch-tensor check import nothing (idempotent; before any Polygraphy run)."""
    from polygraphy.util import array

    array.is_torch = _is_torch
