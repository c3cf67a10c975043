"""Small models that are expensive to fold or to run, and the check that OUTDIR holds one prepare run's
files (issue 22): shared by the security tests and the seeded fuzz suite (tests/test_fuzz_processes.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from gskit.io import model as gsmodel

OPSETS = [helper.make_opsetid("", 17)]
REPO = Path(__file__).resolve().parents[1]
#: Commands with ``-o FILE`` and the arguments each needs besides MODEL (for small_model's models).
OUTPUT_COMMANDS = {
    "fold": [],
    "sanitize": [],
    "convert": ["--opset", "18"],
    "edit": ["--rename", "y=z"],
    "isolate": ["--inputs", "x", "--outputs", "y"],
    "infer-shapes": [],
    "replace": [],
}


def _model(nodes, inits, *, value_info=(), x_shape=(1,), name="hostile") -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x_shape))],
        inits,
        value_info=list(value_info),
    )
    return helper.make_model(graph, opset_imports=OPSETS)


def _const(name: str, values, dtype=np.int64) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, dtype=dtype), name)


def expand_concat(copies: int = 400, elements: int = 2**20) -> onnx.ModelProto:
    """``copies`` Expand results of ``elements`` floats each (4 MB by default, each under fold's 16 MiB
    threshold), concatenated and summed into the output: 1.6 GB together from a 17 kB file."""
    nodes = [
        helper.make_node("Expand", ["one", "shape"], [f"e{i}"], name=f"expand{i}") for i in range(copies)
    ]
    nodes += [
        helper.make_node("Concat", [f"e{i}" for i in range(copies)], ["c"], axis=0, name="concat"),
        helper.make_node("ReduceSum", ["c"], ["s"], keepdims=0, name="sum"),
        helper.make_node("Add", ["x", "s"], ["y"], name="add"),
    ]
    return _model(nodes, [_const("one", [1.0], np.float32), _const("shape", [elements])])


def lying_expand(elements: int = 400 * 2**20, claim: tuple[int, ...] = (1,)) -> onnx.ModelProto:
    """An Expand of ``elements`` floats (1.6 GB) whose value_info claims the shape ``claim``."""
    nodes = [
        helper.make_node("Expand", ["one", "shape"], ["e"], name="expand"),
        helper.make_node("ReduceSum", ["e"], ["s"], keepdims=0, name="sum"),
        helper.make_node("Add", ["x", "s"], ["y"], name="add"),
    ]
    claims = [helper.make_tensor_value_info("e", TensorProto.FLOAT, list(claim))]
    return _model(nodes, [_const("one", [1.0], np.float32), _const("shape", [elements])], value_info=claims)


def growing(op: str, factor: int, claim: tuple[int, ...] | None = (1,)) -> onnx.ModelProto:
    """One op whose result holds ``factor`` elements from a few bytes of constants (Expand, Tile,
    ConstantOfShape, Range, Pad, OneHot, an outer product or a broadcast), summed into the output; the
    result's value_info claims ``claim`` (None: no claim)."""
    side = max(1, int(np.sqrt(factor)))
    inits: list[onnx.TensorProto] = []
    if op == "Expand":
        nodes = [helper.make_node("Expand", ["one", "n"], ["g"])]
        inits = [_const("one", [1.0], np.float32), _const("n", [factor])]
    elif op == "Tile":
        nodes = [helper.make_node("Tile", ["one", "n"], ["g"])]
        inits = [_const("one", [1.0], np.float32), _const("n", [factor])]
    elif op == "ConstantOfShape":
        value = numpy_helper.from_array(np.array([1.0], np.float32), "value")
        nodes = [helper.make_node("ConstantOfShape", ["n"], ["g"], value=value)]
        inits = [_const("n", [side, side])]
    elif op == "Range":
        nodes = [helper.make_node("Range", ["a", "b", "c"], ["g"])]
        inits = [
            _const("a", 0.0, np.float32),
            _const("b", float(factor), np.float32),
            _const("c", 1.0, np.float32),
        ]
    elif op == "Pad":
        nodes = [helper.make_node("Pad", ["one2", "p"], ["g"])]
        inits = [_const("one2", [[1.0]], np.float32), _const("p", [0, 0, side, side])]
    elif op == "OneHot":
        nodes = [helper.make_node("OneHot", ["i", "d", "v"], ["g"], axis=-1)]
        inits = [_const("i", list(range(side))), _const("d", side), _const("v", [0.0, 1.0], np.float32)]
    elif op == "Outer":
        nodes = [
            helper.make_node("Expand", ["one", "col"], ["a"]),
            helper.make_node("Expand", ["one", "row"], ["b"]),
            helper.make_node("MatMul", ["a", "b"], ["g"]),
        ]
        inits = [_const("one", [1.0], np.float32), _const("col", [side, 1]), _const("row", [1, side])]
    else:  # a broadcast of a column and a row
        nodes = [
            helper.make_node("Expand", ["one", "col"], ["a"]),
            helper.make_node("Expand", ["one", "row"], ["b"]),
            helper.make_node("Add", ["a", "b"], ["g"]),
        ]
        inits = [_const("one", [1.0], np.float32), _const("col", [side, 1]), _const("row", [1, side])]
    nodes += [
        helper.make_node("ReduceSum", ["g"], ["s"], keepdims=0),
        helper.make_node("Add", ["x", "s"], ["y"]),
    ]
    claims = [] if claim is None else [helper.make_tensor_value_info("g", TensorProto.FLOAT, list(claim))]
    return _model(nodes, inits, value_info=claims, name=f"grow_{op}")


