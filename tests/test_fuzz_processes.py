"""Fuzzing files and processes (issue 22): outputs that are not regular files, fold bombs, long loops and
interrupted runs, each family drawn from a seed.

* outputs: a command (fold, sanitize, convert, edit, isolate, infer-shapes, replace, prepare) writes to a name
  that holds a FIFO, a socket, a folder, a device node (as root), a link to one of those, or a folder where
  the external data goes. A name that is not a regular file, a link or free is refused in one line naming it;
  a link is replaced and what it points at is left; no entry the user did not name changes;
* bombs: models of a few hundred bytes whose ops (Expand, Tile, ConstantOfShape, Range, Pad, OneHot, outer
  products, broadcasts, many concatenated copies) make up to 64 GB, with value_info claiming otherwise, are
  folded in one real process (``--size-threshold`` 1 MiB): every case ends within seconds, the written model
  stays within what fold's limits allow, and the process's peak memory stays bounded;
* loops: constant Loops of 1 to 10^15 iterations, nested or without a trip count: fold ends within seconds;
  loops within its budget fold to the values onnxruntime computes;
* signals: SIGINT or SIGTERM at a random moment of fold, compare or prepare while onnxruntime evaluates: the
  command ends within seconds with 130 or 143, no partial file and no work folder;
* kills: SIGKILL at a random moment of ``prepare`` runs that replace each other's files in one OUTDIR: what
  is left always belongs to one run (report.json only beside all of it), and the next run cleans up.

In CI (pytest) a fixed, seeded set runs in about a minute. For a long run::

    python tests/test_fuzz_processes.py --cases 200 [--seed 1]

prints ``N hostile inputs tried, 0 tracebacks, 0 files replaced or deleted that the user did not name,
at most S s to end after SIGINT/SIGTERM`` or the failing cases (exit 1).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from hostile_models import (  # noqa: E402  # beside this file, also when run as a script
    ONE_RUN_SETS,
    OUTPUT_COMMANDS,
    check_one_run,
    expand_concat,
    growing,
    long_loop,
    lying_expand,
    make_entry,
    matmul_chain,
    peak_resident_bytes,
    signalled,
    small_model,
    start_gskit,
)
from test_fuzz import CaseTimeout  # noqa: E402
from test_fuzz import _alarm as alarm  # noqa: E402

#: Seconds one case may take before it counts as a hang.
CASE_SECONDS = 30
#: Seconds a command may take to end after SIGINT or SIGTERM.
END_SECONDS = 8.0
#: fold's threshold in the bombs family, and the peak memory its process may reach (the bombs ask for up
#: to 64 GB; fold's limits allow at most max_passes x the threshold of results).
BOMB_THRESHOLD = 2**20
BOMB_PEAK_BYTES = 700 * 2**20


@dataclass
class Tally:
    """What a family found: cases tried, problems (kind, text), the slowest end after a signal."""

    tried: int = 0
    problems: list[tuple[str, str]] = field(default_factory=list)
    slowest_end: float = 0.0

    def add(self, other: Tally) -> None:
        self.tried += other.tried
        self.problems += other.problems
        self.slowest_end = max(self.slowest_end, other.slowest_end)


def _cli(argv: list[str]) -> tuple[int, str]:
    """``gskit ARGV`` in this process: exit code and stderr."""
    from gskit.cli import main

    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as stop:
            code = int(stop.code or 0)
    return code, err.getvalue()


def _crash(err: str) -> str | None:
    if "Traceback" in err or "a gskit bug" in err or "terminate called" in err:
        return err.strip().splitlines()[-1] if err.strip() else "crash"
    return None


# ---- outputs -----------------------------------------------------------------------------------------------

KINDS = ("fifo", "socket", "folder", "chardev", "link to fifo", "link to folder", "regular", "absent")
#: kinds that must be refused (the others are replaced or created)
REFUSED = {"fifo", "socket", "folder", "chardev"}


def _entries(folder: Path) -> dict[str, tuple[int, int, int]]:
    out = {}
    for p in folder.rglob("*"):
        info = p.lstat()
        out[str(p.relative_to(folder))] = (info.st_ino, info.st_mode, info.st_size if p.is_file() else 0)
    return out


def output_case(root: Path, rng: random.Random) -> Tally:
    """One command writing to a name that holds something (see the module's docstring)."""
    tally = Tally(tried=1)
    command = rng.choice([*OUTPUT_COMMANDS, "prepare"])
    kind = rng.choice([k for k in KINDS if command != "prepare" or not k.startswith("link to ")])
    weights = rng.choice([8, 32])  # 32: the model's weights go to a data file beside it
    model = small_model(root / "in" / "m.onnx", weights=weights)
    out = root / "out"
    out.mkdir(parents=True)
    if command == "prepare":
        name = rng.choice(["model.onnx", "model.onnx.data", "report.json", "report.html"])
        recipe = root / "recipe.yaml"
        recipe.write_text("steps: [sanitize, fold]\n")
        argv = ["prepare", str(model), "-o", str(out), "--recipe", str(recipe)]
    else:
        name = rng.choice(["o.onnx", "o.onnx.data"])
        argv = [command, str(model), "-o", str(out / "o.onnx"), *OUTPUT_COMMANDS[command]]
    sockets: list[socket.socket] = []
    label = f"outputs: {command} with {name} a {kind}"
    try:
        if not make_entry(out / name, kind, sockets):
            return Tally()
        before = _entries(out)
        code, err = _cli(argv)
    finally:
        for sock in sockets:
            sock.close()
    crash = _crash(err)
    if crash:
        tally.problems.append(("traceback", f"{label}: {crash}"))
        return tally
    refused = kind in REFUSED
    last = err.strip().splitlines()[-1] if err.strip() else ""
    if refused and (code != 2 or str(out / name) not in last or len(err.strip().splitlines()) != 1):
        tally.problems.append(("wrong", f"{label}: exit {code}, {last!r}"))
    if not refused and code != 0:
        tally.problems.append(("wrong", f"{label}: exit {code}, {last!r}"))
    after = _entries(out)
    # What the user named may change: the output (and its data file), prepare's set in OUTDIR. A link there
    # is replaced; whatever it pointed at must stay as it was.
    allowed = {"o.onnx", "o.onnx.data"} if command != "prepare" else {*ONE_RUN_SETS["b"], ".gskit.lock"}
    changed = [p for p, e in before.items() if after.get(p) != e and p not in allowed]
    changed += [p for p in set(after) - set(before) if p not in allowed]
    if refused and after != before:
        changed += sorted(set(after) ^ set(before)) or ["(an entry's inode, mode or size)"]
    if changed:
        tally.problems.append(("replaced", f"{label}: changed {sorted(changed)}"))
    return tally


# ---- bombs -------------------------------------------------------------------------------------------------

BOMB_OPS = ("Expand", "Tile", "ConstantOfShape", "Range", "Pad", "OneHot", "Outer", "Add")


def bomb(rng: random.Random) -> tuple[str, onnx.ModelProto]:
    """A small model that makes a large tensor (described)."""
    kind = rng.choice((*BOMB_OPS, "concat", "liar"))
    if kind == "concat":
        copies, elements = rng.randint(2, 400), 2 ** rng.randint(10, 22)
        return f"concat {copies} x {elements}", expand_concat(copies, elements)
    if kind == "liar":
        elements = 2 ** rng.randint(20, 34)
        return f"Expand of {elements} claiming [1]", lying_expand(elements)
    factor = 2 ** rng.randint(12, 34)
    claim = rng.choice([(1,), None, (rng.randint(1, 8), rng.randint(1, 8))])
    return f"{kind} x {factor} claiming {claim}", growing(kind, factor, claim)


def bombs(root: Path, seed: int, count: int) -> Tally:
    """Fold ``count`` bombs in one real process (its peak memory is what is checked)."""
    root.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, __file__, "--fold-bombs", str(seed), str(count), str(root)],
        capture_output=True,
        text=True,
        timeout=CASE_SECONDS * count + 60,
    )
    tally = Tally(tried=count)
    try:
        result = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        ended = f"bombs: the process ended with {done.returncode}: {done.stderr[-500:]}"
        tally.problems.append(("traceback", ended))
        return tally
    tally.problems += [tuple(p) for p in result["problems"]]  # type: ignore[misc]
    if result["peak"] > BOMB_PEAK_BYTES:
        tally.problems.append(("wrong", f"bombs: peak memory {result['peak'] >> 20} MiB"))
    return tally


