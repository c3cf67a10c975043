"""Check gskit's layering over the import graph: ``python scripts/check_layers.py [ROOT]``.

Reads every ``import`` statement (module level and inside functions) of ``ROOT/gskit/**.py`` and of the
library files of ``ROOT/plugins/*/`` with :mod:`ast`, without importing anything, and prints one line per
violation (exit 1) or nothing (exit 0). The rules and the layers are described in docs/architecture.md:

* Layers, lowest first, by package (a module's layer is that of its first package under ``gskit/``,
  :data:`LAYERS`): **core** (``gskit.errors``, ``gskit.io``, ``gskit.plugin``, ``gskit.passes``, and
  any package not listed), **backends** (``gskit.backends``: everything that runs a model or talks to
  TensorRT), **front-ends** (``gskit.torch_export``) and **compare** (``gskit.compare``), **pipeline**
  (``gskit.pipeline``), **cli** (``gskit.cli``). A module imports only gskit modules of its own layer or
  lower ones. Core may import a backend lazily (inside a function) only where :data:`LAZY_CORE_IMPORTS`
  says so, with the reason.
* Heavy optional dependencies (:data:`HEAVY`) only in backends, front-ends and plugin kernels
  (``plugins/*/kernel.py``, ``plugins/*/trt_plugin.py``); ``torch`` also inside the functions of a plugin's
  ``patterns.py`` (the PyTorch code ``from_torch`` derives rules from, run only when no cache holds them).
* Execution libraries (:data:`EXECUTION`: onnxruntime, Polygraphy's runners and CUDA wrapper) only in
  backends.

Imports by string (``importlib.import_module``) are not seen: keep them in backends too. Plugin tests
(``test_*.py``) are free to use any package as an independent reference.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: Layer and rank of each package (or module) directly under gskit/. A module's layer is that of its first
#: package under gskit/ (``gskit.passes.fold`` -> ``passes`` -> core), and it may import ranks <= its own.
#: A package or module not listed here is core, the strictest layer, until it is placed.
LAYERS: dict[str, tuple[str, int]] = {
    "errors": ("core", 0),  # the one exception type: every layer raises it
    "io": ("core", 0),
    "plugin": ("core", 0),
    "passes": ("core", 0),
    "backends": ("backends", 1),
    "torch_export": ("front-ends", 2),
    "compare": ("compare", 2),
    "pipeline": ("pipeline", 3),
    "cli": ("cli", 4),
}
CORE = ("core", 0)
#: (core module, backend module it imports inside a function) -> why that execution belongs there.
LAZY_CORE_IMPORTS = {
    (
        "gskit.passes.fold.batched",
        "gskit.backends.ort",
    ): "fold evaluates constant nodes on onnxruntime (batched mode)",
    (
        "gskit.passes.fold.whole_graph",
        "gskit.backends.ort",
    ): "fold evaluates constant nodes on onnxruntime (whole graph)",
    (
        "gskit.passes.tensor_types",
        "gskit.backends.ort",
    ): "onnxruntime ships the symbolic shape inference Polygraphy uses",
    (
        "gskit.plugin.derive",
        "gskit.torch_export.derive",
    ): "from_torch exports a plugin's PyTorch code when no cache holds its rules (torch only then)",
}
#: Heavy optional dependencies: only in backends, front-ends and plugin kernels.
HEAVY = ("tensorrt", "tensorrt_rtx", "torch", "triton")
#: Libraries that run models: only in backends.
EXECUTION = ("onnxruntime", "onnxruntime_extensions", "polygraphy.backend", "polygraphy.cuda")
#: Plugin folder files that may import heavy dependencies (the GPU kernel and the TensorRT plugin).
PLUGIN_KERNEL_FILES = ("kernel.py", "trt_plugin.py")
#: The plugin file whose functions may import torch inside their body: the PyTorch code ``from_torch`` derives
#: rules from, which runs only when no cache holds them (the file itself loads on any CPU).
PLUGIN_TORCH_SOURCE = "patterns.py"


@dataclass(frozen=True)
class Violation:
    path: Path
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


def _package(module: str) -> str | None:
    """The first package (or module) under gskit/ of a gskit module: ``gskit.passes.fold`` -> ``passes``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "gskit" else None


