"""The plugin core: what an op and a plugin node are, what a plugin declares, and where plugins come from.

``ops``: standard domains, op labels, what makes a node a plugin node and its identity. ``spec``: a plugin's
:class:`PluginSpec` (attributes, tensor info, output rules, reference) and the rules checked when it loads.
``registry``: the loaded specs, looked up by key or node. ``discovery``: where plugins come from (shipped,
installed under the ``gskit.plugins`` entry point, ``$GSKIT_PLUGINS``, ``./plugins``) and loading them.
``deferred``: ``patterns_in``, a plugin's patterns imported when first read (only replacing reads them).
``derive``: ``from_torch``, a plugin's patterns derived from the PyTorch code it replaces, and their caches.
``native``: a plugin's native forms (the ONNX op a TensorRT version runs natively) and the choice of a form
for a target; ``target``: the TensorRT version a model is prepared for. ``scaffold``: the folder ``gskit
plugin new`` writes.

The plugin folders themselves live outside this package (the repository's ``plugins/``, installed as
``gskit_plugins``, or third-party packages); their ``spec.py`` imports the names re-exported here. How a
plugin runs is not here: ``gskit.backends.ort`` runs its reference, ``gskit.backends.trt_plugin`` registers
it with TensorRT. Core layer (docs/architecture.md).
"""

from gskit.plugin.deferred import patterns_in
from gskit.plugin.derive import from_torch
from gskit.plugin.discovery import load_plugins, load_spec_file
from gskit.plugin.native import NativeForm
from gskit.plugin.registry import PluginRegistry
from gskit.plugin.spec import Attribute, AttrType, PluginSpec, TensorInfo, per_channel_of, same_as_input

__all__ = [
    # What a plugin declares (a plugin folder's spec.py)
    "Attribute",
    "AttrType",
    "PluginSpec",
    "NativeForm",
    "TensorInfo",
    "per_channel_of",
    "same_as_input",
    "patterns_in",
    # Patterns derived from the PyTorch code a plugin replaces (torch imported only to derive)
    "from_torch",
    # Where plugins come from
    "PluginRegistry",
    "load_plugins",
    "load_spec_file",
]
