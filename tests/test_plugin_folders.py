"""Every plugin folder, found on disk (tests/plugin_folders.py): its layout, and the plugin on onnxruntime.

For each folder: the files of the plugin layout are there, the spec's patterns are ``patterns.PATTERNS``,
and a one-node model of the plugin (default attributes, the spec module's example inputs) gets its output
dtype and rank from gskit's shape inference and runs on onnxruntime (through the numpy reference) to the
reference's own result (float32: rtol 1e-6, atol 0; the same numpy code runs on both sides).

The last test adds new plugin folders in a temporary root beside copies of the shipped ones (a renamed
copy of ClampSwish, and a ``gskit plugin new`` folder with its reference written), points
``$GSKIT_TEST_PLUGIN_ROOTS`` at it and runs the plugin-wide test files in a fresh pytest: each one collects
the new plugins, and their tests pass, without a change anywhere else.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from plugin_folders import (
    REPO,
    ROOTS_ENV,
    example_inputs,
    ids,
    input_names,
    load_plugin,
    one_node_model,
    plugin_folders,
    plugin_roots,
)

from gskit.backends import ort
from gskit.passes.patterns import Rule
from gskit.passes.shapes import infer_shapes
from gskit.plugin import PluginRegistry
from gskit.plugin.scaffold import new_plugin

#: Files every plugin folder has (plugins/README.md, "Layout of a plugin folder").
LAYOUT = ("__init__.py", "spec.py", "reference.py", "patterns.py", "README.md", "test_reference.py")
#: Test files that run over every plugin folder.
PLUGIN_WIDE_TESTS = (
    "tests/test_plugin_folders.py",
    "tests/test_trt_plugin.py",
    "tests/test_trt_aot_ptx.py",
    "tests/test_trt_gpu.py",
)
FOLDERS = plugin_folders()


@pytest.mark.parametrize("folder", FOLDERS, ids=ids(FOLDERS))
def test_folder_has_the_plugin_layout(folder: Path) -> None:
    missing = [name for name in LAYOUT if not (folder / name).is_file()]
    assert not missing, f"{folder.name} lacks {missing}"
    spec, module = load_plugin(folder)
    rules = tuple(spec.patterns)  # imported now where the spec defers them (patterns_in)
    patterns = sys.modules[module.__name__ + ".patterns"]
    assert rules == tuple(patterns.PATTERNS)
    assert all(isinstance(rule, Rule) for rule in rules)
    assert spec.reference is not None


@pytest.mark.parametrize("folder", FOLDERS, ids=ids(FOLDERS))
def test_plugin_runs_on_onnxruntime_as_its_reference_does(folder: Path) -> None:
    spec, _ = load_plugin(folder)
    arrays = example_inputs(folder, np.random.default_rng(0))
    registry = PluginRegistry([spec])
    model = infer_shapes(one_node_model(spec, arrays), registry)
    expected = spec.run_reference(arrays, {})
    inferred = {v.name: v.type.tensor_type for v in (*model.graph.value_info, *model.graph.output)}
    for name, want in zip(spec.outputs, expected, strict=True):
        assert inferred[name].elem_type == onnx.helper.np_dtype_to_tensor_dtype(want.dtype)
        assert len(inferred[name].shape.dim) == want.ndim
    got = ort.run(model, dict(zip(input_names(spec), arrays, strict=True)), plugins=registry)
    for name, want in zip(spec.outputs, expected, strict=True):
        np.testing.assert_allclose(got[name], want, rtol=1e-6, atol=0)


def test_the_shipped_plugins_are_found() -> None:
    if os.environ.get(ROOTS_ENV):
        pytest.skip(f"plugin roots replaced by ${ROOTS_ENV}")
    assert plugin_roots() == [REPO / "plugins"]
    assert {"clamp_swish", "layer_norm", "rms_norm", "deform_conv2d"} <= {f.name for f in FOLDERS}


def _twin(source: Path, target: Path) -> None:
    """A new plugin folder: ``source`` copied under another folder name and op name."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "build", "cpp"))
    spec = target / "spec.py"
    text, count = re.subn(r'name="ClampSwish"', 'name="ClampSwishTwin"', spec.read_text())
    assert count == 1
    spec.write_text(text)


def _scaffolded(root: Path) -> None:
    """A new plugin from ``gskit plugin new`` with its reference written (softsign)."""
    new_plugin("soft_sign", root)
    path = root / "soft_sign" / "reference.py"
    text, count = re.subn(
        r"    raise NotImplementedError\(.*\)\n",
        "    return (x / (1 + np.abs(x))).astype(x.dtype)\n",
        path.read_text(),
    )
    assert count == 1
    path.write_text(text)


def test_new_plugin_folders_are_picked_up_by_every_plugin_wide_test(tmp_path: Path) -> None:
    """Two new folders beside copies of the shipped ones: a copy of ClampSwish under another name (it has an
    AOT kernel, so the AOT test takes it too) and a ``gskit plugin new`` folder with its reference written."""
    if os.environ.get(ROOTS_ENV):
        pytest.skip("already running under a replaced plugin root")
    root = tmp_path / "plugins"
    for folder in FOLDERS:
        shutil.copytree(folder, root / folder.name, ignore=shutil.ignore_patterns("__pycache__", "build"))
    _twin(REPO / "plugins" / "clamp_swish", root / "clamp_swish_twin")
    _scaffolded(root)
    env = {**os.environ, ROOTS_ENV: str(root), "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])}

    def pytest_run(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
        return done.stdout

    collected = pytest_run("--collect-only", *PLUGIN_WIDE_TESTS).splitlines()
    # TensorRT's own plugins have no trt_plugin.py: the Python-plugin tests leave them out (test_trt_gpu.py
    # runs TensorRT's implementation of each). A plugin whose only form is a native op (GroupNorm) has no
    # TensorRT implementation to test at all.
    own = {f.name for f in FOLDERS if load_plugin(f)[0].library is not None}
    native_only = {f.name for f in FOLDERS if not load_plugin(f)[0].plugin_form}
    python_plugin_tests = ("tests/test_trt_plugin.py", "tests/test_trt_aot_ptx.py")
    for test_file in PLUGIN_WIDE_TESTS:
        mine = [line for line in collected if line.startswith(test_file)]
        new = ["clamp_swish_twin"] + ([] if test_file.endswith("aot_ptx.py") else ["soft_sign"])
        shipped = [
            f.name
            for f in FOLDERS
            if not (f.name in own and test_file in python_plugin_tests)
            and not (f.name in native_only and test_file != "tests/test_plugin_folders.py")
        ]
        for name in [*shipped, *new]:  # the shipped ones stay too
            found = any(re.search(rf"\[{name}[\]-]", line) for line in mine)
            assert found, f"{test_file} does not collect plugin folder {name}"

    wide = ("tests/test_plugin_folders.py", "tests/test_trt_plugin.py")
    ran = pytest_run("-k", "clamp_swish_twin or soft_sign", *wide)
    passed = re.search(r"(\d+) passed", ran)
    assert passed and int(passed.group(1)) >= 8 and "failed" not in ran, ran[-2000:]
