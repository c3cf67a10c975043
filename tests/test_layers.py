"""gskit's layering (docs/architecture.md), checked over the import graph by scripts/check_layers.py.

The real tree must pass; a tree with deliberate violations must fail, each named, while the imports the
rules allow (a plugin kernel importing Triton, fold's lazy import of the onnxruntime backend) stay quiet.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CHECKER = REPO / "scripts" / "check_layers.py"


def _checker():
    spec = importlib.util.spec_from_file_location("check_layers", CHECKER)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def _run(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHECKER), str(root)], capture_output=True, text=True, timeout=120, check=False
    )


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_tree_follows_the_layering() -> None:
    done = _run(REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == ""


#: file -> (source, the violation it must produce, or None when the rules allow it)
CASES = {
    "gskit/__init__.py": ("", None),
    "gskit/passes/edit.py": (
        "from gskit.backends import ort\n",
        "gskit.passes.edit (core) imports backends (gskit.backends)",
    ),
    "gskit/passes/inspect.py": (
        "def f():\n    import tensorrt\n",
        "gskit.passes.inspect (core) imports tensorrt: only backends",
    ),
    "gskit/passes/shapes.py": (
        "def f():\n    from gskit.compare.outputs import compare\n",
        "gskit.passes.shapes (core) imports compare (gskit.compare) inside a function",
    ),
    "gskit/passes/fold/batched.py": (
        "from gskit import model\n\ndef run():\n    from gskit.backends import ort\n",
        None,  # the one lazy core-to-backend import the rules allow
    ),
    "gskit/passes/convert.py": (
        "from gskit.backends.ort import run\n",
        "gskit.passes.convert (core) imports backends",
    ),
    "gskit/backends/__init__.py": ("", None),
    "gskit/pipeline/__init__.py": ("", None),
    "gskit/pipeline/steps.py": (
        "from gskit.cli import main\n",
        "gskit.pipeline.steps (pipeline) imports cli",
    ),
    "gskit/backends/ort.py": (
        "import onnxruntime\nfrom gskit.cli import main\n",
        "gskit.backends.ort (backends) imports cli",
    ),
    "gskit/compare/outputs.py": (
        "from polygraphy.backend.trt import TrtRunner\n",
        "gskit.compare.outputs (compare) imports polygraphy.backend: "
        "running models belongs in gskit.backends",
    ),
    "gskit/cli/__init__.py": (
        "from gskit.pipeline.prepare import prepare\nfrom gskit.backends import trt\n",
        None,
    ),
    "gskit/sub/__init__.py": ("", None),
    "gskit/sub/thing.py": ("from ..cli import main\n", "gskit.sub.thing (core) imports cli (gskit.cli)"),
    "plugins/demo/kernel.py": ("import triton\n", None),
    "plugins/demo/trt_plugin.py": ("import tensorrt.plugin as trtp\n", None),
    "plugins/demo/test_kernel.py": ("import torch\n", None),
    "plugins/demo/spec.py": ("def f():\n    import torch\n", "plugin file demo/spec.py imports torch"),
    # from_torch's PyTorch code: torch inside a function of patterns.py, never at module level
    "plugins/demo/patterns.py": ("def gelu(x):\n    import torch\n    return torch.tanh(x)\n", None),
    "plugins/other/patterns.py": ("import torch\n", "plugin file other/patterns.py imports torch"),
    "plugins/other/reference.py": (
        "def f():\n    import torch\n",
        "plugin file other/reference.py imports torch",
    ),
    # from_torch exports only when no cache holds the rules: the one lazy core-to-front-end import
    "gskit/plugin/derive.py": (
        "def derive():\n    from gskit.torch_export import derive\n",
        None,
    ),
    "gskit/plugin/spec.py": (
        "def f():\n    from gskit.torch_export.derive import derive_descriptions\n",
        "gskit.plugin.spec (core) imports front-ends (gskit.torch_export) inside a function",
    ),
}


def test_the_checker_fails_on_deliberate_violations(tmp_path: Path) -> None:
    _write(tmp_path, {name: source for name, (source, _) in CASES.items()})
    done = _run(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    for name, (_, expected) in CASES.items():
        mine = [line for line in lines if line.startswith(f"{tmp_path / name}:")]
        if expected is None:
            assert mine == [], f"{name} should pass: {mine}"
        else:
            assert len(mine) == 1 and expected in mine[0], f"{name}: expected {expected!r}, got {mine}"


def test_a_module_level_backend_import_in_fold_is_still_refused(tmp_path: Path) -> None:
    """fold may import the onnxruntime backend only inside the function that evaluates nodes."""
    _write(tmp_path, {"gskit/passes/fold/batched.py": "from gskit.backends import ort\n"})
    done = _run(tmp_path)
    assert done.returncode == 1 and "gskit.passes.fold.batched (core) imports backends" in done.stdout


def test_a_new_module_is_core_by_default() -> None:
    checker = _checker()
    assert checker.layer_of("gskit.brand_new") == checker.CORE
    assert checker.layer_of("gskit.brand_new.module") == checker.CORE
    assert checker.layer_of("gskit.pipeline.brand_new") == ("pipeline", 3)
    assert checker.layer_of("gskit.passes.brand_new") == checker.CORE
    assert checker.layer_of("gskit.backends.onnx_tensorrt") == ("backends", 1)
    assert checker.layer_of("gskit.compare.layers") == ("compare", 2)
    assert checker.layer_of("gskit.cli.fold") == ("cli", 4)


def test_a_root_without_gskit_is_an_error(tmp_path: Path) -> None:
    done = _run(tmp_path)
    assert done.returncode == 2 and "no gskit/ folder" in done.stderr


@pytest.mark.parametrize(
    "module", ["gskit.passes.fold", "gskit.passes.convert", "gskit.passes.sanitize", "gskit.compare.outputs"]
)
def test_core_and_compare_modules_import_without_loading_a_runtime(module: str) -> None:
    """Importing a core pass does not load onnxruntime or TensorRT: they come with a backend call."""
    code = (
        f"import sys, {module}\n"
        "runtimes = ('onnxruntime', 'tensorrt', 'tensorrt_rtx', 'torch')\n"
        "loaded = sorted(m for m in runtimes if m in sys.modules)\n"
        "print(','.join(loaded))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    expected = "onnxruntime" if module == "gskit.compare.outputs" else ""
    assert done.stdout.strip() == expected


def test_every_allowed_lazy_import_is_still_needed() -> None:
    """An allowance that no code uses any more is removed, so the list stays the list of real exceptions."""
    checker = _checker()
    for module, backend in checker.LAZY_CORE_IMPORTS:
        path = REPO / Path(*module.split(".")).with_suffix(".py")
        source = path.read_text()
        package, _, name = backend.rpartition(".")
        assert f"from {package} import {name}" in source or f"import {backend}" in source, (module, backend)
        assert checker.layer_of(module) == checker.CORE