def _fold_bombs(seed: int, count: int, root: Path) -> None:
    """The bombs family's own process: fold each, print one JSON line (problems, peak memory)."""
    rng = random.Random(f"bombs-{seed}")
    problems = []
    for index in range(count):
        what, model = bomb(rng)
        path, out = root / f"b{index}.onnx", root / f"f{index}.onnx"
        onnx.save(model, str(path))
        start = time.monotonic()
        code, err = _cli(["fold", str(path), "-o", str(out), "--size-threshold", str(BOMB_THRESHOLD)])
        seconds = time.monotonic() - start
        crash = _crash(err)
        if crash or code != 0:
            kind = "traceback" if crash else "wrong"
            problems.append((kind, f"bombs: {what}: exit {code}: {crash or err[-200:]}"))
        elif seconds > CASE_SECONDS:
            problems.append(("wrong", f"bombs: {what}: took {seconds:.0f} s"))
        elif out.stat().st_size > 10 * BOMB_THRESHOLD + 5 * path.stat().st_size + 65536:
            problems.append(("wrong", f"bombs: {what}: wrote {out.stat().st_size} bytes"))
        out.unlink(missing_ok=True)
    peak = peak_resident_bytes()
    print(json.dumps({"problems": problems, "peak": peak}))


# ---- loops -------------------------------------------------------------------------------------------------


