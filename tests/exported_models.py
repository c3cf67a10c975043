"""Small PyTorch models, one per plugin pattern, exported to ONNX by both torch exporters.

Each :class:`Case` names the plugin it plants, how many instances, the standard ops that must be gone
after ``gskit replace``, and a builder. :func:`export` writes the case with the TorchScript exporter
(``dynamo=False``, opset 17) or the dynamo exporter (``dynamo=True``) and returns the path; a case an
exporter cannot produce raises :class:`ExportUnsupported` with the reason, so tests skip and say why.
``deform_conv_onnx`` is built in ONNX directly (one ``DeformConv`` node, opset 19), exporter-independent;
``deform_conv_custom`` has the same weights and exports its deformable convolution (torchvision is not
installed; a stand-in computes it with the plugin's numpy reference) as one ``custom::deform_conv2d`` node
in torchvision's argument order: an autograd.Function ``symbolic`` for the TorchScript exporter, a
torch.library custom op with a ``custom_translation_table`` for the dynamo exporter.

torch is imported lazily: importing this module needs only numpy and onnx.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

BATCH = 2  # example batch; the exported batch axis is dynamic ("batch")
OPSET_TORCHSCRIPT = 17
CHANNELS = 8
DEFORM = {"in": 4, "out": 6, "kernel": 3, "hw": (6, 5)}


class ExportUnsupported(Exception):
    """An exporter cannot produce this case (the message says why); tests skip with it."""


@dataclass(frozen=True)
class Case:
    """One exported test model.

    Attributes:
        name: case name, also the file stem.
        plugin: the plugin op type it plants (domain "gskit").
        planted: how many plugin instances ``gskit replace`` must produce.
        gone: standard op types that must not remain after the replacement.
        input_shape: shape of the single input ``x`` at export time (batch first).
        build: ``(dynamo) -> path`` writer, given the destination path.
        onnx_twin: for custom-domain exports that onnxruntime cannot run, the name of a case with the
            same weights whose original model runs on onnxruntime (the comparison reference).
        exporters: which exporters apply (False: TorchScript, True: dynamo).
    """

    name: str
    plugin: str
    planted: int
    gone: tuple[str, ...]
    input_shape: tuple[int, ...]
    build: Callable[[Path, bool], None]
    onnx_twin: str | None = None
    exporters: tuple[bool, ...] = field(default=(False, True))


# --------------------------------------------------------------------------------------------------
# torch modules (built inside functions so that torch stays optional)


def _torch():
    import torch

    return torch


def _clamp_swish_module():
    torch = _torch()

    class ClampSwishFn(torch.autograd.Function):
        """The custom op of the seed notes: clamp at zero, then x / (1 + exp(-x))."""

        @staticmethod
        def forward(ctx, x):
            x = x.clamp(min=0)
            return x / (1 + torch.exp(-x))

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(CHANNELS, CHANNELS)

        def forward(self, x):
            x = ClampSwishFn.apply(x)
            x = self.proj(x * 2 - 1)
            return ClampSwishFn.apply(x)

    return Model()


def _layer_norm_module():
    torch = _torch()

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = torch.nn.LayerNorm(CHANNELS, eps=1e-5)
            self.proj = torch.nn.Linear(CHANNELS, CHANNELS)

        def forward(self, x):
            return self.norm(self.proj(x))

    return Model()


def _layer_norm_handwritten(eps1: float = 1e-6):
    torch = _torch()

    class HandLayerNorm(torch.nn.Module):
        """The layer norm of older transformer code: mean, biased variance, sqrt."""

        def __init__(self, size: int, eps: float = 1e-12) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(size))
            self.bias = torch.nn.Parameter(torch.zeros(size))
            self.eps = eps

        def forward(self, x):
            u = x.mean(-1, keepdim=True)
            s = (x - u).pow(2).mean(-1, keepdim=True)
            x = (x - u) / torch.sqrt(s + self.eps)
            return self.weight * x + self.bias

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1 = HandLayerNorm(CHANNELS, eps=eps1)
            self.proj = torch.nn.Linear(CHANNELS, CHANNELS)
            self.norm2 = HandLayerNorm(CHANNELS, eps=1e-5)

        def forward(self, x):
            return self.norm2(self.proj(self.norm1(x)))

    return _randomized(Model())


def _rms_norm_handwritten():
    torch = _torch()

    class HandRMSNorm(torch.nn.Module):
        def __init__(self, size: int, eps: float = 1e-6) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(size))
            self.eps = eps

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1 = HandRMSNorm(CHANNELS)
            self.proj = torch.nn.Linear(CHANNELS, CHANNELS)
            self.norm2 = HandRMSNorm(CHANNELS, eps=1e-5)

        def forward(self, x):
            return self.norm2(self.proj(self.norm1(x)))

    return _randomized(Model())


def _rms_norm_functional():
    torch = _torch()

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(CHANNELS))
            self.proj = torch.nn.Linear(CHANNELS, CHANNELS)

        def forward(self, x):
            return torch.nn.functional.rms_norm(self.proj(x), (CHANNELS,), self.weight, eps=1e-6)

    return _randomized(Model())


def _deform_conv_weights() -> dict[str, np.ndarray]:
    """Weights shared by the two DeformConv cases (DCNv2: offsets and mask predicted by convolutions)."""
    rng = np.random.default_rng(7)
    c, o, k = DEFORM["in"], DEFORM["out"], DEFORM["kernel"]
    taps = k * k
    return {
        "weight": (rng.standard_normal((o, c, k, k)) * 0.3).astype(np.float32),
        "bias": (rng.standard_normal(o) * 0.1).astype(np.float32),
        "offset_weight": (rng.standard_normal((2 * taps, c, k, k)) * 0.3).astype(np.float32),
        "offset_bias": (rng.standard_normal(2 * taps) * 0.5).astype(np.float32),
        "mask_weight": (rng.standard_normal((taps, c, k, k)) * 0.3).astype(np.float32),
        "mask_bias": np.zeros(taps, np.float32),
    }


def _deform_conv_reference():
    """The plugin's numpy reference, loaded by path (plugins/ is not a package on sys.path)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "plugins" / "deform_conv2d" / "reference.py"
    spec = importlib.util.spec_from_file_location("_exported_models_deform_conv2d_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.deform_conv2d


_DEFORM_ATTRS = {"strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1], "group": 1, "offset_group": 1}
#: Attributes a symbolic forwarding torchvision::deform_conv2d's arguments writes.
#: Its inputs are (x, weight, offset, mask, bias).
_TORCHVISION_ATTRS = {
    "stride_h": 1,
    "stride_w": 1,
    "pad_h": 1,
    "pad_w": 1,
    "dil_h": 1,
    "dil_w": 1,
    "n_weight_grps": 1,
    "n_offset_grps": 1,
    "use_mask": 1,
}
#: Domain of the exported custom node (the seed example's choice; the plugin's patterns know it).
CUSTOM_DOMAIN = "custom"


def _deform_conv_autograd_fn():
    """For the TorchScript exporter: an autograd.Function whose ``symbolic`` emits custom::deform_conv2d."""
    torch = _torch()
    reference = _deform_conv_reference()

    class DeformConv2dFn(torch.autograd.Function):
        """Stands in for torchvision.ops.deform_conv2d (not installed here)."""

        @staticmethod
        def forward(ctx, x, weight, offset, mask, bias):
            arrays = (t.detach().numpy() for t in (x, weight, offset, bias, mask))
            return torch.from_numpy(reference(*arrays, **_DEFORM_ATTRS))

        @staticmethod
        def symbolic(g, x, weight, offset, mask, bias):
            attrs = {f"{k}_i": v for k, v in _TORCHVISION_ATTRS.items()}
            return g.op(f"{CUSTOM_DOMAIN}::deform_conv2d", x, weight, offset, mask, bias, **attrs)

    return DeformConv2dFn.apply


_TORCH_LIBRARY_OP: list[Any] = []


def _deform_conv_custom_op():
    """For the dynamo exporter: a torch.library custom op (defined once per process)."""
    torch = _torch()
    if _TORCH_LIBRARY_OP:
        return _TORCH_LIBRARY_OP[0]
    reference = _deform_conv_reference()

    @torch.library.custom_op(
        "gskit_tests::deform_conv2d",
        mutates_args=(),
        schema="(Tensor x, Tensor weight, Tensor offset, Tensor mask, Tensor bias) -> Tensor",
    )
    def deform_conv2d(x, weight, offset, mask, bias):
        arrays = (t.detach().numpy() for t in (x, weight, offset, bias, mask))
        return torch.from_numpy(reference(*arrays, **_DEFORM_ATTRS))

    @deform_conv2d.register_fake
    def _(x, weight, offset, mask, bias):
        return x.new_empty((x.shape[0], weight.shape[0], offset.shape[2], offset.shape[3]))

    _TORCH_LIBRARY_OP.append(deform_conv2d)
    return deform_conv2d


@contextlib.contextmanager
def _deform_conv_translation():
    """A custom_translation_table for the dynamo exporter that writes one custom::deform_conv2d node.

    onnxscript only builds ops it has a schema for: one is registered for the export and removed after.
    """
    import onnxscript
    from onnx.defs import OpSchema

    torch = _torch()
    schema = OpSchema(
        "deform_conv2d",
        CUSTOM_DOMAIN,
        1,
        inputs=[OpSchema.FormalParameter(n, "T") for n in ("x", "weight", "offset", "mask", "bias")],
        outputs=[OpSchema.FormalParameter("y", "T")],
        type_constraints=[("T", ["tensor(float)"], "")],
        attributes=[OpSchema.Attribute(k, OpSchema.AttrType.INT) for k in _TORCHVISION_ATTRS],
    )
    onnx.defs.register_schema(schema)
    custom = onnxscript.values.Opset(CUSTOM_DOMAIN, 1)

    def translate(x, weight, offset, mask, bias):
        return custom.deform_conv2d(x, weight, offset, mask, bias, **_TORCHVISION_ATTRS)

    try:
        yield {torch.ops.gskit_tests.deform_conv2d.default: translate}
    finally:
        onnx.defs.deregister_schema("deform_conv2d", 1, CUSTOM_DOMAIN)


def _deform_conv_module(dynamo: bool):
    torch = _torch()
    deform = _deform_conv_custom_op() if dynamo else _deform_conv_autograd_fn()
    weights = _deform_conv_weights()

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            c, k = DEFORM["in"], DEFORM["kernel"]
            self.offset = torch.nn.Conv2d(c, 2 * k * k, k, padding=1)
            self.mask = torch.nn.Conv2d(c, k * k, k, padding=1)
            self.weight = torch.nn.Parameter(torch.from_numpy(weights["weight"]))
            self.bias = torch.nn.Parameter(torch.from_numpy(weights["bias"]))
            with torch.no_grad():
                self.offset.weight.copy_(torch.from_numpy(weights["offset_weight"]))
                self.offset.bias.copy_(torch.from_numpy(weights["offset_bias"]))
                self.mask.weight.copy_(torch.from_numpy(weights["mask_weight"]))
                self.mask.bias.copy_(torch.from_numpy(weights["mask_bias"]))

        def forward(self, x):
            mask = torch.sigmoid(self.mask(x))
            return torch.relu(deform(x, self.weight, self.offset(x), mask, self.bias))

    return Model()


def _randomized(module):
    """Give norm weights non-trivial values so a swapped weight/bias would show in the comparison."""
    torch = _torch()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name.endswith("weight") and param.ndim == 1:
                param.copy_(1 + 0.3 * torch.randn(param.shape, generator=generator))
            elif name.endswith("bias") and param.ndim == 1:
                param.copy_(0.3 * torch.randn(param.shape, generator=generator))
    return module


# --------------------------------------------------------------------------------------------------
# exporters


def _export_torch(
    make_module: Callable[[], Any],
    input_shape: tuple[int, ...],
    path: Path,
    dynamo: bool,
    custom_opsets: dict[str, int] | None = None,
    translation: dict[Any, Any] | None = None,
) -> None:
    torch = _torch()
    torch.manual_seed(0)
    module = make_module().eval()
    x = torch.randn(*input_shape)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            if dynamo:
                torch.onnx.export(
                    module,
                    (x,),
                    str(path),
                    dynamo=True,
                    input_names=["x"],
                    output_names=["y"],
                    dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1, max=1024)}},
                    external_data=False,
                    verbose=False,
                    custom_translation_table=translation,
                )
            else:
                torch.onnx.export(
                    module,
                    (x,),
                    str(path),
                    dynamo=False,
                    opset_version=OPSET_TORCHSCRIPT,
                    input_names=["x"],
                    output_names=["y"],
                    dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}},
                    custom_opsets=custom_opsets,
                )
    except Exception as err:  # each exporter raises its own types; the reason is what a test reports
        exporter = "dynamo" if dynamo else "TorchScript"
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ExportUnsupported(f"{exporter} exporter failed: {type(err).__name__}: {first[:300]}") from err


