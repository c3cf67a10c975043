"""gskit against the tools people use today, on the same models in one run.

Usage::

    python bench/run.py [--quick] [--json PATH] [--only fold,replace,large,cli] [--timeout S] [--large-gb GB]
                        [--large-cap FRACTION]

Suites (each measurement runs in its own child process, see ``bench/peers.py``):

* ``fold``: gskit fold vs ``polygraphy surgeon sanitize --fold-constants`` vs onnxsim vs onnxslim on onnx's
  light models, PyTorch exports (ExampleNet, tests/exported_models.py) and transformer-like graphs of about
  10k/50k/100k nodes: median wall time, peak RSS, nodes before/after, outputs on onnxruntime.
* ``replace``: gskit replace (every plugin in plugins/) on transformer-like graphs of 400/2000/4000 blocks
  (10.4k/52k/104k nodes, one LayerNorm instance per block).
* ``large``: gskit prepare (transform steps of the default recipe) and folding by each tool on a model with
  2.5 GB of external weights, against a bare ``onnx.load`` + ``onnx.save_model(save_as_external_data=True)``.
  With ``--large-cap 0.3`` the command and the floor also run in cgroup-v1 memory groups, uncapped and capped
  at 0.3x the weights (cold page cache each time): whether each completes, its wall time, and the group's
  peak with its split into anonymous memory and page cache (``large_model["memory_cap"]`` and the rows).
* ``cli``: the command line as users run it, whole processes (``bench/processes.py``): ``gskit prepare``
  (default recipe) and ``gskit compare`` on the bundled example and light models beside the library calls
  (``prepare()``, ``compare()``) and their floors (``bench/floors.py``: one onnxruntime session run once; a
  plain two-session comparison), and ``gskit --version``/``--help``/``inspect`` beside ``python -c pass`` and
  ``python -c "import onnx"``, with the packages each process imported. Each command and its floor run in
  turn (command, floor, command, ...): the ratio is the median of the pairs' ratios, which a drift of the
  machine's speed during the runs does not move as it moves two medians taken minutes apart.

``--quick`` (a few minutes on a busy machine): light_squeezenet, ExampleNet, a 1k-node transformer,
replace on 1k and 10k nodes, a 200 MB stand-in for the large model (labelled as such), and the ``cli``
suite on the example and light_squeezenet.
Generated models go to a temporary folder; the JSON goes to ``bench/results/`` (git-ignored) unless
``--json`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.text import Text

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import models  # noqa: E402
from bench.peers import ATOL, FOLD_TOOLS, NOLIMIT, PREPARE_STEPS, RTOL, Row, measure  # noqa: E402
from bench.processes import WATCHED, Command, Measured, measure_pair, measure_process, pycache_env  # noqa: E402

log = logging.getLogger("bench")

SUITES = ("fold", "replace", "large", "cli")
QUICK_LIGHT = ("light_squeezenet",)
#: Blocks of the transformer-like graphs (26 nodes each): about 10k, 50k and 100k nodes.
FULL_BLOCKS = (400, 2000, 4000)
QUICK_BLOCKS = (40, 400)
MB, GB = 1e6, 1e9


#: Rows measured so far, written to ``_PARTIAL_JSON`` after each measurement (a long run that is stopped
#: still leaves its numbers).
_DONE: list[Row] = []
_PARTIAL_JSON: list[Path] = []


def _measure(*args: Any, **kwargs: Any) -> Row:
    return _record(measure(*args, **kwargs))


def _record(row: Row) -> Row:
    _DONE.append(row)
    for path in _PARTIAL_JSON:
        path.write_text(json.dumps({"partial": True, "rows": [r.as_dict() for r in _DONE]}, indent=2))
    return row


def _fold_suite(work: Path, quick: bool, timeout: float, models_filter: list[str], runs: int) -> list[Row]:
    sources: list[tuple[str, Path, int]] = []  # (label, path, runs)
    light = models.light_models()
    if quick:
        light = [p for p in light if p.stem in QUICK_LIGHT]
    sources += [(p.stem, p, runs) for p in light]
    exported = models.exported_models(work / "exported")
    if quick:
        exported = exported[:1]  # ExampleNet
    sources += [(p.stem, p, runs) for p in exported]
    for blocks in QUICK_BLOCKS[:1] if quick else FULL_BLOCKS:
        label = f"transformer {blocks * models.NODES_PER_BLOCK // 1000}k"
        if models_filter and not any(f in label for f in models_filter):
            continue
        path = models.write_transformer_like(work / "transformer" / f"t{blocks}.onnx", blocks=blocks)
        sources.append((label, path, 1))
    if models_filter:
        sources = [s for s in sources if any(f in s[0] for f in models_filter)]
    rows = []
    for label, path, runs in sources:
        scale = 3 if "transformer" in label and not quick else 1
        # light models make > 16 MiB constants from ConstantOfShape: also show gskit without its size cap
        # onnxruntime alone needs minutes to create a session for > 10k nodes: outputs checked up to 10k
        check = not label.startswith("transformer") or int(label.split()[1][:-1]) <= 11
        for tool in (*FOLD_TOOLS, NOLIMIT) if label.startswith("light_") else FOLD_TOOLS:
            rows.append(
                _measure(
                    "fold", label, tool, path, work / "out", runs=runs, timeout=timeout * scale, compare=check
                )
            )
    return rows


def _replace_suite(work: Path, quick: bool, timeout: float) -> list[Row]:
    rows = []
    for blocks in QUICK_BLOCKS if quick else FULL_BLOCKS:
        label = f"transformer {blocks * models.NODES_PER_BLOCK / 1000:.1f}k ({blocks} instances)"
        runs = 3 if blocks <= 400 else 1
        rows.append(
            _measure(
                "replace",
                label,
                "gskit-replace",
                work / "none.onnx",
                work / "out",
                runs=runs,
                timeout=timeout * 3,
                compare=blocks <= 400,
                extra={"blocks": blocks},
            )
        )
    return rows


#: Paired runs of the command line and the floor as whole processes on the large model (the disk is shared
#: and noisy: each pair runs back to back, and the medians are reported).
LARGE_CLI_RUNS = 2


def _large_suite(
    work: Path, quick: bool, timeout: float, size_gb: float, cap: float | None = None
) -> tuple[list[Row], dict[str, Any]]:
    """The large model: ``gskit prepare`` as users run it (the command's whole process, default recipe:
    validate and check_trt included) against the I/O floor as a whole process, in pairs, then (``cap``) both
    again in memory groups, without and with a cap of ``cap`` x the weights, then the library path (the
    transform steps of the default recipe, the floor timed inside its process) and each folding tool."""
    size = 0.2 if quick else size_gb
    path = work / "large" / "big.onnx"
    info = models.large_model(path, int(size * GB))
    label = f"{info['weight_bytes'] / GB:.2f} GB MatMul chain" + (
        " (quick stand-in for >2 GB)" if quick else ""
    )
    rows = _large_cli_rows(path, label, work / "out", LARGE_CLI_RUNS, timeout * 3)
    capped: dict[str, Any] = {}
    if cap is not None:
        capped = _large_capped(path, label, work / "out", cap, info["weight_bytes"], timeout * 3)
        rows += capped.pop("rows")
    for tool in ("onnx-floor", "gskit-prepare", *FOLD_TOOLS):
        runs = 1
        rows.append(
            _measure(
                "large",
                label,
                tool,
                path,
                work / "out",
                runs=runs,
                timeout=timeout * 3,
                compare=tool != "onnx-floor",
            )
        )
    shutil.rmtree(path.parent, ignore_errors=True)
    return rows, {"weight_bytes": info["weight_bytes"], "stand_in": quick, **capped}


#: The rows of the large model's whole processes: the floor, and the command line with the default recipe.
FLOOR_PROCESS, PREPARE_CLI = "onnx-floor (process)", "gskit prepare (CLI)"


def _large_cli_rows(model: Path, label: str, out: Path, runs: int, timeout: float) -> list[Row]:
    """``gskit prepare MODEL -o OUT`` and the floor, each a whole process, ``runs`` pairs back to back:
    median wall, the largest peak RSS and peak anonymous memory (``large_model_memory.run_process``); the
    command's own verdict (its validate step) is the row's match, its steps' times are in ``detail``."""
    from bench.large_model_memory import floor_command, prepare_command, run_process

    measured: dict[str, list[dict[str, Any]]] = {FLOOR_PROCESS: [], PREPARE_CLI: []}
    for _ in range(runs):
        for tool, argv in (
            (FLOOR_PROCESS, floor_command(model, out / "floor.onnx")),
            (PREPARE_CLI, prepare_command(model, out / "prepared")),
        ):
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            result = run_process(argv, timeout=timeout)
            report = out / "prepared" / "report.json"
            if report.is_file():
                result["report"] = json.loads(report.read_text())
            result["written_bytes"] = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
            measured[tool].append(result)
            log.info("large %s: %.1f s, rc %s", tool, result["seconds"], result["returncode"])
    shutil.rmtree(out, ignore_errors=True)
    rows = []
    for tool, results in measured.items():
        row = Row("large", label, tool, runs=len(results))
        failed = [r for r in results if r["returncode"] != 0]
        if failed:
            row.status, row.note = "failed", (failed[0]["stderr"].strip().splitlines() or ["?"])[-1][:200]
        row.seconds = statistics.median(r["seconds"] for r in results)
        row.peak_rss = max(r["peak_rss"] for r in results)
        reports = [r["report"] for r in results if "report" in r]
        if reports:
            row.match = all(report.get("passed") is True for report in reports)
            row.nodes_before = reports[-1]["steps"][0]["nodes_before"]
            row.nodes_after = reports[-1]["steps"][-1]["nodes_after"]
        row.detail = {
            "all_seconds": [round(r["seconds"], 2) for r in results],
            "peak_anon": max(r["peak_anon"] for r in results),
            "written_bytes": results[-1]["written_bytes"],
            "steps": [
                [(step["name"], round(step["seconds"], 2)) for step in report["steps"]] for report in reports
            ],
        }
        rows.append(row)
        _DONE.append(row)
    return rows


