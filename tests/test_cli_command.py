"""The command shape: a pass is a command by one ``PassCommand`` declaration, whose flags are its options."""

from __future__ import annotations

import argparse
import json

import onnx
import pytest
from conftest import parse_model

from gskit.cli import SuggestingParser, build_parser, main
from gskit.cli.command import PassCommand, Ran
from gskit.cli.options import cli_fields, flag_of
from gskit.passes.sanitize import SANITIZE

#: One Identity (a no-op sanitize removes) between the input and an Add.
MODEL = """<ir_version: 8, opset_import: ["" : 17]>
g (float[2] x) => (float[2] y) <float[2] w = {1.0, 2.0}>
{
  i = Identity(x)
  y = Add(i, w)
}
"""

PASS_COMMANDS = ("fold", "sanitize", "convert", "replace", "infer-shapes", "isolate")


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


@pytest.mark.parametrize("name", PASS_COMMANDS)
def test_each_pass_command_offers_model_output_json_and_its_options_fields(name: str) -> None:
    command = importlib_command(name)
    parser = _subparser(build_parser(), name)
    flags = {o for action in parser._actions for o in action.option_strings}
    assert {"-o", "--output", "--json"} <= flags
    assert {flag_of(f) for f in cli_fields(command.graph_pass.options)} <= flags
    assert any(action.dest == "model" for action in parser._actions)


def importlib_command(name: str) -> PassCommand:
    import importlib

    module = importlib.import_module(f"gskit.cli.{name.replace('-', '_')}")
    assert module.run == module.COMMAND.run and module.add_parser == module.COMMAND.add_parser
    return module.COMMAND


def test_a_new_pass_command_is_one_declaration(tmp_path, capsys) -> None:
    """Declared once, a command loads, runs the pass with its flags, writes, and prints JSON or tables."""
    shown: list[Ran] = []
    command = PassCommand(
        "tidy",
        SANITIZE,
        help="tidy",
        description="Tidy a model.",
        output="where to write",
        show=shown.append,
        report=lambda ran: {"nodes": ran.result.report.nodes_after, "written": str(ran.written)},
        layout=("model", "options", "output", "json"),
    )
    parser = SuggestingParser(prog="test")
    command.add_parser(parser.add_subparsers(dest="command", required=True))
    usage = _subparser(parser, "tidy").format_usage()
    # layout orders the arguments: the pass's flags (--skip, --with) before -o
    assert usage.index("--skip") < usage.index("-o OUTPUT") < usage.index("--json")

    src = tmp_path / "m.onnx"
    onnx.save(parse_model(MODEL), src)
    out = tmp_path / "out.onnx"
    args = parser.parse_args(["tidy", str(src), "-o", str(out), "--json"])
    assert args.func(args) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == {"nodes": 1, "written": str(out.resolve())}
    assert [n.op_type for n in onnx.load(out).graph.node] == ["Add"]

    args = parser.parse_args(["tidy", str(src), "-o", str(tmp_path / "kept.onnx"), "--skip", "remove_noops"])
    assert args.func(args) == 0 and not capsys.readouterr().out
    (ran,) = shown
    assert [n.op_type for n in ran.result.model.graph.node] == ["Identity", "Add"]  # --skip reached it


def test_a_pass_command_refuses_its_input_as_output_before_running(tmp_path, capsys) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(parse_model(MODEL), src)
    before = src.read_bytes()
    for name in PASS_COMMANDS:
        extra = ["--outputs", "y"] if name == "isolate" else ["--int32"] if name == "convert" else []
        assert main([name, str(src), "-o", str(src), *extra]) == 2, name
        err = capsys.readouterr().err
        assert err.startswith(f"gskit {name}: error: ") and err.count("\n") == 1, err
    assert src.read_bytes() == before


#: ``gskit inspect EXAMPLE`` as the process's own command line (``main()``), counting full collections.
OWN_PROCESS = """
import gc, json, sys
full = []
gc.callbacks.append(lambda phase, info: full.append(phase == "stop" and info["generation"] == 2))
sys.argv = ["gskit", "inspect", sys.argv[1]]
from gskit.cli import main
code = main()
print(json.dumps({"code": code, "frozen": gc.get_freeze_count(), "full": sum(full), "on": gc.isenabled()}))
"""


def test_the_command_line_imports_without_the_cycle_collector_and_freezes_what_it_imported(tmp_path):
    """The collector scanned the modules over and over while they were imported (0.1 s of a small prepare's
    0.6 s of CPU): the process's own command line imports without it, then freezes what it imported."""
    import subprocess
    import sys
    from pathlib import Path

    import gskit

    example = Path(gskit.__file__).parent / "data" / "example.onnx"
    done = subprocess.run(
        [sys.executable, "-c", OWN_PROCESS, str(example)], capture_output=True, text=True, timeout=300
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["code"] == 0 and report["on"]  # collecting again for the command's own work
    assert report["frozen"] > 10_000 and report["full"] == 0
    import gc

    before = gc.get_freeze_count()
    assert main(["inspect", str(example)]) == 0  # a caller's process: its collector is left as it was
    assert gc.get_freeze_count() == before and gc.isenabled()


#: ``gskit prepare`` as the process's own command line; the OpenBLAS setting it ran with, numpy's CPU.
BLAS_PROCESS = """
import json, os, sys, time
sys.argv = ["gskit", "inspect", sys.argv[1]]
from gskit.cli import main
code = main()
time.sleep(0.2)  # a spinning thread's last turn counted too
others = time.process_time() - time.thread_time()  # every thread but this one (inspect runs no session)
print(json.dumps({"code": code, "timeout": os.environ.get("OPENBLAS_THREAD_TIMEOUT"), "others": others}))
"""


@pytest.mark.parametrize("given", [None, "20"])
def test_the_command_lines_blas_threads_sleep_unless_the_user_set_their_timeout(given, tmp_path):
    """numpy's OpenBLAS threads spun for 0.1 s after loading (100 ms of a core at each start): the process's
    own command line has them sleep at once, unless OPENBLAS_THREAD_TIMEOUT is set; a caller's process keeps
    its environment."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import gskit

    example = Path(gskit.__file__).parent / "data" / "example.onnx"
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    if given is not None:
        env["OPENBLAS_THREAD_TIMEOUT"] = given
    command = [sys.executable, "-c", BLAS_PROCESS, str(example)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["code"] == 0 and report["timeout"] == (given or "4")
    if given is None:
        assert report["others"] < 0.03  # numpy's threads slept (spinning, they took 0.1 s)
    before = os.environ.get("OPENBLAS_THREAD_TIMEOUT")
    assert main(["inspect", str(example)]) == 0 and os.environ.get("OPENBLAS_THREAD_TIMEOUT") == before
