"""RMSNorm over the last axis as one plugin node.

``y = x / sqrt(mean(x^2) + epsilon) * weight`` with the mean over the last axis. It replaces the
hand-written ``x * rsqrt(mean(x^2) + eps) * w`` that exporters write as Pow/Mul, ReduceMean, Add,
Sqrt, Reciprocal or Div, Mul, and ``F.rms_norm``. The name does not collide with ONNX's
RMSNormalization (opset 23).

The output takes the weight's dtype (``per_channel_of(0, 1, dtype_of=1)``), which is ``x``'s in every form
but one: fp16 TorchScript exports of Hugging Face models keep the residual stream (``x``) in float32 and cast
the normalized value to float16 before the float16 weight.

Native form: ONNX ``RMSNormalization`` (opset 23), which TensorRT imports natively from 10.15. For a target of
10.15 or newer a matched region becomes that op (the model's opset is raised to 23; its output takes the
scale's dtype, as the plugin's does), below it the plugin node, which is what makes RMSNorm one kernel on
TensorRT 10.3 (JetPack 6) or 8.6.
"""

from __future__ import annotations

from gskit.plugin import Attribute, AttrType, NativeForm, PluginSpec, patterns_in, per_channel_of

from .reference import rms_norm

SPEC = PluginSpec(
    name="RMSNorm",
    namespace="gskit",
    version="1",
    inputs=("x", "weight"),
    outputs=("y",),
    attributes=(
        Attribute("epsilon", AttrType.FLOAT, 1e-5, doc="added to the mean of squares before the square root"),
    ),
    infer=per_channel_of(0, 1, dtype_of=1),
    reference=rms_norm,
    patterns=patterns_in(".patterns", __package__),  # built when replacing reads them
    native=(
        NativeForm(
            "RMSNormalization",
            opset=23,
            tensorrt="10.15",
            attributes={"epsilon": "epsilon"},
            fixed={"axis": -1},
            doc="onnx-tensorrt 10.15 changelog",
        ),
    ),
    doc=(
        "Root-mean-square normalization over the last axis: y = x / sqrt(mean(x^2) + epsilon) * weight. "
        "weight has the size of x's last axis. Output: x's shape, weight's dtype (x's, but for a float32 x "
        "normalized into a float16 model)."
    ),
)
