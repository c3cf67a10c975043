"""Export the corpus models that need their own Python environment: torchvision, ultralytics, diffusers.

    $GSKIT_EXPORT_PYTHON scripts/corpus_exports.py --out DIR [--only NAME,...]

Runs in the export environment (``[exports]`` in ``scripts/real_models.toml`` pins its packages; gskit is
not imported here), never in gskit's own: torchvision and ultralytics want PyPI's torch build. For each
``[[exported]]`` entry it builds the PyTorch model (a real architecture from its package, a tiny config,
random weights; nothing is downloaded), counts the ground truth on it, exports it with every exporter the
entry names and writes, atomically, ``DIR/NAME.EXPORTER.onnx`` and ``DIR/NAME.json`` (ground truth, package
versions, and per exporter the file or the exporter's one-line failure). It prints one line per model.
``scripts/real_models.py`` runs it and caches DIR.

Exit status: 0 when every model was built (an exporter's own failure is a result, recorded in NAME.json), 1
when a model could not be built or a pinned package is missing or at another version (the line says which).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import tomllib

MANIFEST = Path(__file__).with_name("real_models.toml")
SEED = 0


# ------------------------------------------------------------------------------------------- ground truth


class CallCounter:
    """Counts calls of library functions during one forward pass (functional ops have no module to count)."""

    def __init__(self, targets: dict[str, tuple[object, str]]) -> None:
        self.targets, self.counts = targets, dict.fromkeys(targets, 0)

    @contextlib.contextmanager
    def active(self):
        saved = {}
        for key, (owner, attr) in self.targets.items():
            original = getattr(owner, attr)
            saved[key] = original

            def counting(*args, _key=key, _original=original, **kwargs):
                self.counts[_key] += 1
                return _original(*args, **kwargs)

            setattr(owner, attr, counting)
        try:
            yield self
        finally:
            for key, (owner, attr) in self.targets.items():
                setattr(owner, attr, saved[key])


def count_modules(module) -> dict[str, int]:
    """Modules of the kinds gskit's patterns target, counted on the PyTorch model.

    LayerNorm / RMSNorm / SiLU as ``real_models.ground_truth`` counts them; GroupNorm (``nn.GroupNorm``);
    DeformConv (torchvision's ``DeformConv2d``); MSDA (a transformers ``*MultiscaleDeformableAttention``
    block, one multi-scale deformable attention each); Detect (an ultralytics detection head, ``Segment``
    included).
    Folds are counted as calls (``functional_calls``): MobileViTv2 has no ``nn.Fold`` module.
    """
    import torch

    counts = dict.fromkeys(("LayerNorm", "RMSNorm", "SiLU", "GroupNorm", "DeformConv", "MSDA", "Detect"), 0)
    for sub in module.modules():
        name = type(sub).__name__
        if "RMSNorm" in name or name == "T5LayerNorm":
            counts["RMSNorm"] += 1
        elif isinstance(sub, torch.nn.LayerNorm) or name.endswith("LayerNorm"):
            counts["LayerNorm"] += 1
        elif _is_silu(sub):
            counts["SiLU"] += 1
        elif isinstance(sub, torch.nn.GroupNorm):
            counts["GroupNorm"] += 1
        elif name == "DeformConv2d":
            counts["DeformConv"] += 1
        elif name.endswith("MultiscaleDeformableAttention"):
            counts["MSDA"] += 1
        elif name in ("Detect", "Segment", "Pose", "OBB", "v10Detect"):
            counts["Detect"] += 1
    base = ("LayerNorm", "RMSNorm", "SiLU")  # always present, as in the transformers rows
    return {key: n for key, n in counts.items() if n or key in base}


def _is_silu(module) -> bool:
    import torch

    return isinstance(module, torch.nn.SiLU) or type(module).__name__ in ("SiLUActivation", "SwishActivation")


def functional_calls(module, args) -> dict[str, int]:
    """Calls in one forward pass, where modules do not tell: Fold (``F.fold``, which ``nn.Fold`` calls too;
    MobileViTv2 folds without a module), F.grid_sample (one per level of each deformable attention),
    torchvision's deform_conv2d, and SiLU modules (ultralytics shares one ``nn.SiLU`` among all its
    convolutions). Only the non-zero counts."""
    import torch

    targets: dict[str, tuple[object, str]] = {
        "Fold": (torch.nn.functional, "fold"),
        "grid_sample calls": (torch.nn.functional, "grid_sample"),
    }
    with contextlib.suppress(ImportError):
        import torchvision.ops.deform_conv as deform

        targets["deform_conv2d calls"] = (deform, "deform_conv2d")
    counter = CallCounter(targets)
    silu = {"SiLU calls": 0}

    def count_silu(*_) -> None:
        silu["SiLU calls"] += 1

    hooks = [m.register_forward_hook(count_silu) for m in module.modules() if _is_silu(m)]
    try:
        with torch.no_grad(), counter.active():
            module(*args)
    finally:
        for hook in hooks:
            hook.remove()
    return {key: n for key, n in {**counter.counts, **silu}.items() if n}


# ------------------------------------------------------------------------------------------------ builders


def _transformers_output(model, input_name: str, outputs: tuple[int, ...]):
    """A module calling a Hugging Face model with one named input and returning some of its outputs."""
    import torch

    class Outputs(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model.eval()

        def forward(self, x):
            out = self.model(**{input_name: x}, return_dict=False)
            picked = tuple(out[i] for i in outputs)
            return picked if len(picked) > 1 else picked[0]

    return Outputs().eval()


def deformable_detr():
    """transformers' Deformable DETR: a 2-stage ResNet backbone of its own (no timm, no pretrained weights),
    d_model 64, one encoder and one decoder layer, 2 feature levels, 20 queries."""
    import torch
    import transformers as tf

    backbone = tf.ResNetConfig(
        embedding_size=16,
        hidden_sizes=[16, 32],
        depths=[1, 1],
        layer_type="basic",
        out_features=["stage1", "stage2"],
    )
    config = tf.DeformableDetrConfig(
        use_timm_backbone=False,
        backbone_config=backbone,
        backbone=None,
        use_pretrained_backbone=False,
        d_model=64,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        num_feature_levels=2,
        encoder_n_points=2,
        decoder_n_points=2,
        num_queries=20,
        num_labels=4,
        disable_custom_kernels=True,
    )
    model = tf.DeformableDetrForObjectDetection(config)
    return (
        _transformers_output(model, "pixel_values", (0, 1)),
        (torch.rand(1, 3, 64, 64),),
        ["pixel_values"],
        [
            "logits",
            "pred_boxes",
        ],
    )


def rt_detr():
    """transformers' RT-DETR: its own ResNet-vd backbone (tiny, random), hybrid encoder with one layer,
    d_model 64, one decoder layer, 3 feature levels, 20 queries."""
    import torch
    import transformers as tf

    backbone = tf.RTDetrResNetConfig(
        embedding_size=16,
        hidden_sizes=[16, 32, 64, 128],
        depths=[1, 1, 1, 1],
        layer_type="basic",
        out_features=["stage2", "stage3", "stage4"],
    )
    config = tf.RTDetrConfig(
        backbone_config=backbone,
        use_timm_backbone=False,
        use_pretrained_backbone=False,
        encoder_hidden_dim=64,
        encoder_in_channels=[32, 64, 128],
        encoder_ffn_dim=128,
        encoder_attention_heads=4,
        d_model=64,
        decoder_in_channels=[64, 64, 64],
        decoder_ffn_dim=128,
        decoder_layers=1,
        decoder_attention_heads=4,
        decoder_n_points=2,
        num_queries=20,
        num_labels=4,
        disable_custom_kernels=True,
    )
    model = tf.RTDetrForObjectDetection(config)
    return (
        _transformers_output(model, "pixel_values", (0, 1)),
        (torch.rand(1, 3, 64, 64),),
        ["pixel_values"],
        [
            "logits",
            "pred_boxes",
        ],
    )


def mobilevitv2():
    """transformers' MobileViTv2 image classifier, width multiplier 0.5, one attention block per stage. Its
    transformer blocks unfold the feature map into patches and fold them back (``nn.functional.fold``), and
    its norms are ``nn.GroupNorm(1, C)``."""
    import torch
    import transformers as tf

    config = tf.MobileViTV2Config(image_size=64, width_multiplier=0.5, n_attn_blocks=[1, 1, 1], num_labels=10)
    model = tf.MobileViTV2ForImageClassification(config)
    return (
        _transformers_output(model, "pixel_values", (0,)),
        (torch.rand(1, 3, 64, 64),),
        ["pixel_values"],
        ["logits"],
    )


def dcnv2():
    """A DCNv2 network as mmdet's and DCNv2's modulated blocks are written: each deformable convolution gets
    its offsets and its mask (sigmoid) from a plain convolution of the same input, then BatchNorm and ReLU."""
    import torch
    from torchvision.ops import DeformConv2d

    class ModulatedBlock(torch.nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.offset_mask = torch.nn.Conv2d(cin, 3 * 3 * 3, 3, stride, 1)  # 2*9 offsets + 9 mask logits
            self.conv = DeformConv2d(cin, cout, 3, stride, 1, bias=False)
            self.norm = torch.nn.BatchNorm2d(cout)

        def forward(self, x):
            out = self.offset_mask(x)
            offset, mask = out[:, :18], torch.sigmoid(out[:, 18:])
            return torch.relu(self.norm(self.conv(x, offset, mask)))

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = torch.nn.Conv2d(3, 16, 3, 2, 1)
            self.blocks = torch.nn.Sequential(ModulatedBlock(16, 16, 1), ModulatedBlock(16, 32, 2))
            self.head = torch.nn.Conv2d(32, 8, 1)

        def forward(self, x):
            return self.head(self.blocks(torch.relu(self.stem(x))))

    net = Net().eval()
    with torch.no_grad():  # random offsets of a few pixels, as a trained net has (init gives zeros)
        for block in net.blocks:
            block.offset_mask.weight.normal_(0, 0.05)
    return net, (torch.rand(1, 3, 32, 32),), ["x"], ["y"]


def unet2d():
    """diffusers' UNet2DModel (the DDPM UNet), tiny: channels (32, 64), one ResNet layer per block, an
    attention down and up block, GroupNorm with 8 groups. Inputs: the noisy sample and the timestep (float32
    [1])."""
    import diffusers
    import torch

    model = diffusers.UNet2DModel(
        sample_size=16,
        in_channels=3,
        out_channels=3,
        block_out_channels=(32, 64),
        layers_per_block=1,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=8,
        attention_head_dim=16,
    ).eval()

    class Sample(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, sample, timestep):
            return self.model(sample, timestep, return_dict=False)[0]

    return Sample().eval(), (torch.rand(1, 3, 16, 16), torch.tensor([10.0])), ["sample", "timestep"], ["out"]


#: name -> (build, packages it needs). build() -> (module, example inputs, input names, output names).
BUILDERS: dict[str, tuple[Callable, tuple[str, ...]]] = {
    "deformable-detr": (deformable_detr, ("torch", "transformers")),
    "rt-detr": (rt_detr, ("torch", "transformers")),
    "mobilevitv2": (mobilevitv2, ("torch", "transformers")),
    "dcnv2": (dcnv2, ("torch", "torchvision")),
    "unet2d": (unet2d, ("torch", "diffusers")),
}

#: ultralytics models: name -> (model yaml, nms). Built from the yaml (random weights), exported by
#: ultralytics.
ULTRALYTICS = {
    "yolov8n": ("yolov8n.yaml", False),
    "yolov8n-nms": ("yolov8n.yaml", True),
    "yolo11n": ("yolo11n.yaml", False),
    "yolo11n-nms": ("yolo11n.yaml", True),
    "yolov8n-seg": ("yolov8n-seg.yaml", False),
}
ULTRALYTICS_PACKAGES = ("torch", "torchvision", "ultralytics")
YOLO_IMAGE_SIZE = 640


# ------------------------------------------------------------------------------------------------ export


#: An exporter label: `torchscript-N` or `dynamo-N` (opset N), and `+deformconv` for the TorchScript exporter
#: with a user-registered symbolic that writes torchvision's deform_conv2d as ONNX DeformConv (torchvision
#: registers none: without it the TorchScript exporter refuses `torchvision::deform_conv2d` at every opset).
EXPORTER = re.compile(r"^(torchscript|dynamo)-(\d+)(\+deformconv)?$")


def _deform_conv_symbolic(g, x, weight, offset, mask, bias, *args):
    """torchvision::deform_conv2d -> ONNX DeformConv (opset 19), as users register it for TensorRT >= 10.1."""
    from torch.onnx import symbolic_helper

    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups, offset_groups = (
        symbolic_helper._get_const(a, "i", "int") for a in args[:8]
    )
    use_mask = symbolic_helper._get_const(args[8], "b", "use_mask")
    inputs = [x, weight, offset, bias] + ([mask] if use_mask else [])
    return g.op(
        "DeformConv",
        *inputs,
        strides_i=[stride_h, stride_w],
        pads_i=[pad_h, pad_w, pad_h, pad_w],
        dilations_i=[dil_h, dil_w],
        group_i=groups,
        offset_group_i=offset_groups,
    )


@contextlib.contextmanager
def _deform_conv_registered(opset: int):
    import torch

    torch.onnx.register_custom_op_symbolic("torchvision::deform_conv2d", _deform_conv_symbolic, opset)
    try:
        yield
    finally:
        torch.onnx.unregister_custom_op_symbolic("torchvision::deform_conv2d", opset)


def _export_torch(module, args, inputs: list[str], outputs: list[str], exporter: str, path: Path) -> None:
    import torch

    match = EXPORTER.match(exporter)
    if match is None:
        raise ValueError(f"unknown exporter {exporter!r} (torchscript-N, dynamo-N, torchscript-N+deformconv)")
    kind, opset = match.group(1), int(match.group(2))
    symbolic = _deform_conv_registered(opset) if match.group(3) else contextlib.nullcontext()
    with tempfile.TemporaryDirectory(prefix="gskit-export-", dir=path.parent) as tmp:
        out = Path(tmp) / path.name
        with torch.no_grad(), symbolic:
            torch.onnx.export(
                module,
                args,
                str(out),
                opset_version=opset,
                dynamo=kind == "dynamo",
                input_names=inputs,
                output_names=outputs,
            )
        if kind == "dynamo":
            import onnx  # the dynamo exporter may leave weights in a side file: fold them into one file

            onnx.save(onnx.load(str(out)), str(out))
        os.replace(out, path)


def _export_ultralytics(yaml: str, nms: bool, exporter: str, path: Path) -> dict[str, int]:
    """ultralytics' own ONNX export (TorchScript exporter) of a model built from its yaml; its truth."""
    from ultralytics import YOLO

    opset = int(exporter.rsplit("-", 1)[1])
    with tempfile.TemporaryDirectory(prefix="gskit-export-", dir=path.parent) as tmp:
        cwd = os.getcwd()
        os.chdir(tmp)  # ultralytics writes the file beside the (yaml-named) model, in the working directory
        try:
            import torch

            model = YOLO(yaml)
            image = torch.rand(1, 3, YOLO_IMAGE_SIZE, YOLO_IMAGE_SIZE)
            truth = {**count_modules(model.model), **functional_calls(model.model.eval(), (image,))}
            if nms:
                truth["NMS"] = 1
            written = model.export(
                format="onnx", imgsz=YOLO_IMAGE_SIZE, opset=opset, simplify=False, nms=nms, device="cpu"
            )
            os.replace(Path(tmp) / written, path)
        finally:
            os.chdir(cwd)
    return truth