def loop_case(rng: random.Random) -> Tally:
    from gskit.backends import ort as gsort
    from gskit.passes.fold import fold
    from gskit.passes.fold.cost import RUN_BUDGET

    tally = Tally(tried=1)
    trips = rng.choice([None, *(10**k for k in range(16)), rng.randint(1, 3000)])
    body = rng.randint(1, 20)
    nested = rng.choice([None, None, rng.randint(1, 10 ** rng.randint(1, 9))])
    label = f"loops: trips {trips}, body {body}, nested {nested}"
    model = long_loop(trips, body, nested=nested)
    try:
        with alarm(CASE_SECONDS):
            folded, report = fold(model)
    except CaseTimeout:
        tally.problems.append(("wrong", f"{label}: fold ran over {CASE_SECONDS} s"))
        return tally
    except Exception as err:  # noqa: BLE001  # any exception is the finding
        tally.problems.append(("traceback", f"{label}: {type(err).__name__}: {err}"))
        return tally
    left = "Loop" in [n.op_type for n in folded.graph.node]
    cost = None if trips is None else trips * (body + 3 + (nested or 0) * 3)
    if not left and (cost is None or cost > 2 * RUN_BUDGET):
        tally.problems.append(("wrong", f"{label}: evaluated a loop over the budget"))
    if not left:
        x = {"x": np.ones(1, np.float32)}
        got, want = gsort.run(folded, x)["y"], gsort.run(model, x)["y"]
        if not np.allclose(got, want, rtol=1e-5):
            tally.problems.append(("wrong", f"{label}: folded to {got}, onnxruntime says {want}"))
    elif "loop" not in report.excluded:
        tally.problems.append(("wrong", f"{label}: left without a reason"))
    return tally


# ---- signals and kills -------------------------------------------------------------------------------------


def signal_case(root: Path, rng: random.Random) -> Tally:
    """SIGINT or SIGTERM at a random moment of a command that evaluates for a long time."""
    tally = Tally(tried=1)
    root.mkdir(parents=True)
    out = root / "out"
    out.mkdir()
    command = rng.choice(["fold", "compare", "prepare"])
    sig = rng.choice([signal.SIGINT, signal.SIGTERM])
    delay = rng.uniform(1.0, 8.0)
    if command == "fold":
        onnx.save(matmul_chain(), str(root / "m.onnx"))
        argv = ["fold", str(root / "m.onnx"), "-o", str(out / "f.onnx")]
    else:
        onnx.save(long_loop(10**12), str(root / "m.onnx"))
        argv = ["compare", str(root / "m.onnx"), str(root / "m.onnx")]
        if command == "prepare":
            argv = ["prepare", str(root / "m.onnx"), "-o", str(out)]
    label = f"signals: {command}, {sig.name} after {delay:.1f} s"
    code, seconds, err = signalled(argv, sig, delay, root)
    if code is None:
        tally.problems.append(("wrong", f"{label}: still running 60 s later"))
        return tally
    tally.slowest_end = seconds
    crash = _crash(err)
    if code == -sig:
        pass  # ended by the signal's default action: it came before the command started, nothing was written
    elif code == 0 and not crash:
        # finished before the signal (a fast machine folds the chain in under 8 s): its output must be whole
        written = out / "f.onnx" if command == "fold" else out / "model.onnx"
        if command != "compare" and not _loads(written):
            tally.problems.append(("wrong", f"{label}: exit 0 but {written.name} does not load"))
        return tally
    elif crash:
        tally.problems.append(("traceback", f"{label}: {crash}"))
    elif code != 128 + sig:
        tally.problems.append(("wrong", f"{label}: exit {code}: {err.strip()[-200:]}"))
    if seconds > END_SECONDS:
        tally.problems.append(("wrong", f"{label}: ended {seconds:.1f} s after the signal"))
    left = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    if left:
        tally.problems.append(("replaced", f"{label}: left {left}"))
    return tally


def _loads(path: Path) -> bool:
    try:
        onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001  # any reason it does not read is the finding
        return False
    return True


