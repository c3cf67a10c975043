"""Run one tool on one model in a child process: wall time, peak RSS, nodes, outputs on onnxruntime.

Tools (``TOOLS``): constant folding by ``gskit`` (``gskit.passes.fold.fold``; ``gskit-nolimit`` without its
16 MiB cap on new constants), ``polygraphy`` (``polygraphy surgeon sanitize --fold-constants``, run
in-process through polygraphy's CLI entry point), ``onnxsim`` (``onnxsim.simplify``) and ``onnxslim``
(``onnxslim.slim``); ``gskit-replace`` (``gskit.passes.patterns.replace`` with every plugin of ``plugins/``),
``gskit-prepare`` (``gskit.pipeline.prepare.prepare`` with the transform steps of the default recipe) and
``onnx-floor`` (bare ``onnx.load`` + ``onnx.save_model(save_as_external_data=True)``).

Each measurement is one child interpreter (``python bench/peers.py --worker ...``): it imports the tool,
then runs it ``runs`` times (load, transform, save; imports excluded from the time), reads its own peak
RSS (``VmHWM``, imports included; ``ru_maxrss`` is not used since Linux carries it over fork + exec from
the parent; ``rss_after_imports`` says how much was there before the first run), then compares the
written model's outputs with the original's on onnxruntime (CPU, graph optimizations off,
``gskit.io.feeds.random_feeds`` with seed 0, symbolic dims = 2). Outputs match when
``|a - b| <= ATOL + RTOL * |b|`` everywhere (NaN equal to NaN). The parent kills the child after
``timeout`` s; a child that dies is reported as ``crashed``, ``out of memory`` (killed by SIGKILL) or
``timeout``.

The reference outputs of each source model are cached in ``reference_cache`` (default: ``$GSKIT_BENCH_CACHE``
or ``gskit-bench/references`` in the system's temporary folder), keyed by the model's path, size and
modification time: never beside the model, which may sit inside an installed package (the onnx wheel's light
models).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

log = logging.getLogger(__name__)

FOLD_TOOLS = ("gskit", "polygraphy", "onnxsim", "onnxslim")
#: gskit fold without its 16 MiB limit on new constants (the peers have none).
NOLIMIT = "gskit-nolimit"
TOOLS = (*FOLD_TOOLS, NOLIMIT, "gskit-replace", "gskit-prepare", "onnx-floor")
ATOL = 1e-4
RTOL = 1e-3
#: Steps of ``gskit prepare`` measured on the large model: the default recipe without its check steps.
PREPARE_STEPS = ("sanitize", "replace", "infer_shapes", "fold", "infer_shapes")
#: The TensorRT version replace prepares for: older than every native form, so the measured work is pattern
#: matching and plugin node insertion (no native op written, no opset conversion), as before targets existed.
TARGET = "8.5"
_TWO_GB = 2**31


@dataclass
class Row:
    """One measurement: a tool on a model."""

    suite: str
    model: str
    tool: str
    status: str = "ok"  # ok, timeout, crashed, out of memory, failed
    seconds: float | None = None  # median of the runs, imports excluded
    runs: int = 0
    peak_rss: int | None = None  # bytes, ru_maxrss of the child
    rss_after_imports: int | None = None
    nodes_before: int | None = None
    nodes_after: int | None = None
    match: bool | None = None  # outputs within tolerance on onnxruntime (None: not checked)
    max_abs_err: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def measure(
    suite: str,
    model: str,
    tool: str,
    source: Path,
    out_dir: Path,
    *,
    runs: int = 1,
    timeout: float = 120.0,
    compare: bool = True,
    extra: dict[str, Any] | None = None,
    reference_cache: Path | None = None,
) -> Row:
    """Measure ``tool`` on ``source`` in a child process; outputs go to ``out_dir`` (removed afterwards).

    ``reference_cache`` holds the original's outputs between measurements (None:
    :func:`default_reference_cache`).
    ``extra`` is passed to the worker (``gskit-replace`` takes ``blocks``: the graph is generated in the child
    instead of read from ``source``).
    """
    row = Row(suite, model, tool)
    source, out_dir = source.resolve(), out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    job = {
        "tool": tool,
        "source": str(source),
        "out_dir": str(out_dir),
        "runs": runs,
        "compare": compare,
        "extra": extra or {},
        "reference_cache": str(reference_cache or default_reference_cache()),
    }
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(job)]
    start = time.perf_counter()
    # cwd: onnxsim and onnxruntime's symbolic shape inference (onnxslim) leave temporary files in the cwd
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=out_dir
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        row.status, row.note = "timeout", f"killed after {timeout:.0f} s"
    for line in stdout.splitlines():
        if line.startswith("{"):
            for key, value in json.loads(line).items():
                setattr(row, key, value) if hasattr(row, key) else row.detail.__setitem__(key, value)
    if row.status == "timeout" and row.seconds is not None:  # the tool finished; the output check did not
        row.status, row.note = "ok", f"outputs not checked: onnxruntime took over {timeout:.0f} s"
    if row.status != "timeout" and proc.returncode != 0:
        if proc.returncode == -signal.SIGKILL:
            row.status, row.note = "out of memory", "killed by SIGKILL (the OOM killer)"
        elif row.status == "ok":
            row.status = "crashed"
            row.note = _last_line(stderr) or f"exit status {proc.returncode}"
    log.info("%s %s %s: %s in %.1f s", suite, model, tool, row.status, time.perf_counter() - start)
    shutil.rmtree(out_dir, ignore_errors=True)
    return row


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


# -- worker (child process) ----------------------------------------------------------------------------------


def _emit(**values: Any) -> None:
    print(json.dumps(values), flush=True)


def _peak_rss() -> int:
    # ru_maxrss survives fork + exec, so a child of a big parent would report the parent's size; VmHWM belongs
    # to this process's own address space (same figure as ru_maxrss for a process started small).
    with open("/proc/self/status") as f:
        hwm = next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:")), None)
    return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _current_rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def _run_fold_tool(tool: str, source: Path, out: Path) -> None:
    if tool in ("gskit", "gskit-nolimit"):
        from gskit.io import model as gsmodel
        from gskit.passes.fold import fold

        limit = {} if tool == "gskit" else {"size_threshold": None}
        folded, _ = fold(gsmodel.load(source, load_weights=False), **limit)
        gsmodel.save(folded, out)
    elif tool == "polygraphy":
        from polygraphy.tools._main import main as polygraphy_main

        argv = ["surgeon", "sanitize", str(source), "--fold-constants", "-o", str(out), "--silent"]
        if _total_bytes(source) > _TWO_GB:
            argv += ["--save-external-data", out.name + ".data"]
        if polygraphy_main(argv):
            raise RuntimeError("polygraphy surgeon sanitize exited with an error")
    elif tool == "onnxsim":
        import onnxsim

        model, ok = onnxsim.simplify(str(source), output_path=str(out))
        if not ok:
            raise RuntimeError("onnxsim: simplified model failed its check")
        if not out.exists():
            _save_plain(model, out)
    elif tool == "onnxslim":
        import onnxslim

        onnxslim.slim(str(source), output_model=str(out))
    else:
        raise ValueError(f"unknown fold tool {tool}")


def _save_plain(model, out: Path) -> None:
    import onnx

    large = model.ByteSize() > _TWO_GB if model.ByteSize() >= 0 else True
    onnx.save_model(model, str(out), save_as_external_data=large, location=out.name + ".data")


def _total_bytes(path: Path) -> int:
    return sum(
        p.stat().st_size for p in path.parent.iterdir() if p.is_file() and p.name.startswith(path.stem)
    )


def _import_tool(tool: str) -> None:
    import onnx  # noqa: F401
    import onnxruntime  # noqa: F401

    import gskit.io.model  # noqa: F401

    modules = {
        "gskit": ["gskit.passes.fold"],
        NOLIMIT: ["gskit.passes.fold"],
        "polygraphy": ["polygraphy.tools._main", "onnx_graphsurgeon"],
        "onnxsim": ["onnxsim"],
        "onnxslim": ["onnxslim"],
        "gskit-replace": ["gskit.passes.patterns", "bench.models"],
        "gskit-prepare": ["gskit.pipeline.prepare"],
        "onnx-floor": [],
    }
    for name in modules[tool]:
        __import__(name)


def _worker(job: dict[str, Any]) -> None:
    tool, source, out_dir = job["tool"], Path(job["source"]), Path(job["out_dir"])
    _import_tool(tool)
    _emit(rss_after_imports=_current_rss())
    if tool == "gskit-replace":
        _replace_worker(job)
        return
    import onnx

    from bench.models import node_count

    _emit(nodes_before=node_count(onnx.load(str(source), load_external_data=False)))
    times = []
    out = out_dir / "out.onnx"
    for _ in range(job["runs"]):
        for p in out_dir.iterdir():
            p.unlink() if p.is_file() else shutil.rmtree(p)
        start = time.perf_counter()
        if tool in FOLD_TOOLS or tool == NOLIMIT:
            _run_fold_tool(tool, source, out)
        elif tool == "gskit-prepare":
            from gskit.pipeline.prepare import prepare
            from gskit.pipeline.recipe import make_recipe

            recipe = make_recipe([(s, {}) for s in PREPARE_STEPS], tensorrt=TARGET)
            prepare(source, out_dir / "prepared", recipe=recipe)
            out = out_dir / "prepared" / "model.onnx"
        elif tool == "onnx-floor":
            from bench.large_model_memory import onnx_floor

            onnx_floor(source, out)
        times.append(time.perf_counter() - start)
    written = sum(p.stat().st_size for p in out.parent.iterdir() if p.is_file())
    _emit(
        seconds=statistics.median(times),
        runs=len(times),
        peak_rss=_peak_rss(),
        nodes_after=node_count(onnx.load(str(out), load_external_data=False)),
        written_bytes=written,
        all_seconds=[round(t, 4) for t in times],
    )
    if job["compare"]:
        _emit(**_compare(source, out, Path(job["reference_cache"])))


def default_reference_cache() -> Path:
    """Where reference outputs are cached: ``$GSKIT_BENCH_CACHE`` or a folder in the temporary folder."""
    root = os.environ.get("GSKIT_BENCH_CACHE") or Path(tempfile.gettempdir()) / "gskit-bench"
    return Path(root) / "references"


def _reference_file(cache: Path, source: Path) -> Path:
    """The cache file of ``source``'s outputs; a rewritten model (new size or time) gets a new file."""
    stat = source.stat()
    key = hashlib.sha256(f"{source.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache / f"{source.name}.{key}.npz"


def _compare(source: Path, result: Path, cache_dir: Path | None, plugins: Any = None) -> dict[str, Any]:
    """Outputs of ``result`` against ``source``'s (cached in ``cache_dir``; None: not cached)."""
    import numpy as np

    from gskit.backends import ort as gort
    from gskit.io.feeds import random_feeds
    from gskit.io.model import load

    feeds = random_feeds(load(source, load_weights=False))
    cache = _reference_file(cache_dir, source) if cache_dir is not None else None
    if cache is not None and cache.exists():
        with np.load(cache) as data:
            expected = dict(data)
    else:
        expected = gort.run(str(source), feeds)
    if cache is not None and not cache.exists():
        cache.parent.mkdir(parents=True, exist_ok=True)
        partial = cache.with_suffix(f".{os.getpid()}.npz")  # another worker may write the same file
        np.savez(partial, **expected)
        partial.replace(cache)
    got = gort.run(str(result) if plugins is None else load(result), feeds, plugins=plugins)
    if set(got) != set(expected):  # a tool renamed outputs: pair them by position
        got = dict(zip(expected, got.values(), strict=False))
    worst, ok = 0.0, True
    for name, want in expected.items():
        have = got.get(name)
        if have is None or np.shape(have) != np.shape(want):
            return {"match": False, "max_abs_err": None, "note": f"output {name}: missing or shape differs"}
        want64, have64 = np.asarray(want, np.float64), np.asarray(have, np.float64)
        finite = np.isfinite(want64) & np.isfinite(have64)
        if finite.any():
            worst = max(worst, float(np.abs(want64[finite] - have64[finite]).max()))
        ok &= bool(np.allclose(have64, want64, rtol=RTOL, atol=ATOL, equal_nan=True))
    return {"match": ok, "max_abs_err": worst}


def _replace_worker(job: dict[str, Any]) -> None:
    from bench.models import transformer_like
    from gskit.io import model as gsmodel
    from gskit.passes.patterns import replace
    from gskit.plugin import load_plugins

    registry = load_plugins()
    blocks = int(job["extra"]["blocks"])
    times, graph, report = [], None, None
    for _ in range(job["runs"]):
        graph = transformer_like(blocks=blocks)
        nodes_before = len(graph.nodes)
        start = time.perf_counter()
        report = replace(graph, list(registry), tensorrt=TARGET)
        times.append(time.perf_counter() - start)
    _emit(
        seconds=statistics.median(times),
        runs=len(times),
        peak_rss=_peak_rss(),
        nodes_before=nodes_before,
        nodes_after=len(graph.nodes),
        instances=report.replaced,
        all_seconds=[round(t, 4) for t in times],
    )
    if job["compare"]:
        out_dir = Path(job["out_dir"])
        source, result = out_dir / "original.onnx", out_dir / "replaced.onnx"
        gsmodel.save(transformer_like(blocks=blocks), source)
        gsmodel.save(graph, result)
        # generated afresh in out_dir for each measurement: nothing to reuse
        _emit(**_compare(source, result, None, plugins=registry))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "--worker":
        logging.basicConfig(level=logging.ERROR)
        _worker(json.loads(argv[1]))
        return 0
    raise SystemExit("usage: bench/peers.py is used by bench/run.py (python bench/run.py --help)")


if __name__ == "__main__":
    sys.exit(main())
