"""ClampSwish: ``y = max(x, 0) * sigmoid(max(x, 0))`` as one plugin node.

The pattern comes from a custom ``torch.autograd.Function`` whose forward is ``x = x.clamp(min=0)``
followed by ``x / (1 + exp(-x))``; exported to ONNX it becomes a Clip (or Max) and four elementwise ops.
"""

from __future__ import annotations

from gskit.plugin import PluginSpec, patterns_in, same_as_input

from .reference import clamp_swish

SPEC = PluginSpec(
    name="ClampSwish",
    namespace="gskit",
    version="1",
    inputs=("x",),
    outputs=("y",),
    attributes=(),
    infer=same_as_input(0),
    reference=clamp_swish,
    patterns=patterns_in(".patterns", __package__),  # built when replacing reads them
    doc="Swish of the input clamped at zero: x' = max(x, 0), y = x' * sigmoid(x'). Output: x's dtype, shape.",
)
