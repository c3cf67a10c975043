"""PyTorch -> ONNX with plugin nodes: the export cases of the seed notes, end to end on a CPU.

    python scripts/export_cases.py asinh        # aten::asinh has no symbolic: map it to ONNX Asinh
    python scripts/export_cases.py inlined      # an autograd.Function inlined into small ops -> ClampSwish
    python scripts/export_cases.py function     # the Function declares its plugin (@as_plugin)
    python scripts/export_cases.py deform-conv  # torchvision::deform_conv2d -> DeformConv2d plugin node
    python scripts/export_cases.py modules      # export_modules_as_functions -> LayerNorm plugin nodes
    python scripts/export_cases.py all [--dynamo] [-o DIR]

Each case exports, (replaces), infers shapes, folds, and compares every stage with PyTorch on
onnxruntime (plugin nodes through their numpy references), printing one table.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
import torch

from gskit.io import model as gsmodel
from gskit.io.report import console, table
from gskit.passes.fold import fold
from gskit.passes.patterns import replace
from gskit.passes.shapes import infer_shapes
from gskit.plugin import PluginRegistry, load_plugins
from gskit.torch_export import (
    Call,
    ModulePlugin,
    as_plugin,
    export,
    export_as_plugins,
    register_symbolic,
    torch_op,
    translation,
    validate,
)

PLUGINS = load_plugins([Path(__file__).resolve().parent.parent / "plugins"], entry_points=False)
CLAMP_SWISH = PLUGINS.get("gskit", "ClampSwish")
DEFORM_CONV = PLUGINS.get("gskit", "DeformConv2d")
LAYER_NORM = PLUGINS.get("gskit", "LayerNorm")
#: A TensorRT older than every native form (LayerNormalization 8.6, DeformConv 10.1): the seed cases are about
#: plugin nodes, so each region becomes its plugin node.
PLUGIN_TARGET = "8.5"


@dataclass
class CaseResult:
    """The model after each stage, and the max error against PyTorch of each stage."""

    final: onnx.ModelProto
    exported: onnx.ModelProto
    stages: list[tuple[str, int, int, float]] = field(
        default_factory=list
    )  # name, nodes, plugin nodes, error


# ----------------------------------------------------------------------------------------- the models
class Asinh(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.asinh(x)


class ClampSwishFunction(torch.autograd.Function):
    """The seed's custom op: clamp at zero, then x / (1 + exp(-x))."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        x = x.clamp(min=0)
        return x / (1 + torch.exp(-x))


@as_plugin(CLAMP_SWISH)
class ClampSwishPlugin(ClampSwishFunction):
    """The same Function, declared to export as one gskit::ClampSwish node."""


class UsesFunction(torch.nn.Module):
    def __init__(self, function: type) -> None:
        super().__init__()
        self.function = function

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.function.apply(x) * 2.0


