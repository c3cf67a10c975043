"""gskit build: ahead-of-time TensorRT-RTX engine builds on a CPU, profiles, sidecar and atomic writes."""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import onnx
import pytest
from conftest import parse_model

from gskit.backends.trt_build import (
    DYNAMIC_DIM_DEFAULT,
    build_engine,
    check_python_plugin_inputs,
    derive_profile,
    sidecar_path,
)
from gskit.cli import build as build_cli
from gskit.errors import GskitError

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"
rtx = pytest.mark.skipif(importlib.util.find_spec("tensorrt_rtx") is None, reason="needs tensorrt-rtx-cu13")

DYNAMIC = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[N,4] x, float[1,4] b) => (float[N,4] y) {
  a = Add(x, b)
  y = Sigmoid(a)
}
"""


@pytest.fixture
def dynamic_model(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(parse_model(DYNAMIC), path)
    return path


@rtx
def test_aot_build_writes_engine_and_sidecar_atomically(dynamic_model, tmp_path):
    out = tmp_path / "engines"
    info = build_engine(dynamic_model, out / "model.engine", compute_capability="8.9", backend="tensorrt_rtx")
    assert sorted(p.name for p in out.iterdir()) == [
        "model.engine",
        "model.engine.json",
    ]  # no temp files left
    assert info.engine.stat().st_size > 1000
    sidecar = json.loads(sidecar_path(info.engine).read_text())
    assert sidecar["tensorrt"]["flavour"] == "tensorrt_rtx"
    assert sidecar["tensorrt"]["version"].startswith("1.")
    assert sidecar["compute_capability"] == "8.9"
    assert sidecar["strongly_typed"] is True
    assert sidecar["plugins"] == []
    low, opt, high = DYNAMIC_DIM_DEFAULT
    assert sidecar["profiles"] == [
        {
            "x": {"min": [low, 4], "opt": [opt, 4], "max": [high, 4]},
            "b": {"min": [1, 4], "opt": [1, 4], "max": [1, 4]},
        }
    ]
    assert sidecar["model_sha256"] == hashlib.sha256(dynamic_model.read_bytes()).hexdigest()
    assert sidecar["build_seconds"] >= 0 and sidecar["built_at"].endswith("+00:00")
    assert sidecar["engine"] == "model.engine"


@rtx
def test_cli_build_with_shapes_and_timing_cache(dynamic_model, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    build_cli.add_parser(parser.add_subparsers())
    engine, cache = tmp_path / "m.plan", tmp_path / "timing.cache"
    args = parser.parse_args(
        [
            "build",
            str(dynamic_model),
            "-o",
            str(engine),
            "--shape",
            "x:2x4,8x4,64x4",
            "--compute-capability",
            "8.6",
            "--timing-cache",
            str(cache),
            "--json",
        ]
    )
    assert args.func(args) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["compute_capability"] == "8.6"
    assert printed["profiles"][0]["x"] == {"min": [2, 4], "opt": [8, 4], "max": [64, 4]}
    assert json.loads(sidecar_path(engine).read_text())["profiles"] == printed["profiles"]
    assert cache.is_file() and cache.stat().st_size > 0


@rtx
def test_failed_build_leaves_nothing(tmp_path):
    path = tmp_path / "bad.onnx"
    onnx.save(
        parse_model(
            '<ir_version: 10, opset_import: ["" : 17]>\ng (float[4] x) => (float[M] y) { y = Unique(x) }'
        ),
        path,
    )
    out = tmp_path / "out"
    with pytest.raises(GskitError, match="tensorrt_rtx build failed"):
        build_engine(path, out / "bad.engine", compute_capability="8.9", backend="tensorrt_rtx")
    assert list(out.iterdir()) == []


@rtx
def test_rtx_refuses_plugin_nodes(tmp_path):
    path = tmp_path / "p.onnx"
    onnx.save(
        parse_model(
            '<ir_version: 10, opset_import: ["" : 17, "my.ns" : 1]>\n'
            'g (float[4] x) => (float[4] y) { y = my.ns.Swish<plugin_namespace: string = "my.ns">(x) }'
        ),
        path,
    )
    with pytest.raises(GskitError, match=r"needs my\.ns::Swish v1"):
        build_engine(path, tmp_path / "p.engine", compute_capability="8.9", backend="tensorrt_rtx")


@rtx
@pytest.mark.parametrize(("capability", "message"), [("8", "MAJOR.MINOR"), ("9.0", "not supported|failed")])
def test_bad_compute_capability(dynamic_model, tmp_path, capability, message):
    with pytest.raises(GskitError, match=message):
        build_engine(
            dynamic_model, tmp_path / "m.engine", compute_capability=capability, backend="tensorrt_rtx"
        )
    assert not (tmp_path / "m.engine").exists()


@rtx
def test_rtx_without_gpu_or_compute_capability_says_so_before_building(dynamic_model, tmp_path, capsys):
    from gskit.backends.trt import gpu_count
    from gskit.cli import main

    if gpu_count() > 0:
        pytest.skip("a GPU is present: TensorRT-RTX builds for it without --compute-capability")
    engine = tmp_path / "m.engine"
    # Before: Polygraphy's "Invalid Engine" traceback text inside gskit's error, after the build ran.
    assert main(["build", str(dynamic_model), "-o", str(engine), "--backend", "tensorrt_rtx"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--compute-capability" in err and "e.g. 8.9" in err
    assert "Invalid Engine" not in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == [dynamic_model]


def test_derive_profile_fixed_model_needs_none():
    model = parse_model(
        '<ir_version: 10, opset_import: ["" : 17]>\ng (float[2,4] x) => (float[2,4] y) { y = Relu(x) }'
    )
    assert derive_profile(model) == {}


def test_derive_profile_rejects_bad_shapes():
    model = parse_model(DYNAMIC)
    with pytest.raises(GskitError, match="not model inputs"):
        derive_profile(model, {"z": ((1,), (1,), (1,))})
    with pytest.raises(GskitError, match="rank 2"):
        derive_profile(model, {"x": ((1,), (2,), (3,))})
    with pytest.raises(GskitError, match="min <= opt <= max"):
        derive_profile(model, {"x": ((4, 4), (2, 4), (8, 4))})


def test_static_backend_cannot_build(dynamic_model, tmp_path):
    with pytest.raises(GskitError, match="needs TensorRT"):
        build_engine(dynamic_model, tmp_path / "m.engine", backend="static")


def test_python_plugin_modules_load_once_with_siblings_and_name_a_broken_file(tmp_path) -> None:
    """The loader both the parent and the TensorRT worker use: package context, once per process, one line."""
    import sys

    from gskit.backends.trt import PluginFiles, load_plugin_files

    good = tmp_path / "good_plugin"
    good.mkdir()
    (good / "helper.py").write_text("CALLS = []\n")
    (good / "trt_plugin.py").write_text("from .helper import CALLS\nCALLS.append(1)\n")
    for _ in range(2):
        load_plugin_files(PluginFiles((), (good / "trt_plugin.py",)))
    assert sys.modules["gskit_trt_plugin_0_good_plugin.helper"].CALLS == [1]  # imported once

    broken = tmp_path / "broken_plugin"
    broken.mkdir()
    (broken / "trt_plugin.py").write_text("raise RuntimeError('boom')\n")
    message = r"broken_plugin/trt_plugin\.py: cannot import TensorRT plugin: .*boom"
    with pytest.raises(GskitError, match=message):
        load_plugin_files(PluginFiles((), (broken / "trt_plugin.py",)))
    assert "gskit_trt_plugin_0_broken_plugin" not in sys.modules


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_plugin_libraries_load_and_a_broken_one_is_named(tmp_path) -> None:
    """Without full TensorRT a library is loaded with ctypes (its constructor runs); a bad one is one line."""
    from gskit.backends.trt import PluginFiles, load_plugin_files

    marker = tmp_path / "loaded.txt"
    source = tmp_path / "plugin.c"
    source.write_text(
        "#include <stdio.h>\n"
        "__attribute__((constructor)) static void on_load(void) {\n"
        f'  FILE* f = fopen("{marker}", "a"); fputs("x", f); fclose(f);\n'
        "}\n"
    )
    library = tmp_path / "libfake_plugin.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    for _ in range(2):
        load_plugin_files(PluginFiles((library,), ()))
    assert marker.read_text() == "x"

    broken = tmp_path / "libbroken.so"
    broken.write_text("not an ELF file")
    with pytest.raises(GskitError, match=r"libbroken\.so: cannot load the plugin library: "):
        load_plugin_files(PluginFiles((broken,), ()))


def _deform_conv_model(n_inputs: int) -> onnx.ModelProto:
    names = ["x", "w", "offset", "bias", "mask"][:n_inputs]
    inputs = ", ".join(f"float[1, 1, 1, 1] {n}" for n in names)
    attrs = 'plugin_namespace: string = "gskit", plugin_version: string = "1"'
    return parse_model(
        f"""
        <ir_version: 8, opset_import: ["" : 17, "gskit" : 1]>
        g ({inputs}) => (float[1, 1, 1, 1] y) {{
            y = gskit.DeformConv2d <{attrs}> ({", ".join(names)})
        }}
        """
    )


@pytest.mark.parametrize("n_inputs", [3, 4])
def test_python_plugin_refuses_nodes_without_optional_inputs(n_inputs: int) -> None:
    """tensorrt.plugin takes a fixed input count: a short node is named before TensorRT fails on it."""
    module = PLUGINS / "deform_conv2d" / "trt_plugin.py"
    with pytest.raises(GskitError, match=rf"has {n_inputs} inputs.*takes all 5.*C\+\+ plugin library"):
        check_python_plugin_inputs(_deform_conv_model(n_inputs), [module])


def test_python_plugin_refuses_an_empty_input_in_the_middle() -> None:
    model = _deform_conv_model(5)
    model.graph.node[0].input[3] = ""  # no bias, but a mask
    with pytest.raises(GskitError, match=r"has 4 inputs.*takes all 5"):
        check_python_plugin_inputs(model, [PLUGINS / "deform_conv2d" / "trt_plugin.py"])


def test_python_plugin_takes_nodes_with_every_input_and_libraries_take_any() -> None:
    module = PLUGINS / "deform_conv2d" / "trt_plugin.py"
    check_python_plugin_inputs(_deform_conv_model(5), [module])
    check_python_plugin_inputs(_deform_conv_model(3), [])  # a C++ library (not a module) takes 3 to 5
