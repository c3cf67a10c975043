"""The C++ TensorRT plugin library in ``cpp/``: built with CMake, checked on a CPU by ``check_plugin.cpp``.

The harness dlopen()s the built library and checks, with no GPU, no libnvinfer and no kernel launch: the
creator's name, version, namespace, field names and types against ``spec.py`` (passed in a file written here
from ``SPEC``, not a second copy), the load-time registration (with a stand-in registry), plugin creation
with default and other values, the getFieldsToSerialize round trip, clone and attachToContext, output count,
types and shapes (against ``SPEC.infer``), format support, shape validation and the rejection of bad fields.
Needs the TensorRT headers (``TRT_ROOT``, or the paths of NVIDIA's TensorRT container), ``nvcc`` and
``cmake``; skipped without them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from onnx import TensorProto

from gskit.plugin import AttrType, PluginSpec, TensorInfo

from .spec import SPEC

CPP_DIR = Path(__file__).parent / "cpp"
#: Where NVIDIA's TensorRT container and tar packages put NvInferRuntime.h (TRT_ROOT/include comes first).
HEADER_DIRS = (
    "/usr/include/x86_64-linux-gnu",
    "/usr/include/aarch64-linux-gnu",
    "/usr/local/tensorrt/include",
)

# (attributes other than the defaults, x shape, weight shape): y comes from SPEC.infer.
SHAPE_CASES: list[tuple[dict[str, Any], tuple[int, ...], tuple[int, ...]]] = [
    ({}, (1, 4, 6, 7), (4, 4, 3, 3)),
    ({"strides": [2, 1], "pads": [1, 0, 2, 1], "dilations": [2, 1]}, (1, 3, 9, 8), (5, 3, 3, 2)),
    ({"strides": [3, 2], "pads": [0, 1, 1, 0], "group": 2, "offset_group": 2}, (2, 4, 10, 11), (6, 2, 3, 3)),
    ({"dilations": [3, 2], "pads": [2, 2, 2, 2]}, (1, 2, 5, 5), (3, 2, 3, 3)),
    ({"strides": [4, 4]}, (1, 1, 7, 6), (1, 1, 1, 1)),
]


def _trt_include_dir() -> Path | None:
    roots = [Path(os.environ["TRT_ROOT"]) / "include"] if os.environ.get("TRT_ROOT") else []
    for folder in [*roots, *map(Path, HEADER_DIRS)]:
        if (folder / "NvInferRuntime.h").is_file():
            return folder
    return None


def _nvcc() -> str | None:
    found = os.environ.get("CUDACXX") or shutil.which("nvcc")
    return found or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").is_file() else None)


def _missing() -> str | None:
    if _trt_include_dir() is None:
        return (
            "needs the TensorRT headers: set TRT_ROOT to the folder holding include/NvInferRuntime.h "
            f"(or install them in {' or '.join(HEADER_DIRS)})"
        )
    if _nvcc() is None:
        return "needs nvcc (the CUDA toolkit)"
    if shutil.which("cmake") is None:
        return "needs cmake"
    return None


pytestmark = [
    pytest.mark.cpp,
    pytest.mark.slow,
    pytest.mark.skipif(_missing() is not None, reason=_missing() or ""),
]


ShapeCases = Sequence[tuple[Mapping[str, Any], Sequence[int], Sequence[int]]]


def spec_text(spec: PluginSpec, shape_cases: ShapeCases) -> str:
    """The spec in the line format check_plugin.cpp reads: identity, input counts, attributes, shape cases."""
    required = [name for name in spec.inputs if not name.endswith("?")]
    lines = [
        f"name {spec.name}",
        f"namespace {spec.namespace}",
        f"version {spec.version}",
        f"inputs {len(required)} {len(spec.inputs)}",
    ]
    defaults: dict[str, Any] = {}
    for attribute in spec.attributes:
        if attribute.type not in (AttrType.INT, AttrType.INTS):
            raise ValueError(f"{attribute.name}: check_plugin.cpp knows int and ints attributes only")
        defaults[attribute.name] = attribute.default
        values = attribute.default if attribute.type == AttrType.INTS else [attribute.default]
        lines.append(f"attr {attribute.name} {attribute.type.value} {' '.join(map(str, values))}")
    for attrs, x, weight in shape_cases:
        merged = {**defaults, **attrs}
        infos = [TensorInfo(TensorProto.FLOAT, tuple(x)), TensorInfo(TensorProto.FLOAT, tuple(weight)), None]
        (y,) = spec.infer(infos, merged)
        assert y.shape is not None and all(isinstance(d, int) for d in y.shape), y
        values = {k: v if isinstance(v, list) else [v] for k, v in merged.items()}
        tokens = [f"{k}={','.join(map(str, v))}" for k, v in values.items()]
        tokens += [f"x={','.join(map(str, x))}", f"weight={','.join(map(str, weight))}"]
        tokens.append(f"y={','.join(map(str, y.shape))}")
        lines.append("shape " + " ".join(tokens))
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The library and the harness, built once with the plugin's own CMakeLists.txt (default CUDA archs)."""
    build = tmp_path_factory.mktemp("deform_conv2d_cpp")
    include = _trt_include_dir()
    assert include is not None
    configure = [
        "cmake",
        "-S",
        str(CPP_DIR),
        "-B",
        str(build),
        "-DCMAKE_BUILD_TYPE=Release",
        f"-DTRT_ROOT={include.parent}",
        f"-DCMAKE_CUDA_COMPILER={_nvcc()}",
    ]
    targets = ["--target", "gskit_deform_conv2d", "check_deform_conv2d_plugin"]
    output = ""
    for command in (configure, ["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2), *targets]):
        result = subprocess.run(command, capture_output=True, text=True, timeout=900)
        output += result.stdout + result.stderr
        assert result.returncode == 0, output
    assert ": warning:" not in output, output
    return build


def run_harness(build: Path, spec_file: Path) -> subprocess.CompletedProcess[str]:
    harness = build / "check_deform_conv2d_plugin"
    library = build / "libgskit_deform_conv2d.so"
    command = [str(harness), str(library), str(spec_file)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_harness_passes_against_spec(build_dir: Path, tmp_path: Path) -> None:
    spec_file = tmp_path / "spec.txt"
    spec_file.write_text(spec_text(SPEC, SHAPE_CASES))
    result = run_harness(build_dir, spec_file)
    print(result.stdout, result.stderr)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.rstrip().endswith(" failed") and " 0 failed" in result.stdout.splitlines()[-1]
    assert f"shape case {len(SHAPE_CASES) - 1}" in result.stdout


def test_harness_fails_when_the_library_disagrees_with_the_spec(build_dir: Path, tmp_path: Path) -> None:
    wrong = spec_text(SPEC, SHAPE_CASES[:1]).replace(f"namespace {SPEC.namespace}", "namespace elsewhere")
    wrong = wrong.replace("attr group int 1", "attr group int 2").replace("y=1,4,4,5", "y=1,4,4,6")
    spec_file = tmp_path / "wrong.txt"
    spec_file.write_text(wrong)
    result = run_harness(build_dir, spec_file)
    assert result.returncode == 1, result.stdout + result.stderr
    failures = [line for line in result.stdout.splitlines() if line.startswith("[FAIL]")]
    assert any("namespace 'gskit' == spec 'elsewhere'" in line for line in failures), failures
    assert any("serializes the spec defaults" in line for line in failures), failures
    assert any("getOutputShapes" in line for line in failures), failures


def test_library_needs_no_libnvinfer_symbol(build_dir: Path) -> None:
    """The library uses TensorRT through interfaces only, so it loads (and builds) without libnvinfer."""
    if shutil.which("nm") is None:
        pytest.skip("needs nm (binutils)")
    library = str(build_dir / "libgskit_deform_conv2d.so")
    undefined = subprocess.run(["nm", "-uC", library], capture_output=True, text=True, check=True).stdout
    tensorrt = [line for line in undefined.splitlines() if "nvinfer" in line or "getPluginRegistry" in line]
    assert tensorrt == []
    command = ["nm", "-DC", "--defined-only", library]
    exported = subprocess.run(command, capture_output=True, text=True, check=True)
    names = {line.split()[-1] for line in exported.stdout.splitlines() if " T " in line}
    assert {"getCreators", "setLoggerFinder"} <= names, names
    assert not any("gskit::" in line for line in exported.stdout.splitlines()), exported.stdout
