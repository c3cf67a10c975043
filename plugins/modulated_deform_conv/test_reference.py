"""ModulatedDeformConv2d reference against onnxruntime's ONNX ``DeformConv`` (opset 19) with a mask.

onnxruntime computes in float32; the reference in float64: rtol 1e-4 / atol 1e-4 on outputs of magnitude ~10.
Offsets of up to +-4 pixels put samples on and past the borders; float16 inputs give float16 within 2e-2.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from .reference import modulated_deform_conv2d
from .spec import SPEC

# (group, deformable_group, stride, padding [h, w], dilation, bias)
CONFIGS = [
    (1, 1, [1, 1], [0, 0], [1, 1], False),
    (1, 1, [1, 1], [1, 1], [1, 1], True),
    (2, 1, [2, 1], [1, 2], [1, 1], True),
    (1, 2, [1, 2], [2, 1], [2, 1], True),
    (2, 4, [2, 2], [2, 2], [2, 2], False),
]


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


def _onnx_deform_conv(
    x, weight, offset, mask, bias, *, group, offset_group, strides, pads, dilations
) -> np.ndarray:
    names = ["x", "w", "offset", "bias" if bias is not None else "", "mask"]
    node = helper.make_node(
        "DeformConv",
        names,
        ["y"],
        group=group,
        offset_group=offset_group,
        strides=strides,
        pads=pads,
        dilations=dilations,
    )
    arrays = {"x": x, "w": weight, "offset": offset, "bias": bias, "mask": mask}
    graph = helper.make_graph(
        [node],
        "deform_conv",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, arrays[n].shape) for n in names if n],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "C", "H", "W"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
    onnx.checker.check_model(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {n: arrays[n] for n in names if n})[0]


def _case(rng, group, deformable_group, stride, padding, dilation, bias):
    channels, c_out, kh, kw, height, width = 8, 4 * group, 3, 3, 9, 8
    out_h = (height + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    out_w = (width + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    taps = deformable_group * kh * kw
    return (
        rng.standard_normal((2, channels, height, width)).astype(np.float32),
        rng.uniform(-4, 4, size=(2, 2 * taps, out_h, out_w)).astype(np.float32),
        rng.random((2, taps, out_h, out_w)).astype(np.float32),
        rng.standard_normal((c_out, channels // group, kh, kw)).astype(np.float32),
        rng.standard_normal(c_out).astype(np.float32) if bias else None,
    )


@pytest.mark.parametrize(("group", "deformable_group", "stride", "padding", "dilation", "bias"), CONFIGS)
def test_matches_onnx_deform_conv(rng, group, deformable_group, stride, padding, dilation, bias) -> None:
    x, offset, mask, weight, b = _case(rng, group, deformable_group, stride, padding, dilation, bias)
    fields = dict(
        stride=stride, padding=padding, dilation=dilation, group=group, deformable_group=deformable_group
    )
    got = modulated_deform_conv2d(x, offset, mask, weight, b, **fields)
    want = _onnx_deform_conv(
        x,
        weight,
        offset,
        mask,
        b,
        group=group,
        offset_group=deformable_group,
        strides=stride,
        pads=[*padding, *padding],
        dilations=dilation,
    )
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_float16(rng) -> None:
    x, offset, mask, weight, b = _case(rng, 1, 1, [1, 1], [1, 1], [1, 1], True)
    wide = modulated_deform_conv2d(x, offset, mask, weight, b, padding=[1, 1])
    half = modulated_deform_conv2d(
        *(a.astype(np.float16) for a in (x, offset, mask, weight, b)), padding=[1, 1]
    )
    assert half.dtype == np.float16
    np.testing.assert_allclose(half.astype(np.float32), wide, rtol=2e-2, atol=2e-2 * np.abs(wide).max())


def test_spec_fields_are_the_creator_fields() -> None:
    """modulatedDeformConvPlugin.cpp: stride, padding, dilation INT32 x 2; group, deformable_group INT32."""
    assert [(a.name, a.type.value) for a in SPEC.attributes] == [
        ("stride", "ints"),
        ("padding", "ints"),
        ("dilation", "ints"),
        ("group", "int"),
        ("deformable_group", "int"),
    ]
    assert SPEC.inputs == ("x", "offset", "mask", "weight", "bias?")
    assert (SPEC.namespace, SPEC.domain, SPEC.version, SPEC.library) == ("", "TRT", "2", "libnvinfer_plugin")
