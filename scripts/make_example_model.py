"""Write gskit/data/example.onnx: a small PyTorch model with plugin patterns and a foldable shape computation.

The model (TorchScript exporter, opset 17, dynamic batch axis "batch", input ``x`` of shape
``(batch, 4, 8, 8)``) contains:

* a ClampSwish custom ``torch.autograd.Function`` (clamp at zero, then ``x / (1 + exp(-x))``), used twice;
  it exports as Clip, Neg, Exp, Add, Div;
* a hand-written LayerNorm (mean, biased variance, sqrt), which exports as ReduceMean, Sub, Pow,
  ReduceMean, Add, Sqrt, Div, Mul, Add;
* ``x.view(x.size(0), -1)``, which exports as Shape -> Gather -> Unsqueeze -> Concat -> Reshape.

Weights are seeded (deterministic) and total a few KB.
Run: ``python scripts/make_example_model.py [-o PATH]``.
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import warnings
from pathlib import Path

import torch

from gskit.io import model as gsmodel

DEFAULT_OUTPUT = Path(__file__).resolve().parents[1] / "gskit" / "data" / "example.onnx"


class ClampSwish(torch.autograd.Function):
    """The custom op from the seed notes: y = x' / (1 + exp(-x')), x' = max(x, 0)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        x = x.clamp(min=0)
        return x / (1 + torch.exp(-x))


class HandLayerNorm(torch.nn.Module):
    """Layer norm over the last axis as older transformer code writes it."""

    def __init__(self, size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(size))
        self.bias = torch.nn.Parameter(0.1 * torch.randn(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = x.mean(-1, keepdim=True)
        s = (x - u).pow(2).mean(-1, keepdim=True)
        return self.weight * ((x - u) / torch.sqrt(s + self.eps)) + self.bias


class ExampleNet(torch.nn.Module):
    """Conv -> ClampSwish -> pool -> flatten -> Linear -> LayerNorm -> ClampSwish -> Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 8, 3, padding=1)
        self.pool = torch.nn.AvgPool2d(2)
        self.fc1 = torch.nn.Linear(8 * 4 * 4, 32)
        self.norm = HandLayerNorm(32)
        self.fc2 = torch.nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(ClampSwish.apply(self.conv(x)))
        x = x.view(x.size(0), -1)  # Shape -> Gather -> Unsqueeze -> Concat -> Reshape
        x = ClampSwish.apply(self.norm(self.fc1(x)))
        return self.fc2(x)


def make_example(output: Path) -> Path:
    """Export the example model to ``output`` (through gskit.io.model.save) and return the path."""
    torch.manual_seed(0)
    model = ExampleNet().eval()
    x = torch.randn(2, 4, 8, 8)
    with tempfile.TemporaryDirectory(prefix="gskit-example-") as tmp:
        exported = Path(tmp) / "example.onnx"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter is on purpose
            torch.onnx.export(
                model,
                (x,),
                str(exported),
                dynamo=False,
                opset_version=17,
                input_names=["x"],
                output_names=["y"],
                dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}},
            )
        proto = gsmodel.load(exported)
    proto.producer_name = "gskit scripts/make_example_model.py"
    return gsmodel.save(proto, output, external_data=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "-o", "--output", type=Path, default=DEFAULT_OUTPUT, help=f"default: {DEFAULT_OUTPUT}"
    )
    args = parser.parse_args()
    path = make_example(args.output)
    proto = gsmodel.load(path)
    ops = collections.Counter(node.op_type for node in proto.graph.node)
    print(f"wrote {path} ({path.stat().st_size} bytes, opset {proto.opset_import[0].version})")
    print("inputs: " + ", ".join(f"{i.name}{_dims(i)}" for i in proto.graph.input))
    print("outputs: " + ", ".join(f"{o.name}{_dims(o)}" for o in proto.graph.output))
    print("ops: " + ", ".join(f"{op} x{n}" for op, n in sorted(ops.items())))


def _dims(value_info) -> list[str | int]:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


if __name__ == "__main__":
    main()
