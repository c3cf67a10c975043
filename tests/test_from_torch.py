"""``from_torch``: patterns derived from PyTorch code, their caches, and loads without torch.

Every test sets its own user cache (``$GSKIT_CACHE_DIR``) so nothing reads or writes the real one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from gskit.errors import PluginError
from gskit.io.model import to_graph
from gskit.passes.patterns import replace
from gskit.plugin import Attribute, AttrType, PluginSpec, from_torch, load_plugins, same_as_input
from gskit.plugin import derive as derive_module

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def user_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "user-cache"
    monkeypatch.setenv("GSKIT_CACHE_DIR", str(cache))
    return cache


def leaky(x, *, alpha):
    return torch.nn.functional.leaky_relu(x, alpha)


def scaled_tanh(x, *, scale):
    return torch.tanh(x) * (2 * scale)  # the constant is 2 * scale: a scale relation


def test_attributes_are_captured_with_the_relation_found_by_exporting_again(rng) -> None:
    rules = from_torch(scaled_tanh, [(2, 3, 8)], {"scale": 1.5}, dtypes=("float32",))
    assert "derived with torch" in rules.status
    relations = {(c.attribute, c.relation, round(c.k, 6)) for r in rules for c in r.description.captures}
    assert relations == {("scale", "scale", 2.0)}
    leaky_rules = from_torch(leaky, [(2, 3, 8)], {"alpha": 0.1}, dtypes=("float32",))
    ((attr, relation),) = {(c.attribute, c.relation) for r in leaky_rules for c in r.description.captures}
    assert (attr, relation) == ("alpha", "identity")
    assert all(r.description.nodes[-1].op == "LeakyRelu" for r in leaky_rules)
    # the rule gives the model's value, not the one it was derived with
    spec = PluginSpec(
        name="Scaled",
        namespace="t",
        infer=same_as_input(0),
        attributes=(Attribute("scale", AttrType.FLOAT, 1.0),),
        patterns=tuple(rules),
    )
    model = _export(lambda x: torch.tanh(x) * 7.0, (2, 3, 8), dynamo=False)
    graph = to_graph(model)
    report = replace(graph, [spec])
    assert report.replaced == 1, report.plugins
    (node,) = [n for n in graph.nodes if n.op == "Scaled"]
    assert node.attrs["scale"] == pytest.approx(3.5)


class ScaledNorm(torch.nn.Module):
    """A module class: built with the attributes, called with the inputs; its parameter is a pattern input."""

    def __init__(self, *, epsilon: float) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 2.0, 16))
        self.eps = epsilon

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def test_a_module_class_gives_rules_whose_inputs_are_the_examples_then_its_parameters() -> None:
    import dataclasses

    from plugins.rms_norm.spec import SPEC as RMS_NORM

    rules = from_torch(ScaledNorm, [(2, 5, 16)], {"epsilon": 1e-5}, dtypes=("float32",))
    assert {r.description.inputs for r in rules} == {("x", "weight")}
    spec = dataclasses.replace(RMS_NORM, patterns=tuple(rules))
    for dynamo in (False, True):
        module = ScaledNorm(epsilon=3e-4).eval()
        graph = to_graph(_export(module, (3, 7, 16), dynamo=dynamo, opset=18))
        report = replace(graph, [spec], tensorrt="10.3")  # the plugin node (11 has RMSNormalization)
        assert report.replaced == 1, (dynamo, report.plugins)
        (node,) = [n for n in graph.nodes if n.op == "RMSNorm"]
        assert node.attrs["epsilon"] == pytest.approx(3e-4, rel=1e-5)


def cubic(x, *, epsilon):
    return x + (epsilon**3 + 2 * epsilon)


def test_a_constant_no_simple_relation_explains_is_refused() -> None:
    with pytest.raises(PluginError, match="no simple relation"):
        from_torch(cubic, [(2, 4)], {"epsilon": 0.5}, dtypes=("float32",), exporters=("torchscript",))


def doubled(x):
    return x * 2.0 + 1.0


def test_rules_come_from_the_user_cache_then_the_plugin_cache(user_cache: Path, monkeypatch) -> None:
    first = from_torch(doubled, [(4, 8)], dtypes=("float32",), exporters=("torchscript",))
    assert "derived with torch" in first.status and list((user_cache / "derived-patterns").glob("*.json"))

    def no_export(*args, **kwargs):
        raise AssertionError("derived again although the cache holds the rules")

    monkeypatch.setattr("gskit.torch_export.derive.derive_descriptions", no_export)
    second = from_torch(doubled, [(4, 8)], dtypes=("float32",), exporters=("torchscript",))
    assert "from the cache" in second.status and [r.name for r in second] == [r.name for r in first]
    # gskit plugin derive: the plugin's own file, from the user cache (no export)
    shipped = user_cache.parent / "derived_patterns.json"
    rules = from_torch(doubled, [(4, 8)], dtypes=("float32",), exporters=("torchscript",), cache=shipped)
    assert derive_module.write_plugin_cache(derive_module.sources_of(rules)) == [shipped]
    for file in user_cache.rglob("*.json"):
        file.unlink()
    third = from_torch(doubled, [(4, 8)], dtypes=("float32",), exporters=("torchscript",), cache=shipped)
    assert f"from {shipped}" in third.status


PLUGIN_PATTERNS = """
from gskit.plugin import from_torch


def doubled(x):
    import torch

    return torch.tanh(x) * 2.0


