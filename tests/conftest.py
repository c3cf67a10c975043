"""Shared test set-up: markers that skip without their hardware or packages, and small model builders."""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx
import pytest

from gskit.errors import GskitError

LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
LIGHT_MODELS = sorted(LIGHT_DIR.glob("light_*.onnx"))


def _have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _full_tensorrt() -> bool:
    if not _have("tensorrt"):
        return False
    try:
        import tensorrt  # noqa: F401  # the PyPI stub raises on import

        return True
    except Exception:
        return False


def _gpu() -> bool:
    if _have("torch"):
        import torch

        return torch.cuda.is_available()
    return os.path.exists("/dev/nvidia0")


def pytest_configure(config):
    """The suite's own user cache (derived patterns, function sources), removed after the run: tests and the
    commands they start never write into the user's ``~/.cache/gskit``. A cache given with
    ``$GSKIT_CACHE_DIR`` is used as given."""
    from gskit.io.user_cache import CACHE_ENV

    if CACHE_ENV not in os.environ:
        folder = tempfile.mkdtemp(prefix="gskit-test-cache-")
        os.environ[CACHE_ENV] = folder  # the processes the tests start inherit it
        config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


def pytest_collection_modifyitems(config, items):
    reasons = {
        "trt": None
        if _full_tensorrt()
        else "needs full TensorRT (runs in the Docker GPU CI: docker/run-gpu-tests.sh)",
        "gpu": None if _gpu() else "needs a CUDA GPU (runs in the Docker GPU CI)",
        "torch": None if _have("torch") else "needs PyTorch: pip install -e '.[torch]'",
    }
    for item in items:
        for marker, reason in reasons.items():
            if reason and marker in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))


def parse_model(text: str) -> onnx.ModelProto:
    """Build a model from ONNX text syntax and check it."""
    model = onnx.parser.parse_model(text)
    onnx.checker.check_model(model)
    return model


def run_subcommand(command: ModuleType, *argv: str) -> int:
    """Run one ``gskit.cli`` subcommand module with only its own parser, as ``gskit.cli.main`` does.

    Only that parser, so a test does not depend on the other subcommands; a GskitError exits 2.
    """
    parser = argparse.ArgumentParser(prog="gskit")
    command.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except GskitError:
        return 2


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _plugin_schemas_of_one_test() -> object:
    """A test's plugin schemas leave with it: onnx's checker validates every later model against the
    schemas registered in the process, so a test plugin's one-input ScaledTanh would refuse another test's
    two-input node of the same name."""
    yield
    from gskit.passes.plugin_schemas import deregister_schemas

    deregister_schemas()


@pytest.fixture
def model_reads(monkeypatch) -> list[str]:
    """The file names ``onnx.load`` reads during the test, in order (every gskit load goes through it)."""
    reads: list[str] = []
    real_load = onnx.load

    def counted(f, *args, **kwargs):
        reads.append(Path(f).name)
        return real_load(f, *args, **kwargs)

    monkeypatch.setattr(onnx, "load", counted)
    return reads
