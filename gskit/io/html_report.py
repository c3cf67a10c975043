"""``report.html``: one self-contained page with the summary, the comparison and before/after pictures.

Pictures are SVG drawn by Graphviz's ``dot`` (Debian/Ubuntu package ``graphviz``); without it the page says
so instead of a picture. No external scripts, styles or fonts: the file opens anywhere, offline.
"""

from __future__ import annotations

import html
import logging
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

#: Regions larger than this are drawn with their first nodes only, so the page stays readable.
MAX_DRAWN_NODES = 40


@dataclass(frozen=True)
class DrawnNode:
    """A node as a picture shows it: name, ``domain::op`` label, input and output tensor names."""

    name: str
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class Region:
    """One replaced region: its nodes before and the plugin node after, with the boundary tensors."""

    title: str
    before: tuple[DrawnNode, ...]
    after: tuple[DrawnNode, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def dot_source(nodes: Sequence[DrawnNode], inputs: Iterable[str], outputs: Iterable[str], title: str) -> str:
    """Graphviz DOT text for a small region: ops as boxes, boundary tensors as ellipses."""
    shown = list(nodes)[:MAX_DRAWN_NODES]
    lines = [
        "digraph region {",
        f'  label="{_dot(title)}"; labelloc=t; rankdir=TB; fontname="Helvetica";',
        '  node [fontname="Helvetica", fontsize=10];',
    ]
    producers: dict[str, str] = {}
    for index, node in enumerate(shown):
        lines.append(
            f'  n{index} [shape=box, style="rounded,filled", fillcolor="#e8eef7", label="{_dot(node.op)}"];'
        )
        for tensor in node.outputs:
            producers[tensor] = f"n{index}"
    boundary = [*dict.fromkeys(inputs), *dict.fromkeys(outputs)]
    tensor_ids = {name: f"t{i}" for i, name in enumerate(boundary)}
    for name, tid in tensor_ids.items():
        lines.append(f'  {tid} [shape=ellipse, style=filled, fillcolor="#f4f4f4", label="{_dot(name)}"];')
    for index, node in enumerate(shown):
        for tensor in node.inputs:
            if tensor in producers:
                lines.append(f"  {producers[tensor]} -> n{index};")
            elif tensor in tensor_ids:
                lines.append(f"  {tensor_ids[tensor]} -> n{index};")
        for tensor in node.outputs:
            if tensor in tensor_ids and tensor in set(outputs):
                lines.append(f"  n{index} -> {tensor_ids[tensor]};")
    if len(nodes) > len(shown):
        lines.append(f'  more [shape=plaintext, label="... {len(nodes) - len(shown)} more nodes"];')
    lines.append("}")
    return "\n".join(lines)


def render_svg(dot: str) -> str | None:
    """SVG text for DOT source, or None when Graphviz is not installed or fails."""
    exe = shutil.which("dot")
    if exe is None:
        return None
    try:
        result = subprocess.run(
            [exe, "-Tsvg"], input=dot, capture_output=True, text=True, timeout=60, check=True
        )
    except (subprocess.SubprocessError, OSError) as err:
        log.warning("graphviz failed to draw a region: %s", err)
        return None
    svg = result.stdout
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else None


def render_page(
    title: str,
    summary_rows: Sequence[tuple[str, str]],
    step_rows: Sequence[Sequence[str]],
    comparison_rows: Sequence[Sequence[str]],
    regions: Sequence[Region],
    passed: bool,
) -> str:
    """The whole HTML document as a string."""
    verdict = "PASSED" if passed else "FAILED"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="verdict {verdict.lower()}" id="verdict">Validation {verdict}</p>',
        "<h2>Summary</h2>",
        _table(("", ""), summary_rows, table_id="summary", header=False),
        "<h2>Steps</h2>",
        _table(("step", "time (s)", "nodes before", "nodes after", "result"), step_rows, table_id="steps"),
        "<h2>Comparison with the original model</h2>",
        _table(
            ("output", "shape", "max abs err", "max rel err", "result"),
            comparison_rows,
            table_id="comparison",
        )
        if comparison_rows
        else "<p>No comparison ran.</p>",
        f"<h2>Replaced regions ({len(regions)})</h2>",
    ]
    for index, region in enumerate(regions):
        before = render_svg(dot_source(region.before, region.inputs, region.outputs, "before"))
        after = render_svg(dot_source(region.after, region.inputs, region.outputs, "after"))
        parts.append(f'<section class="region" id="region-{index}"><h3>{html.escape(region.title)}</h3>')
        parts.append('<div class="pair">')
        for label, svg in (("before", before), ("after", after)):
            body = (
                svg
                if svg is not None
                else "<p>(install Graphviz, package <code>graphviz</code>, for pictures)</p>"
            )
            parts.append(f'<figure class="{label}">{body}<figcaption>{label}</figcaption></figure>')
        parts.append("</div></section>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _table(
    columns: Sequence[str], rows: Sequence[Sequence[str]], *, table_id: str, header: bool = True
) -> str:
    head = "<tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in columns) + "</tr>" if header else ""
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(cell))}</td>" for cell in row) + "</tr>" for row in rows
    )
    return f'<table id="{table_id}">{head}{body}</table>'


def _dot(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 4px 10px; text-align: left; font-variant-numeric: tabular-nums; }
th { background: #f0f0f0; }
.verdict { font-size: 1.3em; font-weight: bold; }
.verdict.passed { color: #17753a; } .verdict.failed { color: #b3261e; }
.pair { display: flex; gap: 2em; align-items: flex-start; flex-wrap: wrap; }
figure { margin: 0; border: 1px solid #ddd; padding: 0.5em; }
figure svg { max-width: 600px; height: auto; }
"""
