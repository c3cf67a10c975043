"""The worked example of plugins/README.md, run as written: a tanh-GELU plugin whose patterns come from
``from_torch`` of ``gelu(x, approximate="tanh")`` (or by hand) replaces both GELUs of a model exported with
the TorchScript exporter (opset 17) and with the dynamo exporter (opset 18), and ``gskit prepare`` validates
both.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gskit.cli import main
from gskit.io.model import load

README = Path(__file__).resolve().parents[1] / "plugins" / "README.md"

pytestmark = pytest.mark.torch


def _blocks() -> dict[str, str]:
    """The README's Python blocks whose first line is ``# gelu_tanh/FILE (VARIANT)``, by that name."""
    found = {}
    for block in re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S):
        first = block.splitlines()[0]
        if first.startswith("# gelu_tanh/"):
            found[first.removeprefix("# gelu_tanh/")] = block
    return found


def _two_gelu_models(folder: Path) -> list[Path]:
    torch = pytest.importorskip("torch")

    class TwoGelu(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)

        def forward(self, x):
            h = torch.nn.functional.gelu(self.a(x), approximate="tanh")
            return torch.nn.functional.gelu(self.b(h), approximate="tanh")

    torch.manual_seed(0)
    model, x = TwoGelu().eval(), torch.randn(2, 8, 16)
    paths = [folder / "two_gelu.torchscript-17.onnx", folder / "two_gelu.dynamo-18.onnx"]
    torch.onnx.export(model, (x,), str(paths[0]), dynamo=False, opset_version=17, input_names=["x"])
    torch.onnx.export(model, (x,), str(paths[1]), dynamo=True, opset_version=18, input_names=["x"])
    return paths


@pytest.mark.parametrize("variant", ["derived", "by hand"])
def test_gelu_tanh_example_replaces_both_instances_in_both_exports_and_validates(
    variant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GSKIT_CACHE_DIR", str(tmp_path / "cache"))
    blocks = _blocks()
    assert {"patterns.py (derived)", "patterns.py (by hand)", "reference.py", "spec.py"} <= set(blocks)
    folder = tmp_path / "plugins" / "gelu_tanh"
    folder.mkdir(parents=True)
    (folder / "patterns.py").write_text(blocks[f"patterns.py ({variant})"])
    (folder / "reference.py").write_text(blocks["reference.py"])
    (folder / "spec.py").write_text(blocks["spec.py"])
    for model in _two_gelu_models(tmp_path):
        out = tmp_path / f"out-{model.stem}"
        capsys.readouterr()
        code = main(["prepare", str(model), "-o", str(out), "--plugins", str(folder.parent), "--json"])
        report = json.loads(capsys.readouterr().out)
        assert code == 0 and report["passed"] is True, (model.name, report.get("steps"))
        assert report["plugins_inserted"] == {"example::GeluTanh v1": 2}, model.name
        ops = [n.op_type for n in load(out / "model.onnx").graph.node]
        assert ops.count("GeluTanh") == 2 and "Tanh" not in ops and "Gelu" not in ops, (model.name, ops)
