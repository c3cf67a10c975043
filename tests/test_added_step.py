"""Adding a recipe step is one class in one module: a ``GraphPass`` with its options (and their
``gskit prepare`` flag), registered in ``PASSES``; a recipe and the flag then run it like any other step."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
import pytest

from gskit.cli import build_parser, main
from gskit.passes.transform import GraphPass, PassContext, PassResult, StepFlag, prepare_flag, step_flags
from gskit.pipeline import steps

EXAMPLE = Path(__file__).resolve().parents[1] / "gskit" / "data" / "example.onnx"
#: No TensorRT check or build: the runs stay fast and need no TensorRT.
FAST = ["--skip", "check_trt", "--skip", "build"]


class NameGraph(GraphPass):
    """Names the graph (what a step that a project adds can look like)."""

    @dataclass(frozen=True)
    class options:  # the GraphPass attribute: here the options dataclass itself
        """Options of the ``name_graph`` step."""

        name: str = field(
            default="named",
            metadata=prepare_flag(
                StepFlag(
                    "--name-graph",
                    "name the graph (name_graph.name; adds the step after sanitize)",
                    name="name_graph",  # the keyword, where the field's own name would be too plain
                    metavar="NAME",
                    adds_step=("after", ("sanitize",)),
                )
            ),
        )

    name, effect = "name_graph", "in_place"

    def call(self, model: Any, options: Any, context: PassContext) -> PassResult:
        model.name = options.name
        return PassResult(model, modified=True, summary=f"named the graph '{options.name}'")


@pytest.fixture
def added(monkeypatch) -> NameGraph:
    """The step registered for one test (``PASSES`` is the one registry; the recipe schema and the flags
    follow it)."""
    step = NameGraph()
    monkeypatch.setitem(steps.PASSES, step.name, step)
    return step


def _run(argv: list[str], out: Path) -> dict:
    assert main(["prepare", str(EXAMPLE), "-o", str(out), "--json", *argv]) == 0
    return json.loads((out / "report.json").read_text())


def test_a_recipe_runs_the_added_step(added: NameGraph, tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("steps:\n  - sanitize\n  - name_graph: {name: from_recipe}\n  - validate\n")
    report = _run(["--recipe", str(recipe)], tmp_path / "out")
    step = next(s for s in report["steps"] if s["name"] == "name_graph")
    assert step["status"] == "ok" and step["summary"] == "named the graph 'from_recipe'"
    assert step["options"] == {"name": "from_recipe"}
    assert onnx.load(tmp_path / "out" / "model.onnx").graph.name == "from_recipe"
    assert report["passed"] is True


def test_its_flag_adds_and_sets_the_step(added: NameGraph, tmp_path: Path, capsys) -> None:
    report = _run([*FAST, "--name-graph", "from_flag"], tmp_path / "out")
    names = [s["name"] for s in report["steps"]]
    assert names[:2] == ["sanitize", "name_graph"]  # where the flag declares it
    assert report["recipe"] == "default with --skip check_trt --skip build --name-graph"
    assert onnx.load(tmp_path / "out" / "model.onnx").graph.name == "from_flag"
    capsys.readouterr()
    with pytest.raises(SystemExit):
        build_parser().parse_args(["prepare", "--help"])
    assert "--name-graph NAME" in capsys.readouterr().out


def test_an_unknown_option_of_the_added_step_is_refused(added: NameGraph, tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("steps:\n  - name_graph: {title: x}\n")
    assert main(["prepare", str(EXAMPLE), "-o", str(tmp_path / "out"), "--recipe", str(recipe)]) == 2


def test_a_flag_is_declared_on_the_field_it_sets() -> None:
    """The field names the flag's option and keyword; a class-level flag may only add the step."""
    (flag,) = step_flags(NameGraph.options)
    assert (flag.name, flag.option, flag.flag) == ("name_graph", "name", "--name-graph")
    declared = {f.flag: f.option for step in steps.PASSES.values() for f in step_flags(step.options)}
    assert declared["--atol"] == "atol" and declared["--shape"] == "shapes" and declared["--nms"] is None

    @dataclass(frozen=True)
    class Misplaced:
        step_flags = (StepFlag("--x", "sets x", option="x"),)
        x: int = 0

    with pytest.raises(TypeError, match="declare --x on its field x"):
        step_flags(Misplaced)