#: The smallest cap worth running: a process with onnx, onnxruntime and numpy imported holds about this much.
MIN_CAP_BYTES = 256 << 20


def _large_capped(
    model: Path, label: str, out: Path, cap: float, weights: int, timeout: float
) -> dict[str, Any]:
    """The command and the floor in cgroup-v1 memory groups (``large_model_memory.MemoryGroup``), each once
    without a cap and once capped at ``cap`` x the weights, the model's page cache dropped before each run:
    what memory they need, as opposed to the file pages the kernel counts in their RSS. Returns ``rows`` and
    ``memory_cap`` for the JSON (``skipped`` with the reason where memory groups cannot be made)."""
    from bench.large_model_memory import (
        floor_command,
        memory_groups_unavailable,
        prepare_command,
        run_in_group,
    )

    why = memory_groups_unavailable()
    if not why and cap * weights < MIN_CAP_BYTES:
        # The quick stand-in's weights are small enough that the cap falls below what the interpreter and its
        # libraries need on their own: an out-of-memory there would say nothing about the weights.
        why = f"{cap} x the weights is under {MIN_CAP_BYTES >> 20} MiB, less than the interpreter alone needs"
    if why:
        log.warning("large: memory cap skipped: %s", why)
        return {"rows": [], "memory_cap": {"fraction": cap, "skipped": why}}
    limit = int(cap * weights)
    measured = []
    for base, argv in (
        (FLOOR_PROCESS, floor_command(model, out / "floor.onnx")),
        (PREPARE_CLI, prepare_command(model, out / "prepared")),
    ):
        for capped in (False, True):
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            result = run_in_group(argv, model.parent, limit if capped else None, timeout=timeout)
            report = out / "prepared" / "report.json"
            passed = json.loads(report.read_text()).get("passed") if report.is_file() else None
            tool = f"{base}, cold, " + (f"capped {cap:g}x weights" if capped else "no cap")
            row = Row("large", label, tool, runs=1, seconds=result["seconds"], peak_rss=result["peak_rss"])
            group = result["group"]
            if result["returncode"] != 0:
                killed = group["oom_kills"] > 0
                row.status = "out of memory" if killed else "failed"
                row.note = "killed by the group's OOM killer" if killed else result["stderr"].strip()[-200:]
            row.match = passed if base == PREPARE_CLI else None
            row.detail = {
                "capped": capped,
                "returncode": result["returncode"],
                "peak_anon": result["peak_anon"],
                "group": group,
                "in_weights": {
                    "max_usage": round(group["max_usage"] / weights, 3),
                    **{k: round(v / weights, 3) for k, v in group["at_peak"].items()},
                },
            }
            log.info("large %s: %.1f s, rc %s", tool, result["seconds"], result["returncode"])
            measured.append(_record(row))
    shutil.rmtree(out, ignore_errors=True)
    return {"rows": measured, "memory_cap": {"fraction": cap, "limit": limit, "skipped": None}}


