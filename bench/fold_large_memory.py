"""Folding a model over 2 GB: gskit against graphsurgeon and Polygraphy, peak memory and what folded.

Builds ``y = sum_i MatMul(x, Transpose(W_i))`` with ``--count`` (default 40) float32 weights totalling
``--size-gb`` (default 2.7 GB): every Transpose is foldable. Each tool then loads, folds and saves the model
in a fresh interpreter whose working directory is a temporary folder (tools may write stray files there):

* ``gskit``: ``gskit.io.model.load(load_weights=False)`` + ``gskit.passes.fold.fold(size_threshold=None)`` +
  ``gskit.io.model.save``.
* ``graphsurgeon``: ``onnx.load`` + ``gs.import_onnx`` + ``fold_constants()`` + ``cleanup`` +
  ``export_onnx`` + ``onnx.save_model(save_as_external_data=True)``, the usual recipe.
* ``graphsurgeon basic``: the same with ``fold_constants(partitioning="basic")``.
* ``polygraphy``: ``polygraphy surgeon sanitize --fold-constants --save-external-data`` (in-process CLI).

Reported per tool: wall time (imports excluded), peak RSS of the child (``VmHWM``) and its ratio to the
model's size on disk, Transposes folded (counted in the written model), and the outcome: ``ok``,
``silent: folded nothing`` (no error, nothing folded), ``crashed: ...`` (an exception, or the process died)
or ``stopped`` (killed by this script because the machine ran low on memory). Files a tool leaves in its
working directory are listed as ``stray_files`` in the JSON.

Usage::

    python bench/fold_large_memory.py [--size-gb 2.7] [--count 40] [--tools gskit,polygraphy] [--json [PATH]]
                                      [--dir /big/tmp] [--timeout 900]

Numbers depend on the disk and the page cache (the model was just written, so reads are mostly cached) and on
other work on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.large_model_memory import _peak_rss, _rss  # noqa: E402  # after the sys.path fix-up

TOOLS = ("gskit", "graphsurgeon", "graphsurgeon basic", "polygraphy")
#: The script stops a child when the machine's available memory falls below this (the machine is shared).
MIN_AVAILABLE = 2 * 2**30
ROWS = 4096


# -- child: build -------------------------------------------------------------------------------------------


def build(path: Path, size_bytes: int, count: int) -> dict:
    """Write the model with gskit.io.model.save, streaming each weight through a raw file (small RSS)."""
    import numpy as np
    import onnx

    from gskit.io.model import save

    cols = max(1, size_bytes // (count * ROWS * 4))
    nodes, acc = [], None
    for i in range(count):
        nodes.append(onnx.helper.make_node("Transpose", [f"W{i}"], [f"T{i}"], name=f"transpose{i}"))
        nodes.append(onnx.helper.make_node("MatMul", ["x", f"T{i}"], [f"m{i}"], name=f"matmul{i}"))
        if acc is not None:
            nodes.append(onnx.helper.make_node("Add", [acc, f"m{i}"], [f"a{i}"], name=f"add{i}"))
        acc = f"m{i}" if acc is None else f"a{i}"
    nodes.append(onnx.helper.make_node("Identity", [acc], ["y"], name="out"))
    graph = onnx.helper.make_graph(
        nodes,
        "fold_large",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, cols])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, ROWS])],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=8)
    raw = path.parent / "raw.bin"
    total = 0
    with open(raw, "wb") as f:
        for i in range(count):
            values = ((np.arange(ROWS * cols, dtype=np.int64) * 7 + i * 131) % 1009).astype(np.float32)
            values = (values / 1009.0 - 0.5).reshape(ROWS, cols)
            tensor = model.graph.initializer.add(
                name=f"W{i}", data_type=onnx.TensorProto.FLOAT, dims=values.shape
            )
            tensor.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (
                ("location", raw.name),
                ("offset", str(f.tell())),
                ("length", str(values.nbytes)),
                ("basepath", str(raw.parent)),
            ):
                tensor.external_data.add(key=key, value=value)
            values.tofile(f)
            total += values.nbytes
            del values
    save(model, path, external_data=True)
    raw.unlink()
    return {"weight_bytes": total, "model_bytes": _model_bytes(path), "transposes": count}


# -- child: one tool ----------------------------------------------------------------------------------------


def run_gskit(source: Path, out: Path) -> dict:
    from gskit.io import model
    from gskit.passes import fold

    folded, report = fold.fold(model.load(source, load_weights=False), size_threshold=None)
    model.save(folded, out)
    return {
        "mode": report.mode,
        "batches": report.batches,
        "spilled_bytes": report.spilled_bytes,
        "failures": len(report.failures),
    }


def run_graphsurgeon(source: Path, out: Path, partitioning: str | None = None) -> dict:
    import onnx
    import onnx_graphsurgeon as gs

    graph = gs.import_onnx(onnx.load(str(source)))
    graph.fold_constants(partitioning=partitioning).cleanup()
    model = gs.export_onnx(graph)
    model.ir_version = min(model.ir_version, 10)
    onnx.save_model(
        model, str(out), save_as_external_data=True, all_tensors_to_one_file=True, location=out.name + ".data"
    )
    return {}


def run_polygraphy(source: Path, out: Path) -> dict:
    from polygraphy.tools._main import main as polygraphy_main

    argv = [
        "surgeon",
        "sanitize",
        str(source),
        "--fold-constants",
        "-o",
        str(out),
        "--silent",
        "--save-external-data",
        out.name + ".data",
    ]
    status = polygraphy_main(argv)
    if status:
        raise RuntimeError(f"polygraphy surgeon sanitize exited with status {status}")
    return {}


def _tool_main(tool: str, source: Path, out: Path) -> None:
    import onnx  # noqa: F401  # imports outside the timing
    import onnx_graphsurgeon  # noqa: F401

    import gskit.passes.fold  # noqa: F401

    if tool == "polygraphy":
        import polygraphy.tools._main  # noqa: F401
    started = _rss()
    result: dict = {"rss_after_imports": started}
    t0 = time.perf_counter()
    try:
        if tool == "gskit":
            result.update(run_gskit(source, out))
        elif tool == "polygraphy":
            result.update(run_polygraphy(source, out))
        else:
            result.update(run_graphsurgeon(source, out, "basic" if tool.endswith("basic") else None))
    except Exception as err:  # a peer failing is a result
        lines = [
            line for line in traceback.format_exception_only(err)[-1].strip().splitlines() if line.strip()
        ]
        result["error"] = (lines[-1] if lines else repr(err))[:200]
    result.update(seconds=time.perf_counter() - t0, peak_rss=_peak_rss())
    print(json.dumps(result), flush=True)


# -- parent -------------------------------------------------------------------------------------------------


def _model_bytes(path: Path) -> int:
    return sum(
        p.stat().st_size for p in path.parent.iterdir() if p.is_file() and p.name.startswith(path.name)
    )


def _available() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))


def _child(args: list[str], cwd: Path, timeout: float) -> tuple[dict, str]:
    """Run this script as a child in ``cwd``; return its JSON line and an outcome when it did not finish."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", *args]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    start, outcome = time.monotonic(), ""
    while proc.poll() is None:
        if time.monotonic() - start > timeout:
            outcome = f"stopped: timeout after {timeout:.0f} s"
        elif _available() < MIN_AVAILABLE:
            outcome = "stopped: the machine ran low on memory"
        if outcome:
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.2)
    stdout, stderr = proc.communicate()
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else {}
    if not outcome and proc.returncode != 0:
        tail = [line for line in stderr.strip().splitlines() if line.strip()]
        why = (
            "killed (out of memory?)"
            if proc.returncode == -signal.SIGKILL
            else f"exit status {proc.returncode}"
        )
        outcome = f"crashed: {tail[-1][:160] if tail else why}"
    return result, outcome


