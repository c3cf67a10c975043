"""``report.html``: one self-contained page with the summary, the comparison and before/after pictures.

Pictures are SVG drawn by Graphviz's ``dot`` (Debian/Ubuntu package ``graphviz``); without it the page says
so instead of a picture. No external scripts, styles or fonts: the file opens anywhere, offline. Every text
on the page is data: HTML-escaped, with control and bidi characters shown as escapes (``\\x1b``, ``\\u202e``)
as in the terminal (:mod:`gskit.io.text`), in the tables and in the drawings' labels alike.
"""

from __future__ import annotations

import html
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib.metadata import Distribution, PackageNotFoundError
from pathlib import Path

from gskit.io.dist_metadata import metadata_field
from gskit.io.text import visible
from gskit.plugin.ops import NodeSummary

log = logging.getLogger(__name__)

#: Regions larger than this are drawn with their first nodes only, so the page stays readable.
MAX_DRAWN_NODES = 40


@dataclass(frozen=True)
class Region:
    """One replaced region: its nodes before and the plugin node after (with its attributes), with the
    boundary tensors."""

    title: str
    before: tuple[NodeSummary, ...]
    after: tuple[NodeSummary, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attributes: tuple[tuple[str, str], ...] = ()
    #: the form chosen (plugin node or native op) and why, one line
    form: str = ""


@dataclass(frozen=True)
class Page:
    """What ``report.html`` shows, as text cells.

    Attributes:
        title: the page's heading.
        passed: the verdict at the top; None: nothing was validated (no validate step), said as such.
        summary: (label, value) rows: files, sizes, recipe, plugins, TensorRT, engine.
        steps: one row per step (step, time, nodes before, nodes after, result).
        comparison: one row per output (output, shape, dtype, max abs err, max rel err, atol, rtol, result).
        comparison_inputs: how the comparison was fed (inputs with dtypes and shapes, seed or file) and the
            tolerances given.
        regions: the replaced regions, drawn before/after.
        skipped: one row per match that was found and not replaced (plugin, rule, where, reason).
        environment: (name, value) rows: versions of gskit and the libraries it used, and when the page was
            written.
        error: why the run stopped (no model written); the verdict at the top says so instead.
    """

    title: str
    passed: bool | None
    summary: Sequence[tuple[str, str]]
    steps: Sequence[Sequence[str]]
    comparison: Sequence[Sequence[str]]
    comparison_inputs: str
    regions: Sequence[Region]
    skipped: Sequence[Sequence[str]] = ()
    environment: Sequence[tuple[str, str]] = ()
    error: str | None = None


#: Distributions whose versions the page lists (those installed): gskit and what it drives. TensorRT's
#: packages are found by name (``tensorrt``, ``tensorrt_cu12``, ``tensorrt_rtx_cu13``, ...).
VERSIONED = ("gskit", "onnx", "onnxruntime", "onnx_graphsurgeon", "polygraphy")


def environment_rows(now: datetime | None = None) -> list[tuple[str, str]]:
    """(name, version) of each installed distribution of :data:`VERSIONED` and of TensorRT, then the time
    (UTC)."""
    rows = []
    for name in VERSIONED:
        try:
            rows.append((name, metadata_field(Distribution.from_name(name), "Version")))
        except PackageNotFoundError:  # gskit run from a source tree that was never installed
            rows.append((name, "not installed"))
    trt = {}
    for dist in _tensorrt_distributions():
        name = metadata_field(dist, "Name") or ""
        if name.lower().replace("-", "_").startswith("tensorrt") and not name.lower().endswith(
            ("libs", "bindings")
        ):
            trt[name] = metadata_field(dist, "Version")
    rows.extend(sorted(trt.items()) or [("tensorrt", "not installed")])
    when = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    rows.append(("written (UTC)", when.strftime("%Y-%m-%d %H:%M:%S")))
    return rows


def _tensorrt_distributions() -> list[Distribution]:
    """The installed distributions whose metadata folder is named ``tensorrt*``, in the order
    ``importlib.metadata.distributions()`` finds them (``sys.path``, then the folder's listing).

    A metadata folder is named after its distribution (``tensorrt_rtx_cu13-1.7.1.116.dist-info``), so only
    these few metadata files are parsed, not those of every installed distribution (150 here, 0.05 s).
    """
    found = []
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:  # a zip file, a path hook's name, a folder that went away
            continue
        found.extend(
            Distribution.at(Path(entry or ".", name))
            for name in names
            if name.lower().startswith("tensorrt") and name.endswith((".dist-info", ".egg-info"))
        )
    return found


def dot_source(
    nodes: Sequence[NodeSummary], inputs: Iterable[str], outputs: Iterable[str], title: str = ""
) -> str:
    """Graphviz DOT text for a small region: ops as boxes, boundary tensors as ellipses.

    ``title`` labels the drawing; the page leaves it empty, its figure caption says "before" or "after".
    """
    shown = list(nodes)[:MAX_DRAWN_NODES]
    label = f'label="{_dot(title)}"; labelloc=t; ' if title else ""
    lines = [
        "digraph region {",
        f'  {label}rankdir=TB; fontname="Helvetica";',
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


#: Each region's (before, after) SVG drawing (None: not drawn), as :func:`start_drawings` hands them over.
Drawings = list[tuple[str | None, str | None]]


def start_drawings(regions: Sequence[Region]) -> Callable[[], Drawings]:
    """Draw the regions' pictures in a thread from now; the call returned waits for them (for
    :func:`render_page`).

    Graphviz takes 10-20 ms even for small drawings, mostly its own start and its first text layout, time
    the main thread spends on other work meanwhile. The drawings are those :func:`render_page` draws itself,
    failures included (a drawing Graphviz cannot make is None, its warning logged when the drawings are
    collected, where the page would have logged it); an exception the drawing raised is raised by the call.
    """
    if not regions:
        return list
    outcome: list[tuple[bool, object]] = []
    held: list[logging.LogRecord] = []

    def hold(record: logging.LogRecord) -> bool:
        """The drawing thread's log records wait for the collection (the page's place in the log)."""
        if record.thread == thread.ident:
            held.append(record)
            return False
        return True

    def draw() -> None:
        try:
            outcome.append((True, _drawings(regions)))
        except BaseException as err:  # noqa: BLE001  # handed to the caller below
            outcome.append((False, err))

    thread = threading.Thread(target=draw, name="gskit-graphviz", daemon=True)
    log.addFilter(hold)
    thread.start()

    def drawn() -> Drawings:
        thread.join()
        log.removeFilter(hold)
        for record in held:
            log.handle(record)
        held.clear()
        ok, value = outcome[0]
        if not ok:
            raise value  # type: ignore[misc]
        return value  # type: ignore[return-value]

    return drawn


def render_page(page: Page, drawings: Callable[[], Drawings] | None = None) -> str:
    """The whole HTML document as a string.

    Args:
        page: what the page shows.
        drawings: the regions' pictures, started earlier with :func:`start_drawings` (None: drawn now).
    """
    comparison_columns = ("output", "shape", "dtype", "max abs err", "max rel err", "atol", "rtol", "result")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_text(page.title)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{_text(page.title)}</h1>",
        _verdict(page),
        "<h2>Summary</h2>",
        _table(("", ""), page.summary, table_id="summary", header=False),
        "<h2>Steps</h2>",
        _table(("step", "time (s)", "nodes before", "nodes after", "result"), page.steps, table_id="steps"),
        "<h2>Comparison with the original model</h2>",
        f'<p id="comparison-inputs">{_text(page.comparison_inputs)}</p>',
        _table(comparison_columns, page.comparison, table_id="comparison")
        if page.comparison
        else "<p>No comparison ran.</p>",
        f"<h2>Replaced regions ({len(page.regions)})</h2>",
        "<p>Node counts are the region's operator nodes; <code>Constant</code> nodes, whose values the "
        "pattern reads, are not counted (as in <code>gskit compare --per-plugin</code>).</p>"
        if page.regions
        else "",
    ]
    drawn = drawings() if drawings is not None else _drawings(page.regions)
    parts.extend(_region(index, region, drawn[index]) for index, region in enumerate(page.regions))
    parts.append(f"<h2>Matches not replaced ({len(page.skipped)})</h2>")
    parts.append(
        _table(("plugin", "rule", "at node", "reason"), page.skipped, table_id="skipped")
        if page.skipped
        else "<p>None: every match found was replaced.</p>"
    )
    if page.environment:
        parts.append("<h2>Environment</h2>")
        parts.append(_table(("", ""), page.environment, table_id="environment", header=False))
    parts.append("</body></html>")
    return "\n".join(parts)


def _verdict(page: Page) -> str:
    """The line at the top: the run stopped (with why), validation passed or failed, or nothing validated."""
    if page.error is not None:
        return f'<p class="verdict failed" id="verdict">Run FAILED, no model written: {_text(page.error)}</p>'
    if page.passed is None:
        return (
            '<p class="verdict not-validated" id="verdict">Not validated: the recipe has no validate step, '
            "so the written model was not compared with the original</p>"
        )
    verdict = "PASSED" if page.passed else "FAILED"
    return f'<p class="verdict {verdict.lower()}" id="verdict">Validation {verdict}</p>'


def _drawings(regions: Sequence[Region]) -> Drawings:
    """Each region's (before, after) SVG, all drawn by one Graphviz process (a drawing takes a millisecond;
    starting ``dot`` from this large process takes tens)."""
    sources = [
        dot_source(nodes, region.inputs, region.outputs)
        for region in regions
        for nodes in (region.before, region.after)
    ]
    if not sources:
        return []
    svgs = render_svgs(sources)
    return list(zip(svgs[0::2], svgs[1::2], strict=True))


def render_svgs(dots: Sequence[str]) -> list[str | None]:
    """SVG text for each DOT source, as :func:`render_svg` draws it, from one ``dot`` run over them all.

    ``dot`` draws every graph of its input, one SVG document after another. When it fails or the documents
    do not come back one per source (a source it cannot read), each source is drawn alone, so one bad drawing
    costs only itself.
    """
    exe = shutil.which("dot")
    if exe is None:
        return [None] * len(dots)
    if len(dots) > 1:
        try:
            result = subprocess.run(
                [exe, "-Tsvg"], input="\n".join(dots), capture_output=True, text=True, timeout=60, check=True
            )
        except (subprocess.SubprocessError, OSError):
            result = None
        if result is not None:
            documents = result.stdout.split(_SVG_END)[:-1]
            svgs = [
                _PAGE_ID.sub("", document[document.find("<svg") :], count=1) + _SVG_END
                for document in documents
            ]
            if len(svgs) == len(dots) and all(svg.startswith("<svg") for svg in svgs):
                return svgs
    return [render_svg(dot) for dot in dots]


#: How ``dot -Tsvg`` ends each document.
_SVG_END = "</svg>\n"
#: ``dot`` names the top group of the second and later graphs of one run ``page0,1_graph0`` (the first and a
#: graph drawn alone: ``graph0``); the page shows each drawing as if it had been drawn alone.
_PAGE_ID = re.compile(r'(?<=<g id=")page\d+,\d+_(?=graph\d+")')


def _region(index: int, region: Region, drawings: tuple[str | None, str | None]) -> str:
    """One region's section: title, the plugin node's attributes, and the before/after drawings."""
    parts = [f'<section class="region" id="region-{index}"><h3>{_text(region.title)}</h3>']
    if region.form:
        parts.append(f'<p class="form" id="region-{index}-form">{_text(region.form)}</p>')
    if region.attributes:
        parts.append(_table(("attribute", "value"), region.attributes, table_id=f"region-{index}-attributes"))
    parts.append('<div class="pair">')
    for label, svg in zip(("before", "after"), drawings, strict=True):
        body = svg if svg is not None else f"<p>{_NO_GRAPHVIZ}</p>"
        parts.append(f'<figure class="{label}">{body}<figcaption>{label}</figcaption></figure>')
    parts.append("</div></section>")
    return "\n".join(parts)


_NO_GRAPHVIZ = "(install Graphviz, package <code>graphviz</code>, for pictures)"


def _table(
    columns: Sequence[str], rows: Sequence[Sequence[str]], *, table_id: str, header: bool = True
) -> str:
    head = "<tr>" + "".join(f"<th>{_text(c)}</th>" for c in columns) + "</tr>" if header else ""
    body = "".join("<tr>" + "".join(f"<td>{_text(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    return f'<table id="{table_id}">{head}{body}</table>'


def _text(value: object) -> str:
    """Any text as page content: controls shown as escapes, then HTML-escaped."""
    return html.escape(visible(str(value)))


def _dot(text: str) -> str:
    """A DOT string's content: controls shown as escapes, then backslashes and quotes escaped for DOT."""
    return visible(text).replace("\\", "\\\\").replace('"', '\\"')


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 4px 10px; text-align: left; font-variant-numeric: tabular-nums; }
th { background: #f0f0f0; }
.verdict { font-size: 1.3em; font-weight: bold; }
.verdict.passed { color: #17753a; } .verdict.failed { color: #b3261e; }
.verdict.not-validated { color: #8a5a00; }
.pair { display: flex; gap: 2em; align-items: flex-start; flex-wrap: wrap; }
figure { margin: 0; border: 1px solid #ddd; padding: 0.5em; }
figure svg { max-width: 600px; height: auto; }
figcaption { text-align: center; font-weight: bold; }
"""
