"""Random inputs: shapes from the model, ``--shape`` overrides checked against the model's fixed dims."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import parse_model

from gskit.errors import GskitError
from gskit.io.feeds import random_feeds, resolve_feeds

MODEL = parse_model(
    """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[batch, 4, 8] x, int64[3] idx) => (float[batch, 4, 8] y) { y = Identity(x) }
    """
)


def test_symbolic_dims_take_dim_values_and_dtypes_follow_the_model() -> None:
    feeds = random_feeds(MODEL, dim_values={"batch": 3}, seed=1)
    assert feeds["x"].shape == (3, 4, 8) and feeds["x"].dtype == np.float32
    assert feeds["idx"].dtype == np.int64 and feeds["idx"].min() >= 0
    np.testing.assert_array_equal(random_feeds(MODEL, dim_values={"batch": 3}, seed=1)["x"], feeds["x"])


def test_shape_override_may_set_symbolic_dims() -> None:
    assert random_feeds(MODEL, {"x": (5, 4, 8)})["x"].shape == (5, 4, 8)


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        (
            (5, 4, 9),
            r"--shape x:5x4x9 sets dim 2 to 9, but input 'x' is \[batch, 4, 8\] \(dim 2 is fixed at 8\)",
        ),
        ((5, 4), r"--shape x:5x4 has rank 2, but input 'x' is \[batch, 4, 8\]"),
    ],
)
def test_shape_override_that_does_not_fit_is_named(shape: tuple[int, ...], message: str) -> None:
    with pytest.raises(GskitError, match=message):
        random_feeds(MODEL, {"x": shape})


def test_unknown_input_is_named() -> None:
    with pytest.raises(GskitError, match=r"unknown input\(s\) \['z'\]; model inputs are \['idx', 'x'\]"):
        random_feeds(MODEL, {"z": (1,)})


def test_shapes_with_given_feeds_is_an_error_not_ignored() -> None:
    # `gskit compare --inputs F.npz --shape x:...` ran the file's shapes and dropped --shape without a word.
    feeds = {"x": np.zeros((2, 4, 8), np.float32), "idx": np.zeros((3,), np.int64)}
    with pytest.raises(GskitError, match="give --shape or --inputs, not both"):
        resolve_feeds(MODEL, feeds, {"x": (4, 4, 8)})
    assert resolve_feeds(MODEL, feeds, {})["x"].shape == (2, 4, 8)  # no shapes: fine


def test_image_dims_and_metadata_fixed_dims() -> None:
    import onnx

    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 3, "h", "w"])
    t = onnx.helper.make_tensor_value_info("t", onnx.TensorProto.FLOAT, ["batch", "seq"])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["y"])], "g", [x, t], [y])
    model = onnx.helper.make_model(graph)
    onnx.helper.set_model_props(model, {"seq": "10", "h": "not a number"})
    feeds = random_feeds(model, default_dim=2, image_dim=64)
    # Height and width of an image input get the image size; 'seq' comes from the model's metadata.
    assert feeds["x"].shape == (2, 3, 64, 64) and feeds["t"].shape == (2, 10)
    assert random_feeds(model)["x"].shape == (2, 3, 2, 2)


def test_mode_switch_input_gets_the_constant_the_model_compares_it_with() -> None:
    # A VAD's sample rate: Equal(sr, 16000) picks the If branch; a random int would pick the wrong one.
    model = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, T] x, int64 sr, int64[1] flag) => (bool a, bool[1] b, float[N, T] y) <int64[1] k = {1}> {
          rate = Constant<value = int64 {16000}>()
          a = Equal(sr, rate)
          b = Equal(k, flag)
          y = Relu(x)
        }
        """
    )
    feeds = random_feeds(model, seed=3)
    assert feeds["sr"].shape == () and feeds["sr"].dtype == np.int64 and int(feeds["sr"]) == 16000
    assert feeds["flag"].tolist() == [1]
    assert feeds["x"].dtype == np.float32 and feeds["x"].shape == (2, 2)


