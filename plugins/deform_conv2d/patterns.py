"""What DeformConv2d replaces: ONNX ``DeformConv`` (opset 19) and custom-domain ``deform_conv2d`` nodes.

* ``DeformConv(X, W, offset, B?, mask?)``: same input order and attribute names as the plugin; only
  2-D convolutions (4-D weight, two kernel dims). A node with a mask but no bias gets a zero bias, so
  the plugin node has no empty input in the middle (TensorRT plugins take inputs by position).
* ``<domain>::deform_conv2d``, what a ``register_custom_op_symbolic("torchvision::deform_conv2d", ...)``
  symbolic writes when it forwards torchvision's arguments: inputs ``(input, weight, offset, mask,
  bias)`` and attributes ``stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, n_weight_grps,
  n_offset_grps, use_mask``. The domain is whatever the symbolic chose: ``torchvision_symbolic(domain)``
  builds the rule; ``PATTERNS`` has it for ``custom`` (the domain of the seed example).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from gskit.passes.patterns import Match, MatchResult, OpPattern
from gskit.passes.patterns.match import present


def _two_d(match: Match) -> MatchResult:
    node = match.anchor
    weight = node.inputs[1] if len(node.inputs) > 1 else None
    if weight is not None and weight.shape is not None and len(weight.shape) != 4:
        return MatchResult.fail(
            f"'{node.name}' has a {len(weight.shape)}-D weight; the plugin is 2-D only", node
        )
    for name in ("strides", "dilations", "kernel_shape"):
        value = node.attrs.get(name)
        if value is not None and len(value) != 2:
            return MatchResult.fail(f"'{node.name}' has {name}={list(value)}; the plugin is 2-D only", node)
    pads = node.attrs.get("pads")
    if pads is not None and len(pads) != 4:
        return MatchResult.fail(f"'{node.name}' has pads={list(pads)}; the plugin is 2-D only", node)
    return MatchResult.success()


def _onnx_check(match: Match) -> MatchResult:
    node = match.anchor
    if _mask_without_bias(node) and _out_channels(node) is None:
        return MatchResult.fail(
            f"'{node.name}' has a mask but no bias, and its weight's output-channel dim is unknown, so no "
            "zero bias can be made; give the weight a static shape",
            node,
        )
    return _two_d(match)


def _onnx_inputs(match: Match) -> tuple[int | None | np.ndarray, ...]:
    """The node's inputs in order; a zero bias (the weight's dtype) where a mask follows an absent bias."""
    node = match.anchor
    if not _mask_without_bias(node):
        return tuple(range(len(node.inputs)))
    weight = node.inputs[1]
    dtype = np.float32 if weight.dtype is None else weight.dtype
    if isinstance(dtype, int):  # an ONNX type code
        dtype = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    return (0, 1, 2, np.zeros(_out_channels(node), dtype=dtype), 4)


def _mask_without_bias(node: gs.Node) -> bool:
    return present(node, 4) and not present(node, 3)


def _out_channels(node: gs.Node) -> int | None:
    shape = node.inputs[1].shape if len(node.inputs) > 1 else None
    return shape[0] if shape and isinstance(shape[0], int) and shape[0] >= 0 else None


def _symbolic_attrs(match: Match) -> Mapping[str, Any]:
    a = match.anchor.attrs
    attrs: dict[str, Any] = {}
    if "stride_h" in a or "stride_w" in a:
        attrs["strides"] = [a.get("stride_h", 1), a.get("stride_w", 1)]
    if "pad_h" in a or "pad_w" in a:
        ph, pw = a.get("pad_h", 0), a.get("pad_w", 0)
        attrs["pads"] = [ph, pw, ph, pw]
    if "dil_h" in a or "dil_w" in a:
        attrs["dilations"] = [a.get("dil_h", 1), a.get("dil_w", 1)]
    if "n_weight_grps" in a:
        attrs["group"] = a["n_weight_grps"]
    if "n_offset_grps" in a:
        attrs["offset_group"] = a["n_offset_grps"]
    return attrs


def _symbolic_check(match: Match) -> MatchResult:
    node = match.anchor
    if len(node.inputs) < 3:
        return MatchResult.fail(
            f"'{node.name}' has {len(node.inputs)} inputs; needs input, weight, offset", node
        )
    return _two_d(match)


def _symbolic_inputs(match: Match) -> tuple[int | None, ...]:
    """Plugin order (x, weight, offset, bias?, mask?) from torchvision's (input, weight, offset, mask, bias).

    The mask is left out when ``use_mask`` is 0, so a placeholder mask is not multiplied in.
    """
    use_mask = match.anchor.attrs.get("use_mask", 1)
    return (0, 1, 2, 4, 3) if use_mask else (0, 1, 2, 4)


def torchvision_symbolic(domain: str) -> OpPattern:
    """Rule for ``domain::deform_conv2d`` nodes with torchvision's argument order and attribute names."""
    return OpPattern(
        "deform_conv2d",
        domain,
        inputs=_symbolic_inputs,
        attrs=_symbolic_attrs,
        check=_symbolic_check,
        name=f"{domain}::deform_conv2d (torchvision order)",
    )


PATTERNS: tuple = (
    OpPattern(
        "DeformConv",
        "",
        inputs=_onnx_inputs,
        attrs={k: k for k in ("strides", "pads", "dilations", "group", "offset_group")},
        check=_onnx_check,
        name="DeformConv (opset 19)",
    ),
    torchvision_symbolic("custom"),
)
