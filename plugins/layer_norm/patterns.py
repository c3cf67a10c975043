"""What LayerNorm replaces: layer normalization over the last axis, decomposed or as one ONNX op.

Derived rules (``from_torch``, cached in ``derived_patterns.json``; ``gskit plugin derive layer_norm`` writes
it again): ``torch_layer_norm`` (``F.layer_norm``: ``LayerNormalization`` from opset 17, decomposed before),
``layer_norm`` (the decomposition written out, as PaddlePaddle and hand-written modules compute it) and
``keras_layer_norm`` / ``keras_layer_norm_pooled`` (Keras' folded scale, as tf2onnx writes it, with means as
ReduceMean or as GlobalAveragePool). The hand-written rules below cover these and what PyTorch code does not
describe as the plugin's inputs (no bias: the plugin gets a zero bias).

Hand-written rules:

Decomposed (TorchScript and dynamo exporters; ``axes`` as attribute or, from opset 18, as input)::

    mean = ReduceMean(x, axes=[-1]); d = Sub(x, mean)
    var = ReduceMean(Pow(d, 2), axes=[-1])          # or Mul(d, d)
    y = Div(d, Sqrt(Add(var, eps))) * weight + bias  # or Mul(d, Reciprocal(Sqrt(...))), Mul(d, Div(1, ...))

The variance may also be written ``E[x^2] - E[x]^2`` (Flax/JAX code and models converted from it):
``Sub(ReduceMean(Mul(x, x)), Mul(mean, mean))`` (or with ``Pow(., 2)``). Keras' LayerNormalization exported
by tf2onnx folds the scale into both terms, ``x * s + (bias - mean * s)`` with ``s = weight / sqrt(var +
eps)``, its means sometimes written as ``GlobalAveragePool`` (for a 3-D input, the last axis' mean). Then
``LayerNormalization(x, weight, bias, axis=-1)``. ``epsilon`` comes from the constant; a form with no ``Add``
before ``Sqrt`` (what the dynamo exporter leaves of a 1e-12 epsilon) becomes ``epsilon = 0``. A layer norm
without a bias (``nn.LayerNorm(bias=False)``, or a zero bias the dynamo exporter dropped, as in ModernBERT)
gets a zero bias constant of the weight's size, since the plugin takes three inputs.
Calls of the local function ``torch.nn.modules.normalization::LayerNorm`` (TorchScript export with
``export_modules_as_functions={nn.LayerNorm}``) are replaced too when its body normalizes the last
axis only and the call has a weight and a bias; ``epsilon`` is the call's ``eps`` attribute.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_graphsurgeon as gs

from gskit.passes.patterns import (
    FunctionPattern,
    GraphPattern,
    Match,
    MatchResult,
    OpPattern,
    Rewrite,
    constant_value,
)
from gskit.passes.patterns.checks import all_of, one_number, per_last_axis
from gskit.plugin import from_torch

# ---- the PyTorch code (torch is imported only when the rules are derived) --------------------------------


def torch_layer_norm(x: Any, weight: Any, bias: Any, *, epsilon: float) -> Any:
    """``torch.nn.functional.layer_norm`` over the last axis (``nn.LayerNorm``)."""
    import torch

    return torch.nn.functional.layer_norm(x, x.shape[-1:], weight, bias, epsilon)


def layer_norm(x: Any, weight: Any, bias: Any, *, epsilon: float) -> Any:
    """The decomposition written out: ``(x - mean) / sqrt(var + eps) * weight + bias``."""
    import torch

    d = x - x.mean(-1, keepdim=True)
    return d / torch.sqrt(d.pow(2).mean(-1, keepdim=True) + epsilon) * weight + bias


def keras_layer_norm(x: Any, weight: Any, bias: Any, *, epsilon: float) -> Any:
    """Keras' LayerNormalization as tf2onnx writes it: the scale folded into both terms."""
    import torch

    mean = x.mean(-1, keepdim=True)
    d = x - mean
    scale = torch.reciprocal(torch.sqrt((d * d).mean(-1, keepdim=True) + epsilon)) * weight
    return x * scale + (bias - mean * scale)


def keras_layer_norm_pooled(x: Any, weight: Any, bias: Any, *, epsilon: float) -> Any:
    """The same with the means of a 3-D tensor as GlobalAveragePool (tf2onnx's optimizer writes them so)."""
    import torch

    mean = torch.nn.functional.adaptive_avg_pool1d(x, 1)
    d = x - mean
    var = torch.nn.functional.adaptive_avg_pool1d(d * d, 1)
    scale = torch.reciprocal(torch.sqrt(var + epsilon)) * weight
    return x * scale + (bias - mean * scale)


def _per_channel(match: Match) -> MatchResult:
    return per_last_axis(match, "x", "weight", "bias")