def _versions(packages: tuple[str, ...], pins: dict[str, str]) -> tuple[dict[str, str], str | None]:
    """Installed versions of PACKAGES, and the one-line reason when one is missing or not the pinned one."""
    found = {}
    for package in packages:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return (
                found,
                f"{package} is not installed in {sys.executable} (pinned: {package}=={pins[package]})",
            )
        want = pins.get(package)
        if want and found[package].split("+")[0] != want:
            return found, f"{sys.executable} has {package} {found[package]}, the manifest pins {want}"
    return found, None


def export_one(item: dict, pins: dict[str, str], out: Path) -> tuple[dict, str | None]:
    """Build and export one manifest entry: (the record for NAME.json, the reason it could not be built)."""
    import torch

    name = item["name"]
    yolo = ULTRALYTICS.get(name)
    packages = ULTRALYTICS_PACKAGES if yolo else BUILDERS[name][1]
    versions, problem = _versions(packages + ("onnx", "onnxscript"), pins)
    record: dict = {"name": name, "versions": versions, "truth": {}, "exports": {}}
    if problem:
        return record, problem
    for exporter in item["exporters"]:
        torch.manual_seed(SEED)
        path = out / f"{name}.{exporter}.onnx"
        start = time.perf_counter()
        try:
            if yolo:
                record["truth"] = _export_ultralytics(yolo[0], yolo[1], exporter, path)
            else:
                module, args, inputs, outputs = BUILDERS[name][0]()
                record["truth"] = {**count_modules(module), **functional_calls(module, args)}
                _export_torch(module, args, inputs, outputs, exporter, path)
            record["exports"][exporter] = {
                "file": path.name,
                "seconds": round(time.perf_counter() - start, 1),
            }
        except Exception as err:  # the exporter's own failure is a corpus result: record it, go on
            record["exports"][exporter] = {"error": _one_line(err)}
    return record, None


def _one_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0] if lines else ''}"[:300]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for NAME.EXPORTER.onnx and NAME.json")
    parser.add_argument("--only", help="comma-separated model names")
    args = parser.parse_args(argv)
    manifest = tomllib.loads(MANIFEST.read_text())
    pins = manifest["exports"]["packages"]
    only = set(args.only.split(",")) if args.only else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("YOLO_OFFLINE", "1")  # ultralytics: no update checks, no font downloads
    failed = 0
    for item in manifest["exported"]:
        if only and item["name"] not in only:
            continue
        try:
            record, problem = export_one(item, pins, out)
        except Exception as err:  # a build this package version rejects: say so, go on with the others
            record, problem = (
                {"name": item["name"], "truth": {}, "exports": {}},
                f"build failed: {_one_line(err)}",
            )
        record["error"] = problem
        tmp = out / f"{item['name']}.json.part"
        tmp.write_text(json.dumps(record, indent=1))
        os.replace(tmp, out / f"{item['name']}.json")
        failed += problem is not None
        done = {e: ("ok" if "file" in r else r["error"]) for e, r in record["exports"].items()}
        print(f"{item['name']}: {problem or done}", flush=True)
    shutil.rmtree(out / "__pycache__", ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
