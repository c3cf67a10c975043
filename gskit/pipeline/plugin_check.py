"""``gskit plugin check NAME MODEL``: the one loop a plugin author runs while writing a plugin.

Load the plugin (its derived rules included), replace its patterns in MODEL (and nothing else), say for each
rule what it replaced or where its best attempt stopped, write the prepared copy with shapes inferred, compare
each plugin node with the region it replaced on onnxruntime (``compare --per-plugin``), and name the parts of
the plugin that are still stubs.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from gskit.compare.plugins import PluginCompareReport, compare_plugins
from gskit.errors import GskitError
from gskit.io import model as gsmodel
from gskit.passes.patterns.replace import REPLACE, ReplaceOptions, RuleReport, Skip
from gskit.passes.shapes import infer_graph_shapes
from gskit.passes.transform import run_pass
from gskit.plugin.derive import sources_of, status_of
from gskit.plugin.discovery import load_plugins
from gskit.plugin.registry import PluginRegistry
from gskit.plugin.spec import PluginSpec
from gskit.plugin.stubs import stub_parts

log = logging.getLogger(__name__)


@dataclass
class PluginCheckReport:
    """What ``gskit plugin check`` found.

    Attributes:
        plugin: the plugin's qualified name.
        source: its ``spec.py``.
        model: the model checked.
        rules: one entry per rule: what it replaced, its best attempt where it did not.
        derived: one line per ``from_torch`` call: where its rules came from.
        replaced: plugin nodes written.
        skipped: matches found but not replaced, with the reason.
        prepared: the prepared copy (None when nothing was replaced, or it was not kept).
        comparison: each plugin node against the region it replaced (None when nothing was replaced).
        stubs: parts still stubs (``reference``, ``trt_plugin``, ``kernel``).
        comparison_error: why the comparison could not run (empty when it ran).
    """

    plugin: str
    source: str | None
    model: str
    rules: list[RuleReport] = field(default_factory=list)
    derived: list[str] = field(default_factory=list)
    replaced: int = 0
    skipped: list[Skip] = field(default_factory=list)
    prepared: str | None = None
    comparison: PluginCompareReport | None = None
    stubs: list[str] = field(default_factory=list)
    comparison_error: str = ""

    @property
    def passed(self) -> bool:
        """Something was replaced and every plugin node matches the region it replaced."""
        return self.replaced > 0 and self.comparison is not None and self.comparison.passed


def find_plugin(registry: PluginRegistry, name: str) -> PluginSpec:
    """The plugin called ``name``: its op name (``RMSNorm``), ``namespace::name`` or folder (``rms_norm``).

    Raises:
        GskitError: no plugin or more than one has that name (the message lists them).
    """
    found = [
        s
        for s in registry
        if name in (s.name, f"{s.namespace}::{s.name}", s.qualified_name)
        or (s.source is not None and s.source.parent.name == name)
    ]
    if len(found) == 1:
        return found[0]
    if not found:
        known = ", ".join(
            sorted(f"{s.name} ({s.source.parent.name})" if s.source else s.name for s in registry)
        )
        raise GskitError(f"no plugin called '{name}' (known: {known}); --plugins DIR adds a plugin folder")
    raise GskitError(
        f"'{name}' names {len(found)} plugins ({', '.join(s.qualified_name for s in found)}); "
        "give namespace::name"
    )


def check_plugin(
    name: str,
    model: str | os.PathLike,
    *,
    plugins: list[str] | None = None,
    output: str | os.PathLike | None = None,
    atol: float = 1e-5,
    rtol: float = 1e-5,
) -> PluginCheckReport:
    """Replace one plugin's patterns in ``model``, compare the result region by region, list its stubs.

    Args:
        name: the plugin (see :func:`find_plugin`).
        model: the ONNX model the plugin is meant for.
        plugins: plugin folders besides the default sources (``--plugins``).
        output: where to keep the prepared copy; None writes it to a temporary folder removed afterwards.
        atol: absolute tolerance of the per-plugin comparison.
        rtol: relative tolerance of the per-plugin comparison.

    Raises:
        GskitError: the plugin or the model cannot be loaded, or ``output`` would overwrite ``model``.
    """
    registry = load_plugins(plugins or [])
    spec = find_plugin(registry, name)
    report = PluginCheckReport(spec.qualified_name, str(spec.source) if spec.source else None, str(model))
    report.derived = [f"from_torch({s.function}): {status_of(s)}" for s in sources_of(spec.patterns)]
    report.stubs = list(stub_parts(spec))
    graph = gsmodel.to_graph(gsmodel.load(model))
    infer_graph_shapes(graph, registry, strict=False)  # ranks let rules compare axes like [2] with [-1]
    options = ReplaceOptions(only=(spec.name,), explain=True)
    # The plugin node is what is checked: a native form (LayerNormalization for a new enough TensorRT) is
    # onnx's op, not the author's code. A spec with no plugin node (GroupNorm) checks its native op.
    checked = dataclasses.replace(spec, native=()) if spec.plugin_form else spec
    replaced = run_pass(REPLACE, graph, options, plugins=[checked]).report
    report.rules = replaced.rules
    report.replaced = replaced.replaced
    report.skipped = [s for p in replaced.plugins for s in p.skipped]
    if not report.replaced:
        return report
    infer_graph_shapes(graph, registry, strict=False)
    with tempfile.TemporaryDirectory(prefix="gskit-plugin-check-") as tmp:
        target = Path(output) if output is not None else Path(tmp) / f"{Path(model).stem}.{spec.name}.onnx"
        target = gsmodel.resolve_output(model, target, in_place=False)
        written = gsmodel.save(graph, target)
        report.prepared = str(written) if output is not None else None
        try:
            report.comparison = compare_plugins(model, written, plugins=registry, atol=atol, rtol=rtol)
        except GskitError as err:
            report.comparison_error = str(err)
    return report