def _through_graphsurgeon(model, **kwargs) -> dict[str, np.ndarray]:
    """random_feeds as it was: the inputs read from ``gs.import_onnx`` of the whole model."""
    import gskit.io.feeds as feeds_module

    original = feeds_module._declared_inputs
    feeds_module._declared_inputs = lambda model: None
    try:
        return random_feeds(model, **kwargs)
    finally:
        feeds_module._declared_inputs = original


def _light_models() -> list:
    """The bundled example and onnx's light test models (weights, symbolic and fixed dims)."""
    from pathlib import Path

    import onnx

    import gskit
    from gskit.io import model as gsmodel

    folder = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    paths = [Path(gskit.__file__).parent / "data" / "example.onnx", *sorted(folder.glob("*.onnx"))[:4]]
    return [gsmodel.load(p, load_weights=False) for p in paths]


def _typed():
    """Inputs of every kind random_feeds draws: float16 image (metadata fixes its height), bool scalar,
    uint8, float64 with an unknown dim, and an int32 input of unknown rank."""
    import onnx
    from onnx import TensorProto, helper

    inputs = [
        helper.make_tensor_value_info("img", TensorProto.FLOAT16, ["N", 3, "height", "W"]),
        helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
        helper.make_tensor_value_info("u", TensorProto.UINT8, [2]),
        helper.make_tensor_value_info("d", TensorProto.DOUBLE, [None, 2]),
        helper.make_tensor_value_info("r", TensorProto.INT32, None),
    ]
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)
    graph = helper.make_graph([helper.make_node("Identity", ["img"], ["y"])], "g", inputs, [output])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.helper.set_model_props(model, {"height": "5"})
    return model


TYPED = _typed()


def test_inputs_read_from_the_protobuf_give_graphsurgeons_feeds() -> None:
    """Inputs are read from the model's protobuf (no import of the whole graph): the same arrays as through
    graphsurgeon, for real models, every numpy dtype, symbolic, unknown and metadata-fixed dims, scalars
    and an input of unknown rank; and the same errors."""
    from gskit.io.feeds import _declared_inputs

    for model in [*_light_models(), MODEL, TYPED]:
        assert _declared_inputs(model) is not None
        for kwargs in ({}, {"seed": 3, "dim_values": {"N": 4}}, {"image_dim": 16}):
            if model is TYPED:
                kwargs = {**kwargs, "shapes": {"r": (2, 2)}}  # unknown rank: a shape is needed
            ours, theirs = random_feeds(model, **kwargs), _through_graphsurgeon(model, **kwargs)
            assert list(ours) == list(theirs)
            for name in ours:
                assert ours[name].dtype == theirs[name].dtype
                np.testing.assert_array_equal(ours[name], theirs[name])
    for call in (random_feeds, _through_graphsurgeon):
        with pytest.raises(GskitError, match="input 'r' has unknown rank"):
            call(TYPED)


def test_inputs_that_graphsurgeon_alone_describes_exactly_go_through_it() -> None:
    """An Equal node (a mode switch may read an input), value_info naming an input, or an input type
    without a numpy dtype: the protobuf is not read for the inputs, graphsurgeon's import is."""
    from gskit.io.feeds import _declared_inputs

    switch = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (int64 sr, float[2] x) => (bool y) { k = Constant<value = int64 {16000}>() y = Equal(sr, k) }
        """
    )
    from onnx import TensorProto, helper

    described = helper.make_model(
        helper.make_graph(
            [helper.make_node("Identity", ["x"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"])],
            value_info=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        )
    )
    bf16 = parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (bfloat16[2] x) => (bfloat16[2] y) { y = Identity(x) }
        """
    )
    assert [_declared_inputs(m) for m in (switch, described, bf16)] == [None, None, None]
    assert random_feeds(switch)["sr"] == 16000
    assert random_feeds(described)["x"].shape == (3,)  # graphsurgeon takes value_info's shape
