"""Fuzzing the model reader: truncated and byte-flipped models through ``inspect``, ``fold`` and ``prepare``;
and models whose names try to be markup or terminal control through every command that shows names.

Every case must end cleanly: exit 0, 1 or 2, one ``error:`` line on 2, no traceback and no safety-net
message ("a gskit bug"), within a time limit; the input file unchanged; nothing read or written under the
case's folder outside the input's folder and the named output, and nothing written outside the output and
the system's temporary folder (checked with an audit hook on ``open`` and with directory listings).

In CI (pytest) a fixed, seeded set of cases runs in well under a minute. For a long run::

    python tests/test_fuzz.py --cases 2000 [--seed 1] [--minutes 10]

prints ``N malformed inputs tried, 0 tracebacks, 0 files read or written outside what the user named`` or
the failing cases (exit 1). ``--names N`` runs N hostile-name cases instead (``tests/hostile_names.py``): each
must end cleanly with nothing on stdout or stderr that a terminal would act on (in a pipe and with colours
forced), its JSON strict and exact, ``report.html`` free of raw controls.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import io
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import pytest
from hostile_names import hostile_name, renamed, strict_json, unsafe_characters
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "gskit" / "data" / "example.onnx"
#: Seconds one command may take on one case before it counts as a hang.
CASE_SECONDS = 20


class CaseTimeout(BaseException):
    """Raised by the alarm in a case that hangs (a BaseException: the CLI's safety net must not catch it)."""


# ---- models built here -------------------------------------------------------------------------------------


def _light_models() -> dict[str, onnx.ModelProto]:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    weight = numpy_helper.from_array(
        np.linspace(-1, 1, 4 * 3 * 3 * 3, dtype=np.float32).reshape(4, 3, 3, 3), "w"
    )
    conv = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="conv"),
            helper.make_node("Relu", ["c"], ["r"], name="relu"),
            helper.make_node("Shape", ["r"], ["s"], name="shape"),
            helper.make_node("ConstantOfShape", ["s"], ["z"], name="zeros"),
            helper.make_node("Add", ["r", "z"], ["y"], name="add"),
        ],
        "conv",
        [x],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        initializer=[weight],
    )
    then_branch = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Abs", ["x"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)],
    )
    cond = helper.make_tensor("cond", TensorProto.BOOL, [], [True])
    branchy = helper.make_graph(
        [
            helper.make_node(
                "If", ["cond"], ["i"], then_branch=then_branch, else_branch=else_branch, name="if"
            ),
            helper.make_node("custom.Plug", ["i"], ["y"], domain="custom", name="plug", alpha=0.5, label="p"),
        ],
        "branchy",
        [x],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])],
        initializer=[cond],
    )
    opsets = [helper.make_opsetid("", 17)]
    return {
        "conv": helper.make_model(conv, opset_imports=opsets, producer_name="fuzz"),
        "branchy": helper.make_model(branchy, opset_imports=[*opsets, helper.make_opsetid("custom", 1)]),
    }


def base_models() -> dict[str, bytes]:
    """Serialized models the cases mutate: the bundled example and the light ones built here."""
    models = {"example": EXAMPLE.read_bytes()}
    models.update({name: model.SerializeToString() for name, model in _light_models().items()})
    return models


# ---- mutations ---------------------------------------------------------------------------------------------