# -- cli: the command line as users run it -------------------------------------------------------------------

EXAMPLE = REPO / "gskit" / "data" / "example.onnx"
CLI_QUICK_LIGHT = ("light_squeezenet",)
CLI_FULL_LIGHT = ("light_squeezenet", "light_shufflenet", "light_inception_v1", "light_resnet50")
CLI_RUNS = 3
#: What a Python user calls instead of the command (``python -c``, after the probe that imported ``sys``);
#: each prints the seconds of the call, imports excluded.
LIBRARY_PREPARE = """
import json, time
from gskit.pipeline.prepare import prepare
start = time.perf_counter()
report = prepare(sys.argv[1], sys.argv[2])
print(json.dumps({"seconds": time.perf_counter() - start, "passed": report.passed}))
"""
LIBRARY_COMPARE = """
import json, time
from functools import partial
from gskit.compare.outputs import compare
from gskit.plugin.discovery import load_plugins
start = time.perf_counter()
# the plugins as the command line gives them: loaded only for a model with nodes of a custom domain
report = compare(sys.argv[1], sys.argv[2], plugins=partial(load_plugins, None))
print(json.dumps({"seconds": time.perf_counter() - start, "passed": report.passed}))
"""
#: The floors (``bench/floors.py``), after their imports so that the work is timed alone; a compare floor
#: whose outputs differ says so instead of exiting.
FLOOR_SESSION = f"""
import json
sys.path.insert(0, {str(REPO)!r})
import numpy, onnx, onnxruntime
from bench.floors import session_floor
print(json.dumps({{"seconds": session_floor(sys.argv[1])}}))
"""
FLOOR_COMPARE = f"""
import json
sys.path.insert(0, {str(REPO)!r})
import numpy, onnxruntime
from bench.floors import compare_floor
try:
    print(json.dumps({{"seconds": compare_floor(sys.argv[1], sys.argv[2]), "match": True}}))
except SystemExit as differ:
    print(json.dumps({{"match": False, "note": str(differ)}}))
"""
FLOOR_PLUGINS = f"""
import json
sys.path.insert(0, {str(REPO)!r})
import numpy, onnx, onnxruntime
from bench.floors import parse_references, plugin_compare_floor
try:
    seconds = plugin_compare_floor(sys.argv[1], sys.argv[2], parse_references(sys.argv[3:]))
    print(json.dumps({{"seconds": seconds, "match": True}}))
except SystemExit as differ:
    print(json.dumps({{"match": False, "note": str(differ)}}))
"""
#: Start-up commands, the floor each is divided by, and the watched packages each may import (it uses them).
STARTUP = (
    ("gskit --version", ["--version"], "python -c pass", ()),
    ("gskit --help", ["--help"], "python -c pass", ()),
    (
        "gskit inspect",
        ["inspect", "{model}"],
        "python -c import onnx",
        ("onnx", "numpy", "onnx_graphsurgeon"),
    ),
)
STARTUP_FLOORS = {"python -c pass": "pass", "python -c import onnx": "import onnx"}


