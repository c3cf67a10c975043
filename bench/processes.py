"""Time whole processes as users start them: wall time, peak memory, and the modules each one imported.

A command line is measured from ``Popen`` to its exit, interpreter start and imports included. The child runs
a short probe first (``python -c PROBE+BODY ARGS``): an exit handler, registered before anything else so it
runs last, writes the process's own peak resident memory (``VmHWM``) and the top-level names in
``sys.modules`` to the file ``$GSKIT_BENCH_PROBE``. ``ru_maxrss`` of a waited child is not used: Linux carries
it over fork + exec, so every child would report at least this process's size. The body is what the user's
process does: ``gskit ARGS`` runs ``gskit.cli.main`` as the installed entry point does; ``code`` runs as
``python -c CODE ARGS``.

Every command runs once unmeasured (the bytecode cache, ``$PYTHONPYCACHEPREFIX``, and the page cache are warm
afterwards, as they are for a user's second command), then ``runs`` times: the row has the median wall time,
the highest peak, and the modules of the last run. A child that prints a JSON line with ``seconds`` (the
floors and the library paths: the work after imports) also gets the median of those. :func:`measure_pair`
runs two commands in turn (a command and its floor) and gives each pair's wall-time ratio.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Runs first in the child. It imports nothing that the interpreter has not already imported at start
#: (``atexit`` is built in), so the module list is the command's own.
PROBE = """
import atexit, os, sys
def _gskit_bench_probe():
    names = sorted({name.split(".")[0] for name in list(sys.modules)})
    with open("/proc/self/status") as status:
        peak = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
    with open(os.environ["GSKIT_BENCH_PROBE"], "w") as out:
        out.write("\\n".join([str(peak), *names]))
