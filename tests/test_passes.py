"""The pass contract: one registry, declared effects, cheap postconditions, options as the single source."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
from pathlib import Path

import pytest

from gskit.cli import build_parser, main
from gskit.errors import GskitError
from gskit.passes.fold import FoldOptions, fold
from gskit.passes.transform import GraphPass, PassContext, PassResult, PromiseError, run_pass
from gskit.pipeline import steps as passes
from gskit.pipeline.recipe import parse_recipe
from gskit.pipeline.steps import DEFAULT_STEPS, PASSES, STEP_OPTIONS

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "gskit" / "data" / "example.onnx"
# the module, not the function gskit.passes.patterns exports under the same name
replace_module = importlib.import_module("gskit.passes.patterns.replace")


def test_one_registry_declares_every_pass() -> None:
    assert set(DEFAULT_STEPS) <= set(PASSES)
    assert STEP_OPTIONS == {name: p.options for name, p in PASSES.items()}
    for name, step in PASSES.items():
        assert isinstance(step, GraphPass), f"{name} is not a GraphPass"
        assert step.name == name
        assert dataclasses.is_dataclass(step.options)
        assert step.effect in ("in_place", "copying", "analysis")
        assert type(step).call is not GraphPass.call, f"{name} does not implement call"
    assert {n for n, p in PASSES.items() if p.effect == "analysis"} == {"check_trt", "validate", "build"}


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
    real = replace_module._replace

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(replace_module, "_replace", counting)
    out = tmp_path / "out"
    assert main(["prepare", str(EXAMPLE), "-o", str(out)]) == 0
    assert len(calls) == 1
    steps = json.loads((out / "report.json").read_text())["steps"]
    assert [s["status"] for s in steps if s["name"] == "replace"] == ["ok"]


def test_replace_promise_catches_a_replacement_that_left_its_nodes(tmp_path: Path, monkeypatch) -> None:
    """A matcher that reports a region but leaves the original nodes in place breaks the step's promise."""
    real = replace_module._replace

    def forgetful(graph, specs, options):
        copy = graph.copy()
        report = real(copy, specs, options)  # regions as if replaced, but the graph given is left as it was
        return report

    monkeypatch.setattr(replace_module, "_replace", forgetful)
    out = tmp_path / "out"
    assert main(["prepare", str(EXAMPLE), "-o", str(out)]) == 2
    failed = json.loads((out / "report.json").read_text())["steps"][-1]
    assert failed["name"] == "replace" and failed["status"] == "failed"
    assert "broke its promise" in failed["summary"] and "not in the graph" in failed["summary"]


def test_an_analysis_that_says_it_modified_the_graph_is_a_bug(monkeypatch) -> None:
    import onnx_graphsurgeon as gs

    monkeypatch.setattr(
        passes.CheckTrt, "call", lambda self, model, options, context: PassResult(summary="x", modified=True)
    )
    with pytest.raises(PromiseError, match="declared analysis but says it modified the graph"):
        run_pass(PASSES["check_trt"], gs.Graph(), passes.CheckTrtOptions(), PassContext())


@pytest.mark.parametrize("ends", [{"inputs": ("x",)}, {"outputs": ("y",)}])
def test_isolate_requires_both_ends(ends: dict) -> None:
    import onnx_graphsurgeon as gs

    from gskit.passes.isolate import IsolateOptions

    with pytest.raises(GskitError, match="needs both 'inputs' and 'outputs'|at least one output"):
        run_pass(PASSES["isolate"], gs.Graph(), IsolateOptions(**ends))


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


