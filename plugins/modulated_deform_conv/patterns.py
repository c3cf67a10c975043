"""What ModulatedDeformConv2d replaces: deformable convolutions with a mask (DCNv2), 2-D, symmetric padding.

* ONNX ``DeformConv(X, W, offset, B?, mask)`` (opset 19): the plugin takes ``(x, offset, mask, weight,
  bias?)``; ``strides``, ``dilations``, ``group`` and ``offset_group`` map to ``stride``, ``dilation``,
  ``group`` and ``deformable_group``; ``pads [top, left, bottom, right]`` must be symmetric and become
  ``[pad_h, pad_w]``.
* ``custom::deform_conv2d`` with torchvision's argument order ``(input, weight, offset, mask, bias)`` and
  ``use_mask = 1`` (what a symbolic forwarding torchvision's arguments writes).

A DeformConv without a mask (DCNv1) is left to gskit's own DeformConv2d plugin: this one needs the mask as a
tensor of the run's batch size, which no constant can be. gskit's DeformConv2d matches the same nodes; it is
listed first and wins, unless ``replace: {only: [ModulatedDeformConv2d]}`` (``--only ModulatedDeformConv2d``)
picks TensorRT's plugin.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gskit.passes.patterns import Match, MatchResult, OpPattern
from gskit.passes.patterns.match import present


def _plane(match: Match, pads: list[int] | None, sizes: dict[str, Any]) -> MatchResult:
    node = match.anchor
    weight = node.inputs[1] if len(node.inputs) > 1 else None
    if weight is not None and weight.shape is not None and len(weight.shape) != 4:
        return MatchResult.fail(f"'{node.name}' has a {len(weight.shape)}-D weight; the plugin is 2-D", node)
    for name, value in sizes.items():
        if value is not None and len(value) != 2:
            return MatchResult.fail(f"'{node.name}' has {name}={list(value)}; the plugin is 2-D", node)
    if pads is not None and (len(pads) != 4 or pads[:2] != pads[2:]):
        return MatchResult.fail(
            f"'{node.name}' has pads={list(pads)}; the plugin pads both sides alike ([pad_h, pad_w])", node
        )
    return MatchResult.success()


def _onnx_check(match: Match) -> MatchResult:
    node = match.anchor
    if not present(node, 4):
        return MatchResult.fail(
            f"'{node.name}' has no mask (DCNv1); ModulatedDeformConv2d needs one (gskit's DeformConv2d not)",
            node,
        )
    pads = node.attrs.get("pads")
    sizes = {k: node.attrs.get(k) for k in ("strides", "dilations", "kernel_shape")}
    return _plane(match, None if pads is None else [int(p) for p in pads], sizes)


def _onnx_attrs(match: Match) -> Mapping[str, Any]:
    a = match.anchor.attrs
    pads = list(a.get("pads", [0, 0, 0, 0]))
    return {
        "stride": list(a.get("strides", [1, 1])),
        "padding": pads[:2],
        "dilation": list(a.get("dilations", [1, 1])),
        "group": a.get("group", 1),
        "deformable_group": a.get("offset_group", 1),
    }


def _symbolic_check(match: Match) -> MatchResult:
    node = match.anchor
    if not node.attrs.get("use_mask", 1) or not present(node, 3):
        return MatchResult.fail(
            f"'{node.name}' has no mask (use_mask=0); ModulatedDeformConv2d needs one", node
        )
    if len(node.inputs) < 4:
        return MatchResult.fail(
            f"'{node.name}' has {len(node.inputs)} inputs; needs input, weight, offset, mask"
        )
    return _plane(match, None, {})


def _symbolic_attrs(match: Match) -> Mapping[str, Any]:
    a = match.anchor.attrs
    return {
        "stride": [a.get("stride_h", 1), a.get("stride_w", 1)],
        "padding": [a.get("pad_h", 0), a.get("pad_w", 0)],
        "dilation": [a.get("dil_h", 1), a.get("dil_w", 1)],
        "group": a.get("n_weight_grps", 1),
        "deformable_group": a.get("n_offset_grps", 1),
    }


def torchvision_symbolic(domain: str) -> OpPattern:
    """Rule for ``domain::deform_conv2d`` nodes with torchvision's argument order and attribute names."""
    return OpPattern(
        "deform_conv2d",
        domain,
        inputs=(0, 2, 3, 1, 4),
        attrs=_symbolic_attrs,
        check=_symbolic_check,
        name=f"{domain}::deform_conv2d with mask (torchvision order)",
    )


PATTERNS: tuple = (
    OpPattern(
        "DeformConv",
        "",
        inputs=(0, 2, 4, 1, 3),
        attrs=_onnx_attrs,
        check=_onnx_check,
        name="DeformConv with mask (opset 19)",
    ),
    torchvision_symbolic("custom"),
)
