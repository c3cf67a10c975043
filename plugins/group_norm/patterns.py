"""What GroupNorm replaces: ``nn.GroupNorm`` as the exporters decompose it.

Both the TorchScript exporter (opset 17) and the dynamo exporter (opset 18) write::

    grouped = Reshape(x, [N or 0, G, -1])               # the channels split into G groups
    normed = InstanceNormalization(grouped, ones(G), zeros(G), epsilon)
    back = Reshape(normed, Shape(x))                    # dynamo: a constant shape, x's own
    y = Add(Mul(back, weight[C, 1, ...]), bias[C, 1, ...])

Instance normalization of the ``(N, G, -1)`` view is group normalization; the per-channel affine follows. The
rule takes constant ``weight``/``bias`` of ``C`` elements (``(C, 1, ...)`` or ``(C,)``), all-ones scale and
all-zeros bias of the instance norm, and a grouping reshape whose ``G`` divides ``C``; the region becomes one
``GroupNormalization`` (opset 21) with the weight and bias flattened to ``(C,)``. A GroupNorm without affine
(``affine=False``: no Mul/Add) is not matched.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_graphsurgeon as gs

from gskit.passes.patterns import GraphPattern, Match, MatchResult, Rewrite
from gskit.passes.patterns.checks import one_number


def _layout(match: Match) -> tuple[int, int] | MatchResult:
    """``(C, G)`` of the match, or why it is no group norm."""
    x = match.inputs["x"]
    shape = x.shape
    if shape is None or len(shape) < 3:
        return MatchResult.fail(f"'{x.name}' has unknown rank or fewer than 3 dims (N, C, ...)", match.anchor)
    groups = np.asarray(match.captures.get("groups"))
    if groups.ndim != 1 or groups.size != 3 or groups[2] != -1:
        return MatchResult.fail(f"grouping reshape {groups.tolist()} is not [N, G, -1]", match.anchor)
    batch, g = int(groups[0]), int(groups[1])
    if batch not in (0, shape[0]):
        return MatchResult.fail(
            f"grouping reshape keeps batch {batch}, '{x.name}' has {shape[0]}", match.anchor
        )
    weight, bias = (np.asarray(match.captures[name]) for name in ("weight", "bias"))
    c = weight.size
    if g < 1 or c % g or (isinstance(shape[1], int) and shape[1] != c):
        return MatchResult.fail(
            f"{c} channel weights do not fit {g} groups of '{x.name}' {shape}", match.anchor
        )
    for name, value in (("weight", weight), ("bias", bias)):
        if value.size != c or value.ndim not in (1, len(shape) - 1) or value.shape[0] != c:
            return MatchResult.fail(f"{name} of shape {value.shape} is not per channel ({c})", match.anchor)
    ones, zeros = np.asarray(match.captures["ones"]), np.asarray(match.captures["zeros"])
    if ones.size != g or zeros.size != g or np.any(ones != 1) or np.any(zeros != 0):
        return MatchResult.fail(
            "instance norm scale/bias are not ones/zeros of the group count", match.anchor
        )
    return c, g


def _same_shape(match: Match) -> MatchResult:
    """The dynamo form's shape constant brings back ``x``'s own shape (0 copies a dim)."""
    if "shape" not in match.captures:
        return MatchResult.success()
    back = np.asarray(match.captures["shape"]).tolist()
    dims = match.inputs["x"].shape or ()
    if len(back) != len(dims) or any(b != 0 and b != d for b, d in zip(back, dims, strict=True)):
        return MatchResult.fail(f"reshape back to {back} is not the input's shape {list(dims)}", match.anchor)
    return MatchResult.success()


def _check(match: Match) -> MatchResult:
    layout = _layout(match)
    if isinstance(layout, MatchResult):
        return layout
    for result in (one_number(match, "eps"), _same_shape(match)):
        if not result:
            return result
    return MatchResult.success()


class _GroupNormPattern(GraphPattern):
    """The decomposed group norm; the rewrite flattens weight and bias to ``(C,)``."""

    def rewrite(self, match: Match) -> Rewrite:
        c, g = _layout(match)  # type: ignore[misc]  # the check ran first
        name = match.anchor.outputs[0].name  # unique in its graph
        flat = [
            gs.Constant(f"{name}__{part}", np.asarray(match.captures[part]).reshape(c).copy())
            for part in ("weight", "bias")
        ]
        return Rewrite((match.inputs["x"], *flat), {"epsilon": match.scalar("eps"), "num_groups": g})


def _decomposed(back: str) -> GraphPattern:
    def group_norm(op: Any, x: Any) -> Any:
        grouped = op.Reshape(x, op.capture("groups"), allowzero=0)
        normed = op.InstanceNormalization(
            grouped, op.capture("ones"), op.capture("zeros"), epsilon=op.capture("eps")
        )
        shape = op.Shape(x) if back == "shape" else op.capture("shape")
        restored = op.Reshape(normed, shape, allowzero=0)
        return op.Add(op.Mul(restored, op.capture("weight")), op.capture("bias"))

    return _GroupNormPattern(
        group_norm,
        inputs=("x",),
        check=_check,
        name=f"group_norm[{'Shape(x)' if back == 'shape' else 'constant shape'}]",
    )


PATTERNS: tuple = (_decomposed("shape"), _decomposed("constant"))