def _cli_suite(
    work: Path,
    quick: bool,
    timeout: float,
    runs: int,
    models_list: list[tuple[str, Path]] | None = None,
    *,
    warmup: bool = True,
) -> list[Row]:
    """Whole processes of ``gskit`` beside the library calls and the floors, all in this run.

    ``models_list``: (label, path) of the models (default: the example, then light models); the start-up
    commands' ``inspect`` reads the first. ``warmup``: run each command once unmeasured first.
    """
    if models_list is None:
        names = CLI_QUICK_LIGHT if quick else CLI_FULL_LIGHT
        models_list = [("example", EXAMPLE)] + [(p.stem, p) for p in models.light_models() if p.stem in names]
    (work / "cli").mkdir(parents=True, exist_ok=True)
    cli = _CliRuns(runs, timeout, pycache_env(), warmup, work / "cli")
    rows = _cli_startup_rows(cli, models_list[0][1])
    for label, path in models_list:
        rows += _cli_model_rows(cli, label, path, work / "cli" / label)
    return rows


@dataclass
class _CliRuns:
    """How the ``cli`` suite runs each command (``bench.processes.measure_process``)."""

    runs: int
    timeout: float
    env: dict[str, str]
    warmup: bool
    cwd: Path  # where the commands run: a folder of their own, as a user's (gskit also reads ./plugins)

    def row(self, model: str, tool: str, command: Command) -> Row:
        """Measure ``command``: one row, recorded in the partial JSON."""
        measured = measure_process(
            command, runs=self.runs, timeout=self.timeout, cwd=self.cwd, env=self.env, warmup=self.warmup
        )
        return _record(self._row(model, tool, command, measured))

    def pair(
        self, model: str, tool: str, command: Command, floor_tool: str, floor: Command
    ) -> tuple[Row, Row]:
        """Measure ``command`` and its floor in turn (``bench.processes.measure_pair``): the command's row
        gets the median of the per-pair ratios, which a drift of the machine's speed does not move."""
        mine, theirs, ratios = measure_pair(
            command,
            floor,
            runs=self.runs,
            timeout=self.timeout,
            cwd=self.cwd,
            env=self.env,
            warmup=self.warmup,
        )
        floor_row = _record(self._row(model, floor_tool, floor, theirs))
        row = self._row(model, tool, command, mine)
        _against(row, floor_row, pair_ratios=ratios)
        return _record(row), floor_row

    def _row(self, model: str, tool: str, command: Command, measured: Measured) -> Row:
        row = Row("cli", model, tool, status=measured.status, seconds=measured.seconds, note=measured.note)
        row.runs, row.peak_rss = len(measured.all_seconds), measured.peak_rss
        # prepare and compare exit 0 when the outputs matched; the floors and library calls say it in JSON
        passed = measured.output.get("passed", measured.output.get("match"))
        if command.kind == "gskit" and command.args[0] in ("prepare", "compare") and measured.status == "ok":
            passed = measured.returncode == 0
        row.match = passed if isinstance(passed, bool) else None
        row.detail = {
            "command": command.display(),
            "all_seconds": measured.all_seconds,
            "work_seconds": measured.work_seconds,
            "returncode": measured.returncode,
            "imports": [name for name in WATCHED if name in measured.modules],
            "modules": len(measured.modules),
        }
        log.info("cli %s %s: %s %s s", model, tool, row.status, row.seconds)
        return row


def _cli_startup_rows(cli: _CliRuns, model: Path) -> list[Row]:
    """``--version``, ``--help`` and ``inspect`` beside ``python -c pass`` and ``python -c "import onnx"``."""
    floors = {
        name: cli.row("-", f"floor: {name}", Command("code", [code])) for name, code in STARTUP_FLOORS.items()
    }
    rows = list(floors.values())
    for tool, args, floor, allowed in STARTUP:
        command = Command("gskit", [a.format(model=model) for a in args])
        row = cli.row(model.stem if "{model}" in args[-1] else "-", tool, command)
        _against(row, floors[floor])
        row.detail["unused_imports"] = [m for m in row.detail["imports"] if m not in allowed]
        rows.append(row)
    return rows


