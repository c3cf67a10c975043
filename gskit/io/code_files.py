"""Importing a Python file that is not on ``sys.path`` as a named module (plugin ``spec.py`` files, TensorRT
plugin modules).

Standard library only: the TensorRT worker (``gskit.backends.trt_worker``) imports it in a child interpreter
that must not load onnx or numpy.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def import_file(
    name: str, path: Path, failures: tuple[type[BaseException], ...] = (Exception,)
) -> ModuleType | None:
    """Import the file ``path`` as the module ``name``, with its folder as package path (so it may import
    its siblings relatively), and register it in ``sys.modules``.

    Args:
        name: the module's name in ``sys.modules``.
        path: the Python file.
        failures: what the file's code raising counts as its failure: the half-made module is removed from
            ``sys.modules`` again before the exception goes on to the caller, which names the file.

    Returns:
        The module, or None when ``path`` cannot be imported as a Python module at all (no loader for it).
    """
    spec = importlib.util.spec_from_file_location(name, path, submodule_search_locations=[str(path.parent)])
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except failures:
        del sys.modules[name]
        raise
    return module
