"""gskit: prepare ONNX models for TensorRT.

The public API is grouped below; each name lives in a module whose name says what it does.
Heavy optional dependencies (tensorrt, tensorrt_rtx, torch) are imported only by the functions that use them.
"""

from gskit.errors import GskitError, ModelCheckError, PluginError
from gskit.io.model import load, save, to_graph, to_model

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
