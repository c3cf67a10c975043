"""Every gskit module imports without the optional heavy dependencies (they are imported lazily)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gskit
import gskit.cli

#: Optional dependencies that no gskit module may import at module level.
BLOCKED = ("tensorrt", "tensorrt_rtx", "torch")

# Runs first in a fresh interpreter: a meta path finder placed first refuses the blocked packages (and
# their submodules) as if they were not installed.
BLOCKER = """
import importlib, json, pkgutil, sys

BLOCKED = set(sys.argv[1].split(","))

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by test_imports)", name=name)
        return None

sys.meta_path.insert(0, Blocker())
for name in list(sys.modules):
    if name.split(".")[0] in BLOCKED:
        del sys.modules[name]
"""

# Then every module of the package is imported (``__main__`` modules would run the CLI, so not those).
IMPORT_ALL = """
import gskit
import gskit.cli

imported, failed = [], {}
def walk_error(name):
    failed[name] = "could not walk this package"

for info in pkgutil.walk_packages(gskit.__path__, "gskit.", onerror=walk_error):
    if info.name.rsplit(".", 1)[-1] == "__main__":
        continue
    try:
        importlib.import_module(info.name)
        imported.append(info.name)
    except Exception as err:
        failed[info.name] = f"{type(err).__name__}: {err}"
leaked = sorted(n for n in sys.modules if n.split(".")[0] in BLOCKED)
print(json.dumps({"imported": imported, "failed": failed, "leaked": leaked}))
"""


def _modules_on_disk() -> set[str]:
    root = Path(gskit.__file__).parent
    names = set()
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names - {"gskit"}


def test_every_module_imports_without_optional_dependencies() -> None:
    result = subprocess.run(
        [sys.executable, "-c", BLOCKER + IMPORT_ALL, ",".join(BLOCKED)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["failed"] == {}
    assert report["leaked"] == []
    unreached = _modules_on_disk() - set(report["imported"])
    assert not unreached, (
        f"modules not reached by pkgutil (a folder without __init__.py?): {sorted(unreached)}"
    )
    assert "gskit.passes.inspect" in report["imported"] and "gskit.cli.inspect" in report["imported"]


def test_blocker_really_blocks() -> None:
    result = subprocess.run(
        [sys.executable, "-c", BLOCKER + "import torch\n", ",".join(BLOCKED)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode != 0
    assert "ModuleNotFoundError" in result.stderr and "blocked by test_imports" in result.stderr


def test_import_paths_the_readmes_document_name_the_owners() -> None:
    """Names the README and plugins/README.md show under a module that no longer owns them still import
    from there, and are the owner's objects (not copies)."""
    from gskit.backends import aot_ptx, trt_plugin
    from gskit.passes import fold
    from gskit.passes.fold import fold_pass, options
    from gskit.plugin import discovery, registry, spec

    assert spec.load_plugins is discovery.load_plugins and spec.PluginRegistry is registry.PluginRegistry
    assert trt_plugin.triton_ptx is aot_ptx.triton_ptx
    assert fold.fold is fold_pass.fold and fold.FOLD is fold_pass.FOLD
    assert fold.FoldOptions is options.FoldOptions and fold.FoldReport is options.FoldReport
    try:
        spec.load_everything  # noqa: B018  # a name nobody moved is still an AttributeError
    except AttributeError as err:
        assert "load_everything" in str(err)
    else:
        raise AssertionError("gskit.plugin.spec answered a name it never had")


# A real run with torch installed: the commands that need no torch leave it unimported.
RUN_WITHOUT_TORCH = """
import sys
from gskit.cli import main
code = main(sys.argv[1:])
print("TORCH" if "torch" in sys.modules else "NO-TORCH", code)
"""


def test_compare_and_validate_do_not_import_torch(tmp_path: Path) -> None:
    """Polygraphy's torch-tensor check imported torch on every onnxruntime run (1 s, 170 MB per command)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        import pytest

        pytest.skip("torch is not installed: nothing could import it")
    example = str(Path(gskit.__file__).parent / "data" / "example.onnx")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("steps: [sanitize, fold, validate]\n")  # no plugin node: nothing asks for torch
    for argv in (
        ["compare", example, example],
        ["compare", example, example, "--layerwise"],
        ["prepare", example, "-o", str(tmp_path / "out"), "--recipe", str(recipe)],
    ):
        done = subprocess.run(
            [sys.executable, "-c", RUN_WITHOUT_TORCH, *argv], capture_output=True, text=True, timeout=300
        )
        assert done.stdout.strip().splitlines()[-1] == "NO-TORCH 0", (
            argv,
            done.stdout[-500:],
            done.stderr[-500:],
        )


LOADED_BY = """
import sys
from gskit.cli import main
code = main(sys.argv[1:])
print(" ".join(sorted(m for m in sys.modules if m.startswith("gskit.cli.") or m in ("onnx", "numpy"))), code)
"""


def _loaded(*argv: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", LOADED_BY, *argv], capture_output=True, text=True, timeout=120
    )
    return done.stdout.strip().splitlines()[-1].split()


def test_version_imports_no_command_and_a_command_imports_only_its_own() -> None:
    """Building every subcommand's parser imported all 13 modules (and onnx, numpy ...) for `--version`."""
    assert _loaded("--version") == ["0"]
    example = str(Path(gskit.__file__).parent / "data" / "example.onnx")
    loaded = _loaded("inspect", example)
    assert loaded[-1] == "0"
    # the shared helpers (gskit.cli.command, gskit.cli.options) load with any command; no other command does
    commands = [m for m in loaded if m.startswith("gskit.cli.") and m.split(".")[2] in gskit.cli.COMMANDS]
    assert commands == ["gskit.cli.inspect"]
    listed = subprocess.run(
        [sys.executable, "-m", "gskit.cli", "--help"], capture_output=True, text=True, timeout=120
    )
    assert all(name.replace("_", "-") in listed.stdout for name in gskit.cli.COMMANDS)
