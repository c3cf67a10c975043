"""ModulatedDeformConv2d v2: TensorRT's own DCNv2 plugin (``libnvinfer_plugin``, IPluginV3, TensorRT 10.11+).

TensorRT implements it: this folder has no kernel and no ``trt_plugin.py``. Inputs ``(x, offset, mask,
weight, bias?)`` and fields ``stride``, ``padding``, ``dilation`` (INT32 x 2), ``group``, ``deformable_group``
(INT32) as
NVIDIA/TensorRT's ``plugin/modulatedDeformConvPlugin`` defines them (README.md names the files and commit).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gskit.errors import PluginError
from gskit.plugin import Attribute, AttrType, PluginSpec, TensorInfo, libnvinfer, patterns_in

from .reference import modulated_deform_conv2d


def example_inputs(rng: np.random.Generator) -> list[np.ndarray]:
    """x ``[1, 4, 6, 7]``, offset, mask, weight ``[4, 4, 3, 3]`` and bias for a one-node test model."""
    return [
        rng.standard_normal((1, 4, 6, 7)).astype(np.float32),
        rng.standard_normal((1, 18, 4, 5)).astype(np.float32),
        rng.random((1, 9, 4, 5)).astype(np.float32),
        rng.standard_normal((4, 4, 3, 3)).astype(np.float32),
        rng.standard_normal(4).astype(np.float32),
    ]


def infer(inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any]) -> list[TensorInfo]:
    """``[N, C_out, oH, oW]`` in ``x``'s dtype: N from x, C_out from the weight, oH and oW from the offset (as
    the plugin's ``getOutputShapes`` does).

    Raises:
        PluginError: x, offset or weight is absent, or of a known rank other than 4.
    """
    x, offset = inputs[0], inputs[1] if len(inputs) > 1 else None
    weight = inputs[3] if len(inputs) > 3 else None
    if x is None or offset is None or weight is None:
        raise PluginError("ModulatedDeformConv2d needs inputs x, offset, mask and weight")
    for label, info in (("x", x), ("offset", offset), ("weight", weight)):
        if info.shape is not None and len(info.shape) != 4:
            raise PluginError(f"ModulatedDeformConv2d input {label} has rank {len(info.shape)}, expected 4")
    n = x.shape[0] if x.shape else None
    c_out = weight.shape[0] if weight.shape else None
    spatial = tuple(offset.shape[2:]) if offset.shape else (None, None)
    return [TensorInfo(x.dtype, (n, c_out, *spatial))]


SPEC = PluginSpec(
    name="ModulatedDeformConv2d",
    **libnvinfer.SPEC_FIELDS,
    version="2",
    inputs=("x", "offset", "mask", "weight", "bias?"),
    outputs=("y",),
    attributes=(
        Attribute("stride", AttrType.INTS, [1, 1], doc="[stride_h, stride_w]"),
        Attribute("padding", AttrType.INTS, [0, 0], doc="[pad_h, pad_w], both sides alike"),
        Attribute("dilation", AttrType.INTS, [1, 1], doc="[dilation_h, dilation_w]"),
        Attribute("group", AttrType.INT, 1, doc="convolution groups"),
        Attribute("deformable_group", AttrType.INT, 1, doc="channel groups sharing offsets and masks"),
    ),
    infer=infer,
    reference=modulated_deform_conv2d,
    patterns=patterns_in(".patterns", __package__),  # built when replacing reads them
    supports_fp16=True,
    doc=(
        "TensorRT's ModulatedDeformConv2d v2 (libnvinfer_plugin, TensorRT >= 10.11; v1 from 8.6, deprecated):"
        " deformable convolution with a mask (DCNv2), symmetric padding, inputs (x, offset, mask, weight, "
        "bias?)."
    ),
)