def measure(tool: str, source: Path, work: Path, transposes: int, model_bytes: int, timeout: float) -> dict:
    """One tool in a child whose working directory is a fresh temporary folder (removed afterwards)."""
    cwd = Path(tempfile.mkdtemp(prefix="tool-", dir=work))
    out = cwd / "out" / "folded.onnx"
    out.parent.mkdir()
    try:
        result, outcome = _child(["run", tool, str(source), str(out)], cwd, timeout)
        if "error" in result:
            outcome = f"crashed: {result.pop('error')}"
        folded = None
        if out.is_file() and not outcome:
            import onnx

            written = onnx.load(str(out), load_external_data=False)
            folded = transposes - sum(n.op_type == "Transpose" for n in written.graph.node)
            result["written_bytes"] = _model_bytes(out)
        if not outcome:
            outcome = "silent: folded nothing" if not folded else "ok"
        stray = sorted(p.name for p in cwd.iterdir() if p.name != "out")
        result.update(tool=tool, outcome=outcome, folded=folded, stray_files=stray)
        if result.get("peak_rss"):
            result["peak_ratio"] = result["peak_rss"] / model_bytes
        return result
    finally:
        shutil.rmtree(cwd, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gb", type=float, default=2.7, help="total weight size in GB (1e9 bytes)")
    parser.add_argument("--count", type=int, default=40, help="foldable Transposes (one per weight)")
    parser.add_argument(
        "--tools", default=",".join(TOOLS), help=f"comma-separated subset of {', '.join(TOOLS)}"
    )
    parser.add_argument("--dir", type=Path, default=None, help="folder for the temporary files")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per tool")
    parser.add_argument(
        "--json",
        nargs="?",
        const="-",
        default=None,
        metavar="PATH",
        help="write the results as JSON to PATH (no PATH: print JSON instead of the table)",
    )
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        if args.child[0] == "build":
            print(json.dumps(build(Path(args.child[1]), int(args.child[2]), int(args.child[3]))))
        else:
            _tool_main(args.child[1], Path(args.child[2]), Path(args.child[3]))
        return 0

    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    unknown = sorted(set(tools) - set(TOOLS))
    if unknown:
        parser.error(f"unknown tools: {', '.join(unknown)}")
    work = Path(tempfile.mkdtemp(prefix="gskit-fold-large-", dir=args.dir))
    try:
        source = work / "model" / "big.onnx"
        source.parent.mkdir()
        built, outcome = _child(
            ["build", str(source), str(int(args.size_gb * 1e9)), str(args.count)], work, args.timeout
        )
        if outcome:
            raise SystemExit(f"building the model failed: {outcome}")
        results = {
            **built,
            "tools": [
                measure(t, source, work, built["transposes"], built["model_bytes"], args.timeout)
                for t in tools
            ],
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)

    if args.json == "-":
        print(json.dumps(results, indent=2))
        return 0
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    from gskit.io.report import console, table

    gb = 1e9
    rows = [
        (
            r["tool"],
            f"{r['seconds']:.1f}" if r.get("seconds") is not None else "-",
            f"{r['peak_rss'] / gb:.2f}" if r.get("peak_rss") else "-",
            f"{r['peak_ratio']:.2f}x" if r.get("peak_ratio") else "-",
            f"{r['folded']}/{built['transposes']}" if r.get("folded") is not None else "-",
            r["outcome"],
        )
        for r in results["tools"]
    ]
    title = f"Folding {built['transposes']} Transposes of a {built['model_bytes'] / gb:.2f} GB model"
    console().print(
        table(title, ("tool", "wall s", "peak RSS GB", "peak / model", "folded", "outcome"), rows)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