def _deform_conv_custom(path: Path, dynamo: bool) -> None:
    shape = CASES["deform_conv_custom"].input_shape
    if not dynamo:
        _export_torch(
            lambda: _deform_conv_module(False), shape, path, False, custom_opsets={CUSTOM_DOMAIN: 1}
        )
        return
    module = lambda: _deform_conv_module(True)  # noqa: E731  # defines the custom op before the table refers to it
    module()
    with _deform_conv_translation() as table:
        _export_torch(module, shape, path, True, translation=table)


def _deform_conv_onnx(path: Path, dynamo: bool) -> None:
    """The DeformConv case in ONNX directly: Conv -> offsets, Conv+Sigmoid -> mask, DeformConv, Relu."""
    w = _deform_conv_weights()
    c, o, k = DEFORM["in"], DEFORM["out"], DEFORM["kernel"]
    h, wd = DEFORM["hw"]
    init = [
        helper.make_tensor(name, TensorProto.FLOAT, a.shape, a.flatten().tolist()) for name, a in w.items()
    ]
    conv = {"kernel_shape": [k, k], "pads": [1, 1, 1, 1]}
    nodes = [
        helper.make_node(
            "Conv", ["x", "offset_weight", "offset_bias"], ["offset"], name="offset_conv", **conv
        ),
        helper.make_node(
            "Conv", ["x", "mask_weight", "mask_bias"], ["mask_logits"], name="mask_conv", **conv
        ),
        helper.make_node("Sigmoid", ["mask_logits"], ["mask"], name="mask_sigmoid"),
        helper.make_node(
            "DeformConv",
            ["x", "weight", "offset", "bias", "mask"],
            ["deformed"],
            name="deform_conv",
            kernel_shape=[k, k],
            pads=[1, 1, 1, 1],
            strides=[1, 1],
            dilations=[1, 1],
            group=1,
            offset_group=1,
        ),
        helper.make_node("Relu", ["deformed"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes,
        "deform_conv_onnx",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", c, h, wd])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", o, h, wd])],
        initializer=init,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
    onnx.checker.check_model(model, full_check=True)
    path.write_bytes(model.SerializeToString())


