"""gskit.pipeline.recipe: every step's options round-trip through YAML; every bad recipe names its file and
line."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from gskit.errors import GskitError
from gskit.passes.fold import FoldOptions
from gskit.pipeline.recipe import Recipe, RecipeStep, load_recipe, make_recipe, parse_recipe
from gskit.pipeline.steps import DEFAULT_STEPS, STEP_OPTIONS, BuildOptions, ValidateOptions

#: A value other than the default for every option of every step (as the dataclass holds it).
NON_DEFAULT: dict[str, dict[str, Any]] = {
    "sanitize": {"skip": ("dedupe",), "extra": ("a", "b")},
    "edit": {
        "rename": {"x": "input"},
        "input_shapes": {"x": (1, "batch", None)},
        "input_dtypes": {"x": "float16"},
        "remove_nodes": ("n1",),
        "insert_after": ({"tensor": "t", "op": "Mul", "inputs": [[2.0]], "attrs": {}},),
        "set_attrs": {"n2": {"axis": -1, "name": "s", "values": [1, 2]}},
        "remove_attrs": {"n3": ("alpha",)},
        "force": True,
        "expose": ("t1", "t2"),
        "constants_to_initializers": True,
        "drop_initializer_inputs": True,
    },
    "isolate": {"inputs": ("a",), "outputs": ("b", "c")},
    "lower": {"only": ("Col2Im",)},
    "replace": {"only": ("LayerNorm",), "keep_function": True, "explain": True, "tensorrt": "10.3"},
    "nms": {
        "score_threshold": 0.3,
        "iou_threshold": 0.5,
        "max_output_boxes": 100,
        "class_agnostic": True,
        "best_class_only": False,
        "head": "yolov5",
        "box_format": "xyxy",
        "tensor": "output0",
    },
    "infer_shapes": {"strict": False},
    "fold": {"max_passes": 3, "fold_shapes": False, "size_threshold": 1024, "allow_partial": True},
    "convert": {
        "opset": 17,
        "fp16": True,
        "keep_io_fp32": False,
        "block_ops": ("Softmax",),
        "clamp_min": 1e-3,
        "clamp_max": 6.5e4,
        "keep_inputs": ("x",),
        "keep_outputs": ("y",),
        "int32": True,
        "int32_inputs": False,
        "int32_constants": False,
    },
    "check_trt": {"fail_on_unsupported": True, "backend": "static"},
    "validate": {
        "atol": 1e-3,
        "rtol": 0.5,
        "seed": 7,
        "shapes": {"x": (4, 4, 8, 8)},
        "inputs": "feeds.npz",
    },
    "build": {
        "compute_capability": "8.6",
        "shapes": {"x": ((1, 4), (2, 4), (8, 4))},
        "timing_cache": "cache.bin",
        "required": True,
    },
}


def test_samples_cover_every_option() -> None:
    assert NON_DEFAULT.keys() == STEP_OPTIONS.keys()
    for name, cls in STEP_OPTIONS.items():
        fields = dataclasses.fields(cls)
        assert NON_DEFAULT[name].keys() == {f.name for f in fields}, name
        defaults = cls()
        for f in fields:
            assert NON_DEFAULT[name][f.name] != getattr(defaults, f.name), f"{name}.{f.name}"


@pytest.mark.parametrize("name", sorted(STEP_OPTIONS))
@pytest.mark.parametrize("which", ["default", "non_default"])
def test_options_round_trip_through_yaml(name: str, which: str) -> None:
    cls = STEP_OPTIONS[name]
    options = cls() if which == "default" else cls(**NON_DEFAULT[name])
    recipe = Recipe(steps=(RecipeStep(name, options),))
    again = parse_recipe(recipe.to_yaml(), source="round-trip.yaml")
    assert [s.name for s in again.steps] == [name]
    assert again.steps[0].options == options
    assert again.to_yaml() == recipe.to_yaml()


def test_whole_recipe_round_trips_in_order() -> None:
    steps = tuple(RecipeStep(name, STEP_OPTIONS[name](**NON_DEFAULT[name])) for name in STEP_OPTIONS)
    again = parse_recipe(Recipe(steps=steps).to_yaml())
    assert [(s.name, s.options) for s in again.steps] == [(s.name, s.options) for s in steps]
    assert [s.line for s in again.steps] == sorted({s.line for s in again.steps})  # one line per step


def test_make_recipe_validates_python_values() -> None:
    recipe = make_recipe([(name, {}) for name in DEFAULT_STEPS])
    assert tuple(s.name for s in recipe.steps) == DEFAULT_STEPS
    assert make_recipe([("fold", {"max_passes": 2})]).steps[0].options == FoldOptions(max_passes=2)
    with pytest.raises(GskitError, match=r"<python>:\d+: fold\.max_passes"):
        make_recipe([("fold", {"max_passes": "2"})])


def test_values_are_converted_to_the_option_types() -> None:
    recipe = parse_recipe(
        "steps:\n"
        "  - validate: {atol: 1e-5, rtol: 1, shapes: {x: [2, 3]}, inputs: null}\n"
        "  - build: {shapes: {x: [[1, 3], [2, 3], [4, 3]]}}\n"
    )
    validate, build = (s.options for s in recipe.steps)
    # PyYAML reads 1e-5 (no dot) as a string and 1 as an int: both become floats.
    assert validate == ValidateOptions(atol=1e-5, rtol=1.0, shapes={"x": (2, 3)}, inputs=None)
    assert isinstance(validate.atol, float) and isinstance(validate.rtol, float)
    assert build == BuildOptions(shapes={"x": ((1, 3), (2, 3), (4, 3))})


@pytest.mark.parametrize(
    ("step", "line"),
    [
        ("sanitize", "steps:\n  - sanitize\n"),
        ("bare colon", "steps:\n  - fold:\n"),
        ("empty mapping", "steps:\n  - fold: {}\n"),
    ],
)
def test_step_without_options_gets_defaults(step: str, line: str) -> None:
    options = parse_recipe(line).steps[0].options
    assert options == type(options)()


# (recipe text, line the error must name, a fragment of the message)
BAD_RECIPES = [
    ("", 1, "empty recipe"),
    ("# only a comment\n", 1, "empty recipe"),
    ("- fold\n", 1, "mapping with a 'steps:' list"),
    ("steps: fold\n", 1, "'steps' must be a list"),
    ("stepz:\n  - fold\n", 1, "unknown top-level key"),
    ("steps: []\n", 1, "'steps' is empty"),
    ("steps:\n", 1, "'steps' must be a list"),
    ("steps:\n  - fold\nsteps:\n  - validate\n", 3, "'steps' is given twice"),
    ("steps:\n  - fold\n  - {[a]: 1}\n", 3, "plain name"),
    ("steps:\n  - fold\n  - fold: {[a]: 1}\n", 3, "plain name"),
    ("steps:\n  - fold\n  - folding\n", 3, "unknown step 'folding'"),
    ("steps:\n  - fold\n  - {fold: {}, validate: {}}\n", 3, "a step is a name"),
    ("steps:\n  - fold\n  - [fold]\n", 3, "a step is a name"),
    ("steps:\n  - fold: 3\n", 2, "must be a mapping"),
    ("steps:\n  - fold: [3]\n", 2, "must be a mapping"),
    ("steps:\n  - sanitize\n  - fold: {max_pass: 3}\n", 3, "has no option 'max_pass'"),
    ("steps:\n  - fold:\n      max_passes: 3\n      max_passes: 5\n", 4, "'max_passes' is given twice"),
    ("steps:\n  - fold: {max_passes: 2.5}\n", 2, "fold.max_passes"),
    ("steps:\n  - fold: {max_passes: true}\n", 2, "expected an integer"),
    ("steps:\n  - fold: {max_passes: null}\n", 2, "fold.max_passes"),
    ("steps:\n  - fold: {allow_partial: 1}\n", 2, "expected true or false"),
    ("steps:\n  - fold: {allow_partial: 'yes'}\n", 2, "expected true or false"),
    ("steps:\n  - validate: {atol: true}\n", 2, "validate.atol"),
    ("steps:\n  - validate: {atol: 1e}\n", 2, "validate.atol"),
    ("steps:\n  - validate: {inputs: 3}\n", 2, "validate.inputs"),
    ("steps:\n  - validate: {shapes: {x: 3}}\n", 2, "expected a list"),
    ("steps:\n  - validate: {shapes: [x]}\n", 2, "expected a mapping"),
    ("steps:\n  - validate: {shapes: {x: [1, true]}}\n", 2, "expected an integer"),
    ("steps:\n  - build: {shapes: {x: [1, 2, 3]}}\n", 2, "build.shapes"),
    ("steps:\n  - build: {shapes: {x: [[1, 2], [2, x]]}}\n", 2, "build.shapes"),
    ("steps:\n  - edit: {input_shapes: {x: [1, true]}}\n", 2, "edit.input_shapes"),
    ("steps:\n  - edit: {input_shapes: {x: [1, 2.5]}}\n", 2, "edit.input_shapes"),
    ("steps:\n  - edit: {rename: {1: a}}\n", 2, "edit.rename"),
    ("steps:\n  - sanitize: {skip: dedupe}\n", 2, "expected a list"),
    ("steps:\n  - replace: {only: LayerNorm}\n", 2, "replace.only"),
    ("steps:\n  - check_trt: {backend: trt}\n", 2, "not one of"),
    ("steps:\n  - fold: {max_passes: !!python/object:os.system x}\n", 2, "cannot read the value"),
    ("steps:\n  - fold: {max_passes: !custom 3}\n", 2, "cannot read the value"),
    ("steps:\n  - fold: {max_passes: [3}\n", 2, "not valid YAML"),
    ("steps:\n  - fold\n\tbad: tab\n", 3, "not valid YAML"),
]


@pytest.mark.parametrize(("text", "line", "fragment"), BAD_RECIPES)
def test_errors_name_file_and_line(tmp_path: Path, text: str, line: int, fragment: str) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    with pytest.raises(GskitError) as info:
        load_recipe(path)
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: "), message
    assert fragment in message
    assert "\n" not in message


def test_missing_recipe_file(tmp_path: Path) -> None:
    with pytest.raises(GskitError, match=r"recipe\.yaml: cannot read recipe"):
        load_recipe(tmp_path / "recipe.yaml")


def test_custom_registry() -> None:
    @dataclasses.dataclass(frozen=True)
    class Opts:
        level: int = 1
        names: tuple[str, ...] = ()

    recipe = parse_recipe("steps:\n  - mine: {level: 3, names: [a]}\n", registry={"mine": Opts})
    assert recipe.steps[0].options == Opts(level=3, names=("a",))
    with pytest.raises(GskitError, match="unknown step 'fold'; known steps: mine"):
        parse_recipe("steps: [fold]\n", registry={"mine": Opts})


def test_file_options_resolve_against_the_recipe_folder(tmp_path: Path) -> None:
    folder = tmp_path / "recipes"
    folder.mkdir()
    absolute = tmp_path / "elsewhere" / "cache.bin"
    path = folder / "r.yaml"
    path.write_text(
        f"steps:\n  - validate: {{inputs: data/feeds.npz}}\n  - build: {{timing_cache: {absolute}}}\n"
    )
    validate, build = load_recipe(path).steps
    assert Path(validate.options.inputs) == folder / "data" / "feeds.npz"
    assert Path(build.options.timing_cache) == absolute
    # Text without a file keeps paths as written (the caller's working directory decides).
    parsed = parse_recipe("steps:\n  - validate: {inputs: data/feeds.npz}\n")
    assert parsed.steps[0].options.inputs == "data/feeds.npz"


# ---- validation describes the written model ----------------------------------------------------------------

CHANGING_STEPS = {
    "edit": "{set_attrs: {/fc1/Gemm: {alpha: 5.0}}}",
    "convert": "{fp16: true}",
    "isolate": "{inputs: [x], outputs: [y]}",
    "replace": "",
    "fold": "",
    "sanitize": "",
    "infer_shapes": "",
}


@pytest.mark.parametrize("step", sorted(CHANGING_STEPS))
def test_a_changing_step_after_validate_is_refused_naming_both_lines(step: str) -> None:
    options = f": {CHANGING_STEPS[step]}" if CHANGING_STEPS[step] else ""
    text = f"steps:\n  - fold\n  - validate: {{atol: 1.0e-3}}\n  - check_trt\n  - {step}{options}\n"
    with pytest.raises(GskitError) as caught:
        parse_recipe(text, source="r.yaml")
    message = str(caught.value)
    assert message.startswith(f"r.yaml:5: step '{step}' changes the model after step 'validate' (line 3)")
    assert "\n" not in message


def test_checks_after_validate_and_a_second_validate_are_allowed() -> None:
    parse_recipe("steps:\n  - validate\n  - check_trt\n  - build\n")
    parse_recipe("steps:\n  - fold\n  - validate\n  - convert: {fp16: true}\n  - validate: {atol: 1.0e-2}\n")
    parse_recipe("steps:\n  - fold\n")  # no validation at all: allowed, and said so by prepare


def test_the_order_is_checked_for_recipes_made_in_python_too() -> None:
    from gskit.pipeline.prepare import default_recipe, recipe_with_overrides
    from gskit.pipeline.recipe import check_validation_order

    with pytest.raises(GskitError, match=r"<python>:3: step 'fold' changes the model .*\(line 2\)"):
        make_recipe([("validate", {}), ("fold", {})])
    built = Recipe(
        steps=(RecipeStep("validate", STEP_OPTIONS["validate"]()), RecipeStep("fold", FoldOptions()))
    )
    with pytest.raises(GskitError, match=r"<default>: step 2: step 'fold' changes .* \(step 1\)"):
        check_validation_order(built)
    # the default recipe, and --fp16 adding its convert step, keep validate after every change
    fp16 = recipe_with_overrides(default_recipe(), fp16=True)
    names = [s.name for s in fp16.steps]
    assert names.index("convert") < names.index("validate")
    check_validation_order(fp16)


@pytest.mark.parametrize(
    "names",
    [list(DEFAULT_STEPS), ["fold"], ["sanitize", "validate", "check_trt"], ["fold", "fold", "infer_shapes"]],
)
def test_a_recipe_of_steps_without_options_is_the_one_its_yaml_reads(names: list[str]) -> None:
    """``make_recipe`` builds steps without options directly (the default recipe: no PyYAML import, no
    round trip): the same steps, options and lines as reading the YAML it wrote for them."""
    import yaml

    made = make_recipe([(name, {}) for name in names])
    text = yaml.safe_dump({"steps": [{name: {}} for name in names]}, sort_keys=False)
    assert made == parse_recipe(text, source="<python>")
    assert [step.line for step in made.steps] == [i + 2 for i in range(len(names))]


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([], "'steps' is empty"),
        ([("fold", {}), ("no_such_step", {})], r"<python>:3: unknown step 'no_such_step'"),
        (
            [("validate", {}), ("fold", {})],
            r"<python>:3: step 'fold' changes the model after step 'validate'",
        ),
    ],
)
def test_a_recipe_of_steps_without_options_fails_as_its_yaml_does(entries: list, message: str) -> None:
    with pytest.raises(GskitError, match=message):
        make_recipe(entries)


def test_the_default_recipe_imports_no_yaml() -> None:
    """PyYAML (10 ms) loads where a recipe is read or printed, not for the default recipe of a run."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from gskit.pipeline.prepare import default_recipe, recipe_with_overrides\n"
        "recipe = recipe_with_overrides(default_recipe(), skip=['build'], tensorrt='10.3')\n"
        "assert 'yaml' not in sys.modules, 'yaml imported'\n"
        "recipe.to_yaml()\n"
        "assert 'yaml' in sys.modules\n"
        "print('OK')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "OK", done.stderr[-500:]
