"""Reusable checks for rules (each returns a MatchResult naming the culprit)."""

from __future__ import annotations

import numpy as np

from gskit.passes.patterns.match import MatchResult, elem_type_name
from gskit.passes.patterns.rules import Match
from gskit.passes.tensor_types import elem_type


def one_number(match: Match, capture: str) -> MatchResult:
    """The constant captured as ``capture`` holds exactly one element."""
    value = np.asarray(match.captures.get(capture))
    if value.size != 1:
        return MatchResult.fail(f"'{capture}' has {value.size} elements, not 1", match.anchor)
    return MatchResult.success()


def per_last_axis(match: Match, x: str, *names: str) -> MatchResult:
    """Each input in ``names`` has shape ``(C,)`` or ``(1, ..., C)`` with C = 1 or x's last dim.

    Unknown shapes pass (the plugin broadcasts like the original ops); known shapes that would
    broadcast over more than the last axis fail.
    """
    x_shape = getattr(match.inputs[x], "shape", None)
    for name in names:
        tensor = match.inputs[name]
        shape = getattr(tensor, "shape", None)
        if shape is None:
            continue
        if any(d != 1 for d in shape[:-1]) or (x_shape is not None and len(shape) > len(x_shape)):
            return MatchResult.fail(
                f"{name} '{tensor.name}' has shape {list(shape)}, not one value per last axis", match.anchor
            )
        last, x_last = (shape[-1] if shape else 1), (x_shape[-1] if x_shape else None)
        if isinstance(last, int) and isinstance(x_last, int) and last not in (1, x_last):
            return MatchResult.fail(
                f"{name} '{tensor.name}' has {last} elements, x's last axis {x_last}", match.anchor
            )
    return MatchResult.success()


def all_of(*results: MatchResult) -> MatchResult:
    """The first failure among ``results``, or success."""
    return next((r for r in results if not r), MatchResult.success())


def casts_back_to(match: Match, x: str, capture: str) -> MatchResult:
    """The Cast captured as ``capture`` (its ``to``) returns to the dtype of input ``x``, which is known.

    Patterns that widen ``x`` for the computation (Hugging Face norms compute in float32 and cast back)
    become one plugin node that reads and writes ``x``'s dtype; that is only the same computation when the
    result is cast back to that dtype.
    """
    tensor = match.inputs[x]
    to = match.captures.get(capture)
    have = elem_type(tensor.dtype)
    if have is None:
        return MatchResult.fail(
            f"dtype of {x} '{tensor.name}' is unknown, so the Cast back cannot be checked", match.anchor
        )
    if to != have:
        return MatchResult.fail(
            f"the result is cast to {elem_type_name(to)}, not to the dtype of {x} '{tensor.name}' "
            f"({elem_type_name(have)})",
            match.anchor,
        )
    return MatchResult.success()