def _cli_model_rows(cli: _CliRuns, label: str, model: Path, work: Path) -> list[Row]:
    """prepare, then compare of the original with what it wrote: the command, the library call, the floor."""
    out, lib_out = work / "prepared", work / "library"
    floor_command = Command("code", [FLOOR_SESSION, str(model)], label="bench/floors.py session MODEL")
    prepare_command = Command("gskit", ["prepare", str(model), "-o", str(out)], fresh=out)
    prepare_cli, session = cli.pair(
        label, "gskit prepare", prepare_command, "floor: one session", floor_command
    )
    lib_command = Command("code", [LIBRARY_PREPARE, str(model), str(lib_out)], lib_out, "prepare(MODEL, OUT)")
    prepare_lib = cli.row(label, "library prepare()", lib_command)
    _against(prepare_lib, session, work_time=True)
    rows = [session, prepare_cli, prepare_lib]
    prepared = out / "model.onnx"
    if prepared.exists():
        pair = [str(model), str(prepared)]
        # a plain session cannot run plugin nodes (gskit runs their references): the floor then runs two
        # sessions of the original, the same work for a plain script
        plain = not _has_custom_nodes(prepared)
        floor_pair = pair if plain else [str(model), str(model)]
        floor_command = Command("code", [FLOOR_COMPARE, *floor_pair], label="bench/floors.py compare A B")
        compare_command = Command("gskit", ["compare", *pair])
        compare_cli, two = cli.pair(
            label, "gskit compare", compare_command, "floor: two sessions", floor_command
        )
        if not plain:
            two.detail["floor_note"] = "the prepared model has plugin nodes: the original twice"
            # what a script must add to run the plugin nodes at all: onnx, and their references as
            # onnxruntime-extensions Python ops (bench/floors.py plugins)
            references = _plugin_references(prepared)
            plugin_floor = Command(
                "code", [FLOOR_PLUGINS, *pair, *references], label="bench/floors.py plugins A B --reference"
            )
            compare_again, python_ops = cli.pair(
                label, PLUGIN_FLOOR_COMPARE, compare_command, "floor: plugin nodes as PyOps", plugin_floor
            )
            rows += [python_ops, compare_again]
        compare_lib = cli.row(
            label, "library compare()", Command("code", [LIBRARY_COMPARE, *pair], label="compare(A, B)")
        )
        _against(compare_lib, two, work_time=True)
        rows += [two, compare_cli, compare_lib]
    shutil.rmtree(work, ignore_errors=True)
    return rows


def _plugin_references(path: Path) -> list[str]:
    """``DOMAIN:OP=MODULE:FUNCTION`` of the reference of each plugin op in the model (the shipped plugins)."""
    import onnx

    from gskit.plugin.discovery import load_plugins
    from gskit.plugin.ops import ORT_DOMAINS

    registry = load_plugins(None)
    references = {}
    for node in onnx.load(str(path), load_external_data=False).graph.node:
        spec = registry.for_node(node) if node.domain not in ORT_DOMAINS else None
        if spec is not None and spec.reference is not None:
            function = spec.reference
            references[f"{node.domain}:{node.op_type}"] = f"{function.__module__}:{function.__qualname__}"
    return [f"{op}={target}" for op, target in references.items()]


def _has_custom_nodes(path: Path) -> bool:
    """Whether the model has a node outside the domains onnxruntime runs itself (a plugin node)."""
    import onnx

    from gskit.plugin.ops import ORT_DOMAINS

    proto = onnx.load(str(path), load_external_data=False)
    return any(node.domain not in ORT_DOMAINS for node in proto.graph.node)


def _against(
    row: Row, floor: Row, *, work_time: bool = False, pair_ratios: list[float] | None = None
) -> None:
    """Set ``row``'s ratio to ``floor``: whole process to whole process (``pair_ratios``: the median of the
    ratios of runs made in turn), or (``work_time``, a library call) the call's time to the floor's work after
    its imports."""
    row.detail["floor"] = floor.tool
    mine = row.detail["work_seconds"] if work_time else row.seconds
    theirs = floor.detail["work_seconds"] if work_time else floor.seconds
    row.detail["ratio"] = round(mine / theirs, 3) if mine and theirs else None
    row.detail["ratio_of"] = "work after imports" if work_time else "whole process"
    if pair_ratios:
        row.detail["pair_ratios"] = pair_ratios
        row.detail["ratio"] = round(statistics.median(pair_ratios), 3)
        row.detail["ratio_of"] = f"whole process, median of {len(pair_ratios)} pairs run in turn"
    if row.peak_rss and floor.peak_rss:
        row.detail["peak_ratio"] = round(row.peak_rss / floor.peak_rss, 3)


# -- goals -------------------------------------------------------------------------------------------------


def _ok(row: Row) -> bool:
    return row.status == "ok" and row.match is not False


