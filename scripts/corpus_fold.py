"""Fold on the corpus: gskit's ``fold`` against Polygraphy's ``surgeon sanitize --fold-constants``.

Used by ``scripts/real_models.py --fold-vs-polygraphy``. For each model it counts the nodes (graph and
subgraphs) left by

* gskit's library ``fold(model)`` with its default options (16 MiB ``size_threshold``),
* the same with ``size_threshold=None`` (no limit, as Polygraphy's CLI default),
* ``polygraphy surgeon sanitize MODEL --fold-constants -o OUT`` (the CLI, in a temporary working folder:
  Polygraphy writes uuid-named ``.data`` files into the current folder),

and runs onnx's checker on the input and on each output. Every tool runs in its own subprocess with a
timeout, so one model that hangs or crashes a tool is a row, not the end of the run.

A row is flagged when gskit (no limit) leaves more nodes than Polygraphy (a real miss), when only the
default threshold makes the difference or gskit's extra nodes are all ``Cast`` (graphsurgeon's cast
elision, which gskit turns off because ``Cast(int->float) -> Add -> Cast(->int)`` computed as an integer
``Add`` differs past float's exact range; documented choices, reported but not problems), or when gskit's
output fails a checker level that its input passed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

#: Seconds one tool may take on one model.
FOLD_TIMEOUT = 600
#: The three folds compared, in table order.
TOOLS = ("gskit", "gskit-nolimit", "polygraphy")
#: Checker levels, worst first: ``fail`` (onnx.checker rejects the file), ``basic`` (passes the checker,
#: fails its ``full_check`` strict shape inference), ``full`` (passes both).
CHECK_LEVELS = ("fail", "basic", "full")


@dataclass
class FoldRow:
    """One model folded by every tool."""

    model: str
    exporter: str
    nodes_in: int | None = None
    check_in: str = ""
    nodes: dict[str, int | None] = field(default_factory=dict)
    check: dict[str, str] = field(default_factory=dict)
    #: ops gskit (no limit) leaves beyond Polygraphy's output, by op type (only where it leaves more)
    extra_ops: dict[str, int] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.model} {self.exporter}".strip()


def compare_fold(name: str, exporter: str, path: Path, env: dict[str, str]) -> FoldRow:
    """Fold ``path`` with every tool (each in a subprocess) and count nodes and checker levels."""
    row = FoldRow(name, exporter)
    row.nodes_in, row.check_in, _ = _measure(path, env)
    ops: dict[str, dict[str, int]] = {}
    with tempfile.TemporaryDirectory(prefix="gskit-corpus-fold-") as tmp:
        for tool in TOOLS:
            out = Path(tmp) / tool / "folded.onnx"
            out.parent.mkdir()
            start = time.perf_counter()
            error = _run_tool(tool, path, out, env)
            row.seconds[tool] = round(time.perf_counter() - start, 1)
            if error:
                row.errors[tool] = error
                row.nodes[tool], row.check[tool] = None, ""
                continue
            row.nodes[tool], row.check[tool], ops[tool] = _measure(out, env)
    if "gskit-nolimit" in ops and "polygraphy" in ops:
        mine, theirs = Counter(ops["gskit-nolimit"]), Counter(ops["polygraphy"])
        if sum(mine.values()) > sum(theirs.values()):
            row.extra_ops = dict(sorted((mine - theirs).items()))
    return row


def _run_tool(tool: str, model: Path, out: Path, env: dict[str, str]) -> str:
    """Run one fold; '' on success, else the one-line reason."""
    if tool == "polygraphy":
        command = ["polygraphy", "surgeon", "sanitize", str(model), "--fold-constants", "-o", str(out)]
    else:
        command = [sys.executable, __file__, "--gskit-worker", tool, str(model), str(out)]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, env=env, cwd=out.parent, timeout=FOLD_TIMEOUT
        )
    except subprocess.TimeoutExpired:
        return f"timed out after {FOLD_TIMEOUT}s"
    if done.returncode or not out.is_file():
        lines = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        errors = [line for line in lines if "error" in line.lower()] or lines
        return (errors[-1] if errors else f"exit {done.returncode}")[:200]
    return ""


def _measure(path: Path, env: dict[str, str]) -> tuple[int | None, str, dict[str, int]]:
    """(nodes in graph and subgraphs, checker level, nodes by op) of a file, measured in a subprocess."""
    command = [sys.executable, __file__, "--measure-worker", str(path)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=FOLD_TIMEOUT)
        result = json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, json.JSONDecodeError, IndexError):
        return None, "fail", {}
    return result["nodes"], result["check"], result["ops"]


def flags(row: FoldRow) -> list[str]:
    """Why a row needs a look: gskit leaves more nodes than Polygraphy, or breaks the checker."""
    found = []
    poly = row.nodes.get("polygraphy")
    for tool in ("gskit", "gskit-nolimit"):
        if tool in row.errors:
            found.append(f"{tool} failed: {row.errors[tool]}")
    nolimit, default = row.nodes.get("gskit-nolimit"), row.nodes.get("gskit")
    extra = ", ".join(f"{op} {n}" for op, n in row.extra_ops.items())
    if poly is not None and nolimit is not None and nolimit > poly:
        if set(row.extra_ops) == {"Cast"}:
            found.append(f"casts: gskit keeps {extra} that graphsurgeon's cast elision removes (on purpose)")
        else:
            miss = f"gskit leaves {nolimit} nodes without a size limit, Polygraphy {poly} ({extra})"
            found.append(f"MISS: {miss}")
    elif poly is not None and default is not None and default > poly:
        found.append(f"threshold: gskit leaves {default} nodes with its 16 MiB default, Polygraphy {poly}")
    for tool in ("gskit", "gskit-nolimit"):
        level = row.check.get(tool)
        if level and CHECK_LEVELS.index(level) < CHECK_LEVELS.index(row.check_in or "fail"):
            found.append(f"CHECKER: {tool} output is '{level}', its input was '{row.check_in}'")
    return found


def fold_problems(rows: list[FoldRow]) -> list[str]:
    """Flags that fail the corpus run: real misses, gskit failures and checker regressions (not the
    documented size threshold, nor the int->float->int casts gskit keeps)."""
    deliberate = ("threshold", "casts")
    return [f"{row.label}: {flag}" for row in rows for flag in flags(row) if not flag.startswith(deliberate)]


def print_fold_table(rows: list[FoldRow]) -> None:
    """Nodes in / after each tool, checker levels (input, gskit, gskit no limit, Polygraphy), flags."""
    header = ("model", "in", "gskit", "nolimit", "polygraphy", "checker in/gskit/nolimit/poly", "flags")
    lines = [header]
    for row in rows:
        counts = [_cell(row.nodes.get(t), row.errors.get(t)) for t in TOOLS]
        checks = "/".join([row.check_in or "-"] + [row.check.get(t) or "-" for t in TOOLS])
        lines.append((row.label, _cell(row.nodes_in, None), *counts, checks, "; ".join(flags(row)) or "ok"))
    widths = [max(len(line[i]) for line in lines) for i in range(6)]
    for line in lines:
        counts = [cell.rjust(w) for cell, w in zip(line[1:5], widths[1:5], strict=True)]
        head = [line[0].ljust(widths[0]), *counts]
        print("  ".join([*head, line[5].ljust(widths[5]), line[6]]))


def _cell(count: int | None, error: str | None) -> str:
    if error:
        return "err"
    return "-" if count is None else str(count)


# ------------------------------------------------------------------------------------------------ workers


def _gskit_worker(tool: str, model_path: str, out_path: str) -> None:
    from gskit.io import model as gsmodel
    from gskit.passes.fold import fold

    model = gsmodel.load(model_path)
    folded, _ = fold(model) if tool == "gskit" else fold(model, size_threshold=None)
    gsmodel.save(folded, out_path, check=False)  # the checker is measured separately


def _measure_worker(path: str) -> None:
    import onnx

    from gskit.io import model as gsmodel

    model = gsmodel.load(path)
    ops = Counter(n.op_type for g in gsmodel.graph_protos(model.graph) for n in g.node)
    level = "full"
    try:
        onnx.checker.check_model(path)
    except Exception:  # onnx raises ValidationError and others: all mean "fails the checker"
        level = "fail"
    else:
        try:
            onnx.checker.check_model(path, full_check=True)
        except Exception:
            level = "basic"
    print(json.dumps({"nodes": sum(ops.values()), "check": level, "ops": ops}))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--gskit-worker"]:
        _gskit_worker(*sys.argv[2:5])
    elif sys.argv[1:2] == ["--measure-worker"]:
        _measure_worker(sys.argv[2])
    else:
        sys.exit("used by scripts/real_models.py --fold-vs-polygraphy")
