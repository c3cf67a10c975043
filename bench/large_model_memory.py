"""Peak memory and wall time of gskit on a model over 2 GB, against bare onnx as the I/O floor.

Builds a MatMul chain whose float32 weights total ``--size-gb`` (default 2.5 GB) in a temporary folder,
then runs each stage in a fresh interpreter and reads that process's peak RSS (``VmHWM``):

* ``gskit lazy isolate+save``: ``load(load_weights=False)`` + ``isolate`` (a part holding every weight)
  + ``save``; weights are streamed from file to file.
* ``gskit load+save``: ``load()`` with weights + ``save``.
* ``onnx load+save (floor)``: ``onnx.load`` + ``onnx.save_model(save_as_external_data=True)``.

Then two whole processes, timed from start to exit (interpreter and imports included), with their peak RSS
(``wait4``) and peak anonymous memory (``RssAnon``, sampled; see :func:`run_process`):

* ``onnx floor (whole process)``: the floor's stage in an interpreter that imports onnx and nothing else.
* ``gskit prepare CLI (whole process)``: ``python -m gskit.cli prepare MODEL -o OUT``, the default recipe
  (validate and check_trt included), as a user runs it.

``run_in_group`` runs such a process in a cgroup-v1 memory group, capped or not, from a cold page cache
(``MemoryGroup``): what the command needs when memory is short, as opposed to the file pages the kernel counts
in its RSS; ``bench/run.py --only large --large-cap 0.3`` uses it.

Usage::

    python bench/large_model_memory.py [--size-gb 2.5] [--json results.json] [--dir /big/tmp] [--keep]

Numbers depend on the disk and the page cache (the model was just written, so reads are mostly cached).
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
from pathlib import Path

ROWS = 4096
#: Bytes per weight at most; the chain alternates [ROWS, cols] and [cols, ROWS] weights.
MAX_WEIGHT_BYTES = 768 * 2**20

STAGES = {
    "gskit lazy isolate+save": "lazy_isolate_save",
    "gskit load+save": "load_save",
    "onnx load+save (floor)": "onnx_floor",
}


def _peak_rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


# -- stages (each runs in its own interpreter) ---------------------------------------------------------------


def build(path: Path, size_bytes: int) -> dict:
    """Write the model with gskit.save; returns its weight count and bytes."""
    import numpy as np
    from onnx import TensorProto, helper

    from gskit.io.model import save

    count = max(1, -(-size_bytes // MAX_WEIGHT_BYTES))
    cols = max(1, size_bytes // (count * ROWS * 4))
    names, nodes, current, width = [], [helper.make_node("Relu", ["x"], ["t0"])], "t0", ROWS
    shapes = []
    for i in range(count):
        shape = (ROWS, cols) if i % 2 == 0 else (cols, ROWS)
        name, out = f"W{i}", f"t{i + 1}"
        nodes.append(helper.make_node("MatMul", [current, name], [out]))
        names.append(name)
        shapes.append(shape)
        current, width = out, shape[1]
    nodes.append(helper.make_node("Relu", [current], ["y"]))
    graph = helper.make_graph(
        nodes,
        "bench",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, ROWS])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    total = 0
    for i, (name, shape) in enumerate(zip(names, shapes, strict=True)):
        values = np.arange(shape[0] * shape[1], dtype=np.float32).reshape(shape)
        values += np.float32(i)
        tensor = model.graph.initializer.add(name=name, data_type=TensorProto.FLOAT, dims=shape)
        tensor.raw_data = values.tobytes()
        total += values.nbytes
        del values
    save(model, path, external_data=True)  # also below 2 GB, so small runs take the same paths
    return {"weights": count, "weight_bytes": total, "output": current}


def lazy_isolate_save(path: Path, out: Path) -> None:
    from gskit.io.model import load, save, to_graph
    from gskit.passes.isolate import isolate

    graph = to_graph(load(path, load_weights=False))
    save(isolate(graph, ["t0"], ["y"]), out)


def load_save(path: Path, out: Path) -> None:
    from gskit.io.model import load, save

    save(load(path), out)


def onnx_floor(path: Path, out: Path) -> None:
    import onnx

    model = onnx.load(str(path))
    onnx.save_model(
        model, str(out), save_as_external_data=True, all_tensors_to_one_file=True, location=out.name + ".data"
    )


def _stage_main(name: str, args: list[str]) -> None:
    started_rss = _rss()
    if name == "build":
        import gskit.io.model  # noqa: F401  # imports outside the timing

        t0 = time.perf_counter()
        info = build(Path(args[0]), int(args[1]))
    else:
        import onnx  # noqa: F401

        import gskit.passes.isolate  # noqa: F401

        started_rss = _rss()
        t0 = time.perf_counter()
        globals()[name](Path(args[0]), Path(args[1]))
        info = {}
    info.update(seconds=time.perf_counter() - t0, peak_rss=_peak_rss(), rss_after_imports=started_rss)
    print(json.dumps(info))


# -- whole processes ---------------------------------------------------------------------------------------

#: How often :func:`run_process` samples the anonymous memory of the process tree.
SAMPLE_SECONDS = 0.02


def floor_command(model: Path, out: Path) -> list[str]:
    """The I/O floor as a whole process: an interpreter that imports onnx, loads the model with its weights
    and saves it with external data (:func:`onnx_floor`), nothing else."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path; "
        "from bench.large_model_memory import onnx_floor; onnx_floor(Path(sys.argv[2]), Path(sys.argv[3]))"
    )
    return [sys.executable, "-c", code, str(Path(__file__).resolve().parents[1]), str(model), str(out)]