def goals(rows: list[Row], large: dict[str, Any] | None, quick: bool) -> list[dict[str, Any]]:
    """Each goal with its measured value and whether it is met (None: not measured in this run)."""
    result = []
    fold_rows = [r for r in rows if r.suite == "fold"]
    if fold_rows:
        by_model: dict[str, dict[str, Row]] = {}
        for r in fold_rows:
            by_model.setdefault(r.model, {})[r.tool] = r
        nodes_met, poly_met, time_ratios = 0, 0, []
        for tools in by_model.values():
            g = tools.get("gskit")
            peers = [r.nodes_after for t, r in tools.items() if not t.startswith("gskit") and _ok(r)]
            nolimit = tools.get(NOLIMIT)
            if nolimit and _ok(nolimit) and (not g or not _ok(g) or nolimit.nodes_after < g.nodes_after):
                g = nolimit  # the goal counts gskit's best setting; the table shows both
            if g and _ok(g) and (not peers or g.nodes_after <= min(peers)):
                nodes_met += 1
            p = tools.get("polygraphy")  # time and nodes of the same gskit setting are compared
            if g and _ok(g) and (not (p and _ok(p)) or g.nodes_after <= p.nodes_after):
                poly_met += 1
            if g and p and _ok(g) and _ok(p) and p.seconds:
                time_ratios.append(g.seconds / p.seconds)
        result.append(
            _goal(
                "fold removes >= nodes of the best peer",
                f"{nodes_met}/{len(by_model)} models",
                nodes_met == len(by_model),
            )
        )
        result.append(
            _goal(
                "(context) fold removes >= nodes of Polygraphy",
                f"{poly_met}/{len(by_model)} models",
                poly_met == len(by_model),
            )
        )
        worst = max(time_ratios) if time_ratios else None
        result.append(
            _goal(
                "fold time <= 1.0x Polygraphy (worst model)",
                f"{worst:.2f}x (median {statistics.median(time_ratios):.2f}x)" if worst else "n/a",
                worst <= 1.0 if worst else None,
            )
        )
    rep = sorted((r for r in rows if r.suite == "replace" and r.status == "ok"), key=lambda r: r.nodes_before)
    if len(rep) >= 2:
        lo, hi = rep[0], rep[-1]
        ratio, size_ratio = hi.seconds / lo.seconds, hi.nodes_before / lo.nodes_before
        limit = 10.5 * size_ratio / 10
        result.append(
            _goal(
                f"replace t({hi.nodes_before // 1000}k)/t({lo.nodes_before / 1000:.0f}k) <= {limit:.3g}",
                f"{ratio:.1f} for {size_ratio:.0f}x nodes",
                ratio <= limit,
            )
        )
    four_hundred = [r for r in rows if r.suite == "replace" and r.detail.get("instances") == 400]
    if four_hundred:
        r = four_hundred[0]
        result.append(
            _goal(
                "400 instances in ~10k nodes <= 0.5 s",
                f"{r.seconds:.2f} s" if r.seconds else r.status,
                bool(r.seconds and r.seconds <= 0.5 and r.match is not False),
            )
        )
    big = {r.tool: r for r in rows if r.suite == "large"}
    if big and large:
        weights, tag = large["weight_bytes"], " (stand-in)" if large["stand_in"] else ""
        g = big.get("gskit")
        if g:
            ratio = g.peak_rss / weights if g.peak_rss else None
            result.append(
                _goal(
                    f"fold large{tag}: peak RSS <= 1.5x model",
                    f"{ratio:.2f}x" if ratio else g.status,
                    bool(ratio and ratio <= 1.5 and _ok(g)),
                )
            )
        p, floor = big.get("gskit-prepare"), big.get("onnx-floor")
        if p:
            ratio = p.peak_rss / weights if p.peak_rss else None
            result.append(
                _goal(
                    f"prepare large{tag} (library, transform steps): peak RSS <= 1.3x weights",
                    f"{ratio:.2f}x" if ratio else p.status,
                    bool(ratio and ratio <= 1.3 and _ok(p)),
                )
            )
        cli, floor_process = big.get(PREPARE_CLI), big.get(FLOOR_PROCESS)
        for name, row, under, limit in (
            (f"prepare large{tag} (library, transform steps): wall <= 2x I/O floor", p, floor, 2.0),
            (
                f"prepare CLI large{tag} (default recipe, whole process): wall <= 1.5x I/O floor",
                cli,
                floor_process,
                1.5,
            ),
        ):
            if row and under and row.seconds and under.seconds:
                ratio = row.seconds / under.seconds
                value = f"{ratio:.2f}x ({row.seconds:.1f} s vs {under.seconds:.1f} s)"
                result.append(_goal(name, value, ratio <= limit and _ok(row)))
        if cli and cli.peak_rss:
            ratio, anon = cli.peak_rss / weights, cli.detail.get("peak_anon", 0) / weights
            result.append(
                _goal(
                    f"prepare CLI large{tag} (default recipe, whole process): peak RSS <= 0.3x weights",
                    f"{ratio:.2f}x ({anon:.2f}x anonymous; the rest: weight file pages onnxruntime maps)",
                    ratio <= 0.3 and _ok(cli),
                )
            )
        result += _capped_goals(big, large, tag)
    return result + _cli_goals([r for r in rows if r.suite == "cli"])


def _capped_goals(big: dict[str, Row], large: dict[str, Any], tag: str) -> list[dict[str, Any]]:
    """The large suite's memory-group runs (``--large-cap``): does the command complete under the cap, at what
    wall time against its uncapped run, and does the floor."""
    cap = large.get("memory_cap")
    if not cap:
        return []
    name = f"prepare CLI large{tag}: completes in a memory group capped at {cap['fraction']:g}x weights"
    if cap.get("skipped"):
        return [_goal(name, f"skipped: {cap['skipped']}", None)]
    suffix = f"capped {cap['fraction']:g}x weights"
    capped, free = big.get(f"{PREPARE_CLI}, cold, {suffix}"), big.get(f"{PREPARE_CLI}, cold, no cap")
    floor = big.get(f"{FLOOR_PROCESS}, cold, {suffix}")
    if not capped or not free:
        return []
    value = f"{capped.status}, {capped.seconds:.1f} s vs {free.seconds:.1f} s uncapped"
    value += f"; group peak {capped.detail['in_weights']['max_usage']:.2f}x weights"
    if floor:
        value += f"; onnx floor capped: {floor.status}"
    return [_goal(name, value, _ok(capped))]


