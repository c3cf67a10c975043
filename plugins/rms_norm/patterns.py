"""What RMSNorm replaces: ``x / sqrt(mean(x^2, -1) + eps) * weight`` in the forms exporters write.

``x^2`` is ``Pow(x, 2)`` or ``Mul(x, x)``; the division is ``Div(x, std)``, ``Mul(x, Reciprocal(std))``
(dynamo's ``rsqrt``) or ``Mul(x, Div(1, std))`` (TorchScript's ``rsqrt``). ``axes`` as attribute or input.
The ``float32`` forms are Hugging Face's (LLaMA, Qwen2, Mistral ...): ``Cast(x, to=float)`` first and the
normalized value cast back to ``x``'s dtype before the weight; in an fp16 or bf16 model one plugin node then
reads and writes ``x``'s dtype (the plugin accumulates in float32). In a float32 model those Casts are no-ops.
"""

from __future__ import annotations

from typing import Any

from gskit.passes.patterns import GraphPattern
from gskit.passes.patterns.checks import all_of, casts_back_to, one_number, per_last_axis


def _normalize(op: Any, x: Any, std: Any, form: str) -> Any:
    if form == "div":
        return op.Div(x, std)
    if form == "reciprocal":
        return op.Mul(x, op.Reciprocal(std))
    return op.Mul(x, op.Div(1.0, std))


def _decomposed(square: str, normalize: str, *, upcast: bool = False) -> GraphPattern:
    def rms_norm(op: Any, x: Any, weight: Any) -> Any:
        wide = op.Cast(x, to=1) if upcast else x
        sq = op.Pow(wide, 2.0) if square == "pow" else op.Mul(wide, wide)
        std = op.Sqrt(op.Add(op.ReduceMean(sq, axes=[-1], keepdims=1), op.capture("eps")))
        normalized = _normalize(op, wide, std, normalize)
        return op.Mul(op.Cast(normalized, to=op.capture("to")) if upcast else normalized, weight)

    if not upcast:
        return GraphPattern(
            rms_norm,
            attrs={"epsilon": "eps"},
            check=lambda m: all_of(one_number(m, "eps"), per_last_axis(m, "x", "weight")),
            name=f"rms_norm[{square},{normalize}]",
        )
    return GraphPattern(
        rms_norm,
        attrs={"epsilon": "eps"},
        check=lambda m: all_of(
            one_number(m, "eps"), per_last_axis(m, "x", "weight"), casts_back_to(m, "x", "to")
        ),
        name=f"rms_norm[{square},{normalize},float32]",
    )


PATTERNS: tuple = tuple(
    _decomposed(s, n, upcast=u)
    for u in (True, False)
    for s in ("pow", "mul")
    for n in ("div", "reciprocal", "one_div")
)