def prepare_command(model: Path, out_dir: Path) -> list[str]:
    """``gskit prepare MODEL -o OUT_DIR`` as a user runs it: the default recipe, the command's own process."""
    return [sys.executable, "-m", "gskit.cli", "prepare", str(model), "-o", str(out_dir)]


def run_process(argv: list[str], *, timeout: float | None = None, group: MemoryGroup | None = None) -> dict:
    """Run ``argv`` as a whole process (interpreter start and imports included) and measure it.

    Returns ``seconds`` (wall time), ``peak_rss`` (the kernel's high-water mark of resident memory:
    ``wait4``'s ``ru_maxrss``, the largest of the process and the children it waited for; it counts the
    pages of files the process maps, such as the external weights onnxruntime maps to run a model),
    ``peak_anon`` (the largest sum of ``RssAnon`` over the process and its children, sampled every
    :data:`SAMPLE_SECONDS`: the processes' own memory, not file pages the kernel can drop and read again),
    ``returncode`` and ``stderr`` (its last 4000 characters). A process still running after ``timeout``
    seconds is killed (returncode -9). With ``group``, the process starts inside that memory group and the
    result gets ``group``: the group's numbers (:meth:`MemoryGroup.result`).
    """
    with tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        join = group.join if group is not None else None
        proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True, preexec_fn=join
        )
        peak_anon, status, usage = 0, 0, None
        while True:
            if group is not None:
                group.sample()
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if timeout is not None and time.perf_counter() - start > timeout:
                os.killpg(proc.pid, signal.SIGKILL)
                _, status, usage = os.wait4(proc.pid, 0)
                break
            peak_anon = max(peak_anon, sum(_anon_bytes(p) for p in _process_tree(proc.pid)))
            time.sleep(SAMPLE_SECONDS)
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
        err.seek(0)
        stderr = err.read()[-4000:]
    result = {
        "seconds": seconds,
        "peak_rss": usage.ru_maxrss * 1024,
        "peak_anon": peak_anon,
        "returncode": proc.returncode,
        "stderr": stderr,
    }
    if group is not None:
        result["group"] = group.result()
    return result


# -- memory groups: what a command needs when memory is short ------------------------------------------------

#: Where cgroup-v1 memory groups are made (``mkdir`` there makes one).
CGROUP_MEMORY = Path("/sys/fs/cgroup/memory")
#: The counters of ``memory.stat`` kept from the sample where the group used the most.
GROUP_STAT_KEYS = ("rss", "cache", "mapped_file", "dirty", "writeback")


def memory_groups_unavailable() -> str | None:
    """Why this machine cannot make a cgroup-v1 memory group for a measurement; None where it can."""
    if not (CGROUP_MEMORY / "memory.limit_in_bytes").is_file():
        return f"no cgroup-v1 memory controller at {CGROUP_MEMORY}"
    if not os.access(CGROUP_MEMORY, os.W_OK):
        return f"{CGROUP_MEMORY} is not writable (memory groups need root or a delegated hierarchy)"
    return None