#: (command row, library row, limit, goal) of the ``cli`` suite's ratio goals.
CLI_RATIO_GOALS = (
    (
        "gskit prepare",
        "library prepare()",
        1.5,
        "small models: prepare <= 1.5x floor (load, one session, run once)",
    ),
    ("gskit compare", "library compare()", 1.3, "compare <= 1.3x a plain two-session script"),
)
#: ``gskit compare`` of a model with plugin nodes again, against the two-session script that runs them as
#: Python ops (``bench/floors.py plugins``): the issue's plain script cannot run them at all.
PLUGIN_FLOOR_COMPARE = "gskit compare (plugin floor)"
#: Commands that use no torch-using step in the ``cli`` suite.
TORCH_FREE = ("gskit prepare", "gskit compare", "gskit inspect", "gskit --help", "gskit --version")


def _cli_goals(cli: list[Row]) -> list[dict[str, Any]]:
    """The issue 27 goals measured by the ``cli`` suite: each command (whole process) and library call
    against its floor, and the packages each start-up command imports."""
    if not cli:
        return []
    result = []
    for command, library, limit, name in CLI_RATIO_GOALS:
        for tool, label in ((command, "command, whole process"), (library, "library call, after imports")):
            measured = [r for r in cli if r.tool == tool]
            ratios = [r.detail.get("ratio") for r in measured]
            if not measured or None in ratios:
                failed = next((r for r in measured if r.detail.get("ratio") is None), None)
                result.append(_goal(f"{name} [{label}]", failed.status if failed else "n/a", None))
                continue
            worst = max(measured, key=lambda r: r.detail["ratio"])
            value = ", ".join(f"{r.model} {r.detail['ratio']:.2f}x" for r in measured)
            met = worst.detail["ratio"] <= limit and all(_ok(r) for r in measured)
            result.append(_goal(f"{name} [{label}]", f"worst {worst.detail['ratio']:.2f}x ({value})", met))
    against_plugins = [r for r in cli if r.tool == PLUGIN_FLOOR_COMPARE]
    if against_plugins:
        ratios = [r.detail.get("ratio") for r in against_plugins]
        pairs = zip(against_plugins, ratios, strict=True)
        value = ", ".join(f"{r.model} {ratio:.2f}x" for r, ratio in pairs if ratio is not None)
        met = None not in ratios and max(ratios) <= 1.3 and all(_ok(r) for r in against_plugins)
        result.append(
            _goal(
                "compare with plugin nodes <= 1.3x a two-session script that runs them as Python ops "
                "(beside the goal above, whose plain script cannot run them) [command, whole process]",
                value or against_plugins[0].status,
                met,
            )
        )
    torch_users = sorted(
        {f"{r.tool} ({r.model})" for r in cli if r.tool in TORCH_FREE and "torch" in r.detail["imports"]}
    )
    checked = [r for r in cli if r.tool in TORCH_FREE and r.status == "ok"]
    result.append(
        _goal(
            "torch never imported by prepare/compare/inspect/--help/--version",
            ", ".join(torch_users) if torch_users else f"not imported ({len(checked)} commands)",
            not torch_users if checked else None,
        )
    )
    startup = [r for r in cli if "unused_imports" in r.detail]
    if startup:
        extra = [
            f"{r.tool.removeprefix('gskit ')}: {', '.join(r.detail['unused_imports'])}"
            for r in startup
            if r.detail["unused_imports"]
        ]
        result.append(
            _goal(
                "--help, --version, inspect import only what they use",
                "; ".join(extra) if extra else "nothing unused",
                not extra and all(r.status == "ok" for r in startup),
            )
        )
    return result


def _goal(name: str, value: str, met: bool | None) -> dict[str, Any]:
    return {"goal": name, "value": value, "met": met}


# -- output ------------------------------------------------------------------------------------------------


def _fmt_row(r: Row) -> tuple[Any, ...]:
    match = {True: "yes", False: "NO", None: "-"}[r.match]
    if r.match is not None and r.max_abs_err is not None:
        match += f" ({r.max_abs_err:.1e})"
    return (
        r.suite,
        r.model,
        r.tool,
        r.status if r.status == "ok" else Text.assemble((r.status, "red"), f" {r.note[:60]}"),
        f"{r.seconds:.3f}" if r.seconds is not None else "-",
        str(r.runs),
        f"{r.peak_rss / MB:.0f}" if r.peak_rss else "-",
        f"{r.nodes_before}" if r.nodes_before is not None else "-",
        f"{r.nodes_after}" if r.nodes_after is not None else "-",
        match,
    )


CLI_COLUMNS = (
    "model",
    "what",
    "wall s (median)",
    "work s",
    "peak MB",
    "floor",
    "floor wall s",
    "floor work s",
    "ratio",
    "ratio of",
    "watched packages imported",
)