def _torch_case(make_module: Callable[[], Any], input_shape: tuple[int, ...]) -> Callable[[Path, bool], None]:
    def build(path: Path, dynamo: bool) -> None:
        _export_torch(make_module, input_shape, path, dynamo)

    return build


_SEQ = (BATCH, 3, CHANNELS)
_IMAGE = (BATCH, DEFORM["in"], *DEFORM["hw"])

CASES: dict[str, Case] = {
    case.name: case
    for case in (
        Case(
            "clamp_swish",
            "ClampSwish",
            2,
            ("Exp", "Clip", "Max"),
            _SEQ,
            _torch_case(_clamp_swish_module, _SEQ),
        ),
        Case(
            "layer_norm_module",
            "LayerNorm",
            1,
            ("LayerNormalization", "ReduceMean", "Sqrt"),
            _SEQ,
            _torch_case(_layer_norm_module, _SEQ),
        ),
        Case(
            "layer_norm_handwritten",
            "LayerNorm",
            2,
            ("LayerNormalization", "ReduceMean", "Sqrt"),
            _SEQ,
            _torch_case(_layer_norm_handwritten, _SEQ),
        ),
        Case(
            "layer_norm_bert_eps",
            "LayerNorm",
            2,
            ("LayerNormalization", "ReduceMean", "Sqrt"),
            _SEQ,
            _torch_case(lambda: _layer_norm_handwritten(eps1=1e-12), _SEQ),
        ),
        Case(
            "rms_norm_handwritten",
            "RMSNorm",
            2,
            ("ReduceMean", "Sqrt", "Reciprocal", "RMSNormalization"),
            _SEQ,
            _torch_case(_rms_norm_handwritten, _SEQ),
        ),
        Case(
            "rms_norm_functional",
            "RMSNorm",
            1,
            ("ReduceMean", "Sqrt", "Reciprocal", "RMSNormalization"),
            _SEQ,
            _torch_case(_rms_norm_functional, _SEQ),
        ),
        Case(
            "deform_conv_custom",
            "DeformConv2d",
            1,
            ("deform_conv2d",),
            _IMAGE,
            _deform_conv_custom,
            onnx_twin="deform_conv_onnx",
            exporters=(False, True),
        ),
        Case(
            "deform_conv_onnx",
            "DeformConv2d",
            1,
            ("DeformConv",),
            _IMAGE,
            _deform_conv_onnx,
            exporters=(False,),
        ),
    )
}


def export(name: str, directory: Path, *, dynamo: bool) -> Path:
    """Write case ``name`` into ``directory`` with the chosen exporter and return the file.

    Raises:
        ExportUnsupported: the exporter cannot produce this case (the reason is in the message).
        KeyError: no such case.
    """
    case = CASES[name]
    path = Path(directory) / f"{name}{'_dynamo' if dynamo else '_torchscript'}.onnx"
    case.build(path, dynamo)
    return path


def example_input(name: str, batch: int = 3, seed: int = 0) -> np.ndarray:
    """A float32 input for case ``name``; its batch differs from the exported one (dynamic axis check)."""
    shape = (batch, *CASES[name].input_shape[1:])
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
