"""A plugin's patterns given as ``patterns_in``: imported and checked when first read, with the messages an
eagerly built tuple gets at load; commands that never replace never build them."""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gskit.errors import PluginError
from gskit.pipeline.prepare import prepare
from gskit.plugin.deferred import DeferredPatterns
from gskit.plugin.discovery import load_plugins

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "gskit" / "data" / "example.onnx"

SPEC_PY = """
from gskit.plugin import PluginSpec, patterns_in, same_as_input
from .reference import neg_relu

SPEC = PluginSpec(
    name="{name}", namespace="test.deferred", infer=same_as_input(0), reference=neg_relu,
    patterns=patterns_in(".patterns", __package__),
)
"""

REFERENCE_PY = """
import numpy as np


def neg_relu(x):
    return np.maximum(-x, 0).astype(x.dtype)
"""

PATTERNS_PY = """
from gskit.passes.patterns import GraphPattern

PATTERNS = (GraphPattern(lambda op, x: op.{op}(op.Neg(x)), name="{rule}"),)
"""


def write_plugin(
    root: Path, *, op: str = "Relu", rule: str = "Relu(Neg(x))", name: str = "NegRelu", patterns: str = ""
) -> Path:
    folder = root / "neg_relu"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "spec.py").write_text(textwrap.dedent(SPEC_PY.replace("{name}", name)))
    (folder / "reference.py").write_text(textwrap.dedent(REFERENCE_PY))
    text = patterns or PATTERNS_PY.replace("{op}", op).replace("{rule}", rule)
    (folder / "patterns.py").write_text(textwrap.dedent(text))
    return folder


def _spec(root: Path, name: str = "NegRelu"):
    registry = load_plugins([root], entry_points=False)
    return registry, registry.get("test.deferred", name)


def test_loading_imports_no_rule_and_reading_them_imports_them_once(tmp_path):
    registry, spec = _spec(write_plugin(tmp_path).parent)
    assert isinstance(spec.patterns, DeferredPatterns) and not spec.patterns.loaded
    assert not [name for name in sys.modules if name.endswith("neg_relu.patterns")]
    (rule,) = spec.patterns
    assert rule.name == "Relu(Neg(x))" and spec.patterns.loaded
    assert spec.patterns[0] is rule and len(spec.patterns) == 1  # not imported again
    registry.import_patterns()
    assert spec.patterns.rules() == (rule,)


def test_a_bad_rule_fails_when_read_with_the_message_of_an_eager_one_and_every_time_after(tmp_path):
    _, spec = _spec(write_plugin(tmp_path, op="Reul").parent)
    for _ in range(2):
        with pytest.raises(
            PluginError, match=r"spec\.py: pattern 'Relu\(Neg\(x\)\)' names op 'Reul', which ONNX"
        ):
            list(spec.patterns)


def test_a_rule_naming_a_missing_op_of_its_own_namespace_fails_when_read(tmp_path):
    text = """
    from gskit.passes.patterns import OpPattern

    PATTERNS = (OpPattern("Missing", "test.deferred"),)
    """
    registry, spec = _spec(write_plugin(tmp_path, patterns=text).parent)
    with pytest.raises(PluginError, match=r"names op 'test\.deferred::Missing', but no loaded plugin"):
        registry.import_patterns()


def test_patterns_that_cannot_be_imported_are_one_line_naming_the_plugin(tmp_path):
    folder = write_plugin(tmp_path, patterns="PATTERNS = (\n")
    _, spec = _spec(tmp_path)
    with pytest.raises(PluginError) as err:
        len(spec.patterns)
    assert str(err.value).startswith(f"{folder.resolve() / 'spec.py'}: cannot import ")
    assert "SyntaxError" in str(err.value) and "\n" not in str(err.value)
    (folder / "patterns.py").write_text("PATTERNS = 3\n")
    _, spec = _spec(tmp_path)
    with pytest.raises(PluginError, match=r"patterns\.py: PATTERNS must be a list or tuple of pattern rules"):
        list(spec.patterns)


def test_the_name_warning_comes_when_the_rules_are_read(tmp_path, caplog):
    write_plugin(tmp_path, name="Relu")  # a plugin named like an ONNX op
    with caplog.at_level(logging.WARNING, logger="gskit"):
        _, spec = _spec(tmp_path, "Relu")
        assert not [r for r in caplog.records if "is also an ONNX op" in r.getMessage()]
        list(spec.patterns)
    assert [r for r in caplog.records if "plugin name 'Relu' is also an ONNX op" in r.getMessage()]


def test_prepare_fails_on_a_bad_rule_before_any_step_runs(tmp_path):
    write_plugin(tmp_path / "plugins", op="Reul")
    with pytest.raises(PluginError, match="names op 'Reul'"):
        prepare(EXAMPLE, tmp_path / "out", plugin_dirs=[tmp_path / "plugins"])
    assert not (tmp_path / "out").exists()  # nothing ran, nothing written


def test_the_rules_come_from_the_folder_their_spec_was_loaded_from(tmp_path):
    """Two folders of the same name loaded one after the other get the same module name: the first
    registry's rules are still the first folder's."""
    write_plugin(tmp_path / "a", rule="from a")
    write_plugin(tmp_path / "b", rule="from b")
    _, first = _spec(tmp_path / "a")
    _, second = _spec(tmp_path / "b")
    assert [r.name for r in first.patterns] == ["from a"]
    assert [r.name for r in second.patterns] == ["from b"]


def test_patterns_imported_later_get_hash_checked_bytecode(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path / "pycache"))
    folder = write_plugin(tmp_path / "plugins")
    _, spec = _spec(tmp_path / "plugins")
    cached = Path(importlib.util.cache_from_source(str((folder / "patterns.py").resolve())))
    assert not cached.exists()
    list(spec.patterns)
    assert int.from_bytes(cached.read_bytes()[4:8], "little") == 3  # PEP 552: hash-based, checked


def _modules_after(*argv: str) -> set[str]:
    """The modules loaded once ``gskit ARGV`` ran, in a fresh interpreter."""
    code = (
        "import sys\nfrom gskit.cli import main\nsys.argv = ['gskit', *sys.argv[1:]]\ntry:\n    main()\n"
        "except SystemExit:\n    pass\nprint('MODULES', *sorted(sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True)
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("MODULES ")]
    return set(line.split()[1:])


def test_compare_with_plugin_nodes_builds_no_rule(tmp_path):
    out = tmp_path / "out"
    prepare(EXAMPLE, out)
    loaded = _modules_after("compare", str(EXAMPLE), str(out / "model.onnx"))
    assert "gskit_plugins.clamp_swish" in loaded  # its reference ran the plugin nodes
    assert not {name for name in loaded if name.endswith(".patterns") or "passes.patterns" in name}
