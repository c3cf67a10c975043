"""The lower pass: Col2Im (which TensorRT's parser rejects) as Reshape/Transpose or a one-hot ConvTranspose.

Each rewritten model runs on onnxruntime against torch's ``F.fold`` (an independent col2im) and against the
original Col2Im node on onnxruntime: exactly equal where blocks tile the image or do not overlap, within
rtol 1e-6 / atol 1e-6 (sums of up to nine values of order 1, added in another order) where they overlap.
TensorRT-RTX's parser rejects the original and takes the rewritten model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import parse_model

from gskit.backends import ort
from gskit.backends.trt_check import UNSUPPORTED, check_trt
from gskit.io import model as gsmodel
from gskit.passes.lower import lower

# (image (H, W), block (kh, kw), strides, dilations, pads [t, l, b, r], form)
CASES = [
    ((8, 6), (2, 2), (2, 2), (1, 1), (0, 0, 0, 0), "reshape"),  # MobileViTv2's nn.Fold: blocks tile the image
    ((6, 9), (3, 3), (3, 3), (1, 1), (0, 0, 0, 0), "reshape"),
    ((7, 9), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), "conv_transpose"),  # overlapping, padded
    ((11, 10), (3, 2), (2, 1), (2, 3), (2, 1, 2, 1), "conv_transpose"),  # dilated, non-square
    ((9, 8), (2, 2), (2, 2), (1, 1), (0, 0, 0, 0), "conv_transpose"),  # a row no block reaches
    ((5, 7), (2, 3), (3, 2), (1, 1), (0, 0, 0, 0), "conv_transpose"),  # gaps between blocks
]


def _grid(image, block, strides, dilations, pads) -> tuple[int, int]:
    return tuple(
        (image[a] + pads[a] + pads[a + 2] - dilations[a] * (block[a] - 1) - 1) // strides[a] + 1
        for a in (0, 1)
    )


def _col2im_model(image, block, strides, dilations, pads, channels: int = 3) -> onnx.ModelProto:
    oh, ow = _grid(image, block, strides, dilations, pads)
    rows = channels * block[0] * block[1]
    text = f"""
    <ir_version: 9, opset_import: ["" : 18]>
    g (float[N,{rows},{oh * ow}] x) => (float[N,{channels},{image[0]},{image[1]}] y) {{
        image = Constant<value = int64[2] {{{image[0]}, {image[1]}}}>()
        block = Constant<value = int64[2] {{{block[0]}, {block[1]}}}>()
        y = Col2Im<strides = {list(strides)}, dilations = {list(dilations)}, pads = {list(pads)}>(
            x, image, block)
    }}"""
    return parse_model(text)


def _fold(x: np.ndarray, image, block, strides, dilations, pads) -> np.ndarray:
    """torch's F.fold; it pads symmetrically, so an asymmetric case crops a symmetric result."""
    import torch

    top, left, bottom, right = pads
    sym = (max(top, bottom), max(left, right))
    size = (image[0] + 2 * sym[0] - top - bottom, image[1] + 2 * sym[1] - left - right)
    y = torch.nn.functional.fold(
        torch.from_numpy(x), size, block, dilation=dilations, padding=sym, stride=strides
    ).numpy()
    return y[:, :, sym[0] - top : sym[0] - top + image[0], sym[1] - left : sym[1] - left + image[1]]


@pytest.mark.torch
@pytest.mark.parametrize(("image", "block", "strides", "dilations", "pads", "form"), CASES)
def test_col2im_rewrite_matches_fold_and_onnxruntime(
    image, block, strides, dilations, pads, form, rng
) -> None:
    model = _col2im_model(image, block, strides, dilations, pads)
    graph = gsmodel.to_graph(model)
    report = lower(graph)
    assert [item.form for item in report.lowered] == [form] and not report.left
    lowered = gsmodel.to_model(graph)
    onnx.checker.check_model(lowered, full_check=True)
    assert "Col2Im" not in {n.op_type for n in lowered.graph.node}
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim[1:]]
    x = rng.standard_normal((2, *dims)).astype(np.float32)
    got = ort.run(lowered, {"x": x})["y"]
    original = ort.run(model, {"x": x})["y"]
    want = _fold(x, image, block, strides, dilations, pads)
    overlap = any(k * d > s for k, d, s in zip(block, dilations, strides, strict=True))
    tolerance = {"rtol": 1e-6, "atol": 1e-6} if overlap else {"rtol": 0, "atol": 0}
    np.testing.assert_allclose(got, want, **tolerance)
    np.testing.assert_allclose(got, original, **tolerance)


def test_tensorrt_rtx_rejects_col2im_and_takes_the_rewrite(tmp_path: Path) -> None:
    for image, block, strides, dilations, pads, _ in (CASES[0], CASES[3]):
        model = _col2im_model(image, block, strides, dilations, pads)
        before = check_trt(gsmodel.save(model, tmp_path / "col2im.onnx"), backend="tensorrt_rtx")
        assert [i.op_type for i in before.nodes_with(UNSUPPORTED)] == ["Col2Im"]
        graph = gsmodel.to_graph(model)
        lower(graph)
        after = check_trt(
            gsmodel.save(gsmodel.to_model(graph), tmp_path / "lowered.onnx"), backend="tensorrt_rtx"
        )
        assert after.ok, after.issues


def test_col2im_without_constant_shapes_is_left_with_the_reason() -> None:
    model = parse_model("""
    <ir_version: 9, opset_import: ["" : 18]>
    g (float[1,12,12] x, int64[2] image) => (float[1,3,8,6] y) {
        block = Constant<value = int64[2] {2, 2}>()
        y = Col2Im<strides = [2, 2]>(x, image, block)
    }""")
    graph = gsmodel.to_graph(model)
    report = lower(graph)
    assert not report.lowered and report.left == [
        ("Col2Im(y)", "image_shape and block_shape are not constants")
    ]


@pytest.mark.torch
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning")
@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_exported_fold_is_prepared_and_validated(tmp_path: Path, dynamo: bool) -> None:
    """nn.Unfold -> per-patch Linear -> nn.Fold, the MobileViTv2 round trip, through the default recipe."""
    import torch

    from gskit.pipeline.prepare import prepare

    class Patches(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.unfold, self.fold = torch.nn.Unfold(2, stride=2), torch.nn.Fold((8, 6), 2, stride=2)
            self.mix = torch.nn.Linear(12, 12)

        def forward(self, x):
            return self.fold(self.mix(self.unfold(x).transpose(1, 2)).transpose(1, 2))

    torch.manual_seed(0)
    path = tmp_path / "fold.onnx"
    args = {"dynamo": True} if dynamo else {"dynamo": False, "opset_version": 18}
    torch.onnx.export(Patches().eval(), (torch.randn(1, 3, 8, 6),), str(path), input_names=["x"], **args)
    assert "Col2Im" in {n.op_type for n in onnx.load(path).graph.node}
    report = prepare(path, tmp_path / "out")
    assert report.passed
    lowered = next(s for s in report.steps if s.name == "lower")
    assert lowered.summary.startswith("1 node(s) lowered") and "Col2Im -> reshape" in lowered.summary
    assert not report.tensorrt.rejected
    assert report.lowered == {"Col2Im -> reshape": 1}
