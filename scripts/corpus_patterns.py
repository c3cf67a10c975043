"""Derived rules against hand-written ones on the corpus: each plugin with ``from_torch`` rules, run twice.

Used by ``scripts/real_models.py --derived-vs-hand-written``. For each model, in its own subprocess (this file
with ``--one MODEL``), every shipped plugin that has derived rules replaces its patterns twice on a fresh copy
of the model (shapes inferred first, as ``gskit replace`` does): once with its hand-written rules only, once
with its derived rules only. An instance is a replaced region, known by its output tensors. The row lists, per
plugin, the instances each set found, those the derived rules missed, and those only they found; the extra
ones are checked region by region on onnxruntime (``compare --per-plugin``) and the row says whether each
passed.

A row is a problem when the derived rules miss an instance the hand-written rules find, when an extra one
fails its comparison, or when the model could not be read.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

#: Seconds the two replacements (and the comparison of extras) may take on one model.
PATTERNS_TIMEOUT = 900


@dataclass
class PatternsRow:
    """One model: per plugin, what each rule set found."""

    model: str
    exporter: str
    hand_written: dict[str, int] = field(default_factory=dict)
    derived: dict[str, int] = field(default_factory=dict)
    #: instances (their output tensors) the hand-written rules find and the derived ones do not
    missing: dict[str, list[list[str]]] = field(default_factory=dict)
    #: instances only the derived rules find, with whether each matched its region on onnxruntime
    extra: dict[str, list[dict]] = field(default_factory=dict)
    error: str = ""
    seconds: float = 0.0

    @property
    def label(self) -> str:
        return f"{self.model} {self.exporter}".strip()


def compare_rules(name: str, exporter: str, path: Path, env: dict[str, str]) -> PatternsRow:
    """Both rule sets on one model, in a subprocess (its crash or hang is this row's error)."""
    row = PatternsRow(name, exporter)
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, __file__, "--one", str(path)],
            capture_output=True,
            text=True,
            env=env,
            timeout=PATTERNS_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        row.error = f"timed out after {PATTERNS_TIMEOUT}s"
        return row
    row.seconds = time.perf_counter() - start
    try:
        result = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        row.error = f"exit {done.returncode}: {lines[-1] if lines else 'no output'}"[:300]
        return row
    for key in ("hand_written", "derived", "missing", "extra", "error"):
        setattr(row, key, result[key])
    return row


def patterns_problems(rows: list[PatternsRow]) -> list[str]:
    found = []
    for row in rows:
        if row.error:
            found.append(f"{row.label}: {row.error}")
        for plugin, missed in row.missing.items():
            if missed:
                found.append(
                    f"{row.label}: derived {plugin} rules miss {len(missed)} instance(s) at {missed[0]}"
                )
        for plugin, extras in row.extra.items():
            failed = [e for e in extras if not e["passed"]]
            if failed:
                found.append(f"{row.label}: {len(failed)} extra {plugin} instance(s) fail their comparison")
    return found


def print_patterns_table(rows: list[PatternsRow]) -> None:
    header = ("model", "exporter", "hand-written", "derived", "missed", "extra (validated)")
    lines = [header]
    for row in rows:
        plugins = sorted(set(row.hand_written) | set(row.derived))

        def counts(found: dict[str, int], names: list[str] = plugins) -> str:
            return ", ".join(f"{p.split('::')[-1].split()[0]} {found.get(p, 0)}" for p in names) or "-"

        missed = sum(len(v) for v in row.missing.values())
        extras = [e for v in row.extra.values() for e in v]
        extra = f"{len(extras)} ({sum(e['passed'] for e in extras)} pass)" if extras else "0"
        lines.append(
            (
                row.model,
                row.exporter or "-",
                counts(row.hand_written),
                counts(row.derived),
                str(missed),
                extra,
            )
            if not row.error
            else (row.model, row.exporter or "-", "-", "-", "-", row.error[:80])
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)))


# ---------------------------------------------------------------------------------------------- worker


def _one(path: str) -> dict:
    """Both rule sets on ``path`` (this process): the row's fields as JSON-able values."""
    import onnx_graphsurgeon as gs

    from gskit.compare.plugins import compare_plugins
    from gskit.io.model import load, save, to_graph
    from gskit.passes.patterns import replace
    from gskit.passes.shapes import infer_graph_shapes
    from gskit.plugin import load_plugins

    gs.logger.G_LOGGER.severity = gs.logger.G_LOGGER.ERROR
    registry = load_plugins()
    specs = [s for s in registry if any(hasattr(r, "forms") for r in s.patterns)]
    model = load(path)

    def run(derived: bool) -> tuple[dict[str, set[tuple[str, ...]]], dict[tuple[str, ...], str], object]:
        chosen = [
            dataclasses.replace(s, patterns=tuple(r for r in s.patterns if hasattr(r, "forms") == derived))
            for s in specs
        ]
        graph = to_graph(model)
        infer_graph_shapes(graph, registry, strict=False)
        # 8.5: older than every native form, so each found region is a plugin node compare_plugins can check
        report = replace(graph, chosen, tensorrt="8.5")
        found: dict[str, set[tuple[str, ...]]] = {}
        nodes = {}
        for region in report.regions:
            found.setdefault(region.plugin, set()).add(region.outputs)
            nodes[region.outputs] = region.node
        infer_graph_shapes(graph, registry, strict=False)
        return found, nodes, graph

    hand, _, _ = run(False)
    derived, derived_nodes, derived_graph = run(True)
    result: dict = {
        "hand_written": {p: len(v) for p, v in hand.items()},
        "derived": {p: len(v) for p, v in derived.items()},
        "missing": {},
        "extra": {},
        "error": "",
    }
    for plugin in sorted(set(hand) | set(derived)):
        result["missing"][plugin] = sorted(
            list(o) for o in hand.get(plugin, set()) - derived.get(plugin, set())
        )
        extras = sorted(derived.get(plugin, set()) - hand.get(plugin, set()))
        if not extras:
            continue
        with tempfile.TemporaryDirectory(prefix="gskit-corpus-patterns-") as tmp:
            written = save(derived_graph, Path(tmp) / "derived.onnx")
            checks = {c.node: c for c in compare_plugins(path, written, plugins=registry).plugins}
        result["extra"][plugin] = [
            {"outputs": list(o), "passed": bool(checks[derived_nodes[o]].passed)} for o in extras
        ]
    return result


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--one":
        print(json.dumps(_one(sys.argv[2])))
    else:
        print("usage: corpus_patterns.py --one MODEL (scripts/real_models.py --derived-vs-hand-written)")
        sys.exit(2)