def long_loop(
    trips: int | None = 10**12, body_nodes: int = 1, *, nested: int | None = None
) -> onnx.ModelProto:
    """A constant Loop of ``trips`` iterations (None: no trip count, runs while its condition holds, which
    stays true) whose body adds the iteration number ``body_nodes`` times; ``nested``: the body runs an
    inner Loop of that many iterations too."""
    nodes = [helper.make_node("Cast", ["i"], ["f0"], to=TensorProto.FLOAT)]
    for k in range(body_nodes):
        nodes.append(helper.make_node("Add", ["v" if k == 0 else f"a{k - 1}", "f0"], [f"a{k}"]))
    last = f"a{body_nodes - 1}"
    if nested is not None:
        inner = long_loop(nested, 1).graph.node[0].attribute[0].g
        nodes.append(helper.make_node("Loop", ["inner_m", "", last], ["inner_out"], body=inner))
        nodes.append(helper.make_node("Identity", ["inner_out"], ["v2"]))
    else:
        nodes.append(helper.make_node("Identity", [last], ["v2"]))
    nodes.append(helper.make_node("Identity", ["c"], ["c2"]))
    inits = [_const("inner_m", nested)] if nested is not None else []
    body = helper.make_graph(
        nodes,
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v", TensorProto.FLOAT, [1]),
        ],
        [
            helper.make_tensor_value_info("c2", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v2", TensorProto.FLOAT, [1]),
        ],
        inits,
    )
    trip_input = "M" if trips is not None else ""
    outer = [
        helper.make_node("Loop", [trip_input, "cond", "v0"], ["vf"], body=body, name="loop"),
        helper.make_node("Add", ["x", "vf"], ["y"], name="add"),
    ]
    consts = [_const("cond", True, np.bool_), _const("v0", [0.0], np.float32)]
    if trips is not None:
        consts.append(_const("M", trips))
    return _model(outer, consts, name="loop")


def matmul_chain(size: int = 2048, depth: int = 30) -> onnx.ModelProto:
    """A chain of ``depth`` constant MatMuls of ``size`` x ``size`` floats (each result at fold's threshold):
    allowed to fold, and slow, so a signal can land while onnxruntime evaluates it."""
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((size, size)) / np.sqrt(size)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["A" if i == 0 else f"m{i - 1}", "A"], [f"m{i}"]) for i in range(depth)
    ]
    nodes += [
        helper.make_node("ReduceSum", [f"m{depth - 1}"], ["s"], keepdims=0),
        helper.make_node("Add", ["x", "s"], ["y"]),
    ]
    return _model(nodes, [numpy_helper.from_array(a, "A")], name="chain")


def small_model(path: Path, *, weights: int = 8) -> Path:
    """y = x @ w (w of weights x weights floats) + b, saved at ``path`` (external data past 1 KiB tensors)."""
    w = np.linspace(-1, 1, weights * weights, dtype=np.float32).reshape(weights, weights)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, weights])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, weights])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.ones(weights, np.float32), "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return gsmodel.save(model, path, external_data=weights * weights * 4 >= 1024)


