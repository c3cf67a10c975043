"""Which parts of a plugin are still stubs, as ``gskit plugin new`` writes them.

A stub is a function whose body, after its docstring, is one ``raise NotImplementedError(...)``. It is
recognised from the code itself, not from a marker the scaffold writes: a marker left behind would call a
written reference a stub, and a deleted one would call a stub implemented. A stub stops being one as soon as
its body does anything else.

Parts: ``reference`` (the spec's numpy reference), ``kernel`` (``kernel.py`` whose public functions are all
stubs) and ``trt_plugin`` (``trt_plugin.py`` that calls a stub kernel, when no C++ plugin is beside it).
Files are read with ``ast``, never imported (a kernel may import torch or triton).
"""

from __future__ import annotations

import ast
import functools
import logging
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gskit.plugin.derive import function_source
from gskit.plugin.spec import PluginSpec

log = logging.getLogger(__name__)

#: The parts that can be stubs, in the order reports name them.
PARTS = ("reference", "trt_plugin", "kernel")


def stub_parts(spec: PluginSpec) -> tuple[str, ...]:
    """The parts of ``spec``'s plugin that are stubs (a subset of :data:`PARTS`, in that order)."""
    folder = spec.source.parent if spec.source is not None else None
    found = set()
    if spec.reference is not None and is_stub_function(spec.reference):
        found.add("reference")
    if folder is not None:
        kernel = folder / "kernel.py"
        if kernel.is_file() and _is_stub_module(kernel):
            found.add("kernel")
            trt_plugin = folder / "trt_plugin.py"
            if trt_plugin.is_file() and not (folder / "cpp").exists() and _calls_kernel(trt_plugin):
                found.add("trt_plugin")
    return tuple(part for part in PARTS if part in found)


def describe_stubs(spec: PluginSpec) -> str:
    """``reference and kernel are stubs (raising NotImplementedError)``, or "" when none is."""
    parts = stub_parts(spec)
    if not parts:
        return ""
    names = f"{', '.join(parts[:-1])} and {parts[-1]}" if len(parts) > 1 else parts[0]
    return f"{names} {'are stubs' if len(parts) > 1 else 'is a stub'} (raising NotImplementedError)"


def is_stub_function(function: Callable[..., Any]) -> bool:
    """True when ``function``'s body is only a docstring and ``raise NotImplementedError``; False when its
    source cannot be read (a builtin, a lambda in a string).

    The source is inspect's (``derive.function_source``: from the user cache for the file's lines as they are
    now, so no tokenizing of the file), and each distinct source is parsed once: check-trt asks this for every
    plugin node (1-2 ms a node, 10 for DeformConv2d).
    """
    try:
        source = textwrap.dedent(function_source(function))
    except (OSError, TypeError):
        return False
    return _stub_source(source)


@functools.lru_cache(maxsize=256)
def _stub_source(source: str) -> bool:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    definition = next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
    return definition is not None and _raises_only(definition)


def _is_stub_module(path: Path) -> bool:
    """Every public top-level function of the file is a stub (and there is at least one)."""
    tree = _parse(path)
    if tree is None:
        return False
    public = [
        node
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_")
    ]
    return bool(public) and all(_raises_only(node) for node in public)


def _calls_kernel(path: Path) -> bool:
    """The file uses ``kernel.<function>`` (the scaffold's TensorRT plugin runs the kernel module)."""
    tree = _parse(path)
    return tree is not None and any(
        isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "kernel"
        for node in ast.walk(tree)
    )


def _parse(path: Path) -> ast.Module | None:
    """The file's syntax tree (read each time; parsed once per distinct text), None when unreadable."""
    try:
        tree = _parsed(path.read_text(encoding="utf-8"), str(path))
    except (OSError, ValueError) as err:  # unreadable, or not UTF-8 (UnicodeDecodeError)
        tree = err
    if isinstance(tree, Exception):  # the file's error, or the syntax error _parsed kept
        log.debug("%s: cannot read it to look for stubs: %s", path, tree)
        return None
    return tree


@functools.lru_cache(maxsize=64)
def _parsed(text: str, filename: str) -> ast.Module | SyntaxError | ValueError:
    """``ast.parse(text)``, or the error it raised (callers only read the tree)."""
    try:
        return ast.parse(text, filename=filename)
    except (SyntaxError, ValueError) as err:
        return err


def _raises_only(definition: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    body = list(definition.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return False
    raised = body[0].exc.func if isinstance(body[0].exc, ast.Call) else body[0].exc
    return isinstance(raised, ast.Name) and raised.id == "NotImplementedError"
