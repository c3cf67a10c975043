"""The view model of ``report.html``: what a prepare run's page shows, built from its report and graph.

``gskit.io.html_report`` draws a ``Page``; this module decides its rows (summary, steps, the comparison, the
replaced regions before and after, the matches replace left) from a run's ``PrepareReport``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx
import onnx_graphsurgeon as gs

from gskit.io import model as gsmodel
from gskit.io.html_report import Drawings, Page, Region, environment_rows, render_page, start_drawings
from gskit.pipeline.recipe import Recipe
from gskit.pipeline.steps import Validate
from gskit.plugin.ops import NodeSummary, op_label
from gskit.plugin.registry import PluginRegistry

if TYPE_CHECKING:
    from gskit.pipeline.prepare import PrepareReport


@dataclass(frozen=True)
class RegionDrawings:
    """The replaced regions as the page shows them, and their drawings under way (:func:`start_drawings`)."""

    regions: list[Region]
    drawn: Callable[[], Drawings]


def draw_regions(replaced: list[Any], original: onnx.ModelProto, graph: gs.Graph) -> RegionDrawings:
    """Start drawing the page's pictures of the replaced regions: Graphviz draws them (10-20 ms, most of it
    its own start) while the run goes on, and :func:`render_report` collects them.

    Args:
        replaced: the replace steps' regions (``PrepareReport.regions``).
        original: the input model (weights not loaded).
        graph: the run's graph as no later step changes it (the after pictures show its plugin nodes).
    """
    regions = _regions(replaced, original, graph)
    return RegionDrawings(regions, start_drawings(regions))


def render_report(
    report: PrepareReport,
    original: onnx.ModelProto,
    *,
    graph: gs.Graph,
    registry: PluginRegistry,
    skipped: Sequence[tuple[str, Any]],
    recipe: Recipe,
    written: Path,
    drawings: RegionDrawings | None = None,
) -> str:
    """The report page of a run.

    Args:
        report: what report.json holds.
        original: the input model (weights not loaded).
        graph: the run's graph as the steps left it (its plugin nodes' stubs and the regions' new nodes).
        registry: the loaded plugins.
        skipped: ``(plugin, Skip)`` for each match replace left, with the reason.
        recipe: the recipe that ran (how validation chose its inputs).
        written: where the prepared model is now (its size is shown).
        drawings: the regions' pictures started by :func:`draw_regions` once the graph was final (None:
            started now, drawn while the rest of the page is made).
    """
    if drawings is None:
        drawings = draw_regions(report.regions, original, graph)
    comparison = report.comparison
    summary = [
        ("input model", f"{report.model} ({_size(_model_files(Path(report.model), original))})"),
        (
            "prepared model",
            f"{report.prepared_model} ({_size(_model_files(written))})"
            if report.prepared_model
            else "(not written)",
        ),
        ("recipe", report.recipe),
        ("TensorRT target", f"{report.target.get('tensorrt')} ({report.target.get('source')})"),
        ("plugins inserted", ", ".join(f"{k}: {v}" for k, v in report.plugins_inserted.items()) or "none"),
        ("native ops written", ", ".join(f"{k}: {v}" for k, v in report.native_inserted.items()) or "none"),
        ("ops lowered", ", ".join(f"{k}: {v}" for k, v in report.lowered.items()) or "none"),
        ("TensorRT check", _trt_line(report.tensorrt)),
        ("engine", (report.engine or {}).get("engine", "not built")),
    ]
    stubs = _stub_lines(graph, registry)
    if stubs:
        summary.append(("plugin stubs", "; ".join(stubs)))
    if report.error:
        summary.append(("error", report.error))
    steps = [
        (s.name, f"{s.seconds:.2f}", str(s.nodes_before), str(s.nodes_after), f"{s.status}: {s.summary}")
        for s in report.steps
    ]
    rows = []
    if comparison is not None:
        rows = [
            (
                o.name,
                "x".join(str(d) for d in o.shape),
                o.dtypes,
                f"{o.max_abs_err:.3g}",
                f"{o.max_rel_err:.3g}",
                f"{o.atol:g}",
                f"{o.rtol:g}",
                ("pass" if o.passed else "FAIL") + (f": {o.note}" if o.note else ""),
            )
            for o in comparison.outputs
        ]
    page = Page(
        title=f"gskit prepare: {Path(report.model).name}",
        passed=None if report.passed is None else report.passed and report.error is None,
        summary=summary,
        steps=steps,
        comparison=rows,
        comparison_inputs=_comparison_inputs(comparison, original, recipe),
        regions=drawings.regions,
        skipped=[(plugin, skip.rule, skip.anchor, skip.reason) for plugin, skip in skipped],
        environment=environment_rows(),
        error=report.error,
    )
    return render_page(page, drawings.drawn)


def _stub_lines(graph: gs.Graph, registry: PluginRegistry) -> list[str]:
    """``my.ns::MyOp v1: reference and kernel are stubs (...)`` for each plugin of the model's nodes."""
    from gskit.plugin.stubs import describe_stubs

    specs = {spec.key: spec for node in graph.nodes if (spec := registry.for_node(node))}
    lines = [(spec.qualified_name, describe_stubs(spec)) for spec in specs.values()]
    return [f"{name}: {text}" for name, text in sorted(lines) if text]


