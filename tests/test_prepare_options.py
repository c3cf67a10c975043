"""``gskit prepare`` without a recipe file: each flag sets its recipe option
(``gskit.pipeline.prepare.recipe_with_overrides``), the report shows it, and ``--print-recipe`` writes the
recipe."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from gskit.cli import main
from gskit.errors import GskitError
from gskit.pipeline.prepare import default_recipe, recipe_with_overrides
from gskit.pipeline.recipe import parse_recipe
from gskit.pipeline.steps import DEFAULT_STEPS

EXAMPLE = Path(__file__).resolve().parents[1] / "gskit" / "data" / "example.onnx"
#: No TensorRT check or build: the runs stay fast and need no TensorRT.
FAST = ["--skip", "check_trt", "--skip", "build"]


def _options(recipe) -> list[tuple[str, object]]:
    return [(step.name, step.options) for step in recipe.steps]


def _step(recipe, name: str):
    return next(step.options for step in recipe.steps if step.name == name)


def test_each_option_lands_in_its_step() -> None:
    recipe = recipe_with_overrides(
        default_recipe(),
        shapes={"x": (2, 4, 8, 8)},
        atol=1e-3,
        rtol=1e-2,
        seed=7,
        only=["LayerNorm"],
        compute_capability="8.9",
    )
    validate = _step(recipe, "validate")
    assert (validate.shapes, validate.atol, validate.rtol, validate.seed) == (
        {"x": (2, 4, 8, 8)},
        1e-3,
        1e-2,
        7,
    )
    assert _step(recipe, "replace").only == ("LayerNorm",)
    assert _step(recipe, "build").compute_capability == "8.9"
    assert [s.name for s in recipe.steps] == list(DEFAULT_STEPS)
    assert recipe.source == "default with --shape --atol --rtol --seed --only --compute-capability"
    assert recipe_with_overrides(default_recipe()) == default_recipe()  # nothing given: unchanged


def test_skip_drops_steps_and_fp16_adds_a_convert_step() -> None:
    recipe = recipe_with_overrides(default_recipe(), skip=["infer_shapes", "build"], fp16=True)
    assert [s.name for s in recipe.steps] == [
        "sanitize",
        "lower",
        "replace",
        "fold",
        "convert",
        "check_trt",
        "validate",
    ]
    assert _step(recipe, "convert").fp16 is True
    # a recipe with its own convert step keeps it, with fp16 turned on and its other options as written
    own = parse_recipe("steps:\n  - convert: {int32: true}\n  - validate\n")
    converted = recipe_with_overrides(own, fp16=True)
    assert [s.name for s in converted.steps] == ["convert", "validate"]
    assert (_step(converted, "convert").fp16, _step(converted, "convert").int32) == (True, True)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"skip": ["bild"]},
            "--skip bild: the recipe has no step 'bild'; its steps: sanitize, lower, replace",
        ),
        (
            {"skip": ["build"], "compute_capability": "8.9"},
            "--compute-capability: the recipe has no build step",
        ),
        ({"skip": ["validate"], "atol": 1e-3}, "--atol: the recipe has no validate step"),
        ({"skip": ["convert"], "fp16": True}, "--fp16 needs the convert step"),
        ({"shapes": {"x": (0, 4)}}, "dim 0 is 0"),
        ({"skip": list(dict.fromkeys(DEFAULT_STEPS))}, "leaves no step"),
    ],
)
def test_contradictions_are_one_line_errors(options: dict, message: str) -> None:
    with pytest.raises(GskitError, match="^[^\n]*$") as err:
        recipe_with_overrides(default_recipe(), **options)
    assert message in str(err.value)


def test_print_recipe_loads_back_as_the_recipe_the_flags_made(tmp_path: Path, capsys) -> None:
    base = tmp_path / "r.yaml"
    base.write_text("steps:\n  - replace\n  - validate: {atol: 1.0e-2, seed: 3}\n  - build\n")
    argv = ["--shape", "x:[2,4,8,8]", "--seed", "9", "--fp16", "--only", "ClampSwish"]
    argv += ["--compute-capability", "8.9", "--inputs", "in.npz", "--rtol", "0.5"]
    assert main(["prepare", "--recipe", str(base), "--print-recipe", *argv]) == 0
    printed = capsys.readouterr().out
    loaded = parse_recipe(printed, base_dir=tmp_path / "elsewhere")
    made = recipe_with_overrides(
        parse_recipe(base.read_text(), base_dir=tmp_path),
        shapes={"x": (2, 4, 8, 8)},
        seed=9,
        fp16=True,
        only=["ClampSwish"],
        compute_capability="8.9",
        inputs="in.npz",
        rtol=0.5,
    )
    assert _options(loaded) == _options(made)
    validate = _step(loaded, "validate")
    assert (validate.atol, validate.rtol, validate.seed) == (1e-2, 0.5, 9)  # the file's atol, the flags' rest
    assert validate.inputs == str(Path("in.npz").absolute())  # the flag's path is the working directory's
    # --print-default-recipe still prints the default recipe
    assert main(["prepare", "--print-default-recipe"]) == 0
    assert _options(parse_recipe(capsys.readouterr().out)) == _options(default_recipe())


def test_flags_show_in_the_report(tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ["prepare", str(EXAMPLE), "-o", str(out), "--json", *FAST]
    argv += [
        "--shape",
        "x:3x4x8x8",
        "--atol",
        "1e-3",
        "--rtol",
        "1e-3",
        "--seed",
        "11",
        "--only",
        "LayerNorm",
        "--tensorrt",
        "8.5",
    ]
    assert main(argv) == 0
    report = json.loads((out / "report.json").read_text())
    assert [s["name"] for s in report["steps"]] == [
        "sanitize",
        "lower",
        "replace",
        "infer_shapes",
        "fold",
        "infer_shapes",
        "validate",
    ]
    validate = next(s["options"] for s in report["steps"] if s["name"] == "validate")
    assert (validate["atol"], validate["rtol"], validate["seed"]) == (1e-3, 1e-3, 11)
    assert report["comparison"]["input_shapes"] == {"x": [3, 4, 8, 8]}
    assert report["comparison"]["atol"] == 1e-3
    assert list(report["plugins_inserted"]) == ["gskit::LayerNorm v1"]  # ClampSwish left alone
    # the flags in the order the steps declare them (replace before validate)
    assert report["recipe"].startswith("default with --skip check_trt --skip build --tensorrt --only --shape")
    assert report["target"] == {"tensorrt": "8.5", "source": "--tensorrt 8.5"}


def test_inputs_flag_feeds_validation(tmp_path: Path) -> None:
    inputs = tmp_path / "in.npz"
    np.savez(inputs, x=np.random.default_rng(0).standard_normal((5, 4, 8, 8)).astype(np.float32))
    out = tmp_path / "out"
    assert main(["prepare", str(EXAMPLE), "-o", str(out), "--json", "--inputs", str(inputs), *FAST]) == 0
    assert json.loads((out / "report.json").read_text())["comparison"]["input_shapes"] == {"x": [5, 4, 8, 8]}


def test_fp16_flag_writes_an_fp16_model(tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ["prepare", str(EXAMPLE), "-o", str(out), "--json", "--fp16", "--atol", "5e-2", "--rtol", "5e-2"]
    assert main([*argv, *FAST]) == 0
    model = onnx.load(out / "model.onnx")
    types = {init.data_type for init in model.graph.initializer}
    assert onnx.TensorProto.FLOAT16 in types
    report = json.loads((out / "report.json").read_text())
    assert next(s for s in report["steps"] if s["name"] == "convert")["options"]["fp16"] is True


def test_prepare_without_output_is_one_line_exit_2(capsys) -> None:
    assert main(["prepare", str(EXAMPLE)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "-o OUTDIR" in err


def test_verbose_after_prepare_is_the_global_flag(capsys) -> None:
    assert main(["prepare", "--print-recipe", "--verbose", "--seed", "1"]) == 0
    assert "seed: 1" in capsys.readouterr().out


@pytest.mark.skipif(
    importlib.util.find_spec("tensorrt") is not None, reason="full TensorRT takes no compute capability"
)
def test_compute_capability_flag_reaches_the_build_step(tmp_path: Path, capsys) -> None:
    """A build asked for with --compute-capability and not done is an error (exit 2): TensorRT-RTX cannot
    build the example's plugin nodes, said once, without asking for the flag that was given."""
    out = tmp_path / "out"
    argv = [
        "prepare",
        str(EXAMPLE),
        "-o",
        str(out),
        "--json",
        "--skip",
        "check_trt",
        "--compute-capability",
        "8.9",
    ]
    assert main(argv) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    build = json.loads((out / "report.json").read_text())["steps"][-1]
    assert (build["name"], build["options"]["compute_capability"], build["status"]) == (
        "build",
        "8.9",
        "failed",
    )
    assert "--compute-capability" not in build["summary"]
    if importlib.util.find_spec("tensorrt_rtx") is not None:
        assert "TensorRT-RTX has no custom plugins and the model has plugin nodes" in error
        assert "(gskit::ClampSwish v1)" in error  # LayerNorm is LayerNormalization for the default target
    # without the flag the build step is skipped with the same reason, not "give --compute-capability"
    assert main(["prepare", str(EXAMPLE), "-o", str(out), "--json", "--skip", "check_trt"]) == 0
    build = json.loads((out / "report.json").read_text())["steps"][-1]
    assert build["status"] == "skipped" and "--compute-capability" not in build["summary"]