PATTERNS = from_torch(doubled, [(4, 8)], dtypes=("float32",), exporters=("torchscript",))
"""

PLUGIN_SPEC = """
import numpy as np
from gskit.plugin import PluginSpec, same_as_input
from .patterns import PATTERNS

SPEC = PluginSpec(
    name="Doubled", namespace="test.torch", infer=same_as_input(0),
    reference=lambda x: (np.tanh(x) * 2).astype(x.dtype), patterns=PATTERNS,
)
"""

WITHOUT_TORCH = """
import logging, sys
sys.modules["torch"] = None  # torch cannot be imported
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
from gskit.plugin import load_plugins
from gskit.plugin.derive import sources_of, status_of
spec = load_plugins([sys.argv[1]], entry_points=False).get("test.torch", "Doubled")
print("RULES", len(spec.patterns))
print("STATUS", *(status_of(s) for s in sources_of(spec.patterns)))
"""


def _write_plugin(root: Path) -> Path:
    folder = root / "doubled"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "patterns.py").write_text(textwrap.dedent(PLUGIN_PATTERNS))
    (folder / "spec.py").write_text(textwrap.dedent(PLUGIN_SPEC))
    return folder


def _without_torch(folder: Path, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "GSKIT_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_TORCH, str(folder.parent)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def test_without_torch_the_plugin_cache_gives_the_rules_and_none_says_so(tmp_path: Path, user_cache) -> None:
    folder = _write_plugin(tmp_path / "plugins")
    done = _without_torch(folder, user_cache)
    assert done.returncode == 0, done.stderr
    assert "RULES 0" in done.stdout
    warnings = [line for line in done.stderr.splitlines() if line.startswith("WARNING")]
    assert (
        len(warnings) == 1
        and "torch is not installed" in warnings[0]
        and "gskit plugin derive" in warnings[0]
    )
    # gskit plugin derive (torch here) writes the plugin's cache; without torch it is used
    from gskit.cli import main

    assert main(["plugin", "derive", "Doubled", "--plugins", str(folder.parent)]) == 0
    assert (folder / "derived_patterns.json").is_file()
    done = _without_torch(folder, user_cache)
    assert "RULES 1" in done.stdout and "torch is not installed" in done.stdout, done.stderr
    assert "WARNING" not in done.stderr
    # the function changed and its cache was not written again: no rules, said in one line
    text = (folder / "patterns.py").read_text().replace("* 2.0", "* 3.0")
    (folder / "patterns.py").write_text(text)
    done = _without_torch(folder, user_cache)
    assert "RULES 0" in done.stdout and "has no rules for doubled as it is now" in done.stderr


WARM_LOAD = """
import sys, time
start = time.perf_counter()
from gskit.plugin import load_plugins
registry = load_plugins()
seconds = time.perf_counter() - start
derived = sum(1 for s in registry for r in s.patterns if hasattr(r, "forms"))
print(f"{seconds:.2f} {derived} {'torch' in sys.modules}")
"""


def test_shipped_plugins_load_their_derived_rules_without_importing_torch(user_cache: Path) -> None:
    """The shipped caches are the warm cache: loading them imports no torch (measured in a fresh process)."""
    env = {**os.environ, "GSKIT_CACHE_DIR": str(user_cache), "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", WARM_LOAD], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    seconds, derived, torch_loaded = done.stdout.split()
    assert int(derived) >= 20 and torch_loaded == "False", done.stdout + done.stderr
    assert "exporting it now" not in done.stderr, (
        "a shipped derived_patterns.json is stale: gskit plugin derive"
    )
    print(f"plugin discovery with warm caches: {seconds} s")


def test_shipped_derived_caches_are_current_for_this_torch() -> None:
    """gskit plugin derive NAME was run after the last change of each shipped from_torch function."""
    registry = load_plugins(entry_points=True)
    version = derive_module.torch_version()
    for spec in registry:
        for source in derive_module.sources_of(spec.patterns):
            entries = derive_module.read_cache_file(source.shipped)
            if not any(e.torch == version for e in entries):
                pytest.skip(f"{source.shipped} holds no rules of torch {version}")
            assert f"from {source.shipped}" in derive_module.status_of(source), (
                f"{spec.qualified_name}: {source.function} changed since its cache was written; run "
                f"`gskit plugin derive {spec.source.parent.name}`"
            )


def _export(fn, shape: tuple[int, ...], *, dynamo: bool, opset: int = 17):
    import io

    import onnx

    class Call(torch.nn.Module):
        def forward(self, x):
            return fn(x)

    x = torch.randn(*shape)
    model = fn if isinstance(fn, torch.nn.Module) else Call()
    if dynamo:
        return torch.onnx.export(model, (x,), dynamo=True, opset_version=opset, verbose=False).model_proto
    buffer = io.BytesIO()
    torch.onnx.export(model, (x,), buffer, dynamo=False, opset_version=opset)
    return onnx.load_from_string(buffer.getvalue())


def test_json_of_a_plugin_cache_names_function_key_and_versions(tmp_path: Path) -> None:
    shipped = tmp_path / "derived_patterns.json"
    rules = from_torch(doubled, [(4, 8)], dtypes=("float32",), exporters=("torchscript",), cache=shipped)
    derive_module.write_plugin_cache(derive_module.sources_of(rules))
    data = json.loads(shipped.read_text())
    (entry,) = data["entries"]
    assert (
        data["format"] == 1
        and entry["function"] == "doubled"
        and entry["torch"] == derive_module.torch_version()
    )
    assert len(entry["rules"]) == len(rules) and np.isclose(
        entry["rules"][0]["nodes"][-1]["inputs"][1]["literal"], 1.0
    )
