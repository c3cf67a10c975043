"""GroupNorm: ``nn.GroupNorm`` as exporters decompose it, written as ONNX ``GroupNormalization`` (opset 21).

This spec has no plugin node (``plugin_form=False``): its only form is the native one. TensorRT imports
``GroupNormalization``-21 (per-channel scale and bias) natively from 10.9; for such a target the decomposed
Reshape/InstanceNormalization/Reshape/Mul/Add region (a diffusers UNet has 21 of them) becomes that one op,
the model's opset raised to 21 when below. For an older target the region is left as the exporter wrote it:
TensorRT runs the decomposition, and gskit writes no plugin node that no TensorRT implementation backs.

The numpy reference (``reference.group_norm``) checks the patterns and the native op on a CPU.
"""

from __future__ import annotations

import numpy as np

from gskit.plugin import Attribute, AttrType, NativeForm, PluginSpec, patterns_in, same_as_input

from .reference import group_norm


def example_inputs(rng: np.random.Generator) -> list[np.ndarray]:
    """Inputs for a one-node model with the default attributes (one group: plugin-wide tests use them)."""
    return [rng.standard_normal(s).astype(np.float32) for s in ((2, 4, 3, 5), (4,), (4,))]


SPEC = PluginSpec(
    name="GroupNorm",
    namespace="gskit",
    version="1",
    inputs=("x", "weight", "bias"),
    outputs=("y",),
    attributes=(
        Attribute("epsilon", AttrType.FLOAT, 1e-5, doc="added to the variance before the square root"),
        Attribute("num_groups", AttrType.INT, 1, doc="groups the channels (axis 1) are split into"),
    ),
    infer=same_as_input(0),
    reference=group_norm,
    patterns=patterns_in(".patterns", __package__),  # built when replacing reads them
    native=(
        NativeForm(
            "GroupNormalization",
            opset=21,
            tensorrt="10.9",
            attributes={"epsilon": "epsilon", "num_groups": "num_groups"},
            doc="onnx-tensorrt 10.9 changelog (opset 21 GroupNorm); older parsers take opset 18's form only",
        ),
    ),
    plugin_form=False,
    doc=(
        "Group normalization over the channel axis: y = (x - mean_g) / sqrt(var_g + epsilon) * weight + "
        "bias, mean and biased variance per sample and group of channels. weight and bias have C elements."
    ),
)
