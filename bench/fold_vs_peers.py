"""Node counts and times of gskit.passes.fold against Polygraphy's fold (and onnxsim / onnxslim when
importable), all in one process.

Usage: ``python bench/fold_vs_peers.py [MODEL ...] [--runs N] [--json FILE] [--tools gskit,polygraphy]
[--baseline CHECKOUT]`` (default: the nine light_*.onnx models shipped in the onnx wheel).

``--baseline CHECKOUT`` adds the tool ``baseline``: the ``gskit/passes/fold`` package of another checkout of
gskit (main, say) and its ``gskit/passes/tensor_types.py``, loaded into this process under another name (the
rest of gskit is this one's), so a change to fold is timed against the code before it under the same load,
round by round.

Per model, every tool first folds the model once unmeasured (its imports, onnxruntime's first session, sympy
for the tools that run onnxruntime's symbolic shape inference: whichever tool ran first would otherwise pay
them for the others), then ``--runs`` rounds fold a fresh copy with each tool, the tools' order rotating from
round to round; a tool's time is the median of its rounds (wall ``seconds`` and ``cpu_seconds``, the process's
CPU time, which other processes on a shared machine disturb less). The table ends with gskit's median ratio to
each other tool and on how many models gskit was slower. ``peak_rss_mib`` is the process's peak RSS after
the tool's warm-up run (monotonic, so read it for the first tool or run one model per process to compare
memory). Progress goes to stderr; ``--json FILE`` writes the rows.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import statistics
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

import onnx

from gskit.io import model as gsmodel
from gskit.passes.fold import FoldOptions, fold

LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def _gskit(model: onnx.ModelProto) -> onnx.ModelProto:
    return fold(model)[0]


def _polygraphy(model: onnx.ModelProto) -> onnx.ModelProto:
    from polygraphy.backend.onnx import fold_constants
    from polygraphy.logger import G_LOGGER

    G_LOGGER.module_severity = G_LOGGER.ERROR
    return fold_constants(model, size_threshold=FoldOptions().size_threshold)  # the same limit as gskit's


def _onnxsim(model: onnx.ModelProto) -> onnx.ModelProto:
    import onnxsim

    return onnxsim.simplify(model)[0]


def _onnxslim(model: onnx.ModelProto) -> onnx.ModelProto:
    import onnxslim

    return onnxslim.slim(model)


def baseline_fold(checkout: Path) -> Callable[[onnx.ModelProto], onnx.ModelProto]:
    """``fold`` of ``CHECKOUT/gskit/passes/fold`` and the ``gskit/passes/tensor_types.py`` it infers shapes
    with, their modules loaded as ``gskit_baseline_fold.*`` (their imports of one another renamed; every
    other gskit import is this checkout's)."""
    folder = checkout / "gskit" / "passes" / "fold"
    package = types.ModuleType("gskit_baseline_fold")
    package.__path__ = []
    sys.modules[package.__name__] = package
    files = {p.stem: p for p in folder.glob("*.py") if p.stem != "__init__"}
    files["tensor_types"] = checkout / "gskit" / "passes" / "tensor_types.py"
    pending = sorted(files)
    # load in dependency order: a module whose imports of its siblings are all loaded goes next
    while pending:
        for stem in pending:
            source = (
                files[stem]
                .read_text()
                .replace("gskit.passes.fold.", "gskit_baseline_fold.")
                .replace("gskit.passes.tensor_types ", "gskit_baseline_fold.tensor_types ")
            )
            needs = {m for m in pending if m != stem and f"gskit_baseline_fold.{m} " in source}
            if needs:
                continue
            module = types.ModuleType(f"gskit_baseline_fold.{stem}")
            module.__file__ = str(files[stem])
            sys.modules[module.__name__] = module
            exec(compile(source, module.__file__, "exec"), module.__dict__)  # noqa: S102  # a checkout of gskit
            pending.remove(stem)
            break
        else:
            raise RuntimeError(f"{folder}: modules import one another in a cycle: {pending}")
    fold_fn = sys.modules["gskit_baseline_fold.fold_pass"].fold
    return lambda model: fold_fn(model)[0]


def tools(
    names: list[str] | None = None, baseline: Path | None = None
) -> dict[str, Callable[[onnx.ModelProto], onnx.ModelProto]]:
    """The tools to run: gskit, the baseline checkout's fold (``baseline``), Polygraphy, and the peers that
    import (or those of ``names``)."""
    found = {"gskit": _gskit}
    if baseline is not None:
        found["baseline"] = baseline_fold(baseline)
    found["polygraphy"] = _polygraphy
    for name, fn in (("onnxsim", _onnxsim), ("onnxslim", _onnxslim)):
        try:
            __import__(name)
            found[name] = fn
        except ImportError:
            pass
    return {n: fn for n, fn in found.items() if names is None or n in names}


def _timed(
    fn: Callable[[onnx.ModelProto], onnx.ModelProto], data: bytes
) -> tuple[float, float, onnx.ModelProto]:
    """Wall and CPU seconds (the process's, every thread) of ``fn`` on a fresh copy of the model."""
    model = onnx.ModelProto.FromString(data)  # a fresh copy, outside the time
    # the graphs the previous run left (graphsurgeon's nodes and tensors refer to one another) are collected
    # here, not during the next tool's run
    gc.collect()
    start, start_cpu = time.perf_counter(), time.process_time()
    out = fn(model)
    return time.perf_counter() - start, time.process_time() - start_cpu, out


def bench(path: Path, runs: int = 3, names: list[str] | None = None, baseline: Path | None = None) -> dict:
    """One row: the model's node count and size, and per tool nodes left, median seconds and each run's."""
    model = gsmodel.load(path)
    data = model.SerializeToString()
    row: dict = {"model": path.stem, "nodes": len(model.graph.node), "size_mib": round(len(data) / 2**20, 1)}
    chosen = tools(names, baseline)
    times: dict[str, list[float]] = {name: [] for name in chosen}
    cpu_times: dict[str, list[float]] = {name: [] for name in chosen}
    for name, fn in chosen.items():
        try:
            _, _, out = _timed(fn, data)  # warm-up
            row[name] = {"nodes": len(out.graph.node)}
        except Exception as err:  # a peer failing is a result, not a crash of the bench
            row[name] = {"error": str(err).splitlines()[0][:120] if str(err) else repr(err)}
        row[name]["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    working = [name for name in chosen if "error" not in row[name]]
    for round_index in range(runs):
        shift = round_index % max(1, len(working))
        for name in working[shift:] + working[:shift]:
            wall, cpu, _ = _timed(chosen[name], data)
            times[name].append(wall)
            cpu_times[name].append(cpu)
    for name in working:
        if times[name]:
            row[name]["seconds"] = round(statistics.median(times[name]), 3)
            row[name]["runs"] = [round(t, 3) for t in times[name]]
            row[name]["cpu_seconds"] = round(statistics.median(cpu_times[name]), 3)
            row[name]["cpu_runs"] = [round(t, 3) for t in cpu_times[name]]
    return row


def summary(rows: list[dict], key: str = "seconds") -> list[str]:
    """Per tool other than gskit: the median of gskit's time over the tool's (``key``: ``seconds`` or
    ``cpu_seconds``) across the models both timed, and on how many gskit was slower."""
    lines = []
    others = [n for n in rows[0] if isinstance(rows[0][n], dict) and n != "gskit"] if rows else []
    for name in others:
        ratios = [
            r["gskit"][key] / r[name][key] for r in rows if key in r.get("gskit", {}) and r[name].get(key)
        ]
        if ratios:
            slower = sum(ratio > 1 for ratio in ratios)
            lines.append(
                f"gskit / {name} ({key}): median {statistics.median(ratios):.2f}x "
                f"({min(ratios):.2f}x-{max(ratios):.2f}x), slower on {slower} of {len(ratios)}"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path)
    parser.add_argument("--runs", type=int, default=3, help="measured rounds per model (default 3)")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="write the rows to FILE")
    parser.add_argument(
        "--tools", default=None, help="comma-separated subset of gskit,baseline,polygraphy,onnxsim,onnxslim"
    )
    parser.add_argument(
        "--baseline", type=Path, default=None, metavar="CHECKOUT", help="also time CHECKOUT's fold package"
    )
    args = parser.parse_args(argv)
    names = args.tools.split(",") if args.tools else None
    rows = []
    for path in args.models or sorted(LIGHT_DIR.glob("light_*.onnx")):
        rows.append(bench(path, args.runs, names, args.baseline))
        print(f"{path.stem}: done", file=sys.stderr, flush=True)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2))
    columns = list(tools(names, args.baseline))
    print(f"{'model':<36}{'nodes':>7}" + "".join(f"{n:>22}" for n in columns))
    for row in rows:
        cells = []
        for n in columns:
            r = row[n]
            cells.append(
                f"{'error':>22}" if "error" in r else f"{r['nodes']:>8} in {r.get('seconds', 0):>7.3f}s    "
            )
        print(f"{row['model'][:35]:<36}{row['nodes']:>7}" + "".join(cells))
    for line in summary(rows) + summary(rows, "cpu_seconds"):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
