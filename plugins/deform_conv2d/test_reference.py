"""DeformConv2d reference against onnxruntime's DeformConv, a slow explicit-loop implementation and Conv.

Tolerances: against onnxruntime (float32 arithmetic) and the float32 ONNX reference evaluator, rtol 1e-5 /
atol 1e-5 on outputs of magnitude ~10; against the float64 loop implementation, rtol 1e-6 / atol 1e-6;
float16 inputs within rtol 1e-2 / atol 5e-2 of the float32 answer.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from gskit.plugin import TensorInfo

from .reference import deform_conv2d, output_size
from .spec import SPEC

# (group, offset_group, strides, pads [t, l, b, r], dilations, with mask, with bias)
CONFIGS = [
    (1, 1, [1, 1], [0, 0, 0, 0], [1, 1], False, False),
    (1, 1, [1, 1], [1, 1, 1, 1], [1, 1], True, True),
    (2, 1, [1, 1], [1, 1, 1, 1], [1, 1], True, True),
    (1, 2, [1, 1], [1, 1, 1, 1], [1, 1], True, True),
    (2, 4, [2, 1], [0, 1, 2, 0], [1, 2], True, True),
    (4, 2, [2, 2], [2, 2, 2, 2], [2, 2], False, True),
]


def _onnx_deform_conv(
    x: np.ndarray,
    w: np.ndarray,
    offset: np.ndarray,
    bias: np.ndarray | None,
    mask: np.ndarray | None,
    **attrs,
) -> onnx.ModelProto:
    names = ["x", "w", "offset", "bias" if bias is not None else "", "mask" if mask is not None else ""]
    arrays = [x, w, offset, bias, mask]
    while names[-1] == "":
        names.pop()
    node = helper.make_node("DeformConv", names, ["y"], **attrs)
    graph = helper.make_graph(
        [node],
        "deform_conv",
        [
            helper.make_tensor_value_info(n, TensorProto.FLOAT, a.shape)
            for n, a in zip(names, arrays, strict=False)
            if n
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "C", "H", "W"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
    onnx.checker.check_model(model)
    return model


def _random_case(rng: np.random.Generator, config, n=2, c=8, h=7, w=6, c_out=8, k=(3, 3)):
    group, offset_group, strides, pads, dilations, with_mask, with_bias = config
    oh = output_size(h, k[0], strides[0], pads[0], pads[2], dilations[0])
    ow = output_size(w, k[1], strides[1], pads[1], pads[3], dilations[1])
    kk = k[0] * k[1]
    inputs = {
        "x": rng.standard_normal((n, c, h, w)).astype(np.float32),
        "w": rng.standard_normal((c_out, c // group, *k)).astype(np.float32),
        # Offsets of a few pixels, so samples cross the border and land outside the image.
        "offset": (rng.standard_normal((n, offset_group * kk * 2, oh, ow)) * 2.5).astype(np.float32),
        "bias": rng.standard_normal(c_out).astype(np.float32) if with_bias else None,
        "mask": rng.random((n, offset_group * kk, oh, ow)).astype(np.float32) if with_mask else None,
    }
    attrs = {
        "strides": strides,
        "pads": pads,
        "dilations": dilations,
        "group": group,
        "offset_group": offset_group,
    }
    return inputs, attrs


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"g{c[0]}-og{c[1]}-s{c[2]}-p{c[3]}-d{c[4]}-m{c[5]}")
def test_matches_onnxruntime_deform_conv(config) -> None:
    rng = np.random.default_rng(0)
    inputs, attrs = _random_case(rng, config)
    model = _onnx_deform_conv(**inputs, **attrs)
    feeds = {k: v for k, v in inputs.items() if v is not None}
    (expected,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    got = deform_conv2d(inputs["x"], inputs["w"], inputs["offset"], inputs["bias"], inputs["mask"], **attrs)
    assert got.dtype == np.float32 and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_matches_onnx_reference_evaluator() -> None:
    rng = np.random.default_rng(1)
    inputs, attrs = _random_case(rng, CONFIGS[4])
    model = _onnx_deform_conv(**inputs, **attrs)
    feeds = {k: v for k, v in inputs.items() if v is not None}
    (expected,) = ReferenceEvaluator(model).run(None, feeds)
    got = deform_conv2d(inputs["x"], inputs["w"], inputs["offset"], inputs["bias"], inputs["mask"], **attrs)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def _bilinear_zero_padded(image: np.ndarray, y: float, x: float) -> float:
    """One bilinear sample of a 2-D image; pixels outside read zero."""
    h, w = image.shape
    y0, x0 = math.floor(y), math.floor(x)
    total = 0.0
    for yy, xx in ((y0, x0), (y0, x0 + 1), (y0 + 1, x0), (y0 + 1, x0 + 1)):
        if 0 <= yy < h and 0 <= xx < w:
            total += (1 - abs(y - yy)) * (1 - abs(x - xx)) * float(image[yy, xx])
    return total


def _slow_deform_conv2d(x, weight, offset, bias, mask, strides, pads, dilations, group, offset_group):
    """torchvision's definition written as loops over every output element and kernel tap (float64)."""
    n, c, h, w = x.shape
    c_out, cpg, kh, kw = weight.shape
    oh, ow = offset.shape[2:]
    y = np.zeros((n, c_out, oh, ow))
    for b in range(n):
        for o in range(c_out):
            g = o // (c_out // group)
            for i in range(oh):
                for j in range(ow):
                    acc = 0.0 if bias is None else float(bias[o])
                    for ci in range(cpg):
                        ch = g * cpg + ci
                        og = ch // (c // offset_group)
                        for u in range(kh):
                            for v in range(kw):
                                k = u * kw + v
                                dy = float(offset[b, og * kh * kw * 2 + 2 * k, i, j])
                                dx = float(offset[b, og * kh * kw * 2 + 2 * k + 1, i, j])
                                py = i * strides[0] - pads[0] + u * dilations[0] + dy
                                px = j * strides[1] - pads[1] + v * dilations[1] + dx
                                sample = _bilinear_zero_padded(x[b, ch], py, px)
                                if mask is not None:
                                    sample *= float(mask[b, og * kh * kw + k, i, j])
                                acc += float(weight[o, ci, u, v]) * sample
                    y[b, o, i, j] = acc
    return y


