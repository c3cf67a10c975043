"""report.html: what the page says about a prepare run (and that its region counts agree with --per-plugin).

The page is read as HTML text here, so this runs without Graphviz or Chromium; tests/test_prepare.py opens it
in headless Chromium where that is installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import onnx
import pytest

import gskit
from gskit.compare.plugins import compare_plugins
from gskit.io.html_report import VERSIONED, dot_source, environment_rows, render_svg, render_svgs
from gskit.pipeline.prepare import prepare
from gskit.pipeline.recipe import make_recipe
from gskit.plugin import load_plugins
from gskit.plugin.ops import NodeSummary

EXAMPLE = Path(gskit.__file__).parent / "data" / "example.onnx"
REPO_PLUGINS = Path(gskit.__file__).parent.parent / "plugins"


class Tables(HTMLParser):
    """The page's tables by id (rows of cell texts) and its figure captions."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.captions: list[str] = []
        self.paragraphs: dict[str, str] = {}
        self._table: str | None = None
        self._cell: list[str] | None = None
        self._in: str | None = None

    def handle_starttag(self, tag, attrs):
        ident = dict(attrs).get("id")
        if tag == "table":
            self._table = ident
            self.tables[ident] = []
        elif tag == "tr" and self._table:
            self.tables[self._table].append([])
        elif tag in ("td", "th") and self._table:
            self._cell = []
        elif tag in ("figcaption", "p"):
            self._in, self._cell = (ident or tag), []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._table and self._cell is not None:
            self.tables[self._table][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "table":
            self._table = None
        elif tag == "figcaption" and self._cell is not None:
            self.captions.append("".join(self._cell).strip())
            self._cell = self._in = None
        elif tag == "p" and self._cell is not None:
            self.paragraphs[self._in] = "".join(self._cell).strip()
            self._cell = self._in = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prepared") / "out"
    steps = ("sanitize", "replace", "infer_shapes", "fold", "infer_shapes", "validate")  # no TensorRT: faster
    report = prepare(EXAMPLE, out, plugin_dirs=[REPO_PLUGINS], recipe=make_recipe([(s, {}) for s in steps]))
    assert report.passed
    return out


@pytest.fixture(scope="module")
def page(prepared) -> Tables:
    parsed = Tables()
    parsed.feed((prepared / "report.html").read_text())
    return parsed


def test_each_region_shows_its_attributes_and_its_form(page, prepared):
    """The default target (the newest TensorRT gskit knows, here) runs LayerNormalization natively: that
    region is the ONNX op, ClampSwish's are plugin nodes; each says which form and why."""
    model = onnx.load(prepared / "model.onnx")
    regions = json.loads((prepared / "report.json").read_text())["regions"]
    norm = next(n for n in model.graph.node if n.op_type == "LayerNormalization")
    epsilon = next(a.f for a in norm.attribute if a.name == "epsilon")
    index = next(i for i, r in enumerate(regions) if r["node"] == norm.name)
    rows = dict(page.tables[f"region-{index}-attributes"][1:])
    assert rows["epsilon"] == f"{epsilon:g}" and rows["axis"] == "-1" and "plugin_namespace" not in rows
    assert page.paragraphs[f"region-{index}-form"].startswith(
        "form: native LayerNormalization: TensorRT 11.5"
    )
    swish = next(i for i, r in enumerate(regions) if r["plugin"] == "gskit::ClampSwish v1")
    assert dict(page.tables[f"region-{swish}-attributes"][1:])["plugin_namespace"] == "gskit"
    assert page.paragraphs[f"region-{swish}-form"] == (
        "form: plugin gskit::ClampSwish: ClampSwish declares no native form"
    )
    summary = dict(page.tables["summary"])
    assert summary["TensorRT target"].startswith("11.5 (newest gskit knows")
    assert summary["native ops written"] == "LayerNormalization: 1"


def test_skipped_matches_are_listed_with_their_reason(page):
    rows = page.tables["skipped"][1:]
    # the example's LayerNorm also matches RMSNorm's rule from its Mul: found, not replaced, and why
    assert [r[0] for r in rows] == ["gskit::RMSNorm v1"]
    assert "overlaps the LayerNorm match" in rows[0][3]


def test_comparison_says_inputs_seed_dtypes_and_tolerances(page):
    header, *rows = page.tables["comparison"]
    assert header == ["output", "shape", "dtype", "max abs err", "max rel err", "atol", "rtol", "result"]
    assert rows[0][:3] == ["y", "2x10", "float32"] and rows[0][5:] == ["1e-05", "1e-05", "pass"]
    inputs = page.paragraphs["comparison-inputs"]
    assert inputs.startswith("inputs x float32[2x4x8x8], random (seed 0); tolerances given: atol 1e-05")


def test_summary_has_file_sizes_and_environment_versions(page, prepared):
    summary = dict(page.tables["summary"])
    size = re.search(r"\((\d+\.\d) kB\)$", summary["input model"])
    assert size and float(size.group(1)) == round(EXAMPLE.stat().st_size / 1e3, 1)
    assert summary["prepared model"].endswith(f"({(prepared / 'model.onnx').stat().st_size / 1e3:.1f} kB)")
    environment = dict(page.tables["environment"])
    assert environment["onnx"] == onnx.__version__
    assert {"gskit", "onnxruntime", "polygraphy", "written (UTC)"} <= set(environment)
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", environment["written (UTC)"])


def test_before_and_after_are_said_once_per_drawing(page, prepared):
    regions = json.loads((prepared / "report.json").read_text())["regions"]
    assert page.captions == ["before", "after"] * len(regions)
    # the drawing itself carries no second label
    source = dot_source([NodeSummary("n", "Relu", ("x",), ("y",))], ["x"], ["y"])
    assert 'label="before"' not in source and not re.search(r"^\s*label=", source, re.M)


def test_region_node_counts_agree_with_compare_per_plugin(prepared):
    """Both count the region's operator nodes; Constant nodes (values the pattern reads) are not counted."""
    regions = json.loads((prepared / "report.json").read_text())["regions"]
    registry = load_plugins([REPO_PLUGINS], entry_points=False)
    checks = compare_plugins(EXAMPLE, prepared / "model.onnx", plugins=registry, shapes={"x": (2, 4, 8, 8)})
    per_plugin = {c.node: len(c.original_nodes) for c in checks.plugins}
    assert (
        per_plugin
        == {r["node"]: len(r["original_nodes"]) for r in regions}
        == {
            "ClampSwish_0": 5,
            "LayerNormalization_0": 9,
            "ClampSwish_1": 5,
        }
    )
    html = (prepared / "report.html").read_text()
    assert all(f"({node}) replaced {count} node(s)" in html for node, count in per_plugin.items())


def test_environment_lists_tensorrt_or_says_it_is_missing():
    names = [name for name, _ in environment_rows()]
    assert any(name.startswith("tensorrt") for name in names)


def test_environment_lists_the_tensorrt_distributions_that_every_installed_one_names():
    """Only the metadata folders named tensorrt* are read: the same rows as reading every distribution's."""
    from importlib.metadata import distributions

    every = {
        d.metadata["Name"]: d.version
        for d in distributions()
        if (d.metadata["Name"] or "").lower().replace("-", "_").startswith("tensorrt")
        and not (d.metadata["Name"] or "").lower().endswith(("libs", "bindings"))
    }
    rows = environment_rows()
    assert rows[len(("gskit", "onnx", "onnxruntime", "onnx_graphsurgeon", "polygraphy")) : -1] == (
        sorted(every.items()) or [("tensorrt", "not installed")]
    )


def test_environment_versions_are_those_importlib_metadata_reads():
    """The versions come from the metadata files' header lines, not the email parser: the same answers."""
    from importlib.metadata import PackageNotFoundError, version

    def expected(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    rows = dict(environment_rows())
    assert [rows[name] for name in VERSIONED] == [expected(name) for name in VERSIONED]


@pytest.mark.parametrize(
    "text",
    [
        "Metadata-Version: 2.1\nName: demo-pkg\nversion: 1.2.3 \nSummary: s\n\nVersion: 9.9\nName: other\n",
        "Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.2.3 \n\nlong description\n",
        "Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.2\n .3\n\n",  # a folded header
        "Metadata-Version: 2.1\r\nName: demo-pkg\r\nVersion: 1.2.3\r\n\r\nVersion: 9\r\n",
        "\nName: demo-pkg\nVersion: 1.2.3\n",  # no header at all: the email package reads it as a body
        "Metadata-Version: 2.1\nSummary: no name\n",
    ],
)
def test_a_metadata_field_is_read_as_the_email_package_reads_it(tmp_path, text):
    from importlib.metadata import Distribution

    from gskit.io.dist_metadata import metadata_field

    folder = tmp_path / "demo_pkg-1.2.3.dist-info"
    folder.mkdir()
    (folder / "METADATA").write_text(text, newline="")
    dist = Distribution.at(folder)
    for field in ("Name", "Version", "Summary"):
        assert metadata_field(dist, field) == dist.metadata[field]


@pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz (scripts/install-system-deps.sh)")
def test_drawings_from_one_graphviz_run_are_those_drawn_one_by_one():
    sources = [
        dot_source(
            [NodeSummary(f"n{j}", f'Op"{j} </svg>', (f"t{j}",), (f"t{j + 1}",)) for j in range(count)],
            ["t0"],
            [f"t{count}"],
            title=f"region {count}",
        )
        for count in (1, 2, 3)
    ]
    alone = [render_svg(source) for source in sources]
    assert all(svg and svg.startswith("<svg") for svg in alone)
    assert render_svgs(sources) == alone
    # One source dot cannot read: that drawing is missing, the others are drawn as before.
    assert render_svgs([sources[0], "digraph {", sources[1]]) == [alone[0], None, alone[1]]


def test_input_size_counts_its_external_data_file(tmp_path):
    source = tmp_path / "src" / "model.onnx"
    gskit.save(gskit.load(EXAMPLE), source, external_data=True)  # weights in model.onnx.data beside it
    out = tmp_path / "out"
    prepare(source, out, recipe=make_recipe([("sanitize", {})]))
    parsed = Tables()
    parsed.feed((out / "report.html").read_text())
    total = sum(f.stat().st_size for f in source.parent.iterdir())
    assert dict(parsed.tables["summary"])["input model"].endswith(f"({total / 1e3:.1f} kB in 2 files)")


def test_drawings_started_early_are_those_the_page_draws(monkeypatch):
    """report.html's drawings are started before the rest of the page is made and collected with it: the
    same pictures (or the same missing ones without Graphviz), and a drawing's exception reaches the page."""
    import threading

    from gskit.io import html_report

    regions = [
        html_report.Region(
            f"region {count}",
            tuple(NodeSummary(f"n{j}", f"Op{j}", (f"t{j}",), (f"t{j + 1}",)) for j in range(count)),
            (NodeSummary("p", "Plugin", ("t0",), (f"t{count}",)),),
            ("t0",),
            (f"t{count}",),
        )
        for count in (1, 3)
    ]
    started = html_report.start_drawings(regions)
    assert started() == html_report._drawings(regions)
    names = {thread.name for thread in threading.enumerate()}
    assert html_report.start_drawings([])() == [] and names == {t.name for t in threading.enumerate()}

    def broken(dots):
        raise RuntimeError("drawing failed")

    monkeypatch.setattr(html_report, "render_svgs", broken)
    with pytest.raises(RuntimeError, match="drawing failed"):
        html_report.start_drawings(regions)()


def test_the_pictures_are_started_once_no_step_changes_the_graph(tmp_path, monkeypatch):
    """prepare starts Graphviz on the regions when only analysis steps are left (check_trt, validate,
    build: they do not change the graph), so it draws while they run; the page shows those drawings, the
    same as a page drawn at the end."""
    from gskit.pipeline import prepare as pipeline
    from gskit.pipeline import report_page

    events: list[str] = []
    real = report_page.draw_regions

    def recorded(*args):
        events.append("draw")
        return real(*args)

    class Listener:
        def started(self, name, index, total):
            events.append(name)

        def finished(self, result):
            pass

    monkeypatch.setattr(pipeline, "_draw_regions", recorded)
    out = tmp_path / "out"
    prepare(EXAMPLE, out, listener=Listener())
    assert events.index("draw") == events.index("check_trt") - 1 and events.count("draw") == 1
    page = (out / "report.html").read_text()
    # the same page as one whose pictures are drawn when it is made
    drawn_late = []
    monkeypatch.setattr(report_page, "draw_regions", lambda *a: drawn_late.append(1) or real(*a))
    monkeypatch.setattr(pipeline, "_draw_regions", lambda *a: None)
    late = tmp_path / "late"
    prepare(EXAMPLE, late)
    assert drawn_late == [1]
    strip = re.compile(r"<td>\d+\.\d\d</td>|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d|/[^<]*?/(out|late)/")
    assert strip.sub("", page) == strip.sub("", (late / "report.html").read_text())
    assert page.count("<figure") == 6


def test_a_failing_graphviz_is_logged_where_the_page_collects_the_drawings(tmp_path, monkeypatch, caplog):
    """Graphviz that fails: each drawing is missing and warned about, as before, and the warnings come when
    the page collects the drawings (its place in the log), not while the steps still run."""
    import logging
    import threading
    import time

    from gskit.io import html_report

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "dot").write_text("#!/bin/sh\necho broken >&2\nexit 3\n")
    (fake / "dot").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    regions = [
        html_report.Region("r", (NodeSummary("n", "Op", ("a",), ("b",)),), (), ("a",), ("b",)),
    ]
    caplog.set_level(logging.WARNING, logger="gskit.io.html_report")
    drawn = html_report.start_drawings(regions)
    deadline = time.monotonic() + 60
    while any(t.name == "gskit-graphviz" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not [r for r in caplog.records if "graphviz failed" in r.getMessage()]
    assert drawn() == [(None, None)]
    assert len([r for r in caplog.records if "graphviz failed" in r.getMessage()]) == 2
