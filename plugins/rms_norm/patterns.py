"""What RMSNorm replaces: ``x / sqrt(mean(x^2, -1) + eps) * weight`` in the forms exporters write.

Derived rules (``from_torch``): the PyTorch code of the RMSNorms in use, exported by every exporter form of
the installed torch (their rules are cached in ``derived_patterns.json``; ``gskit plugin derive rms_norm``
writes it again): ``rms_norm`` (hand-written modules), ``rms_norm_div`` (the same with ``x * x`` and a
division), ``hf_rms_norm`` (transformers' LlamaRMSNorm, Qwen2, Mistral ...), ``t5_layer_norm``
(transformers' T5LayerNorm) and ``torch_rms_norm`` (``F.rms_norm``). The hand-written rules below cover the
same forms and stay for models exported by other tools.

Hand-written rules:

``x^2`` is ``Pow(x, 2)`` or ``Mul(x, x)``; the division is ``Div(x, std)``, ``Mul(x, Reciprocal(std))``
(dynamo's ``rsqrt``) or ``Mul(x, Div(1, std))`` (TorchScript's ``rsqrt``). ``axes`` as attribute or input.
The ``float32`` forms are Hugging Face's (LLaMA, Qwen2, Mistral ...): ``Cast(x, to=float)`` first and the
normalized value cast to the model's dtype before the weight; in an fp16 or bf16 model one plugin node then
reads ``x`` and writes the weight's dtype (the plugin accumulates in float32), which the spec declares as its
output dtype: the replace pass checks that it is the dtype the model has there. In a float32 model those Casts
are no-ops. TorchScript's fp16 exports keep ``x`` in float32 and cast to float16 at the end: the same rule.
"""

from __future__ import annotations

from typing import Any

from gskit.passes.patterns import GraphPattern, Match, MatchResult
from gskit.passes.patterns.checks import all_of, one_number, per_last_axis
from gskit.plugin import from_torch

# ---- the PyTorch code (torch is imported only when the rules are derived) --------------------------------


def rms_norm(x: Any, weight: Any, *, epsilon: float) -> Any:
    """``x * rsqrt(mean(x^2) + eps) * weight``, as hand-written RMSNorm modules compute it."""
    import torch

    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + epsilon))


def rms_norm_div(x: Any, weight: Any, *, epsilon: float) -> Any:
    """The same with the square as ``x * x`` and a division by the root."""
    import torch

    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + epsilon) * weight


def hf_rms_norm(x: Any, weight: Any, *, epsilon: float) -> Any:
    """transformers' LlamaRMSNorm (Qwen2, Mistral ...): float32 inside, x's dtype before the weight."""
    import torch

    dtype = x.dtype
    hidden = x.to(torch.float32)
    hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + epsilon)
    return weight * hidden.to(dtype)


def t5_layer_norm(x: Any, weight: Any, *, epsilon: float) -> Any:
    """transformers' T5LayerNorm: the mean of squares in float32, the result in the weight's dtype."""
    import torch

    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    hidden = x * torch.rsqrt(variance + epsilon)
    if weight.dtype in (torch.float16, torch.bfloat16):
        hidden = hidden.to(weight.dtype)
    return weight * hidden


def torch_rms_norm(x: Any, weight: Any, *, epsilon: float) -> Any:
    """``torch.nn.functional.rms_norm`` (the TorchScript exporter cannot export it)."""
    import torch

    return torch.nn.functional.rms_norm(x, x.shape[-1:], weight, epsilon)


def _weight_per_channel(match: Match) -> MatchResult:
    return per_last_axis(match, "x", "weight")


#: x and weight of the exports: a 3-D activation and one weight per channel (sizes other than 1).
EXAMPLE = [(2, 5, 16), (16,)]

DERIVED: tuple = tuple(
    rule
    for fn in (rms_norm, rms_norm_div, hf_rms_norm, t5_layer_norm, torch_rms_norm)
    for rule in from_torch(fn, EXAMPLE, {"epsilon": 1e-5}, check=_weight_per_channel)
)

# ---- hand-written rules ------------------------------------------------------------------------------------


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
        check=lambda m: all_of(one_number(m, "eps"), per_last_axis(m, "x", "weight")),
        name=f"rms_norm[{square},{normalize},float32]",
    )


HAND_WRITTEN: tuple = tuple(
    _decomposed(s, n, upcast=u)
    for u in (True, False)
    for s in ("pow", "mul")
    for n in ("div", "reciprocal", "one_div")
)

PATTERNS: tuple = (*DERIVED, *HAND_WRITTEN)
