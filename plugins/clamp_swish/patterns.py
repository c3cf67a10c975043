"""What ClampSwish replaces: ``x' = clamp(x, min=0); y = x' / (1 + exp(-x'))`` and ``x' * sigmoid(x')``.

The TorchScript exporter writes the clamp as ``Clip(x, 0, "")`` (``Clip`` with a ``min`` attribute
before opset 11), the dynamo exporter as ``Max(x, 0)``; a ``Relu`` is the same computation. The
swish part is ``Div(x', Add(Exp(Neg(x')), 1))`` as written in the autograd Function, or
``Mul(x', Sigmoid(x'))``. One rule per combination, built by ``_rules``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gskit.passes.patterns import GraphPattern

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


PATTERNS: tuple = (*_rules("Clip", _clip), *_rules("Max", _max), *_rules("Relu", _relu))
