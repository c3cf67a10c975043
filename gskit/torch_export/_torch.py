"""Lazy import of the optional torch dependency."""

from __future__ import annotations

import importlib
from types import ModuleType

from gskit.errors import GskitError

INSTALL_HINT = "pip install gskit[torch]"


def require(module: str = "torch") -> ModuleType:
    """Import ``torch`` (or a submodule, or ``onnxscript``) when a function needs it.

    Raises:
        GskitError: the module is not installed; the message names the extra to install.
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise GskitError(f"gskit.torch_export needs {module.split('.')[0]}: {INSTALL_HINT}") from err