def mutate(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    """A malformed copy of ``data`` (truncated, bytes flipped, a run zeroed or repeated), described."""
    kind = rng.choice(("truncate", "flip", "flip", "flips", "zero", "repeat"))
    size = len(data)
    if kind == "truncate":
        cut = rng.randrange(0, size)
        return f"truncate@{cut}", data[:cut]
    buf = bytearray(data)
    if kind == "flip":
        at = rng.randrange(size)
        buf[at] = rng.randrange(256)
        return f"flip@{at}", bytes(buf)
    if kind == "flips":
        spots = sorted(rng.randrange(size) for _ in range(rng.randint(2, 16)))
        for at in spots:
            buf[at] ^= 1 << rng.randrange(8)
        return f"flips@{spots[:3]}...", bytes(buf)
    at, length = rng.randrange(size), rng.randint(1, 64)
    if kind == "zero":
        buf[at : at + length] = bytes(len(buf[at : at + length]))
        return f"zero@{at}+{length}", bytes(buf)
    return f"repeat@{at}+{length}", bytes(buf[: at + length] + buf[at : at + length] + buf[at + length :])


# ---- running one case --------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What one command on one malformed input did; ``problems`` empty when it behaved."""

    case: str
    command: str
    code: int | None = None
    problems: list[str] = field(default_factory=list)


class OpenWatch:
    """Audit hook recording the files Python opens (read or write) while a case runs."""

    def __init__(self) -> None:
        self.active = False
        self.opened: list[tuple[str, bool]] = []
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple) -> None:
        if (
            not self.active
            or event != "open"
            or not args
            or not isinstance(args[0], (str, bytes, os.PathLike))
        ):
            return
        path, mode = args[0], args[1] if len(args) > 1 else "r"
        name = os.fsdecode(path)
        if name in sys.path or name.startswith("__editable__"):
            return  # the import system probing sys.path entries, not gskit reading a file
        if mode is None and not os.path.isabs(name):
            return  # os.open relative to a dir_fd (shutil.rmtree of gskit's own scratch folders)
        flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
        writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool(
            flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
        )
        self.opened.append((os.path.abspath(name), writes))  # relative to the cwd of now

    @contextlib.contextmanager
    def watching(self) -> Iterator[list[tuple[str, bool]]]:
        self.opened = []
        self.active = True
        try:
            yield self.opened
        finally:
            self.active = False


_WATCH: OpenWatch | None = None


def _watch() -> OpenWatch:
    global _WATCH
    if _WATCH is None:
        _WATCH = OpenWatch()
    return _WATCH


