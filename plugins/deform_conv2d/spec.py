"""DeformConv2d: torchvision's ``deform_conv2d`` (ONNX ``DeformConv``) as one plugin node.

Each kernel tap samples the input at its regular position plus a learned ``(dy, dx)`` offset, by
bilinear interpolation (zero outside the image), optionally scaled by a mask (DCNv2); the samples go
through an ordinary grouped convolution. Inputs follow ONNX DeformConv's order ``(x, weight, offset,
bias?, mask?)`` and its attribute names; see ``reference.deform_conv2d`` for the exact math.

Native form: ONNX ``DeformConv`` (opset 19), which TensorRT imports natively from 10.1 (1D/2D, the same pads
at both ends of each axis). For such a target a matched region becomes that op (a ``DeformConv`` node is left
as it is); below 10.1, or with asymmetric pads, the plugin node. TensorRT-RTX has no DeformConv importer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gskit.errors import PluginError
from gskit.plugin import Attribute, AttrType, NativeForm, PluginSpec, TensorInfo, patterns_in

from .reference import deform_conv2d, output_size


def example_inputs(rng: np.random.Generator) -> list[np.ndarray]:
    """Inputs for a one-node test model with the default attributes (plugin-wide tests use them)."""
    shapes = [(1, 4, 6, 7), (4, 4, 3, 3), (1, 18, 4, 5), (4,), (1, 9, 4, 5)]
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    arrays[4] = rng.random(shapes[4]).astype(np.float32)
    return arrays


def infer(inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any]) -> list[TensorInfo]:
    """Output ``(N, C_out, oH, oW)`` in ``x``'s dtype.

    ``N`` is ``x``'s batch dim (symbolic kept), ``C_out`` is ``weight``'s first dim; each spatial dim is
    ``(size + pads - dilation * (k - 1) - 1) // stride + 1`` when the input size and kernel size are
    known, otherwise ``offset``'s dim at that position (which has the output's spatial shape), else None.

    Raises:
        PluginError: ``x`` or ``weight`` is absent, or has a known rank other than 4.
    """
    x, weight = inputs[0], inputs[1] if len(inputs) > 1 else None
    offset = inputs[2] if len(inputs) > 2 else None
    if x is None or weight is None:
        raise PluginError("DeformConv2d output shape rule needs inputs x and weight")
    for label, info in (("x", x), ("weight", weight), ("offset", offset)):
        if info is not None and info.shape is not None and len(info.shape) != 4:
            raise PluginError(f"DeformConv2d input {label} has rank {len(info.shape)}, expected 4")
    if x.shape is None and weight.shape is None:
        return [TensorInfo(x.dtype, None)]
    x_shape = x.shape or (None,) * 4
    w_shape = weight.shape or (None,) * 4
    off_shape = offset.shape if offset is not None and offset.shape is not None else (None,) * 4
    strides = list(attrs.get("strides") or (1, 1))
    pads = list(attrs.get("pads") or (0, 0, 0, 0))
    dilations = list(attrs.get("dilations") or (1, 1))
    spatial: list[int | str | None] = []
    for axis in (0, 1):
        size, kernel = x_shape[2 + axis], w_shape[2 + axis]
        if isinstance(size, int) and isinstance(kernel, int):
            spatial.append(
                output_size(size, kernel, strides[axis], pads[axis], pads[axis + 2], dilations[axis])
            )
        else:
            spatial.append(off_shape[2 + axis])
    return [TensorInfo(x.dtype, (x_shape[0], w_shape[0], *spatial))]


def symmetric_pads(attrs: Mapping[str, Any]) -> str | None:
    """TensorRT's DeformConv importer takes the same padding at both ends of each spatial axis only."""
    pads = list(attrs.get("pads") or (0, 0, 0, 0))
    half = len(pads) // 2
    if pads[:half] != pads[half:]:
        return f"pads {pads} differ at the two ends of an axis (TensorRT takes symmetric pads only)"
    return None


SPEC = PluginSpec(
    name="DeformConv2d",
    namespace="gskit",
    version="1",
    inputs=("x", "weight", "offset", "bias?", "mask?"),
    outputs=("y",),
    attributes=(
        Attribute("strides", AttrType.INTS, [1, 1], doc="[stride_h, stride_w]"),
        Attribute("pads", AttrType.INTS, [0, 0, 0, 0], doc="[top, left, bottom, right]"),
        Attribute("dilations", AttrType.INTS, [1, 1], doc="[dilation_h, dilation_w]"),
        Attribute("group", AttrType.INT, 1, doc="convolution groups"),
        Attribute("offset_group", AttrType.INT, 1, doc="channel groups sharing one set of offsets"),
    ),
    infer=infer,
    reference=deform_conv2d,
    patterns=patterns_in(".patterns", __package__),  # built when replacing reads them
    native=(
        NativeForm(
            "DeformConv",
            opset=19,
            tensorrt="10.1",
            attributes={k: k for k in ("strides", "pads", "dilations", "group", "offset_group")},
            check=symmetric_pads,
            doc="onnx-tensorrt 10.1 changelog; 1D/2D, symmetric pads; no importer in TensorRT-RTX",
        ),
    ),
    doc=(
        "Deformable 2-D convolution (torchvision deform_conv2d / ONNX DeformConv): bilinear samples at "
        "offset kernel taps, zero outside the image, times the optional mask, then a grouped convolution "
        "plus the optional bias. Output (N, C_out, oH, oW)."
    ),
)
