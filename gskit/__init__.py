"""gskit: prepare ONNX models for TensorRT.

The public API is grouped below; each name lives in a module whose name says what it does.
Heavy optional dependencies (tensorrt, tensorrt_rtx, torch) are imported only by the functions that use them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gskit.errors import GskitError, ModelCheckError, PluginError

if TYPE_CHECKING:
    from gskit.io.model import load, save, to_graph, to_model

#: Names imported on first use: importing ``gskit.cli`` stays light, so a Ctrl-C while the command starts
#: reaches ``gskit.cli.main`` (one line, exit 130) instead of interrupting onnx's import with a traceback.
_MODEL_IO = ("load", "save", "to_graph", "to_model")

__version__ = "0.1.0"

__all__ = [
    # Errors
    "GskitError",
    "ModelCheckError",
    "PluginError",
    # Model I/O
    "load",
    "save",
    "to_graph",
    "to_model",
]


def __getattr__(name: str) -> Any:
    if name in _MODEL_IO:
        from gskit.io import model

        return getattr(model, name)
    raise AttributeError(f"module 'gskit' has no attribute {name!r}")