def _three_d_per_channel(match: Match) -> MatchResult:
    """GlobalAveragePool is the mean over the last axis only for a 3-D input."""
    shape = match.inputs["x"].shape
    if shape is None or len(shape) != 3:
        return MatchResult.fail(
            f"GlobalAveragePool is the mean over the last axis only for a 3-D input; "
            f"'{match.inputs['x'].name}' has shape {shape}",
            match.anchor,
        )
    return _per_channel(match)


#: x, weight and bias of the exports: a 3-D activation, one weight and bias per channel (sizes other than 1).
EXAMPLE = [(2, 5, 16), (16,), (16,)]

DERIVED: tuple = (
    *(
        rule
        for fn in (torch_layer_norm, layer_norm, keras_layer_norm)
        for rule in from_torch(fn, EXAMPLE, {"epsilon": 1e-5}, check=_per_channel)
    ),
    *from_torch(keras_layer_norm_pooled, EXAMPLE, {"epsilon": 1e-5}, check=_three_d_per_channel),
)

# ---- hand-written rules ------------------------------------------------------------------------------------


def _square(op: Any, d: Any, form: str) -> Any:
    return op.Pow(d, 2.0) if form == "pow" else op.Mul(d, d)


def _normalize(op: Any, d: Any, std: Any, form: str) -> Any:
    if form == "div":
        return op.Div(d, std)
    if form == "reciprocal":
        return op.Mul(d, op.Reciprocal(std))
    return op.Mul(d, op.Div(1.0, std))  # TorchScript's rsqrt


def _zero_bias_shape(match: Match) -> tuple[tuple[int, ...], Any] | MatchResult:
    """Shape and dtype of a zero bias: the weight's when it is a constant, else x's last dim and dtype."""
    weight, x = (
        match.inputs.get("weight", match.inputs.get("1")),
        match.inputs.get("x", match.inputs.get("0")),
    )
    value = constant_value(weight)
    if value is not None:
        return (int(value.shape[-1]) if value.ndim else 1,), value.dtype
    last = x.shape[-1] if x.shape else None
    if isinstance(last, int) and isinstance(x.dtype, (np.dtype, type)):  # not bfloat16's bare onnx enum
        return (last,), x.dtype
    return MatchResult.fail(
        f"no bias, and the size of a zero bias is unknown (weight '{weight.name}' is not a constant and "
        f"the last dim of '{x.name}' is not known)",
        match.anchor,
    )


def _zero_bias(match: Match) -> gs.Constant:
    shape, dtype = _zero_bias_shape(match)  # type: ignore[misc]  # the check ran first
    # Named after the anchor's output, which is unique in its graph.
    return gs.Constant(f"{match.anchor.outputs[0].name}__zero_bias", np.zeros(shape, dtype=dtype))


def _needs_zero_bias(match: Match) -> MatchResult:
    shape = _zero_bias_shape(match)
    return shape if isinstance(shape, MatchResult) else MatchResult.success()


class _ZeroBiasPattern(GraphPattern):
    """A decomposed layer norm that ends at the weight's Mul: the plugin gets a zero bias."""

    def rewrite(self, match: Match) -> Rewrite:
        base = super().rewrite(match)
        return Rewrite((*base.inputs, _zero_bias(match)), base.attrs)


def _decomposed(
    square: str, normalize: str, *, with_eps: bool = True, variance: str = "centered", bias: bool = True
) -> GraphPattern:
    def layer_norm(op: Any, x: Any, weight: Any, bias: Any = None) -> Any:
        mean = op.ReduceMean(x, axes=[-1], keepdims=1)
        d = op.Sub(x, mean)
        if variance == "centered":
            var = op.ReduceMean(_square(op, d, square), axes=[-1], keepdims=1)
        else:  # E[x^2] - E[x]^2
            var = op.Sub(
                op.ReduceMean(_square(op, x, square), axes=[-1], keepdims=1), _square(op, mean, square)
            )
        std = op.Sqrt(op.Add(var, op.capture("eps")) if with_eps else var)
        scaled = op.Mul(_normalize(op, d, std, normalize), weight)
        return op.Add(scaled, bias) if bias is not None else scaled

    if not bias:
        pattern_fn: Any = lambda op, x, weight: layer_norm(op, x, weight)  # noqa: E731
        pattern_fn.__name__ = "layer_norm"
    else:
        pattern_fn = layer_norm
    names = ("x", "weight", "bias") if bias else ("x", "weight")
    checks = [lambda m: per_last_axis(m, *names)]
    if with_eps:
        checks.append(lambda m: one_number(m, "eps"))
    if not bias:
        checks.append(_needs_zero_bias)
    # The dynamo exporter's optimizer deletes an Add of a tiny constant (BERT's 1e-12), leaving Sqrt(var):
    # the same computation as LayerNorm with epsilon 0.
    attrs: Any = {"epsilon": "eps"} if with_eps else (lambda m: {"epsilon": 0.0})
    tags = [square, normalize] + ([] if with_eps else ["no-eps"])
    tags += ([] if variance == "centered" else ["E[x^2]-E[x]^2"]) + ([] if bias else ["no-bias"])
    kind = GraphPattern if bias else _ZeroBiasPattern
    return kind(
        pattern_fn,
        attrs=attrs,
        check=lambda m: all_of(*(c(m) for c in checks)),
        name=f"layer_norm[{','.join(tags)}]",
    )


