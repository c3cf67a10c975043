"""gskit.backends.trt_plugin: the tensorrt.plugin signatures derived from a PluginSpec, and plugin folder
loading.

The signatures are checked against the schemas TensorRT's ``tensorrt.plugin`` validates (inputs, then
attributes in registration order, then ``outputs`` and ``stream``/``tactic``). Registration itself needs
full TensorRT and runs in tests/test_trt_gpu.py (Docker GPU CI).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from plugin_folders import plugin_folders

from gskit.backends import trt_plugin
from gskit.errors import PluginError
from gskit.plugin import Attribute, AttrType, PluginSpec, load_spec_file

REPO = Path(__file__).resolve().parent.parent
PLUGIN_FOLDERS = plugin_folders("trt_plugin.py")


def _names(signature) -> str:
    return f"({', '.join(signature.parameters)})"


def test_signatures_of_deform_conv2d_match_the_tensorrt_schemas() -> None:
    (spec,) = load_spec_file(REPO / "plugins" / "deform_conv2d" / "spec.py")
    assert trt_plugin.plugin_id(spec) == "gskit::DeformConv2d"
    assert trt_plugin.input_names(spec) == ["x", "weight", "offset", "bias", "mask"]
    attrs = "strides, pads, dilations, group, offset_group"
    assert (
        _names(trt_plugin.impl_signature(spec))
        == f"(x, weight, offset, bias, mask, {attrs}, outputs, stream)"
    )
    assert _names(trt_plugin.autotune_signature(spec)) == "(x, weight, offset, bias, mask, outputs)"
    annotations = {n: trt_plugin.attribute_annotation(spec, n) for n in attrs.split(", ")}
    assert annotations["group"] is int and annotations["offset_group"] is int
    for name in ("strides", "pads", "dilations"):
        assert annotations[name].__args__[1].__args__[0] is np.int32  # NDArray[np.int32]
    assert trt_plugin.type_combination(spec) == ", ".join(["FP32|FP16"] * 6)


def test_attribute_kinds_map_to_tensorrt_plugin_annotations() -> None:
    spec = PluginSpec(
        name="Kinds",
        namespace="test",
        attributes=(
            Attribute("eps", AttrType.FLOAT, 1e-5),
            Attribute("mode", AttrType.STRING, "a"),
            Attribute("scales", AttrType.FLOATS, [1.0]),
            Attribute("table", AttrType.TENSOR, np.zeros(2, np.float16), tensor_dtype="float16"),
            Attribute("names", AttrType.STRINGS, ["a"]),
        ),
    )
    assert trt_plugin.attribute_annotation(spec, "eps") is float
    assert trt_plugin.attribute_annotation(spec, "mode") is str
    assert trt_plugin.attribute_annotation(spec, "scales").__args__[1].__args__[0] is np.float32
    assert trt_plugin.attribute_annotation(spec, "table").__args__[1].__args__[0] is np.float16
    with pytest.raises(PluginError, match="'names' of kind strings cannot reach a tensorrt.plugin"):
        trt_plugin.attribute_annotation(spec, "names")


@pytest.mark.parametrize("folder", PLUGIN_FOLDERS, ids=[p.name for p in PLUGIN_FOLDERS])
def test_every_spec_has_tensorrt_plugin_annotations(folder: Path) -> None:
    (spec,) = load_spec_file(folder / "spec.py")
    impl = trt_plugin.impl_signature(spec)
    assert list(impl.parameters)[-2:] == ["outputs", "stream"]
    assert len(impl.parameters) == len(spec.inputs) + len(spec.attributes) + 2
    for attr in spec.attributes:
        trt_plugin.attribute_annotation(spec, attr.name)


@pytest.mark.parametrize("folder", PLUGIN_FOLDERS, ids=[p.name for p in PLUGIN_FOLDERS])
def test_load_plugin_folder_gives_the_spec_and_kernel(folder: Path) -> None:
    needs_triton = "import triton" in (folder / "kernel.py").read_text()
    if needs_triton and importlib.util.find_spec("triton") is None:
        with pytest.raises(PluginError, match=r"kernel\.py: cannot import: ImportError: .*needs Triton"):
            trt_plugin.load_plugin_folder(folder / "trt_plugin.py")
        return
    spec, kernel = trt_plugin.load_plugin_folder(folder / "trt_plugin.py")
    assert spec.source == (folder / "spec.py").resolve()
    assert Path(kernel.__file__).resolve() == (folder / "kernel.py").resolve()


def test_register_without_full_tensorrt_names_the_extra() -> None:
    if trt_plugin_importable():
        pytest.skip("full TensorRT is installed")
    (spec,) = load_spec_file(REPO / "plugins" / "rms_norm" / "spec.py")
    with pytest.raises(PluginError, match=r"full TensorRT >= 10.6: pip install 'gskit\[trt\]'"):
        trt_plugin.register_from_spec(spec, shape=lambda i, a: [i[0].like()], impl=lambda *a: None)


def trt_plugin_importable() -> bool:
    try:
        import tensorrt.plugin  # noqa: F401
    except Exception:
        return False
    return True