def _comparison_inputs(comparison: Any, original: onnx.ModelProto, recipe: Recipe) -> str:
    """What the comparison fed, as the validate step describes it (its options: the recipe's first)."""
    if comparison is None:
        return ""
    options = next((s.options for s in recipe.steps if s.name == Validate.name), None)
    return Validate.describe_inputs(comparison, original, options)


def _model_files(path: Path, model: onnx.ModelProto | None = None) -> list[Path]:
    """The model file and the external data files it reads (those of ``model``, else ``<path>.data``)."""
    if model is None:
        data = path.with_name(path.name + ".data")
        return [path, data] if data.is_file() else [path]
    return [path, *(path.parent / name for name in gsmodel.data_locations(model))]


def _size(files: list[Path]) -> str:
    """``1.2 MB`` for the files together (``3 files`` named when there are several)."""
    total = sum(f.stat().st_size for f in files if f.is_file())
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if total >= scale:
            text = f"{total / scale:.1f} {unit}"
            break
    else:
        text = f"{total} bytes"
    return text if len(files) == 1 else f"{text} in {len(files)} files"


def _trt_line(trt: Any) -> str:
    if trt is None:
        return "not run"
    from gskit.backends.trt_check import NEEDS_PLUGIN

    plugins = len(trt.nodes_with(NEEDS_PLUGIN))
    return f"{trt.source}: {len(trt.rejected)} node(s) rejected, {plugins} plugin node(s)"


def _regions(replaced: list[Any], original: onnx.ModelProto, graph: gs.Graph) -> list[Region]:
    before_nodes: dict[str, onnx.NodeProto] = {}
    for g in gsmodel.graph_protos(original.graph):
        for node in g.node:
            before_nodes.setdefault(node.name, node)
    after_nodes = {n.name: n for sub in (graph, *graph.subgraphs(recursive=True)) for n in sub.nodes}
    regions = []
    for region in replaced:
        before = tuple(
            NodeSummary.of(n, op_label(n.domain, n.op_type))
            for n in (before_nodes.get(name) for name in region.original_nodes)
            if n is not None
        )
        plugin = after_nodes.get(region.node)
        after = (
            (
                NodeSummary(
                    plugin.name,
                    op_label(plugin.domain or "", plugin.op),
                    tuple(t.name for t in plugin.inputs),
                    tuple(t.name for t in plugin.outputs),
                ),
            )
            if plugin is not None
            else ()
        )
        title = _region_title(region)
        attrs = plugin.attrs if plugin is not None else {}
        attributes = tuple((k, _attribute_text(v)) for k, v in attrs.items())
        form = f"form: {region.form} {region.op}: {region.why}"
        regions.append(
            Region(title, before, after, tuple(region.inputs), tuple(region.outputs), attributes, form=form)
        )
    return regions


def _region_title(region: Any) -> str:
    """``gskit::LayerNorm v1 (LayerNorm_0) replaced 9 node(s)``, or the native op when that form was taken."""
    count = len(region.original_nodes)
    if region.form != "native":
        return f"{region.plugin} ({region.node}) replaced {count} node(s)"
    if region.kept:
        return f"{region.op} ({region.node}) kept: already the native form of {region.plugin}"
    return f"{region.op} ({region.node}) replaced {count} node(s): the native form of {region.plugin}"


def _attribute_text(value: Any) -> str:
    """An attribute value as a cell: numbers as written, long lists cut."""
    if isinstance(value, (list, tuple)):
        shown = ", ".join(_attribute_text(v) for v in value[:8])
        return f"[{shown}{', ...' if len(value) > 8 else ''}]"
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
