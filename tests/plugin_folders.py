"""The plugin folders that plugin-wide tests run over: found on disk, never listed by hand.

A plugin folder is a folder with a ``spec.py`` directly under a plugin root. The roots are the folders in
``$GSKIT_TEST_PLUGIN_ROOTS`` (``os.pathsep``-separated), else the repository's ``plugins/``. A test that
concerns every plugin parametrizes over :func:`plugin_folders` (optionally only folders holding some
file), so adding a plugin folder is all it takes for it to be tested; tests/test_plugin_folders.py checks
that with a temporary root holding copies of the shipped plugins and a new one.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from gskit.io import model as gsmodel
from gskit.plugin import PluginSpec, TensorInfo, load_spec_file

REPO = Path(__file__).resolve().parents[1]
#: Environment variable naming the plugin roots for the tests (default: the repository's plugins/).
ROOTS_ENV = "GSKIT_TEST_PLUGIN_ROOTS"


def plugin_roots() -> list[Path]:
    """The folders whose subfolders are the plugins under test."""
    env = os.environ.get(ROOTS_ENV)
    if env:
        return [Path(p) for p in env.split(os.pathsep) if p]
    return [REPO / "plugins"]


def plugin_folders(having: str = "spec.py") -> list[Path]:
    """Every plugin folder under :func:`plugin_roots` holding ``spec.py`` and ``having``, sorted by name."""
    found = {
        spec.parent
        for root in plugin_roots()
        for spec in root.glob("*/spec.py")
        if (spec.parent / having).is_file()
    }
    return sorted(found, key=lambda p: (p.name, str(p)))


def ids(folders: list[Path]) -> list[str]:
    """Test ids: the folder names."""
    return [p.name for p in folders]


def load_plugin(folder: Path) -> tuple[PluginSpec, ModuleType]:
    """The folder's (first) spec and its ``spec`` module, imported under a name of its own."""
    name = f"gskit_plugins.tested_{folder.name}"
    spec, *_ = load_spec_file(folder / "spec.py", name)
    return spec, sys.modules[name]


def example_inputs(folder: Path, rng: np.random.Generator) -> list[np.ndarray]:
    """Inputs for a one-node model of the plugin with its default attributes.

    From the spec module: ``example_inputs(rng)`` if it defines one, else ``EXAMPLE_SHAPES`` with
    ``INPUT_DTYPES`` (what ``gskit plugin new`` writes), else a (2, 8) first input and (8,) for the others
    (per-channel weights of the last axis).
    """
    spec, module = load_plugin(folder)
    if hasattr(module, "example_inputs"):
        return list(module.example_inputs(rng))
    shapes, dtypes = getattr(module, "EXAMPLE_SHAPES", None), getattr(module, "INPUT_DTYPES", None)
    if shapes is not None and dtypes is not None:
        return [rng.standard_normal(s).astype(d) for s, d in zip(shapes, dtypes, strict=True)]
    return [
        rng.standard_normal((2, 8) if i == 0 else (8,)).astype(np.float32) for i in range(len(spec.inputs))
    ]


def input_names(spec: PluginSpec) -> list[str]:
    """The spec's input names without the ``?`` of optional ones."""
    return [name.rstrip("?") for name in spec.inputs]


def one_node_model(spec: PluginSpec, arrays: list[np.ndarray], opset: int = 17) -> onnx.ModelProto:
    """One plugin node (default attributes) fed by ``arrays``; outputs typed by the spec's output rule
    (EfficientNMS_TRT's counts and classes are int32 whatever its inputs are)."""
    named = zip(input_names(spec), arrays, strict=True)
    inputs = [gs.Variable(name, dtype=a.dtype, shape=a.shape) for name, a in named]
    infos = [TensorInfo(onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for a in arrays]
    dtypes = [info.dtype for info in spec.infer(infos, {})]
    outputs = [
        gs.Variable(name, dtype=onnx.helper.tensor_dtype_to_np_dtype(dtype))
        for name, dtype in zip(spec.outputs, dtypes, strict=True)
    ]
    graph = gs.Graph(nodes=[spec.make_node(inputs, outputs)], inputs=inputs, outputs=outputs, opset=opset)
    graph.import_domains = [onnx.helper.make_opsetid("", opset), onnx.helper.make_opsetid(spec.domain, 1)]
    return gsmodel.to_model(graph)


def run_compiles(script: str | os.PathLike, out: Path) -> dict[str, Any]:
    """Run ``python script out`` in a fresh interpreter without ``TRITON_INTERPRET``; read the JSON ``out``.

    Triton kernels compile only in a process that never imported Triton in interpreter mode, which the plugin
    kernel tests set for the whole session on machines without a GPU (tests/test_trt_aot_ptx.py).
    """
    import json
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, str(script), str(out)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())