class MemoryGroup:
    """A cgroup-v1 memory group that a measured process starts in, capped at ``limit`` bytes (None: no cap).

    The kernel charges the group for the process tree's anonymous memory and for the file pages it brings
    into the page cache (reads, writes, mappings). Under the cap it reclaims clean file pages, those mapped
    included, and reads them again when touched; anonymous memory cannot be reclaimed (there is no swap), so
    a process whose anonymous memory outgrows the cap is killed by the group's OOM killer. Pages already in
    the page cache stay charged to whoever read them first: :func:`evict_page_cache` drops the inputs' pages
    before a run, so that the group pays for what the command reads.

    Use as a context manager: the group is removed on exit.
    """

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.path = CGROUP_MEMORY / f"gskit-bench-{os.getpid()}-{time.monotonic_ns()}"
        self.peak_stat: dict[str, int] = {}
        self.peak_usage = 0
        self.largest: dict[str, int] = {}

    def __enter__(self) -> MemoryGroup:
        self.path.mkdir()
        if self.limit is not None:
            (self.path / "memory.limit_in_bytes").write_text(str(self.limit))
        return self

    def __exit__(self, *exc: object) -> None:
        for _ in range(50):  # the last task may take a moment to leave after it was reaped
            try:
                self.path.rmdir()  # the page cache still charged to it moves to the parent
                return
            except OSError:
                time.sleep(0.1)

    def join(self) -> None:
        """Move the calling process into the group (``preexec_fn``: the child, before it executes)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def _read(self, name: str) -> str:
        return (self.path / name).read_text()

    def stat(self) -> dict[str, int]:
        pairs = (line.split() for line in self._read("memory.stat").splitlines())
        return {key: int(value) for key, value in pairs}

    def sample(self) -> None:
        """Note the group's usage now; the ``memory.stat`` of the largest sample is kept, and the largest of
        each of :data:`GROUP_STAT_KEYS` over all samples."""
        try:
            usage = int(self._read("memory.usage_in_bytes"))
            stat = self.stat()
        except OSError:
            return
        for key in GROUP_STAT_KEYS:
            self.largest[key] = max(self.largest.get(key, 0), stat.get(key, 0))
        if usage >= self.peak_usage:
            self.peak_usage, self.peak_stat = usage, {k: stat.get(k, 0) for k in GROUP_STAT_KEYS}

    def result(self) -> dict:
        """``limit``, ``max_usage`` (the kernel's ``memory.max_usage_in_bytes``), ``failcnt`` (times the cap
        was hit), ``oom_kills``, ``at_peak`` (``memory.stat`` at the largest sampled usage: ``rss`` is
        anonymous memory, ``cache`` the page cache charged, ``mapped_file`` the part of it mapped) and
        ``largest`` (each counter's largest sample)."""
        oom = dict(line.split() for line in self._read("memory.oom_control").splitlines())
        return {
            "limit": self.limit,
            "max_usage": int(self._read("memory.max_usage_in_bytes")),
            "failcnt": int(self._read("memory.failcnt")),
            "oom_kills": int(oom.get("oom_kill", 0)),
            "at_peak": self.peak_stat,
            "largest": self.largest,
        }


def evict_page_cache(folder: Path) -> None:
    """Drop the page cache of the files under ``folder`` (written back first), so that the next reader reads
    them from the disk and its memory group is charged for them. Only these files: the machine is shared."""
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def run_in_group(argv: list[str], inputs: Path, limit: int | None, *, timeout: float | None = None) -> dict:
    """:func:`run_process` inside a new :class:`MemoryGroup` capped at ``limit`` bytes, the page cache of the
    files under ``inputs`` dropped first (cold reads in every run, capped or not)."""
    evict_page_cache(inputs)
    with MemoryGroup(limit) as group:
        return run_process(argv, timeout=timeout, group=group)


#: The whole processes measured after the stages: label -> (model, output) -> command line.
PROCESSES = {
    "onnx floor (whole process)": floor_command,
    "gskit prepare CLI (whole process)": prepare_command,
}


def _process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants now (those that already ended are gone)."""
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as f:
                    pending.extend(int(child) for child in f.read().split())
        except OSError:
            continue  # ended meanwhile
    return found


def _anon_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon:")), 0)
    except OSError:
        return 0


# -- driver ------------------------------------------------------------------------------------------


def _run_stage(name: str, *args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, "--stage", name, *args], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"stage {name} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gb", type=float, default=2.5, help="total weight size in GB (1e9 bytes)")
    parser.add_argument("--dir", type=Path, default=None, help="folder for the temporary files")
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON here")
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    parser.add_argument("--stage", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.stage:
        _stage_main(args.stage[0], args.stage[1:])
        return 0

    work = Path(tempfile.mkdtemp(prefix="gskit-bench-", dir=args.dir))
    try:
        model = work / "model" / "big.onnx"
        model.parent.mkdir()
        built = _run_stage("build", str(model), str(int(args.size_gb * 1e9)))
        results = {
            "size_gb": args.size_gb,
            "weights": built["weights"],
            "weight_bytes": built["weight_bytes"],
            "build_seconds": built["seconds"],
            "stages": {},
        }
        for label, func in STAGES.items():
            out = work / func / "out.onnx"
            out.parent.mkdir()
            result = _run_stage(func, str(model), str(out))
            result["output_bytes"] = sum(f.stat().st_size for f in out.parent.iterdir())
            results["stages"][label] = result
            shutil.rmtree(out.parent)  # keep the disk footprint at two copies of the weights
        for label, command in PROCESSES.items():
            out = work / "process" / "out"
            out.parent.mkdir()
            result = run_process(command(model, out))
            if result["returncode"] != 0:
                raise SystemExit(f"{label} failed:\n{result['stderr']}")
            result["output_bytes"] = sum(f.stat().st_size for f in out.parent.rglob("*") if f.is_file())
            results["stages"][label] = result
            shutil.rmtree(out.parent)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    from gskit.io.report import console, table

    gb = 1e9
    rows = [
        (
            label,
            f"{r['seconds']:.1f}",
            f"{r['peak_rss'] / gb:.2f}",
            f"{(r['peak_rss'] - r['rss_after_imports']) / gb:.2f}"
            if "rss_after_imports" in r
            else f"(anonymous {r['peak_anon'] / gb:.2f})",
            f"{r['output_bytes'] / gb:.2f}",
        )
        for label, r in results["stages"].items()
    ]
    title = (
        f"{results['weight_bytes'] / gb:.2f} GB of weights in {results['weights']} tensors "
        f"(built and saved in {results['build_seconds']:.1f} s)"
    )
    console().print(table(title, ("stage", "wall s", "peak RSS GB", "RSS growth GB", "written GB"), rows))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