@pytest.mark.parametrize(
    "config", [CONFIGS[1], CONFIGS[4]], ids=["pad-mask", "groups-offset-groups-stride-dil"]
)
def test_matches_slow_loop_implementation(config) -> None:
    rng = np.random.default_rng(2)
    inputs, attrs = _random_case(rng, config, n=1, c=4, h=5, w=4, c_out=2, k=(2, 3))
    got = deform_conv2d(inputs["x"], inputs["w"], inputs["offset"], inputs["bias"], inputs["mask"], **attrs)
    expected = _slow_deform_conv2d(
        inputs["x"], inputs["w"], inputs["offset"], inputs["bias"], inputs["mask"], **attrs
    )
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_zero_offsets_and_unit_mask_is_a_plain_convolution() -> None:
    rng = np.random.default_rng(3)
    inputs, attrs = _random_case(rng, (2, 1, [2, 1], [1, 0, 1, 2], [1, 2], True, True))
    inputs["offset"] = np.zeros_like(inputs["offset"])
    inputs["mask"] = np.ones_like(inputs["mask"])
    conv = helper.make_model(
        helper.make_graph(
            [
                helper.make_node(
                    "Conv",
                    ["x", "w", "bias"],
                    ["y"],
                    strides=attrs["strides"],
                    pads=attrs["pads"],
                    dilations=attrs["dilations"],
                    group=attrs["group"],
                )
            ],
            "conv",
            [
                helper.make_tensor_value_info(k, TensorProto.FLOAT, inputs[k].shape)
                for k in ("x", "w", "bias")
            ],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "C", "H", "W"])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
        ir_version=8,
    )
    feeds = {k: inputs[k] for k in ("x", "w", "bias")}
    (expected,) = ort.InferenceSession(conv.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    got = deform_conv2d(inputs["x"], inputs["w"], inputs["offset"], inputs["bias"], inputs["mask"], **attrs)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_offsets_far_outside_the_image_give_the_bias() -> None:
    rng = np.random.default_rng(4)
    inputs, attrs = _random_case(rng, CONFIGS[1])
    inputs["offset"] = np.full_like(inputs["offset"], 1e3)
    got = deform_conv2d(inputs["x"], inputs["w"], inputs["offset"], inputs["bias"], inputs["mask"], **attrs)
    np.testing.assert_array_equal(got, np.broadcast_to(inputs["bias"].reshape(1, -1, 1, 1), got.shape))


def test_float16_is_computed_in_float32_and_cast_back() -> None:
    rng = np.random.default_rng(5)
    inputs, attrs = _random_case(rng, CONFIGS[2])
    half = {k: None if v is None else v.astype(np.float16) for k, v in inputs.items()}
    got = deform_conv2d(half["x"], half["w"], half["offset"], half["bias"], half["mask"], **attrs)
    assert got.dtype == np.float16
    single = {k: None if v is None else v.astype(np.float32) for k, v in half.items()}
    expected = deform_conv2d(
        single["x"], single["w"], single["offset"], single["bias"], single["mask"], **attrs
    )
    np.testing.assert_allclose(got.astype(np.float32), expected, rtol=1e-2, atol=5e-2)


def test_shape_mismatch_is_refused() -> None:
    rng = np.random.default_rng(6)
    inputs, attrs = _random_case(rng, CONFIGS[1])
    with pytest.raises(ValueError, match="offset is"):
        deform_conv2d(inputs["x"], inputs["w"], inputs["offset"][:, :-2], None, None, **attrs)


def test_output_rule_keeps_symbolic_batch_and_computes_spatial_dims() -> None:
    f = TensorProto.FLOAT
    attrs = {"strides": [2, 1], "pads": [0, 1, 2, 0], "dilations": [1, 2], "group": 1, "offset_group": 1}
    (out,) = SPEC.infer(
        [
            TensorInfo(f, ("N", 8, 7, 6)),
            TensorInfo(f, (16, 8, 3, 3)),
            TensorInfo(f, ("N", 18, None, None)),
            None,
            None,
        ],
        attrs,
    )
    assert out == TensorInfo(f, ("N", 16, output_size(7, 3, 2, 0, 2, 1), output_size(6, 3, 1, 1, 0, 2)))
    # Unknown spatial input dims: taken from the offset when it knows them, else None.
    (out,) = SPEC.infer(
        [
            TensorInfo(f, ("N", 8, "H", "W")),
            TensorInfo(f, (16, 8, 3, 3)),
            TensorInfo(f, ("N", 18, "oH", None)),
        ],
        attrs,
    )
    assert out == TensorInfo(f, ("N", 16, "oH", None))