@contextlib.contextmanager
def _alarm(seconds: int) -> Iterator[None]:
    def expired(signum: int, frame: object) -> None:
        raise CaseTimeout

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _listing(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def _inside(path: str, *folders: Path) -> bool:
    resolved = Path(os.path.abspath(path))
    return any(resolved == f or f in resolved.parents for f in folders)


def run_case(root: Path, name: str, data: bytes, command: str, *, subprocess_run: bool = False) -> Outcome:
    """Run ``gskit COMMAND`` on ``data`` saved as ``root/in/model.onnx``, from ``root/cwd``; check it."""
    from gskit.cli import main

    model_dir, out_dir, cwd = root / "in", root / "out", root / "cwd"
    for folder in (model_dir, out_dir, cwd):
        folder.mkdir(parents=True, exist_ok=True)
    (root / "secret").mkdir(exist_ok=True)
    (root / "secret" / "weights.bin").write_bytes(b"\0" * 64)
    model = model_dir / "model.onnx"
    model.write_bytes(data)
    argv = [command, str(model)]
    if command == "fold":
        argv += ["-o", str(out_dir / "folded.onnx")]
    elif command == "prepare":
        argv += ["-o", str(out_dir / "prepared")]
    before = {folder: _listing(folder) for folder in (model_dir, cwd, root)}
    outcome = Outcome(name, command)
    if subprocess_run:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        try:
            done = subprocess.run(
                [sys.executable, "-m", "gskit.cli", *argv],
                capture_output=True,
                text=True,
                cwd=cwd,
                env=env,
                timeout=CASE_SECONDS * 3,
            )
            outcome.code, err = done.returncode, done.stderr
        except subprocess.TimeoutExpired:
            outcome.problems.append("hang (timed out)")
            return outcome
        opened: list[tuple[str, bool]] = []
    else:
        err_stream = io.StringIO()
        old_cwd = os.getcwd()
        os.chdir(cwd)
        try:
            with (
                _watch().watching() as opened,
                contextlib.redirect_stderr(err_stream),
                contextlib.redirect_stdout(io.StringIO()),
                _alarm(CASE_SECONDS),
            ):
                outcome.code = main(argv)
        except CaseTimeout:
            outcome.problems.append(f"hang (over {CASE_SECONDS} s)")
        except SystemExit as stop:  # argparse
            outcome.code = int(stop.code or 0)
        except BaseException as exc:  # noqa: BLE001  # anything escaping main is the finding itself
            outcome.problems.append(f"escaped main: {type(exc).__name__}: {exc}")
        finally:
            os.chdir(old_cwd)
        err = err_stream.getvalue()
    outcome.problems += _check(outcome.code, err)
    if model.read_bytes() != data:
        outcome.problems.append("the input file changed")
    for folder, listing in before.items():
        now = _listing(folder)
        if folder is root:
            now = {p for p in now if not p.startswith(("out", "in", "cwd"))}
            listing = {p for p in listing if not p.startswith(("out", "in", "cwd"))}
        if now != listing:
            outcome.problems.append(
                f"files appeared or vanished in {folder.name}: {sorted(now ^ listing)[:3]}"
            )
    outcome.problems += _stray_opens(opened, root, model_dir, out_dir)
    return outcome


def _check(code: int | None, err: str) -> list[str]:
    problems = []
    if "Traceback" in err:
        problems.append("traceback: " + err.strip().splitlines()[-1])
    if "a gskit bug" in err:
        problems.append("safety net: " + next(line for line in err.splitlines() if "a gskit bug" in line))
    if code is not None and code not in (0, 1, 2):
        problems.append(f"exit code {code}")
    if code == 2:
        errors = [line for line in err.splitlines() if "error:" in line]
        if len(errors) != 1:
            problems.append(f"exit 2 with {len(errors)} error lines: {err.strip()[:200]}")
    return problems


def _stray_opens(opened: list[tuple[str, bool]], root: Path, model_dir: Path, out_dir: Path) -> list[str]:
    """Opens under the case folder outside the input's folder and the output; writes outside the output
    and the temporary folder (where gskit's scratch files go)."""
    temp = Path(tempfile.gettempdir()).resolve()
    problems = []
    for path, writes in opened:
        if path.startswith("/dev/") or path.startswith("/proc/"):
            continue
        if _inside(path, root.resolve()) and not _inside(path, model_dir.resolve(), out_dir.resolve()):
            problems.append(f"{'wrote' if writes else 'read'} {path}")
        elif writes and not _inside(path, out_dir.resolve(), temp):
            problems.append(f"wrote {path}")
    return problems


def cases(seed: int, count: int) -> Iterator[tuple[str, bytes]]:
    """``count`` malformed models, round robin over the base models, from ``seed``."""
    rng = random.Random(seed)
    bases = sorted(base_models().items())
    for index in range(count):
        name, data = bases[index % len(bases)]
        how, mutated = mutate(data, rng)
        yield f"{name}:{how}", mutated


# ---- names that try to be markup or terminal control (issue 22) ------------------------------------------

#: Commands that show names, as argv after ``gskit`` (MODEL, OUT filled in); prepare is slow, so rarer.
NAME_COMMANDS = {
    "inspect": ["inspect", "MODEL"],
    "inspect --nodes": ["inspect", "MODEL", "--nodes"],
    "inspect --tensors --json": ["inspect", "MODEL", "--tensors", "--json"],
    "replace --explain": ["replace", "MODEL", "-o", "OUT/r.onnx", "--explain"],
    "compare --layerwise": ["compare", "MODEL", "MODEL", "--layerwise"],
    "compare --json": ["compare", "MODEL", "MODEL", "--json"],
    "check-trt": ["check-trt", "MODEL", "--backend", "static"],
    "fold": ["fold", "MODEL", "-o", "OUT/f.onnx"],
    "infer-shapes": ["infer-shapes", "MODEL", "-o", "OUT/s.onnx"],
    "missing file": ["inspect", "OUT/missing.onnx"],
}
#: Every how many name cases one runs ``gskit prepare`` (report.json and report.html checked too).
PREPARE_EVERY = 12


def name_case(root: Path, index: int, rng: random.Random) -> list[str]:
    """A base model with hostile names through one command; the problems found ("" prefixed by the case)."""
    from gskit.cli import main

    base, data = rng.choice(sorted(base_models().items()))
    suffix = hostile_name(rng)
    prefix = hostile_name(rng) if rng.random() < 0.3 else ""
    model = renamed(onnx.load_from_string(data), lambda name: prefix + name + suffix)
    root.mkdir(parents=True)
    file_name = hostile_name(rng).replace("/", "|").replace("\x00", "") if rng.random() < 0.3 else "model"
    path = root / f"{file_name}.onnx"
    onnx.save(model, path)
    name = "prepare" if index % PREPARE_EVERY == 0 else rng.choice(sorted(NAME_COMMANDS))
    argv = (
        ["prepare", "MODEL", "-o", "OUT/prepared", "--skip", "build"]
        if name == "prepare"
        else NAME_COMMANDS[name]
    )
    argv = [str(path) if a == "MODEL" else a.replace("OUT", str(root)) for a in argv]
    colour = rng.random() < 0.5
    label = f"{base} {name}{' (colour)' if colour else ''} names +{suffix!r}"
    out, err = io.StringIO(), io.StringIO()
    saved = {key: os.environ.get(key) for key in ("FORCE_COLOR", "TERM")}
    os.environ.update({"FORCE_COLOR": "1", "TERM": "xterm-256color"} if colour else {})
    try:
        # prepare's first validation imports torch (Polygraphy asks whether a feed is a torch tensor): slow
        seconds = CASE_SECONDS * (3 if name == "prepare" else 1)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _alarm(seconds):
            code = main(argv)
    except CaseTimeout:
        return [f"{label}: hang (over {seconds} s)"]
    except BaseException as exc:  # noqa: BLE001  # anything escaping main is the finding itself
        return [f"{label}: escaped main: {type(exc).__name__}: {exc}"]
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    problems = _check(code, err.getvalue())
    # the "branchy" model's custom node has no plugin spec: running it is refused, rightly
    refused = "missing file" in name or "has no plugin spec" in err.getvalue()
    if code == 2 and not refused:
        problems.append(f"exit 2: {err.getvalue().strip()[-300:]}")
    shown = unsafe_characters(out.getvalue() + err.getvalue(), colour=colour)
    if shown:
        problems.append(f"raw on the terminal: {shown}")
    if name.endswith("--json") and code in (0, 1):
        try:
            parsed = strict_json(out.getvalue())
        except ValueError as exc:
            problems.append(f"not strict JSON: {exc}")
        else:
            if name.startswith("inspect"):
                names = {t["name"] for t in parsed["tensors"]}  # type: ignore[index]
                expected = {v.name for v in (*model.graph.input, *model.graph.output)}
                if not expected <= names:
                    problems.append("JSON lost the exact names")
    if name == "prepare" and code in (0, 1):
        for report in ("report.json", "report.html"):
            text = (root / "prepared" / report).read_text()
            if unsafe_characters(text):
                problems.append(f"{report} holds raw controls: {unsafe_characters(text)}")
        try:
            strict_json((root / "prepared" / "report.json").read_text())
        except ValueError as exc:
            problems.append(f"report.json: {exc}")
    return [f"{label}: {p}" for p in problems]


def name_cases(seed: int, count: int, root: Path) -> list[str]:
    rng = random.Random(f"names-{seed}")
    found: list[str] = []
    for index in range(count):
        found += name_case(root / str(index), index, rng)
    return found


# ---- in CI -------------------------------------------------------------------------------------------------

#: (seed, cases) per command in CI; prepare is slower, so it sees fewer.
CI_CASES = {"inspect": 300, "fold": 200, "prepare": 10}


@pytest.mark.parametrize("command", sorted(CI_CASES))
def test_malformed_models_end_cleanly(tmp_path, command) -> None:
    failures = []
    for index, (name, data) in enumerate(cases(seed=15 + len(command), count=CI_CASES[command])):
        outcome = run_case(tmp_path / str(index), name, data, command)
        if outcome.problems:
            failures.append(f"{command} {name}: {outcome.problems}")
    assert not failures, "\n".join(failures)


def test_malformed_models_end_cleanly_in_a_real_process(tmp_path) -> None:
    """A handful through ``python -m gskit.cli``: the interpreter's own exit codes and stderr."""
    failures = []
    for index, (name, data) in enumerate(cases(seed=7, count=3)):
        for command in ("inspect", "fold"):
            outcome = run_case(tmp_path / f"{index}-{command}", name, data, command, subprocess_run=True)
            if outcome.problems:
                failures.append(f"{command} {name}: {outcome.problems}")
    assert not failures, "\n".join(failures)


#: Hostile-name cases in CI (seeded).
CI_NAME_CASES = 24


def test_hostile_names_are_data_for_every_command(tmp_path) -> None:
    found = name_cases(22, CI_NAME_CASES, tmp_path)
    assert not found, "\n".join(found)


def test_mutations_are_malformed_and_deterministic() -> None:
    first = list(cases(seed=3, count=12))
    assert first == list(cases(seed=3, count=12))
    originals = set(base_models().values())
    assert all(data not in originals for _, data in first if data)


# ---- long runs ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fuzz gskit's model reader with malformed models.")
    parser.add_argument("--cases", type=int, default=1000, help="malformed models to try (default 1000)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the mutations (default 1)")
    parser.add_argument("--minutes", type=float, default=None, help="stop after this long")
    parser.add_argument("--prepare-every", type=int, default=25, help="run prepare on every Nth case")
    parser.add_argument("--start", type=int, default=0, help="skip the first N cases of the seed")
    parser.add_argument("--trace", action="store_true", help="print each case before running it")
    parser.add_argument("--names", type=int, default=0, help="run N hostile-name cases instead")
    args = parser.parse_args(argv)
    import logging

    logging.disable(logging.CRITICAL)
    if args.names:
        with tempfile.TemporaryDirectory(prefix="gskit-fuzz-names-") as tmp:
            found = name_cases(args.seed, args.names, Path(tmp))
        print(f"{args.names} hostile-name cases tried, {len(found)} failing")
        for failure in found[:50]:
            print(failure)
        return 1 if found else 0
    deadline = time.monotonic() + args.minutes * 60 if args.minutes else None
    tried, failures, strays, crashes = 0, [], 0, 0
    watchdog_log = open(os.devnull, "w") if not args.trace else sys.stderr  # noqa: SIM115
    codes: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="gskit-fuzz-") as tmp:
        for index, (name, data) in enumerate(cases(args.seed, args.cases)):
            if index < args.start:
                continue
            if deadline is not None and time.monotonic() > deadline:
                break
            commands = ["inspect", "fold"] + (["prepare"] if index % args.prepare_every == 0 else [])
            for command in commands:
                # A hang inside C code never returns to the alarm: dump where it is and stop, naming the case.
                print(f"case {index} {command} {name}", file=watchdog_log, flush=True)
                faulthandler.dump_traceback_later(CASE_SECONDS * 3, exit=True, file=sys.stderr)
                outcome = run_case(Path(tmp) / str(index) / command, name, data, command)
                faulthandler.cancel_dump_traceback_later()
                key = f"{command} exit {outcome.code}"
                codes[key] = codes.get(key, 0) + 1
                if outcome.problems:
                    failures.append(f"{command} {name}: {outcome.problems}")
                    print(f"FAILED case {index}: {failures[-1]}", file=sys.stderr, flush=True)
                    stray = [p for p in outcome.problems if p.startswith(("read ", "wrote ", "files "))]
                    strays += len(stray) > 0
                    crashes += len(stray) < len(outcome.problems)
            tried += 1
            if index % 100 == 99:
                print(f"... {tried} tried, {len(failures)} failing", file=sys.stderr, flush=True)
    print(
        f"{tried} malformed inputs tried, {crashes} tracebacks, "
        f"{strays} files read or written outside what the user named",
        flush=True,
    )
    print("runs by exit code: " + ", ".join(f"{k}: {v}" for k, v in sorted(codes.items())))
    for failure in failures[:50]:
        print(failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
