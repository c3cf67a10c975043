"""LayerNorm over the last axis as one plugin node.

``y = (x - mean(x)) / sqrt(var(x) + epsilon) * weight + bias`` with the mean and the biased variance
taken over the last axis. It replaces what exporters write for ``nn.LayerNorm`` at opsets below 17 and
for hand-written layer norms (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add), and ONNX's
own ``LayerNormalization`` over the last axis. The name is not an ONNX op (ONNX has LayerNormalization).

Native form: ONNX ``LayerNormalization`` (opset 17), which TensorRT imports natively from 8.6 (its
INormalizationLayer); TensorRT also warns that decomposed layer norms overflow in fp16 and asks for opset 17.
For a target of 8.6 or newer a matched region becomes that op (a ``LayerNormalization`` node is left as it
is), below 8.6 the plugin node.
"""

from __future__ import annotations

from gskit.plugin import Attribute, AttrType, NativeForm, PluginSpec, patterns_in, per_channel_of

from .reference import layer_norm

SPEC = PluginSpec(
    name="LayerNorm",
    namespace="gskit",
    version="1",
    inputs=("x", "weight", "bias"),
    outputs=("y",),
    attributes=(
        Attribute("epsilon", AttrType.FLOAT, 1e-5, doc="added to the variance before the square root"),
    ),
    infer=per_channel_of(0, 1),
    reference=layer_norm,
    patterns=patterns_in(".patterns", __package__),  # built when replacing reads them
    native=(
        NativeForm(
            "LayerNormalization",
            opset=17,
            tensorrt="8.6",
            attributes={"epsilon": "epsilon"},
            fixed={"axis": -1},
            doc="INormalizationLayer (onnx-tensorrt 8.6 changelog); only output Y",
        ),
    ),
    doc=(
        "Layer normalization over the last axis: y = (x - mean) / sqrt(var + epsilon) * weight + bias "
        "(biased variance). weight and bias have the size of x's last axis. Output: x's dtype and shape."
    ),
)