def _deform_conv2d_torch(
    x, weight, offset, mask, bias, sh, sw, ph, pw, dh, dw, groups, offset_groups, use_mask
):  # noqa: ANN001, ANN202
    """torchvision's deform_conv2d in plain torch ops (bilinear taps, zero outside), where it is missing."""
    n, c, h, w = x.shape
    c_out, _, kh, kw = weight.shape
    oh, ow = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    k, og = kh * kw, offset_groups
    off = offset.reshape(n, og, k, 2, oh, ow)
    ys = (
        (torch.arange(oh) * sh - ph).view(1, 1, 1, oh, 1)
        + (torch.arange(kh) * dh).repeat_interleave(kw).view(1, 1, k, 1, 1)
        + off[:, :, :, 0]
    )
    xs = (
        (torch.arange(ow) * sw - pw).view(1, 1, 1, 1, ow)
        + (torch.arange(kw) * dw).repeat(kh).view(1, 1, k, 1, 1)
        + off[:, :, :, 1]
    )
    image = x.reshape(n, og, c // og, h * w)
    y0, x0 = ys.floor(), xs.floor()
    fy, fx = ys - y0, xs - x0
    samples = torch.zeros(n, og, c // og, k * oh * ow, dtype=x.dtype)
    for cy, cx, wt in (
        (y0, x0, (1 - fy) * (1 - fx)),
        (y0, x0 + 1, (1 - fy) * fx),
        (y0 + 1, x0, fy * (1 - fx)),
        (y0 + 1, x0 + 1, fy * fx),
    ):
        inside = (cy >= 0) & (cy < h) & (cx >= 0) & (cx < w)
        flat = (
            (cy.clamp(0, h - 1) * w + cx.clamp(0, w - 1))
            .long()
            .reshape(n, og, 1, -1)
            .expand(-1, -1, c // og, -1)
        )
        samples = samples + image.gather(-1, flat) * (wt * inside).reshape(n, og, 1, -1)
    samples = samples.reshape(n, og, c // og, k, oh, ow)
    if use_mask:
        samples = samples * mask.reshape(n, og, 1, k, oh, ow)
    cols = samples.reshape(n, groups, c // groups * k, oh * ow)
    out = torch.einsum("gok,ngkp->ngop", weight.reshape(groups, c_out // groups, -1), cols)
    return out.reshape(n, c_out, oh, ow) + bias.view(1, -1, 1, 1)


def deform_conv2d_op() -> str:
    """``torchvision::deform_conv2d`` when torchvision is installed, else a stand-in op with its schema."""
    try:
        import torchvision  # noqa: F401

        return "torchvision::deform_conv2d"
    except ImportError:
        pass
    if not hasattr(torch.ops.gskit_examples, "deform_conv2d"):
        lib = torch.library.Library("gskit_examples", "FRAGMENT")
        lib.define(
            "deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, "
            "int stride_h, int stride_w, int pad_h, int pad_w, int dilation_h, int dilation_w, "
            "int groups, int offset_groups, bool use_mask) -> Tensor"
        )
        lib.impl("deform_conv2d", _deform_conv2d_torch, "CompositeExplicitAutograd")
        torch.library.register_fake("gskit_examples::deform_conv2d", _deform_conv2d_torch, lib=lib)
        deform_conv2d_op.library = lib  # type: ignore[attr-defined]  # keep the definition alive
    return "gskit_examples::deform_conv2d"


class DeformConv(torch.nn.Module):
    """The seed's model: a Conv2d predicts offsets for a 3x3 deformable convolution."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = torch.nn.Conv2d(3, 18, 3, padding=1)
        self.weight = torch.nn.Parameter(torch.randn(4, 3, 3, 3) * 0.3)
        self.bias = torch.nn.Parameter(torch.randn(4))
        self.op = torch_op(deform_conv2d_op())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        offset = self.conv1(x)
        mask = torch.zeros(0)
        return self.op(x, self.weight, offset, mask, self.bias, 1, 1, 1, 1, 1, 1, 1, 1, False)


def bind_deform_conv2d(
    x, weight, offset, mask, bias, sh, sw, ph, pw, dh, dw, groups, offset_groups, use_mask
) -> Call:  # noqa: ANN001
    """torchvision's argument order -> DeformConv2d's (x, weight, offset, bias, mask) and attributes."""
    attrs = {
        "strides": [sh, sw],
        "pads": [ph, pw, ph, pw],
        "dilations": [dh, dw],
        "group": groups,
        "offset_group": offset_groups,
    }
    return Call([x, weight, offset, bias, mask if use_mask else None], attrs)


DEFORM_ARG_TYPES = ("v", "v", "v", "v", "v", "i", "i", "i", "i", "i", "i", "i", "i", "b")


class MyLayerNorm(torch.nn.Module):
    """A hand-written layer norm, exported as a local function and replaced by gskit::LayerNorm."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(size) + 0.5)
        self.bias = torch.nn.Parameter(torch.rand(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class TwoNorms(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.norm1 = MyLayerNorm(16, 1e-5)
        self.linear = torch.nn.Linear(16, 16)
        self.norm2 = MyLayerNorm(16, 1e-3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm2(self.linear(self.norm1(x)))


# ------------------------------------------------------------------------------------------ the cases
def case_asinh(out: Path, dynamo: bool = False) -> CaseResult:
    model, args = Asinh().eval(), (torch.randn(2, 5) * 3,)
    table_ = {torch.ops.aten.asinh.default: translation(onnx_op="Asinh")}
    with register_symbolic("aten::asinh", onnx_op="Asinh", opset=9):
        result = export(
            model,
            args,
            out / "asinh.onnx",
            dynamo=dynamo,
            opset=18 if dynamo else 9,
            input_names=["x"],
            output_names=["y"],
            custom_translation_table=table_,
        )
    return _pipeline(result.model, model, args, PluginRegistry())


def case_inlined(out: Path, dynamo: bool = False) -> CaseResult:
    model, args = UsesFunction(ClampSwishFunction).eval(), (torch.randn(1, 2, 5, 5),)
    result = export(
        model,
        args,
        out / "inlined.onnx",
        dynamo=dynamo,
        opset=18 if dynamo else 12,
        input_names=["x"],
        output_names=["y"],
    )
    return _pipeline(result.model, model, args, PluginRegistry([CLAMP_SWISH]), replace_specs=[CLAMP_SWISH])


def case_function(out: Path, dynamo: bool = False) -> CaseResult:
    model, args = UsesFunction(ClampSwishPlugin).eval(), (torch.randn(1, 2, 5, 5),)
    result = export(
        model,
        args,
        out / "function.onnx",
        dynamo=dynamo,
        opset=18 if dynamo else 12,
        input_names=["x"],
        output_names=["y"],
        functions=[ClampSwishPlugin],
    )
    return _pipeline(result.model, model, args, PluginRegistry([CLAMP_SWISH]))


def case_deform_conv(out: Path, dynamo: bool = False) -> CaseResult:
    model, args = DeformConv().eval(), (torch.rand(1, 3, 7, 7),)
    op = deform_conv2d_op()
    table_ = {torch_op(op): translation(plugin=DEFORM_CONV, bind=bind_deform_conv2d)}
    with register_symbolic(
        op, plugin=DEFORM_CONV, arg_types=DEFORM_ARG_TYPES, bind=bind_deform_conv2d, opset=12
    ):
        result = export(
            model,
            args,
            out / "deform_conv.onnx",
            dynamo=dynamo,
            opset=18 if dynamo else 12,
            input_names=["x"],
            output_names=["y"],
            plugins=[DEFORM_CONV],
            custom_translation_table=table_,
        )
    return _pipeline(result.model, model, args, PluginRegistry([DEFORM_CONV]))


def case_modules(out: Path, dynamo: bool = False) -> CaseResult:
    if dynamo:
        raise SystemExit("modules: export_modules_as_functions exists only in the TorchScript exporter")
    model, args = TwoNorms().eval(), (torch.randn(2, 3, 16),)
    plugin = ModulePlugin(LAYER_NORM, attrs=lambda m: {"epsilon": m.eps})
    result = export_as_plugins(
        model,
        args,
        out / "modules.onnx",
        {MyLayerNorm: plugin},
        opset=17,
        tensorrt=PLUGIN_TARGET,
        input_names=["x"],
        output_names=["y"],
    )
    return _pipeline(result.model, model, args, PluginRegistry([LAYER_NORM]))


CASES: dict[str, Callable[[Path, bool], CaseResult]] = {
    "asinh": case_asinh,
    "inlined": case_inlined,
    "function": case_function,
    "deform-conv": case_deform_conv,
    "modules": case_modules,
}


def _pipeline(
    exported: onnx.ModelProto,
    model: torch.nn.Module,
    args: tuple,
    registry: PluginRegistry,
    replace_specs: list | None = None,
) -> CaseResult:
    """replace (optional) -> infer shapes -> fold, each stage checked against PyTorch."""
    result = CaseResult(exported, exported)

    def stage(name: str, proto: onnx.ModelProto) -> None:
        error = max(validate(proto, model, args, plugins=registry).values())
        plugin_nodes = sum(1 for n in proto.graph.node if registry.for_node(n) is not None)
        result.stages.append((name, len(proto.graph.node), plugin_nodes, error))
        result.final = proto

    stage("export", exported)
    current = exported
    if replace_specs:
        graph = gsmodel.to_graph(current)
        replace(graph, replace_specs, tensorrt=PLUGIN_TARGET)
        stage("replace", current := gsmodel.to_model(graph))
    stage("infer shapes", current := infer_shapes(current, registry))
    folded, _ = fold(current, plugins=registry)
    stage("fold", folded)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", choices=[*CASES, "all"])
    parser.add_argument("--dynamo", action="store_true", help="use the dynamo exporter (torch.export)")
    parser.add_argument(
        "-o", "--out", type=Path, help="folder for the .onnx files (default: a temporary one)"
    )
    args = parser.parse_args(argv)
    names = list(CASES) if args.case == "all" else [args.case]
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        for name in names:
            if name == "modules" and args.dynamo:
                continue
            result = CASES[name](out, args.dynamo)
            rows = [(s, n, p, f"{e:.2e}") for s, n, p, e in result.stages]
            title = f"{name} ({'dynamo' if args.dynamo else 'TorchScript'})"
            console().print(table(title, ["stage", "nodes", "plugin nodes", "max |ort - torch|"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