def _run_of(out: Path, name: str) -> str | None:
    """Which input model the OUTDIR file ``name`` was written for: "a" or "b" (None when unreadable)."""
    path = out / name
    if name == "report.json":
        return Path(json.loads(path.read_text())["model"]).stem
    if name == "report.html":
        text = path.read_text()
        return "a" if "gskit prepare: a.onnx" in text else "b" if "gskit prepare: b.onnx" in text else None
    if name == "model.onnx.data":
        return "b"  # only b's weights are large enough for a data file
    proto = onnx.load(str(path), load_external_data=False)
    return {8: "a", 32: "b"}.get(proto.graph.input[0].type.tensor_type.shape.dim[1].dim_value)


#: The files of each run: a has small weights (no data file), b large ones.
ONE_RUN_SETS = {
    "a": {"model.onnx", "report.json", "report.html"},
    "b": {"model.onnx", "model.onnx.data", "report.json", "report.html"},
}


def check_one_run(out: Path) -> str | None:
    """The run OUTDIR's files belong to (None: no file); asserts they all belong to that one run, and that
    report.json is there only beside all of them."""
    names = ("model.onnx", "model.onnx.data", "report.json", "report.html")
    present = {name for name in names if (out / name).exists()}
    runs = {_run_of(out, name) for name in present}
    assert len(runs) <= 1, f"files of two runs: { {n: _run_of(out, n) for n in present} }"
    run = next(iter(runs), None)
    if "report.json" in present:
        report = json.loads((out / "report.json").read_text())
        expected = ONE_RUN_SETS[run] if report["error"] is None else {"report.json", "report.html"}  # type: ignore[index]
        assert present == expected, (run, sorted(present))
    return run


def peak_resident_bytes() -> int:
    """This process's own peak resident memory (``VmHWM``).

    Not ``ru_maxrss``: Linux carries that over fork + exec, so a child of a large pytest process would report
    the parent's size (4.5 GB in the full suite) and no fold would ever look small enough.
    """
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))


def start_gskit(argv: list[str], cwd: Path, stderr=subprocess.PIPE) -> subprocess.Popen:
    """``python -m gskit.cli ARGV`` from ``cwd`` (this checkout's gskit)."""
    return subprocess.Popen(
        [sys.executable, "-m", "gskit.cli", *argv],
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


Ready = Callable[[int, str], bool]


def signalled(
    argv: list[str], sig: signal.Signals, delay: float, cwd: Path, ready: Ready | None = None
) -> tuple[int | None, float, str]:
    """Start ``gskit ARGV``, wait until ``ready(pid, stderr so far)`` (at most 120 s), then ``delay`` s, and
    send ``sig``: (exit code, seconds it took to end, stderr); the code is None when it still ran 60 s later
    (it is killed then)."""
    log = cwd / f"stderr-{time.monotonic_ns()}.txt"
    with open(log, "w") as err_file:
        proc = start_gskit(argv, cwd, stderr=err_file)
        deadline = time.monotonic() + 120
        while ready is not None and proc.poll() is None and time.monotonic() < deadline:
            if ready(proc.pid, log.read_text()):
                break
            time.sleep(0.1)
        time.sleep(delay)
        sent = time.monotonic()
        proc.send_signal(sig)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return None, time.monotonic() - sent, log.read_text()
    seconds = time.monotonic() - sent
    err = log.read_text()
    log.unlink()
    return proc.returncode, seconds, err


def threads_at_least(count: int) -> Ready:
    """Ready once the process runs ``count`` threads (onnxruntime's pool and gskit's worker: evaluating)."""

    def ready(pid: int, err: str) -> bool:
        try:
            return len(os.listdir(f"/proc/{pid}/task")) >= count
        except FileNotFoundError:
            return True

    return ready


def has_child(pid: int, err: str) -> bool:
    """Ready once the process started a child (the TensorRT worker)."""
    try:
        return bool(Path(f"/proc/{pid}/task/{pid}/children").read_text().split())
    except FileNotFoundError:
        return True


def make_entry(path: Path, kind: str, keep: list[socket.socket]) -> bool:
    """Put an entry of ``kind`` at ``path``: fifo, socket (kept open in ``keep``), folder, chardev (a node
    like /dev/null), "link to KIND", regular, absent; False when this machine cannot (a device needs root)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "chardev":
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            return False
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        keep.append(sock)
    elif kind.startswith("link to "):
        target = path.parent / f"target-{path.name}"
        make_entry(target, kind[len("link to ") :], keep)
        path.symlink_to(target)
    elif kind == "regular":
        path.write_bytes(b"the user's file")
    return True
