"""The pass contract: one registry, declared effects, cheap postconditions, options as the single source."""

from __future__ import annotations

import dataclasses
import inspect
import json
from pathlib import Path

import pytest

from gskit import passes, patterns
from gskit.cli import build_parser, main
from gskit.fold import FoldOptions, fold
from gskit.passes import DEFAULT_STEPS, PASSES, STEP_OPTIONS, PassResult, StepError
from gskit.recipe import parse_recipe

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "gskit" / "data" / "example.onnx"


def test_one_registry_declares_every_pass() -> None:
    assert set(DEFAULT_STEPS) <= set(PASSES)
    assert STEP_OPTIONS == {name: p.options for name, p in PASSES.items()}
    for name, step in PASSES.items():
        assert step.name == name
        assert dataclasses.is_dataclass(step.options)
        assert step.effect in ("in_place", "replaces", "check")
        assert type(step).call is not passes.Pass.call, f"{name} does not implement call"
    assert {n for n, p in PASSES.items() if p.effect == "check"} == {"check_trt", "validate", "build"}


def test_fold_defaults_have_one_source() -> None:
    """The library call, the CLI flags and the recipe step all take fold's defaults from FoldOptions."""
    defaults = FoldOptions()
    signature = inspect.signature(fold).parameters
    for option in dataclasses.fields(FoldOptions):
        assert signature[option.name].default == getattr(defaults, option.name), option.name
    args = build_parser().parse_args(["fold", "m.onnx", "-o", "o.onnx"])
    assert (args.max_passes, args.size_threshold) == (defaults.max_passes, defaults.size_threshold)
    recipe = parse_recipe("steps:\n  - fold\n")
    assert recipe.steps[0].options == defaults
    # "no limit" can be written in a recipe
    assert parse_recipe("steps:\n  - fold: {size_threshold: null}\n").steps[0].options.size_threshold is None


def test_replace_runs_the_matcher_once_per_step(tmp_path: Path, monkeypatch) -> None:
    """The replace step checks its promise from the graph, not by replacing everything again on a copy."""
    calls = []
    real = patterns.replace

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(patterns, "replace", counting)
    out = tmp_path / "out"
    assert main(["prepare", str(EXAMPLE), "-o", str(out)]) == 0
    assert len(calls) == 1
    steps = json.loads((out / "report.json").read_text())["steps"]
    assert [s["status"] for s in steps if s["name"] == "replace"] == ["ok"]


def test_replace_promise_catches_a_replacement_that_left_its_nodes(tmp_path: Path, monkeypatch) -> None:
    """A matcher that reports a region but leaves the original nodes in place breaks the step's promise."""
    real = patterns.replace

    def forgetful(graph, specs, **kwargs):
        copy = graph.copy()
        report = real(copy, specs, **kwargs)  # regions as if replaced, but the graph given is left as it was
        return report

    monkeypatch.setattr(patterns, "replace", forgetful)
    out = tmp_path / "out"
    assert main(["prepare", str(EXAMPLE), "-o", str(out)]) == 2
    failed = json.loads((out / "report.json").read_text())["steps"][-1]
    assert failed["name"] == "replace" and failed["status"] == "failed"
    assert "broke its promise" in failed["summary"] and "not in the graph" in failed["summary"]


def test_a_check_that_says_it_modified_the_graph_is_a_bug(monkeypatch) -> None:
    import onnx_graphsurgeon as gs

    monkeypatch.setattr(passes.CheckTrt, "call", lambda self, state, options: PassResult("x", modified=True))
    state = passes.RunState(gs.Graph(), Path("m.onnx"), None, None, Path("."))
    with pytest.raises(StepError, match="is a check but says it modified the graph"):
        PASSES["check_trt"](state, passes.CheckTrtOptions())


def test_isolate_requires_both_ends() -> None:
    import onnx_graphsurgeon as gs

    state = passes.RunState(gs.Graph(), Path("m.onnx"), None, None, Path("."))
    with pytest.raises(StepError, match="needs both 'inputs' and 'outputs'"):
        PASSES["isolate"](state, passes.IsolateOptions(inputs=("x",)))


def test_recipe_edit_step_inserts_nodes_and_removes_attributes(tmp_path: Path) -> None:
    """The recipe's edit step runs the same plan as ``gskit edit``: insert-after and attribute removal too."""
    import numpy as np
    import onnx

    from gskit.backends import ort as ortb

    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "steps:\n"
        "  - edit:\n"
        "      insert_after: [{tensor: y, op: Mul, inputs: [[2.0]]}]\n"
        "      remove_attrs: {/fc1/Gemm: [beta]}\n"
    )
    out = tmp_path / "out"
    assert main(["prepare", str(EXAMPLE), "-o", str(out), "--recipe", str(recipe)]) == 0
    model = onnx.load(out / "model.onnx")
    gemm = next(n for n in model.graph.node if n.name == "/fc1/Gemm")
    assert "beta" not in {a.name for a in gemm.attribute}
    assert model.graph.node[-1].op_type == "Mul" and [o.name for o in model.graph.output] == ["y"]
    x = np.random.default_rng(0).standard_normal((2, 4, 8, 8)).astype(np.float32)
    original = ortb.run(EXAMPLE, {"x": x})["y"]
    edited = ortb.run(out / "model.onnx", {"x": x})["y"]
    np.testing.assert_allclose(edited, 2.0 * original, rtol=1e-6, atol=1e-6)  # beta=1 is Gemm's default


def test_recipe_rejects_a_malformed_insertion_with_its_line(tmp_path: Path) -> None:
    from gskit.errors import GskitError

    with pytest.raises(GskitError, match=r"r.yaml:2: step 'edit': insert_after entry .*expected \{tensor"):
        parse_recipe("steps:\n  - edit: {insert_after: [{op: Relu}]}\n", source="r.yaml")