def _fmt_cli_row(r: Row, rows: list[Row]) -> tuple[Any, ...]:
    floor = next(
        (f for f in rows if f.suite == "cli" and f.model in (r.model, "-") and f.tool == r.detail["floor"]),
        None,
    )
    work = r.detail.get("work_seconds")
    ratio = r.detail.get("ratio")
    return (
        r.model,
        r.detail["command"] if r.status == "ok" else Text.assemble((r.status, "red"), f" {r.note[:60]}"),
        f"{r.seconds:.2f}" if r.seconds is not None else "-",
        f"{work:.2f}" if work is not None else "-",
        f"{r.peak_rss / MB:.0f}" if r.peak_rss else "-",
        r.detail["floor"].removeprefix("floor: "),
        f"{floor.seconds:.2f}" if floor and floor.seconds is not None else "-",
        f"{floor.detail['work_seconds']:.2f}"
        if floor and floor.detail.get("work_seconds") is not None
        else "-",
        f"{ratio:.2f}x" if ratio is not None else "-",
        r.detail["ratio_of"],
        ", ".join(r.detail["imports"]) or "none",
    )


def render(rows: list[Row], goal_rows: list[dict[str, Any]], quick: bool) -> None:
    from gskit.io.report import console, table

    out = console()
    cols = (
        "suite",
        "model",
        "tool",
        "status",
        "wall s (median)",
        "runs",
        "peak RSS MB",
        "nodes before",
        "nodes after",
        f"outputs match (atol {ATOL:g}, rtol {RTOL:g})",
    )
    out.print(table("gskit vs peers" + (" (--quick)" if quick else ""), cols, [_fmt_row(r) for r in rows]))
    cli = [r for r in rows if r.suite == "cli" and "floor" in r.detail]
    if cli:
        out.print(
            table("command line and library vs floors", CLI_COLUMNS, [_fmt_cli_row(r, rows) for r in cli])
        )
    # Table cells are escaped, so colour goes through rich Text rather than markup tags.
    marks = {True: Text("met", style="green"), False: Text("not met", style="red"), None: "not measured"}
    out.print(
        table(
            "goals",
            ("goal", "measured", "status"),
            [(g["goal"], g["value"], marks[g["met"]]) for g in goal_rows],
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small models only (about a minute or two)")
    parser.add_argument("--json", type=Path, default=None, help="write results here (default bench/results/)")
    parser.add_argument(
        "--only", default=",".join(SUITES), help=f"comma-separated suites of {','.join(SUITES)}"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds per measurement (default 60 quick, 120 full; x3 for the big graphs)",
    )
    parser.add_argument(
        "--large-gb", type=float, default=2.5, help="weights of the large model in GB (full run)"
    )
    parser.add_argument(
        "--large-cap",
        type=float,
        default=None,
        metavar="FRACTION",
        help="large suite: also run the command and the floor in cgroup-v1 memory groups, without a cap and "
        "capped at FRACTION x the weights (e.g. 0.3; needs a writable /sys/fs/cgroup/memory, else skipped)",
    )
    parser.add_argument(
        "--dir", type=Path, default=None, help="folder for generated models (default: temporary)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log each measurement")
    parser.add_argument(
        "--models",
        default="",
        help="fold suite: only models whose label contains one of "
        "these comma-separated strings (e.g. light_,transformer)",
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=None,
        help="runs per small model (default 1 quick, 3 full; cli suite: 3 after one unmeasured)",
    )
    args = parser.parse_args(argv)
    models_filter = [m.strip() for m in args.models.split(",") if m.strip()]
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(only) - set(SUITES)
    if unknown:
        parser.error(f"--only: unknown suite(s) {sorted(unknown)}; choose from {','.join(SUITES)}")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    timeout = args.timeout or (60.0 if args.quick else 120.0)
    json_path = args.json or REPO / "bench" / "results" / f"bench-{'quick' if args.quick else 'full'}.json"

    json_path.parent.mkdir(parents=True, exist_ok=True)
    _PARTIAL_JSON.append(json_path.with_suffix(".partial.json"))
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="gskit-bench-", dir=args.dir))
    rows: list[Row] = []
    large = None
    try:
        if "fold" in only:
            rows += _fold_suite(
                work, args.quick, timeout, models_filter, args.runs or (1 if args.quick else 3)
            )
        if "replace" in only:
            rows += _replace_suite(work, args.quick, timeout)
        if "large" in only:
            large_rows, large = _large_suite(work, args.quick, timeout, args.large_gb, args.large_cap)
            rows += large_rows
        if "cli" in only:
            rows += _cli_suite(work, args.quick, timeout, args.runs or CLI_RUNS)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    goal_rows = goals(rows, large, args.quick)
    render(rows, goal_rows, args.quick)
    result = {
        "quick": args.quick,
        "suites": only,
        "seconds": round(time.perf_counter() - started, 1),
        "tolerance": {"atol": ATOL, "rtol": RTOL},
        "prepare_steps": list(PREPARE_STEPS),
        "machine": {
            "python": platform.python_version(),
            "cpus": __import__("os").cpu_count(),
            "platform": platform.platform(),
        },
        "large_model": large,
        "rows": [r.as_dict() for r in rows],
        "goals": goal_rows,
    }
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=2))
    from gskit.io.report import console

    console().print(f"wrote {json_path} ({result['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