def layer_of(module: str) -> tuple[str, int]:
    """The layer name and rank of a gskit module: its first package's in :data:`LAYERS`, else core."""
    return LAYERS.get(_package(module) or "", CORE)


def _layer_prefix(module: str) -> str:
    """``gskit.<first package>``: the imported layer as a violation message names it."""
    package = _package(module)
    return f"gskit.{package}" if package else module


def _within(name: str, packages: tuple[str, ...]) -> str | None:
    return next((p for p in packages if name == p or name.startswith(p + ".")), None)


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(tree: ast.Module, module: str, is_package: bool) -> Iterator[tuple[int, str, bool]]:
    """(line, imported module name, at module level) for each import; ``from a import b`` gives ``a.b``
    too, since ``b`` may be a module."""
    top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, id(node) in top
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join([*package, base] if base else package)
            yield node.lineno, base, id(node) in top
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}", id(node) in top


def check_gskit_file(root: Path, path: Path) -> list[Violation]:
    module = _module_name(root, path)
    layer, rank = layer_of(module)
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found: dict[tuple[int, str], Violation] = {}
    for line, name, module_level in _imports(tree, module, path.name == "__init__.py"):
        if _within(name, ("gskit",)) and name != "gskit":
            other, other_rank = layer_of(name)
            # ``from gskit.backends import ort`` names the package and the module: both are allowed
            lazy_ok = not module_level and any(
                module == mine and (_within(name, (theirs,)) or _within(theirs, (name,)))
                for mine, theirs in LAZY_CORE_IMPORTS
            )
            if other_rank > rank and not lazy_ok:
                where = "" if module_level else " inside a function"
                message = f"{module} ({layer}) imports {other} ({_layer_prefix(name)}){where}"
                found.setdefault((line, message), Violation(path, line, message))
        heavy = _within(name, HEAVY)
        if heavy and layer not in ("backends", "front-ends"):
            message = f"{module} ({layer}) imports {heavy}: only backends, front-ends and plugin kernels may"
            found.setdefault((line, message), Violation(path, line, message))
        execution = _within(name, EXECUTION)
        if execution and layer != "backends":
            message = f"{module} ({layer}) imports {execution}: running models belongs in gskit.backends"
            found.setdefault((line, message), Violation(path, line, message))
    return list(found.values())


def check_plugin_file(path: Path) -> list[Violation]:
    if path.name in PLUGIN_KERNEL_FILES or path.name.startswith("test_"):
        return []
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = []
    for line, name, module_level in _imports(tree, path.stem, False):
        if path.name == PLUGIN_TORCH_SOURCE and not module_level and _within(name, ("torch",)):
            continue  # the PyTorch code of from_torch: imported only when rules are derived
        heavy = _within(name, HEAVY) or _within(name, EXECUTION)
        if heavy:
            message = (
                f"plugin file {path.parent.name}/{path.name} imports {heavy}: only "
                f"{' and '.join(PLUGIN_KERNEL_FILES)} may (spec, reference and patterns load on any CPU)"
            )
            found.append(Violation(path, line, message))
    return list({(v.line, v.message): v for v in found}.values())


def violations(root: Path) -> list[Violation]:
    """Every layering violation under ``root`` (a checkout: ``root/gskit``, ``root/plugins``)."""
    found: list[Violation] = []
    for path in sorted((root / "gskit").rglob("*.py")):
        found += check_gskit_file(root, path)
    for path in sorted((root / "plugins").glob("*/*.py")):
        found += check_plugin_file(path)
    return found


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path(__file__).resolve().parents[1]
    if not (root / "gskit").is_dir():
        print(f"{root}: no gskit/ folder here; pass the checkout's root", file=sys.stderr)
        return 2
    found = violations(root)
    for violation in found:
        print(violation)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
