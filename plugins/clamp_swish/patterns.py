"""What ClampSwish replaces: ``x' = clamp(x, min=0); y = x' / (1 + exp(-x'))`` and ``x' * sigmoid(x')``.

The TorchScript exporter writes the clamp as ``Clip(x, 0, "")`` (``Clip`` with a ``min`` attribute
before opset 11), the dynamo exporter as ``Max(x, 0)``; a ``Relu`` is the same computation. The
swish part is ``Div(x', Add(Exp(Neg(x')), 1))`` as written in the autograd Function, or
``Mul(x', Sigmoid(x'))``.

Derived rules (``from_torch``, cached in ``derived_patterns.json``; ``gskit plugin derive clamp_swish`` writes
it again): ``clamp_swish`` and ``clamp_swish_sigmoid``, the two ways the PyTorch code writes it. The
hand-written rules (one per combination, built by ``_rules``) add the ``Relu`` clamp.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gskit.passes.patterns import GraphPattern
from gskit.plugin import from_torch

# ---- the PyTorch code (torch is imported only when the rules are derived) --------------------------------


def clamp_swish(x: Any) -> Any:
    """The autograd Function's forward: clamp at zero, then ``x / (1 + exp(-x))``."""
    import torch

    x = x.clamp(min=0)
    return x / (1 + torch.exp(-x))


def clamp_swish_sigmoid(x: Any) -> Any:
    """The same swish written with ``sigmoid``."""
    import torch

    x = x.clamp(min=0)
    return x * torch.sigmoid(x)


DERIVED: tuple = (*from_torch(clamp_swish, [(2, 5, 16)]), *from_torch(clamp_swish_sigmoid, [(2, 5, 16)]))

# ---- hand-written rules ------------------------------------------------------------------------------------

Clamp = Callable[[Any, Any], Any]


def _clip(op: Any, x: Any) -> Any:
    return op.Clip(x, min=0.0)


def _max(op: Any, x: Any) -> Any:
    return op.Max(x, 0.0)


def _relu(op: Any, x: Any) -> Any:
    return op.Relu(x)


def _rules(clamp_name: str, clamp: Clamp) -> tuple[GraphPattern, ...]:
    def div_form(op: Any, x: Any) -> Any:
        c = clamp(op, x)
        return op.Div(c, op.Add(op.Exp(op.Neg(c)), 1.0))

    def sigmoid_form(op: Any, x: Any) -> Any:
        c = clamp(op, x)
        return op.Mul(c, op.Sigmoid(c))

    return (
        GraphPattern(div_form, name=f"{clamp_name}/(1+exp(-x))"),
        GraphPattern(sigmoid_form, name=f"{clamp_name}*sigmoid"),
    )


HAND_WRITTEN: tuple = (*_rules("Clip", _clip), *_rules("Max", _max), *_rules("Relu", _relu))

PATTERNS: tuple = (*DERIVED, *HAND_WRITTEN)