def kills(root: Path, seed: int, count: int) -> Tally:
    """``count`` prepare runs into one OUTDIR, alternating two models, each SIGKILLed at a random moment."""
    rng = random.Random(f"kills-{seed}")
    tally = Tally(tried=count)
    root.mkdir(parents=True)
    models = {"a": small_model(root / "a.onnx"), "b": small_model(root / "b.onnx", weights=32)}
    recipe = root / "recipe.yaml"
    recipe.write_text("steps: [sanitize, fold]\n")
    out = root / "out"

    def run(name: str) -> subprocess.Popen:
        return start_gskit(["prepare", str(models[name]), "-o", str(out), "--recipe", str(recipe)], root)

    start = time.monotonic()
    full = run("a")
    full.communicate(timeout=120)
    length = time.monotonic() - start  # a whole run, imports included
    for index in range(count):
        name = "ab"[index % 2]
        proc = run(name)
        time.sleep(rng.uniform(0.3, 1.0) * length)
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        try:
            check_one_run(out)
        except AssertionError as err:
            tally.problems.append(("wrong", f"kills: run {index} ({name}) left {err}"))
    last = run("b")
    _, err = last.communicate(timeout=120)
    if last.returncode != 0 or check_one_run(out) != "b":
        tally.problems.append(
            ("wrong", f"kills: the run after the kills: exit {last.returncode} {err[-200:]}")
        )
    leftovers = sorted(p.name for p in out.iterdir() if p.name.startswith("."))
    if leftovers:
        tally.problems.append(("replaced", f"kills: left {leftovers} after a clean run"))
    return tally


# ---- running families --------------------------------------------------------------------------------------


def run_family(family: str, seed: int, count: int, root: Path) -> Tally:
    """``count`` cases of one family from ``seed``."""
    rng = random.Random(f"{family}-{seed}")
    tally = Tally()
    if family == "bombs":
        return bombs(root, seed, count)
    if family == "kills":
        return kills(root, seed, count)
    for index in range(count):
        if family == "outputs":
            tally.add(output_case(root / f"o{index}", rng))
        elif family == "loops":
            tally.add(loop_case(rng))
        else:
            tally.add(signal_case(root / f"s{index}", rng))
    return tally


#: Cases per family in CI (seeded): in-process families are fast, each signal or kill costs a process.
CI_CASES = {"outputs": 40, "bombs": 12, "loops": 24, "signals": 2, "kills": 5}


def test_outputs_that_are_not_regular_files(tmp_path: Path) -> None:
    tally = run_family("outputs", 22, CI_CASES["outputs"], tmp_path)
    assert tally.tried >= CI_CASES["outputs"] // 2 and not tally.problems, tally.problems


def test_fold_bombs(tmp_path: Path) -> None:
    tally = run_family("bombs", 22, CI_CASES["bombs"], tmp_path)
    assert not tally.problems, tally.problems


def test_long_loops(tmp_path: Path) -> None:
    tally = run_family("loops", 22, CI_CASES["loops"], tmp_path)
    assert not tally.problems, tally.problems


def test_interrupted_runs(tmp_path: Path) -> None:
    tally = run_family("signals", 22, CI_CASES["signals"], tmp_path / "signals")
    tally.add(run_family("kills", 22, CI_CASES["kills"], tmp_path / "kills"))
    assert not tally.problems, tally.problems


# ---- long runs ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=100, help="cases per in-process family (default 100)")
    parser.add_argument(
        "--processes", type=int, default=None, help="signal and kill cases (default cases/10)"
    )
    parser.add_argument("--seed", type=int, default=1, help="seed (default 1)")
    parser.add_argument("--fold-bombs", nargs=3, help=argparse.SUPPRESS)  # the bombs family's own process
    args = parser.parse_args(argv)
    import logging

    logging.disable(logging.CRITICAL)
    if args.fold_bombs:
        seed, count, root = args.fold_bombs
        _fold_bombs(int(seed), int(count), Path(root))
        return 0
    processes = args.processes if args.processes is not None else max(2, args.cases // 10)
    counts = {"outputs": args.cases, "bombs": args.cases, "loops": args.cases, "signals": processes}
    counts["kills"] = processes
    total = Tally()
    with tempfile.TemporaryDirectory(prefix="gskit-fuzz-processes-") as tmp:
        for family, count in counts.items():
            tally = run_family(family, args.seed, count, Path(tmp) / family)
            print(f"{family}: {tally.tried} cases, {len(tally.problems)} findings", flush=True)
            total.add(tally)
    tracebacks = sum(kind == "traceback" for kind, _ in total.problems)
    replaced = sum(kind == "replaced" for kind, _ in total.problems)
    print(
        f"{total.tried} hostile inputs tried, {tracebacks} tracebacks, {replaced} files replaced or deleted "
        f"that the user did not name, at most {total.slowest_end:.1f} s to end after SIGINT/SIGTERM"
    )
    for kind, what in total.problems[:50]:
        print(f"{kind}: {what}")
    return 1 if total.problems else 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
