"""PyTorch export helpers: symbolics and translations that emit plugin nodes, and export with validation.

torch is optional (``pip install gskit[torch]``): importing this package never imports torch; each
function imports it when called and raises :class:`gskit.errors.GskitError` naming the extra if it is
missing.

Two exporters are covered:

* TorchScript (``torch.onnx.export(..., dynamo=False)``): :func:`register_symbolic` maps an aten,
  torchvision or custom op to a standard ONNX op or to a plugin node; :func:`as_plugin` gives an
  ``autograd.Function`` a ``symbolic``; :func:`export_as_plugins` exports modules as local functions
  and replaces their calls by plugin nodes.
* dynamo (``torch.onnx.export(..., dynamo=True)``): :func:`translation` builds an entry of
  ``custom_translation_table`` (plugin nodes through an onnxscript custom opset); :func:`as_plugin`
  routes the Function through a ``torch.library`` custom op.

Every export goes through :func:`export`, which runs the written model on onnxruntime (plugin nodes
through their numpy references) against PyTorch on the same inputs.

``derive`` exports a plugin's PyTorch code with every exporter form for ``gskit.plugin.from_torch``, which
imports it only when no cache holds the rules.
"""

from gskit.torch_export.autograd import as_plugin
from gskit.torch_export.dynamo import plugin_op, torch_op, translation
from gskit.torch_export.export import ExportResult, ModulePlugin, export, export_as_plugins, validate
from gskit.torch_export.torchscript import (
    Call,
    SymbolicRegistration,
    emit_onnx_op,
    emit_plugin,
    register_symbolic,
    unregister_symbolic,
)

__all__ = [
    # TorchScript exporter
    "register_symbolic",
    "unregister_symbolic",
    "SymbolicRegistration",
    "Call",
    "emit_plugin",
    "emit_onnx_op",
    # dynamo exporter
    "translation",
    "plugin_op",
    "torch_op",
    # autograd.Function
    "as_plugin",
    # export and validation
    "export",
    "export_as_plugins",
    "validate",
    "ExportResult",
    "ModulePlugin",
]