def _keras(mean_op: str) -> GraphPattern:
    """Keras' LayerNormalization as tf2onnx writes it: the scale folded into both terms,
    ``x * s + (bias - mean * s)`` with ``s = weight / sqrt(var + eps)``; tf2onnx's optimizer may write the
    mean of a 3-D tensor as ``GlobalAveragePool`` (the mean over its last axis)."""

    def mean_of(op: Any, t: Any) -> Any:
        return op.ReduceMean(t, axes=[-1], keepdims=1) if mean_op == "ReduceMean" else op.GlobalAveragePool(t)

    def layer_norm(op: Any, x: Any, weight: Any, bias: Any) -> Any:
        mean = mean_of(op, x)
        d = op.Sub(x, mean)
        var = mean_of(op, op.Mul(d, d))
        scale = op.Mul(op.Reciprocal(op.Sqrt(op.Add(var, op.capture("eps")))), weight)
        return op.Add(op.Mul(x, scale), op.Sub(bias, op.Mul(mean, scale)))

    def three_d(match: Match) -> MatchResult:
        shape = match.inputs["x"].shape
        if mean_op == "GlobalAveragePool" and (shape is None or len(shape) != 3):
            return MatchResult.fail(
                f"GlobalAveragePool is the mean over the last axis only for a 3-D input; "
                f"'{match.inputs['x'].name}' has shape {shape}",
                match.anchor,
            )
        return MatchResult.success()

    return GraphPattern(
        layer_norm,
        attrs={"epsilon": "eps"},
        check=lambda m: all_of(three_d(m), one_number(m, "eps"), per_last_axis(m, "x", "weight", "bias")),
        name=f"layer_norm[keras,{mean_op}]",
    )


def _last_axis(match: Match) -> MatchResult:
    node = match.anchor
    axis = node.attrs.get("axis", -1)
    rank = len(node.inputs[0].shape) if node.inputs[0].shape is not None else None
    if axis != -1 and (rank is None or axis != rank - 1):
        return MatchResult.fail(
            f"LayerNormalization '{node.name}' normalizes from axis {axis}, not the last axis only", node
        )
    if len(node.outputs) > 1 and any(t.outputs for t in node.outputs[1:]):
        return MatchResult.fail(f"LayerNormalization '{node.name}' has its mean or inverse std used", node)
    if len(node.inputs) < 3 or not node.inputs[2].name:
        return _needs_zero_bias(match)
    return MatchResult.success()


def _op_inputs(match: Match) -> tuple:
    node = match.anchor
    if len(node.inputs) >= 3 and node.inputs[2].name:
        return (0, 1, 2)
    shape, dtype = _zero_bias_shape(match)  # type: ignore[misc]  # _last_axis ran first
    return (0, 1, np.zeros(shape, dtype=dtype))


def _torch_function(match: Match) -> MatchResult:
    node, function = match.anchor, match.function
    if len(node.inputs) != 3 or not all(t.name for t in node.inputs):
        return MatchResult.fail(f"call '{node.name}' has no weight and bias (elementwise_affine=False)", node)
    body = [n for n in function.nodes if n.op == "LayerNormalization"] if function is not None else []
    if len(body) != 1 or body[0].attrs.get("axis", -1) != -1:
        return MatchResult.fail(f"function of call '{node.name}' does not normalize the last axis only", node)
    return MatchResult.success()


_SQUARES, _NORMALIZE = ("pow", "mul"), ("div", "reciprocal", "one_div")

HAND_WRITTEN: tuple = (
    *(
        _decomposed(s, n, with_eps=e, bias=b)
        for b in (True, False)
        for e in (True, False)
        for s in _SQUARES
        for n in _NORMALIZE
    ),
    *(_decomposed(s, n, variance="raw", bias=b) for b in (True, False) for s in _SQUARES for n in _NORMALIZE),
    *(_keras(m) for m in ("ReduceMean", "GlobalAveragePool")),
    OpPattern(
        "LayerNormalization",
        "",
        attrs={"epsilon": "epsilon"},
        inputs=_op_inputs,
        check=_last_axis,
        name="LayerNormalization(axis=-1)",
    ),
    FunctionPattern(
        "LayerNorm",
        "torch.nn.modules.normalization",
        attrs={"epsilon": "eps"},
        inputs=(0, 1, 2),
        check=_torch_function,
        name="torch nn.LayerNorm function",
    ),
)

PATTERNS: tuple = (*DERIVED, *HAND_WRITTEN)
