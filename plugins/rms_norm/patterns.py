"""What RMSNorm replaces: ``x / sqrt(mean(x^2, -1) + eps) * weight`` in the forms exporters write.

``x^2`` is ``Pow(x, 2)`` or ``Mul(x, x)``; the division is ``Div(x, std)``, ``Mul(x, Reciprocal(std))``
(dynamo's ``rsqrt``) or ``Mul(x, Div(1, std))`` (TorchScript's ``rsqrt``). ``axes`` as attribute or input.
"""

from __future__ import annotations

from typing import Any

from gskit.patterns import GraphPattern
from gskit.patterns.checks import all_of, one_number, per_last_axis


def _normalize(op: Any, x: Any, std: Any, form: str) -> Any:
    if form == "div":
        return op.Div(x, std)
    if form == "reciprocal":
        return op.Mul(x, op.Reciprocal(std))
    return op.Mul(x, op.Div(1.0, std))


def _decomposed(square: str, normalize: str) -> GraphPattern:
    def rms_norm(op: Any, x: Any, weight: Any) -> Any:
        sq = op.Pow(x, 2.0) if square == "pow" else op.Mul(x, x)
        std = op.Sqrt(op.Add(op.ReduceMean(sq, axes=[-1], keepdims=1), op.capture("eps")))
        return op.Mul(_normalize(op, x, std, normalize), weight)

    return GraphPattern(
        rms_norm,
        attrs={"epsilon": "eps"},
        check=lambda m: all_of(one_number(m, "eps"), per_last_axis(m, "x", "weight")),
        name=f"rms_norm[{square},{normalize}]",
    )


PATTERNS: tuple = tuple(_decomposed(s, n) for s in ("pow", "mul") for n in ("div", "reciprocal", "one_div"))
