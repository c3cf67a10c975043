"""One shape syntax for every command (gskit.io.shape_args) and the commands that use it."""

from __future__ import annotations

import onnx
import pytest
from onnx import helper

from gskit.cli import main
from gskit.errors import GskitError
from gskit.io.shape_args import format_shape, parse_fixed_shape, parse_profile, parse_symbolic_shape
from gskit.pipeline.recipe import parse_recipe

SPELLINGS = ("x:1x3x224x224", "x:1,3,224,224", "x:[1,3,224,224]", "x:[1, 3, 224, 224]", "x:1X3X224X224")


@pytest.mark.parametrize("text", SPELLINGS)
def test_every_spelling_gives_the_same_fixed_shape(text: str) -> None:
    assert parse_fixed_shape(text) == ("x", (1, 3, 224, 224))


def test_names_keep_colons_and_scalars_are_empty() -> None:
    assert parse_fixed_shape("a:b:2x2") == ("a:b", (2, 2))
    assert parse_fixed_shape("s:") == ("s", ())
    assert parse_fixed_shape("s:[]") == ("s", ())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("x:0x4x8x8", "dim 0 is 0; concrete shapes need dims of at least 1"),
        ("x:-2x4", "dim 0 is -2"),
        ("x:1,?,3", "dim 1 is '?', not an integer"),
        # x-joined dims with a bad one name that one; "dim 0 is '1x3x224xx224'" pointed at the whole text
        ("x:1xbatch", "dim 1 is 'batch', not an integer"),
        ("x:1x3x224xx224", "dim 3 is '', not an integer"),
        ("x:1x3x2.5", "dim 2 is '2.5', not an integer"),
        ("1x3", "write NAME:DIMS"),
        (":1x3", "write NAME:DIMS"),
    ],
)
def test_bad_fixed_shapes_are_one_line_errors(text: str, message: str) -> None:
    with pytest.raises(GskitError, match="--shape") as err:
        parse_fixed_shape(text)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_shapes_print_x_joined_and_scalars_by_name() -> None:
    assert format_shape((1, 3, 224)) == "1x3x224"
    assert format_shape(()) == "scalar"


def test_symbolic_shapes_keep_unknown_and_symbolic_dims() -> None:
    assert parse_symbolic_shape("x:1,3,-1,batch") == ("x", [1, 3, None, "batch"])
    assert parse_symbolic_shape("x:[?,3,max_len]") == ("x", [None, 3, "max_len"])
    assert parse_symbolic_shape("x:1x3x-1x?") == ("x", [1, 3, None, None])
    assert parse_symbolic_shape("x:max_len") == ("x", ["max_len"])  # an x inside a symbol stays
    assert parse_symbolic_shape("x:") == ("x", [])
    for bad in ("x:1,-3", "x:1,2.5", "nocolon"):
        with pytest.raises(GskitError, match="--input-shape"):
            parse_symbolic_shape(bad)


def test_profiles_in_every_spelling() -> None:
    profile = ((1, 3), (4, 3), (8, 3))
    assert parse_profile("x:1x3,4x3,8x3") == ("x", profile)
    assert parse_profile("x:[1,3],[4,3],[8,3]") == ("x", profile)
    assert parse_profile("x:[1],[4],[8]") == ("x", ((1,), (4,), (8,)))
    # one shape, in any spelling, is min = opt = max; plain commas join dims as everywhere else
    assert parse_profile("x:1,3,224") == ("x", ((1, 3, 224),) * 3)
    assert parse_profile("a:b:2x2") == ("a:b", ((2, 2),) * 3)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("x:1x3,4x3", "MIN,OPT,MAX shapes or one shape"),
        ("x:1x3,4x3x2,8x3", "different ranks"),
        ("x:4x3,2x3,8x3", "MIN <= OPT <= MAX"),
        ("x:0x3,1x3,2x3", "dim 0 is 0"),
        ("x:[1,3],junk,[2,3]", "MIN,OPT,MAX shapes or one shape"),
        ("x", "write NAME:DIMS"),
    ],
)
def test_bad_profiles(text: str, message: str) -> None:
    with pytest.raises(GskitError, match="--shape") as err:
        parse_profile(text)
    assert message in str(err.value)


def test_recipe_shapes_follow_the_same_rules() -> None:
    with pytest.raises(GskitError, match=r"<recipe>:2: step 'validate': shapes.x .*dim 0 is 0"):
        parse_recipe("steps:\n  - validate: {shapes: {x: [0, 4]}}\n")
    with pytest.raises(GskitError, match=r"<recipe>:2: step 'build': shapes.x .*MIN <= OPT <= MAX"):
        parse_recipe("steps:\n  - build: {shapes: {x: [[4, 2], [2, 2], [8, 2]]}}\n")
    with pytest.raises(GskitError, match=r"<recipe>:2: step 'edit': shapes.x .*dim -3 is negative"):
        parse_recipe("steps:\n  - edit: {input_shapes: {x: [1, -3]}}\n")
    with pytest.raises(GskitError, match=r"dim '2 x' is not a symbol name"):
        parse_recipe("steps:\n  - edit: {input_shapes: {x: [1, '2 x']}}\n")
    edit = parse_recipe("steps:\n  - edit: {input_shapes: {x: [batch, null, 3]}}\n").steps[0].options
    assert edit.input_shapes == {"x": ("batch", None, 3)}


@pytest.fixture
def relu_model(tmp_path):
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 4])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g", [x], [y])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.parametrize("spelling", ["x:3x4", "x:3,4", "x:[3,4]"])
def test_commands_take_every_spelling(relu_model, tmp_path, spelling: str, capsys) -> None:
    assert main(["compare", str(relu_model), str(relu_model), "--shape", spelling, "--json"]) == 0
    assert '"x": [\n      3,\n      4\n    ]' in capsys.readouterr().out
    out = tmp_path / "e.onnx"
    assert main(["edit", str(relu_model), "-o", str(out), "--input-shape", spelling]) == 0
    dims = onnx.load(out).graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_value for d in dims] == [3, 4]


def test_zero_dim_for_validation_is_one_line_exit_2(relu_model, capsys) -> None:
    assert main(["compare", str(relu_model), str(relu_model), "--shape", "x:0x4"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "dim 0 is 0" in err