atexit.register(_gskit_bench_probe)
del atexit
"""

#: The installed ``gskit`` entry point's body (``[project.scripts] gskit = "gskit.cli:main"``).
GSKIT_BODY = "sys.argv[0] = 'gskit'\nfrom gskit.cli import main\nsys.exit(main())\n"

#: Packages whose presence the ``cli`` suite reports per command: heavy or optional, each imported only by
#: the steps that use it.
WATCHED = (
    "torch",
    "polygraphy",
    "onnxruntime",
    "sympy",
    "onnx",
    "numpy",
    "onnx_graphsurgeon",
    "tensorrt_rtx",
)


@dataclass
class Command:
    """One command line: ``kind`` is ``gskit`` (``args`` after ``gskit``) or ``code`` (``args[0]`` is Python
    source, run after the probe, which imported ``sys``)."""

    kind: str
    args: Sequence[str]
    fresh: Path | None = None  # removed before each run (an output folder the command creates)
    label: str = ""  # what the tables show instead of the command line (``code``: the source is long)

    def argv(self) -> list[str]:
        if self.kind == "code":
            return [sys.executable, "-c", PROBE + self.args[0], *self.args[1:]]
        return [sys.executable, "-c", PROBE + GSKIT_BODY, *self.args]

    def display(self) -> str:
        """How a user types it (or ``label``)."""
        if self.label:
            return self.label
        if self.kind == "gskit":
            return " ".join(["gskit", *map(_short, self.args)])
        return f'python -c "{self.args[0]}"'


def _short(arg: str) -> str:
    return Path(arg).name if os.sep in arg else arg


@dataclass
class Measured:
    """Whole-process numbers of one command over its runs."""

    status: str = "ok"  # ok, timeout, failed (non-zero exit)
    seconds: float | None = None  # median wall time, process start to exit
    all_seconds: list[float] = field(default_factory=list)
    peak_rss: int | None = None  # highest VmHWM over the runs
    work_seconds: float | None = None  # median of the "seconds" the child printed, if it printed any
    modules: list[str] = field(default_factory=list)  # top-level names in sys.modules at exit (last run)
    returncode: int | None = None
    note: str = ""
    output: dict[str, Any] = field(default_factory=dict)  # the child's last JSON line


def pycache_env(cache: Path | None = None) -> dict[str, str]:
    """This environment with ``PYTHONPYCACHEPREFIX`` set to a kept folder (default: one in the temporary
    folder), so the measured runs import from bytecode instead of compiling."""
    cache = cache or Path(os.environ.get("GSKIT_BENCH_CACHE") or Path(tempfile.gettempdir()) / "gskit-bench")
    prefix = os.environ.get("PYTHONPYCACHEPREFIX") or str(cache / "pycache")
    return {**os.environ, "PYTHONPYCACHEPREFIX": prefix}


def measure_process(
    command: Command,
    *,
    runs: int = 3,
    timeout: float = 120.0,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    warmup: bool = True,
) -> Measured:
    """Run ``command`` (once unmeasured when ``warmup``, then ``runs`` times); see the module docstring."""
    with _Runs(command, env) as measuring:
        for index in range(runs + (1 if warmup else 0)):
            if not measuring.once(timeout, cwd, counted=not (warmup and index == 0)):
                break
        return measuring.result()


def measure_pair(
    first: Command,
    second: Command,
    *,
    runs: int = 3,
    timeout: float = 120.0,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    warmup: bool = True,
) -> tuple[Measured, Measured, list[float]]:
    """Run the two commands in turn (first, second, first, ...; each once unmeasured when ``warmup``):
    a drift of the machine's speed during the runs then slows both alike.

    Returns:
        Each command's numbers and the wall-time ratio first/second of each pair in which both ran.
    """
    ratios: list[float] = []
    with _Runs(first, env) as one, _Runs(second, env) as two:
        for index in range(runs + (1 if warmup else 0)):
            counted = not (warmup and index == 0)
            if not (one.once(timeout, cwd, counted=counted) and two.once(timeout, cwd, counted=counted)):
                break
            if counted:
                ratios.append(round(one.last_seconds / two.last_seconds, 4))
        return one.result(), two.result(), ratios


class _Runs:
    """The runs of one command and what they measured (a context: its probe file's folder)."""

    def __init__(self, command: Command, env: dict[str, str] | None) -> None:
        self.command = command
        self.env = dict(env or pycache_env())
        self.measured = Measured()
        self.last_seconds = 0.0
        self._works: list[float] = []
        self._peaks: list[int] = []
        self._folder = tempfile.TemporaryDirectory(prefix="gskit-probe-")
        self.env["GSKIT_BENCH_PROBE"] = str(Path(self._folder.name) / "probe.txt")

    def __enter__(self) -> _Runs:
        return self

    def __exit__(self, *exc: object) -> None:
        self._folder.cleanup()

    def once(self, timeout: float, cwd: Path | None, *, counted: bool) -> bool:
        """One run; False (and the status says why) when it failed or timed out."""
        result, probe = self.measured, Path(self.env["GSKIT_BENCH_PROBE"])
        if self.command.fresh is not None:
            shutil.rmtree(self.command.fresh, ignore_errors=True)
        probe.unlink(missing_ok=True)
        once = _run_once(self.command, timeout, cwd, self.env)
        if once["status"] != "ok":
            result.status, result.note, result.returncode = once["status"], once["note"], once["code"]
            return False
        result.returncode = once["code"]
        if not counted:
            return True
        self.last_seconds = once["seconds"]
        result.all_seconds.append(round(once["seconds"], 4))
        peak, modules = _read_probe(probe)
        if peak is not None:
            self._peaks.append(peak)
            result.modules = modules
        result.output = once["output"]
        if isinstance(once["output"].get("seconds"), (int, float)):
            self._works.append(float(once["output"]["seconds"]))
        return True

    def result(self) -> Measured:
        result = self.measured
        if result.all_seconds:
            result.seconds = statistics.median(result.all_seconds)
        result.peak_rss = max(self._peaks) if self._peaks else None
        result.work_seconds = statistics.median(self._works) if self._works else None
        return result


def _run_once(command: Command, timeout: float, cwd: Path | None, env: dict[str, str]) -> dict[str, Any]:
    start = time.perf_counter()
    proc = subprocess.Popen(
        command.argv(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        cwd=cwd,
        env=env,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"status": "timeout", "note": f"killed after {timeout:.0f} s", "code": None}
    seconds = time.perf_counter() - start
    output: dict[str, Any] = {}
    for line in stdout.splitlines():
        if line.startswith("{"):
            try:
                output = json.loads(line)
            except ValueError:
                continue
    # exit 1 is "validation failed" for gskit (an error exits 2), "outputs differ" for a script that said so
    # in its JSON line: still a measurement. Any other exit (an uncaught exception exits 1) is a failure.
    said = command.kind == "gskit" or bool(output)
    if proc.returncode != 0 and not (proc.returncode == 1 and said):
        lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
        note = lines[-1][:200] if lines else f"exit status {proc.returncode}"
        return {"status": "failed", "note": note, "code": proc.returncode}
    return {"status": "ok", "note": "", "code": proc.returncode, "seconds": seconds, "output": output}


def _read_probe(path: Path) -> tuple[int | None, list[str]]:
    if not path.exists():  # the process ended without running exit handlers (os._exit, a signal)
        return None, []
    first, *names = path.read_text().splitlines()
    return int(first), names
