"""docker/: what the GPU CI image runs, exercised here without Docker (no daemon in this CI)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

REPO = Path(__file__).resolve().parent.parent
#: The marker expression the GPU CI image runs.
GPU_CI_MARKERS = "trt or gpu or cpp"
DOCKER = REPO / "docker"
#: Base tags gskit has chosen from, with their TensorRT versions (TENSORRT_NOTES.md).
KNOWN_TAGS = {"25.12-py3": "10.13", "26.05-py3": "10.16", "26.06-py3": "11.0", "26.08-py3": "11.2"}


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of docker/Dockerfile, continuation lines joined, comments dropped."""
    text = (DOCKER / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    found = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def _runs() -> list[str]:
    return [args for keyword, args in _instructions() if keyword == "RUN"]


def test_base_image_is_pinned_tensorrt_container():
    (base,) = [args for keyword, args in _instructions() if keyword == "FROM"]
    image, _, tag = base.partition(":")
    assert image == "nvcr.io/nvidia/tensorrt"
    assert tag in KNOWN_TAGS, f"unpinned or unknown tag {tag!r}"


def test_installs_the_built_wheel_with_existing_extras_and_keeps_tensorrt():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    extras = set(pyproject["project"]["optional-dependencies"])
    (install,) = [run for run in _runs() if "pip install" in run and ".whl" in run]
    assert (
        "python3 -m build --wheel --outdir /tmp/dist ." in install
    )  # the README's build, not an editable tree
    assert " -e " not in install
    requested = re.search(r'/tmp/dist/gskit-\*\.whl\)\[([^\]]+)\]"', install)
    assert requested, install
    assert set(requested.group(1).split(",")) <= extras
    assert "trt" in requested.group(1).split(",")
    assert "-c /tmp/trt-constraints.txt" in install
    assert not re.search(r"install[^&;]*\btensorrt\b(?!-)", install)  # never reinstalls TensorRT


def test_constraints_script_pins_what_is_installed_here():
    done = subprocess.run(
        [sys.executable, str(DOCKER / "pin_tensorrt.py")], capture_output=True, text=True, check=True
    )
    lines = done.stdout.split()
    assert all(re.fullmatch(r"tensorrt[\w.-]*==[\w.+-]+", line, re.IGNORECASE) for line in lines)
    import importlib.util

    if importlib.util.find_spec("tensorrt_rtx") is not None:
        assert any(
            line.lower().startswith("tensorrt_rtx_cu13==") or line.lower().startswith("tensorrt-rtx-cu13==")
            for line in lines
        )


@pytest.mark.parametrize("with_plugin", [False, True])
def test_cpp_plugin_hook_is_a_no_op_without_cmakelists(tmp_path, with_plugin):
    (hook,) = [run for run in _runs() if "CMakeLists.txt" in run]
    (tmp_path / "plugins" / "swish").mkdir(parents=True)
    if with_plugin:  # a plugin without cpp/ must not trigger a build either
        (tmp_path / "plugins" / "swish" / "spec.py").write_text("")
    done = subprocess.run(["sh", "-c", hook], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not list(tmp_path.rglob("build"))


def test_run_script_builds_and_runs_marked_tests_on_the_gpu():
    script = DOCKER / "run-gpu-tests.sh"
    assert script.stat().st_mode & 0o111, "run-gpu-tests.sh must be executable"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert "docker build -f" in text and "docker/Dockerfile" in text
    run_line = next(line for line in text.splitlines() if "docker run" in line)
    words = shlex.split(run_line.replace('"$image"', "IMAGE").replace('"$@"', ""))
    assert "--gpus" in words and words[words.index("--gpus") + 1] == "all"
    assert words[-4:] == ["-m", "pytest", "-m", GPU_CI_MARKERS]


def test_marker_expression_selects_the_gpu_tests():
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-m",
            GPU_CI_MARKERS,
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/test_trt_gpu.py",
            "tests/test_build.py",
            "plugins/deform_conv2d/test_cpp_plugin.py",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    selected = [line for line in done.stdout.splitlines() if "::" in line]
    prefixes = ("tests/test_trt_gpu.py::", "plugins/deform_conv2d/test_cpp_plugin.py::")
    assert selected and all(line.startswith(prefixes) for line in selected)
    assert any(line.startswith(prefixes[1]) for line in selected)  # the C++ plugin build and checks
    assert any("test_engine_matches_onnxruntime" in line for line in selected)
    assert re.search(r"\d+ deselected", done.stdout)  # the CPU build tests are not selected
