"""What a comparison asks a backend to run: one model under test, on one set of inputs.

``gskit.backends.ort`` and ``gskit.backends.trt`` answer the same three calls with it:
``comparison_runner`` (a Polygraphy runner for the ``Comparator``), ``run_unit`` (a small model, once) and
``tensor_source`` (intermediate tensors, for a layerwise comparison). So ``gskit.compare`` looks a backend up
by name and asks it, and never tests which one it has.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from gskit.plugin.registry import PluginRegistry


@dataclass(frozen=True)
class ModelRun:
    """One model and its inputs, as a backend runs it for a comparison.

    Attributes:
        model: the model in memory or a file (on TensorRT also a serialized engine).
        feeds: inputs by name; their shapes fix TensorRT's optimization profile.
        name: how reports name this run (the Polygraphy runner's name).
        plugins: plugin specs; onnxruntime runs plugin nodes through their numpy references.
        trt_plugins: plugin libraries / folders TensorRT loads (``gskit.backends.trt.find_plugin_files``).
        loaded: ``model`` already loaded (weights left on disk), so that onnxruntime does not read it again.
    """

    model: onnx.ModelProto | str | os.PathLike
    feeds: Mapping[str, np.ndarray]
    name: str
    plugins: PluginRegistry | None = None
    trt_plugins: Sequence[str | os.PathLike] = ()
    loaded: onnx.ModelProto | None = None
