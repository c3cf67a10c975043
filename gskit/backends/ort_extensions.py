"""onnxruntime-extensions' Python custom ops (PyOps), loaded without the package's ``__init__``.

That ``__init__`` also imports the package's model converters (``onnxruntime_extensions.cvt``), which import
transformers and torch wherever they are installed (seconds and 170 MB for every session with a plugin node),
and set ``PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python`` in the environment of every process started
afterwards (the TensorRT worker). gskit needs only ``onnxruntime_extensions._ocos``: the PyOp registration
(``Opdef.declare``, ``PyCustomOpDef``), the hook through which the native library calls a PyOp, and the path
of that library. So that module is imported under a parent package whose ``__init__`` has not run.
Checked with onnxruntime-extensions 0.15.2.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

from gskit.errors import GskitError

#: The distribution's package, and its module that registers PyOps with the native library.
PACKAGE = "onnxruntime_extensions"
PYOP_MODULE = f"{PACKAGE}._ocos"


def pyop_module() -> ModuleType:
    """``onnxruntime_extensions._ocos``, imported once; the package ``__init__`` runs only if someone else
    imported the package itself.

    Raises:
        GskitError: onnxruntime-extensions is not installed, or is a version without that module.
    """
    loaded = sys.modules.get(PYOP_MODULE)
    if loaded is not None:
        return loaded
    if PACKAGE in sys.modules:  # already imported in full by another library: use it as it is
        return importlib.import_module(PYOP_MODULE)
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None:
        raise GskitError(
            "plugin nodes run on onnxruntime through onnxruntime-extensions: "
            "pip install onnxruntime-extensions"
        )
    # The package as a bare module (its __path__ set, its __init__ not run), so that importing the submodule
    # finds its parent; removed again afterwards, so that a later `import onnxruntime_extensions` runs the
    # real __init__ (which then finds _ocos already imported and reuses it).
    sys.modules[PACKAGE] = importlib.util.module_from_spec(spec)
    try:
        return importlib.import_module(PYOP_MODULE)
    except ImportError as err:
        raise GskitError(
            f"onnxruntime-extensions without {PYOP_MODULE} ({err}): install onnxruntime-extensions 0.15"
        ) from err
    finally:
        del sys.modules[PACKAGE]


def library_path() -> str:
    """The native custom-op library that a session registers (``SessionOptions.register_custom_ops_library``).

    Raises:
        GskitError: as :func:`pyop_module`.
    """
    return pyop_module().get_library_path()