#: The CLI command of each pass that has one (its flags come from the pass's options dataclass).
COMMANDS = {
    "sanitize": ["sanitize"],
    "isolate": ["isolate", "--outputs", "y"],
    "replace": ["replace"],
    "infer_shapes": ["infer-shapes"],
    "fold": ["fold"],
    "convert": ["convert"],
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_is_a_recipe_key_and_a_cli_flag_with_the_same_default(name: str) -> None:
    """A default lives in the options dataclass only: the recipe, the CLI and the library all read it."""
    import yaml

    from gskit.cli.options import cli_fields, flag_of, options_from_args

    cls = PASSES[name].options
    defaults = cls()
    fields = dataclasses.fields(cls)
    # every field is a recipe key, and writing its default explicitly gives the defaults
    plain = {
        f.name: list(v) if isinstance(v, tuple) else v for f in fields for v in [getattr(defaults, f.name)]
    }
    recipe = parse_recipe(yaml.safe_dump({"steps": [{name: plain}]}))
    assert recipe.steps[0].options == defaults
    # every field is a CLI flag, and the flags left out give the defaults
    assert [f.name for f in cli_fields(cls)] == [f.name for f in fields]
    parser = build_parser()
    args = parser.parse_args([COMMANDS[name][0], "m.onnx", "-o", "o.onnx", *COMMANDS[name][1:]])
    parsed = options_from_args(args, cls)
    for f in fields:
        if name == "isolate" and f.name == "outputs":
            assert parsed.outputs == ("y",)
            continue
        assert getattr(parsed, f.name) == getattr(defaults, f.name), f.name
    command = next(
        a for a in parser._subparsers._group_actions[0].choices.items() if a[0] == COMMANDS[name][0]
    )
    flags = {s for action in command[1]._actions for s in action.option_strings}
    assert {flag_of(f) for f in fields} <= flags


@pytest.mark.parametrize(
    ("function", "options"),
    [
        ("gskit.passes.fold:fold", "gskit.passes.fold:FoldOptions"),
        ("gskit.passes.sanitize:sanitize", "gskit.passes.sanitize:SanitizeOptions"),
        ("gskit.passes.patterns.replace:replace", "gskit.passes.patterns.replace:ReplaceOptions"),
        ("gskit.passes.shapes:infer_shapes", "gskit.passes.shapes:InferShapesOptions"),
        ("gskit.passes.shapes:infer_graph_shapes", "gskit.passes.shapes:InferShapesOptions"),
        ("gskit.passes.convert:to_fp16", "gskit.passes.convert:ConvertOptions"),
        ("gskit.passes.convert:int64_to_int32", "gskit.passes.convert:ConvertOptions"),
    ],
)
def test_library_keyword_defaults_are_read_from_the_options(function: str, options: str) -> None:
    """Each library function's keyword defaults are its options' defaults (a renamed one is mapped here)."""

    def load(ref: str):
        module, name = ref.split(":")
        return getattr(importlib.import_module(module), name)

    renamed = {"keep_io_types": "keep_io_fp32", "inputs": "int32_inputs", "constants": "int32_constants"}
    defaults = load(options)()
    checked = 0
    for param in inspect.signature(load(function)).parameters.values():
        field = renamed.get(param.name, param.name)
        if param.kind is param.KEYWORD_ONLY and hasattr(defaults, field):
            assert param.default == getattr(defaults, field), param.name
            checked += 1
    assert checked


def _foldable_graph():
    import numpy as np
    import onnx_graphsurgeon as gs

    x = gs.Variable("x", dtype=np.float32, shape=[2])
    a, b = gs.Constant("a", np.ones(2, np.float32)), gs.Constant("b", np.ones(2, np.float32))
    ab = gs.Variable("ab", dtype=np.float32, shape=[2])
    y = gs.Variable("y", dtype=np.float32, shape=[2])
    nodes = [
        gs.Node("Add", "add_ab", inputs=[a, b], outputs=[ab]),
        gs.Node("Mul", "mul", inputs=[x, ab], outputs=[y]),
    ]
    return gs.Graph(nodes=nodes, inputs=[x], outputs=[y], opset=17)


def test_in_place_pass_changes_the_given_graph_and_a_copying_one_does_not() -> None:
    from gskit.passes.fold import FOLD
    from gskit.passes.isolate import ISOLATE, IsolateOptions
    from gskit.passes.transform import run_pass

    assert (FOLD.effect, ISOLATE.effect) == ("in_place", "copying")
    graph = _foldable_graph()
    result = run_pass(FOLD, graph)
    assert result.model is graph and result.modified
    assert [n.op for n in graph.nodes] == ["Mul"]  # the given graph itself was folded
    graph = _foldable_graph()
    result = run_pass(ISOLATE, graph, IsolateOptions(inputs=("x",), outputs=("ab",)))
    assert result.model is not graph
    assert [n.name for n in result.model.nodes] == ["add_ab"]
    assert [n.name for n in graph.nodes] == ["add_ab", "mul"] and [t.name for t in graph.outputs] == ["y"]


def test_a_pass_that_breaks_its_declared_effect_is_caught() -> None:
    from gskit.errors import GskitError
    from gskit.passes.fold import FoldOptions
    from gskit.passes.transform import GraphPass, run_pass
    from gskit.passes.transform import PassResult as Result

    class Sneaky(GraphPass[FoldOptions]):
        name, options, effect = "sneaky", FoldOptions, "in_place"

        def call(self, model, options, context):
            return Result(model.copy(), modified=True)  # says in place, hands back a copy

    with pytest.raises(GskitError, match="declared in_place but returned a new graph"):
        run_pass(Sneaky(), _foldable_graph())


def test_library_function_is_its_pass() -> None:
    """``fold()`` and ``run_pass(FOLD, ...)`` give the same graph and report."""
    from gskit.passes.fold import FOLD
    from gskit.passes.transform import run_pass

    folded, report = fold(_foldable_graph(), max_passes=3)
    result = run_pass(FOLD, _foldable_graph(), FoldOptions(max_passes=3))
    assert [n.op for n in folded.nodes] == [n.op for n in result.model.nodes] == ["Mul"]
    assert report.nodes_after == result.report.nodes_after == 1


def test_cli_values_are_parsed_by_the_field_and_no_limit_is_zero() -> None:
    from gskit.cli.options import options_from_args

    args = build_parser().parse_args(
        ["fold", "m.onnx", "-o", "o.onnx", "--size-threshold", "0", "--no-fold-shapes", "--max-passes", "3"]
    )
    assert options_from_args(args, FoldOptions) == FoldOptions(
        max_passes=3, fold_shapes=False, size_threshold=None
    )
    args = build_parser().parse_args(
        ["isolate", "m.onnx", "-o", "o.onnx", "--inputs", "a, b", "--outputs", "c"]
    )
    assert (args.inputs, args.outputs) == (("a", "b"), ("c",))


def test_graph_passes_take_a_model_proto_and_leave_it_as_it_was() -> None:
    """run_pass's contract for every pass: a ModelProto in, a new ModelProto out, the given one unchanged.

    Replace, isolate and edit used to raise AttributeError ('subgraphs', 'tensors') on a ModelProto.
    """
    import onnx

    from gskit.io import model as gsmodel
    from gskit.passes.edit import EDIT, EditOptions
    from gskit.passes.fold import FOLD
    from gskit.passes.isolate import ISOLATE, IsolateOptions
    from gskit.passes.patterns.replace import REPLACE
    from gskit.passes.transform import run_pass
    from gskit.plugin import load_plugins

    model = gsmodel.load(EXAMPLE)
    before = model.SerializeToString()
    replaced = run_pass(REPLACE, model, plugins=load_plugins())
    assert isinstance(replaced.model, onnx.ModelProto) and replaced.report.replaced == 3
    sub = run_pass(ISOLATE, model, IsolateOptions(inputs=("x",), outputs=("y",))).model
    assert isinstance(sub, onnx.ModelProto) and [i.name for i in sub.graph.input] == ["x"]
    renamed = run_pass(EDIT, model, EditOptions(rename={"x": "pixels"})).model
    assert [i.name for i in renamed.graph.input] == ["pixels"]
    folded = run_pass(FOLD, model).model  # its Constant nodes' values used to be renamed in the given model
    assert len(folded.graph.node) < len(model.graph.node)
    assert model.SerializeToString() == before
    with pytest.raises(TypeError, match="gskit.to_graph"):  # in place on a proto would be lost
        importlib.import_module("gskit.passes.patterns").replace(model, load_plugins())
