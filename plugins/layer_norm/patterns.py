"""What LayerNorm replaces: layer normalization over the last axis, decomposed or as one ONNX op.

Decomposed (TorchScript and dynamo exporters; ``axes`` as attribute or, from opset 18, as input)::

    mean = ReduceMean(x, axes=[-1]); d = Sub(x, mean)
    var = ReduceMean(Pow(d, 2), axes=[-1])          # or Mul(d, d)
    y = Div(d, Sqrt(Add(var, eps))) * weight + bias  # or Mul(d, Reciprocal(Sqrt(...)))

and ``LayerNormalization(x, weight, bias, axis=-1)``. ``epsilon`` comes from the constant; a form with no
``Add`` before ``Sqrt`` (what the dynamo exporter leaves of a 1e-12 epsilon) becomes ``epsilon = 0``.
Calls of the local function ``torch.nn.modules.normalization::LayerNorm`` (TorchScript export with
``export_modules_as_functions={nn.LayerNorm}``) are replaced too when its body normalizes the last
axis only and the call has a weight and a bias; ``epsilon`` is the call's ``eps`` attribute.
"""

from __future__ import annotations

from typing import Any

from gskit.patterns import FunctionPattern, GraphPattern, Match, MatchResult, OpPattern
from gskit.patterns.checks import all_of, one_number, per_last_axis


def _square(op: Any, d: Any, form: str) -> Any:
    return op.Pow(d, 2.0) if form == "pow" else op.Mul(d, d)


def _normalize(op: Any, d: Any, std: Any, form: str) -> Any:
    return op.Div(d, std) if form == "div" else op.Mul(d, op.Reciprocal(std))


def _decomposed(square: str, normalize: str, *, with_eps: bool = True) -> GraphPattern:
    def layer_norm(op: Any, x: Any, weight: Any, bias: Any) -> Any:
        d = op.Sub(x, op.ReduceMean(x, axes=[-1], keepdims=1))
        var = op.ReduceMean(_square(op, d, square), axes=[-1], keepdims=1)
        std = op.Sqrt(op.Add(var, op.capture("eps")) if with_eps else var)
        return op.Add(op.Mul(_normalize(op, d, std, normalize), weight), bias)

    if with_eps:
        return GraphPattern(
            layer_norm,
            attrs={"epsilon": "eps"},
            check=lambda m: all_of(one_number(m, "eps"), per_last_axis(m, "x", "weight", "bias")),
            name=f"layer_norm[{square},{normalize}]",
        )
    # The dynamo exporter's optimizer deletes an Add of a tiny constant (BERT's 1e-12), leaving Sqrt(var):
    # the same computation as LayerNorm with epsilon 0.
    return GraphPattern(
        layer_norm,
        attrs=lambda m: {"epsilon": 0.0},
        check=lambda m: per_last_axis(m, "x", "weight", "bias"),
        name=f"layer_norm[{square},{normalize},no-eps]",
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
        return MatchResult.fail(f"LayerNormalization '{node.name}' has no bias (the plugin needs one)", node)
    return MatchResult.success()


def _torch_function(match: Match) -> MatchResult:
    node, function = match.anchor, match.function
    if len(node.inputs) != 3 or not all(t.name for t in node.inputs):
        return MatchResult.fail(f"call '{node.name}' has no weight and bias (elementwise_affine=False)", node)
    body = [n for n in function.nodes if n.op == "LayerNormalization"] if function is not None else []
    if len(body) != 1 or body[0].attrs.get("axis", -1) != -1:
        return MatchResult.fail(f"function of call '{node.name}' does not normalize the last axis only", node)
    return MatchResult.success()


PATTERNS: tuple = (
    *(_decomposed(s, n) for s in ("pow", "mul") for n in ("div", "reciprocal")),
    *(_decomposed(s, n, with_eps=False) for s in ("pow", "mul") for n in ("div", "reciprocal")),
    OpPattern(
        "LayerNormalization",
        "",
        attrs={"epsilon": "epsilon"},
        inputs=(0, 1, 2),
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
