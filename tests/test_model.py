"""gskit.io.model: round trips, IR version for onnxruntime, atomic saves, lazy weights, and bad files."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import uses_external_data

from gskit import cli
from gskit.errors import GskitError, ModelCheckError
from gskit.io.model import (
    EXTERNAL_TENSOR_MIN_BYTES,
    MAX_ORT_IR_VERSION,
    check_file,
    load,
    resolve_output,
    save,
    save_linked,
    to_graph,
    to_model,
)


def _mlp(rng: np.random.Generator, ir_version: int = onnx.IR_VERSION) -> onnx.ModelProto:
    """Y = Relu(X @ W + B): W (8 KiB) goes to external data, B (128 B) stays inline."""
    weight = rng.standard_normal((64, 32)).astype(np.float32)
    bias = rng.standard_normal(32).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["X", "W"], ["M"]),
            helper.make_node("Add", ["M", "B"], ["S"]),
            helper.make_node("Relu", ["S"], ["Y"]),
        ],
        "mlp",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 32])],
        [numpy_helper.from_array(weight, "W"), numpy_helper.from_array(bias, "B")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=ir_version)


def _weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _graph_weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Weights read through gs.Graph (lazy values for tensors still on disk)."""
    graph = to_graph(model)
    return {name: t.values for name, t in graph.tensors().items() if hasattr(t, "values")}


def _assert_bit_identical(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert actual.keys() == expected.keys()
    for name, value in expected.items():
        assert actual[name].dtype == value.dtype and actual[name].shape == value.shape, name
        assert actual[name].tobytes() == value.tobytes(), name


def _listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _bad_model() -> onnx.ModelProto:
    """Fails onnx's checker: Relu reads a tensor that nothing produces."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["nowhere"], ["Y"])],
        "bad",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.zeros(512, np.float32), "big")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


# Round trips ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("external_data", [False, True])
def test_round_trip_bit_identical(tmp_path: Path, rng: np.random.Generator, external_data: bool) -> None:
    model = _mlp(rng)
    path = save(model, tmp_path / "m.onnx", external_data=external_data)
    assert path == (tmp_path / "m.onnx").resolve()
    assert (tmp_path / "m.onnx.data").is_file() == external_data
    assert _listing(tmp_path) == (["m.onnx", "m.onnx.data"] if external_data else ["m.onnx"])

    _assert_bit_identical(_weights(load(path)), _weights(model))
    lazy = load(path, load_weights=False)
    on_disk = [t.name for t in lazy.graph.initializer if uses_external_data(t)]
    assert on_disk == (["W"] if external_data else [])  # B is below EXTERNAL_TENSOR_MIN_BYTES
    assert 32 * 4 < EXTERNAL_TENSOR_MIN_BYTES <= 64 * 32 * 4
    _assert_bit_identical(_graph_weights(lazy), _weights(model))


def test_written_ir_version_runs_on_onnxruntime(tmp_path: Path, rng: np.random.Generator) -> None:
    model = _mlp(rng, ir_version=onnx.IR_VERSION)
    assert model.ir_version > MAX_ORT_IR_VERSION  # onnx 1.23 writes 14 by default
    path = save(model, tmp_path / "m.onnx", external_data=True)
    assert model.ir_version == onnx.IR_VERSION, "the caller's model keeps its IR version"
    assert onnx.load(str(path), load_external_data=False).ir_version <= MAX_ORT_IR_VERSION

    x = rng.standard_normal((3, 64)).astype(np.float32)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"X": x})
    weights = _weights(model)
    expected = np.maximum(x @ weights["W"] + weights["B"], 0)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def test_save_graph(tmp_path: Path, rng: np.random.Generator) -> None:
    model = _mlp(rng)
    path = save(to_graph(model), tmp_path / "g.onnx")
    _assert_bit_identical(_weights(load(path)), _weights(model))


# Atomic saves -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("external_data", [False, True])
def test_failed_check_leaves_nothing(tmp_path: Path, external_data: bool) -> None:
    with pytest.raises(ModelCheckError, match="m.onnx"):
        save(_bad_model(), tmp_path / "m.onnx", external_data=external_data)
    assert _listing(tmp_path) == [], "no model, no data file, no temporary folder"


def test_failed_check_keeps_existing_destination(tmp_path: Path, rng: np.random.Generator) -> None:
    path = save(_mlp(rng), tmp_path / "m.onnx", external_data=True)
    before = {name: (tmp_path / name).read_bytes() for name in _listing(tmp_path)}
    with pytest.raises(ModelCheckError):
        save(_bad_model(), path, external_data=True)
    assert {name: (tmp_path / name).read_bytes() for name in _listing(tmp_path)} == before


def test_unchecked_save_writes_bad_model(tmp_path: Path) -> None:
    path = save(_bad_model(), tmp_path / "m.onnx", check=False)
    assert _listing(tmp_path) == ["m.onnx"]
    assert load(path).graph.node[0].input[0] == "nowhere"


def test_resolve_output_refuses_input(tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    spelled_otherwise = tmp_path / "sub" / ".." / "m.onnx"
    with pytest.raises(GskitError, match="overwrite the input"):
        resolve_output(model, spelled_otherwise, in_place=False)
    assert resolve_output(model, model, in_place=True) == model
    assert resolve_output(model, tmp_path / "out.onnx", in_place=False) == tmp_path / "out.onnx"


# Lazy weights -----------------------------------------------------------------------------------------


def test_lazy_model_saved_elsewhere_streams_weights(tmp_path: Path, rng: np.random.Generator) -> None:
    model = _mlp(rng)
    source = save(model, tmp_path / "a" / "m.onnx", external_data=True)
    source_data = (tmp_path / "a" / "m.onnx.data").read_bytes()
    lazy = load(source, load_weights=False)

    target = save(lazy, tmp_path / "b" / "m.onnx")  # external data chosen: weights are on disk
    assert (tmp_path / "b" / "m.onnx.data").is_file()
    weight = next(t for t in lazy.graph.initializer if t.name == "W")
    assert uses_external_data(weight) and not weight.HasField("raw_data"), "weights stay on disk"
    assert (tmp_path / "a" / "m.onnx.data").read_bytes() == source_data

    _assert_bit_identical(_weights(load(target)), _weights(model))
    # The written file points at its own data file only (no basepath of the source leaks into it).
    written = onnx.load(str(target), load_external_data=False)
    keys = {e.key for t in written.graph.initializer for e in t.external_data}
    assert keys <= {"location", "offset", "length"}


def test_lazy_graph_saved_elsewhere(tmp_path: Path, rng: np.random.Generator) -> None:
    model = _mlp(rng)
    source = save(model, tmp_path / "a" / "m.onnx", external_data=True)
    graph = to_graph(load(source, load_weights=False))
    target = save(graph, tmp_path / "b" / "m.onnx", external_data=True)
    _assert_bit_identical(_weights(load(target)), _weights(model))


def test_lazy_model_over_its_own_data_file(tmp_path: Path, rng: np.random.Generator) -> None:
    source = save(_mlp(rng), tmp_path / "m.onnx", external_data=True)
    before = {name: (tmp_path / name).read_bytes() for name in _listing(tmp_path)}
    lazy = load(source, load_weights=False)
    with pytest.raises(GskitError, match="m.onnx.data"):
        save(lazy, source)
    assert {name: (tmp_path / name).read_bytes() for name in _listing(tmp_path)} == before


def test_lazy_model_without_external_data_refused(tmp_path: Path, rng: np.random.Generator) -> None:
    source = save(_mlp(rng), tmp_path / "a" / "m.onnx", external_data=True)
    lazy = load(source, load_weights=False)
    with pytest.raises(GskitError, match="external_data=True"):
        save(lazy, tmp_path / "b" / "m.onnx", external_data=False)
    assert _listing(tmp_path / "b") == []


def test_caller_model_unchanged_by_external_save(tmp_path: Path, rng: np.random.Generator) -> None:
    model = _mlp(rng)
    before = onnx.ModelProto()
    before.CopyFrom(model)
    save(model, tmp_path / "m.onnx", external_data=True)
    for old, new in zip(before.graph.initializer, model.graph.initializer, strict=True):
        assert new.HasField("raw_data") and new.raw_data == old.raw_data, new.name
        assert not uses_external_data(new) and new.data_location == TensorProto.DEFAULT, new.name
        assert list(new.dims) == list(old.dims) and new.data_type == old.data_type, new.name


def test_caller_model_proto_identical_after_external_save(tmp_path: Path, rng: np.random.Generator) -> None:
    model = _mlp(rng)
    before = model.SerializeToString()
    save(model, tmp_path / "m.onnx", external_data=True)
    assert model.SerializeToString() == before


def test_caller_typed_data_unchanged_by_external_save(tmp_path: Path) -> None:
    values = np.arange(512, dtype=np.float32)
    tensor = helper.make_tensor("T", TensorProto.FLOAT, values.shape, values.tolist())  # float_data
    graph = helper.make_graph(
        [helper.make_node("Identity", ["T"], ["Y"])],
        "typed",
        [],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [512])],
        [tensor],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    before = model.SerializeToString()
    path = save(model, tmp_path / "m.onnx", external_data=True)
    np.testing.assert_array_equal(numpy_helper.to_array(load(path).graph.initializer[0]), values)
    assert model.SerializeToString() == before


# Edge cases of save ----------------------------------------------------------------------------------


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def test_string_tensor_stays_inline_with_external_data(tmp_path: Path) -> None:
    """ONNX external data cannot hold strings: they must not be written there as object pointers."""
    words = np.array([f"word{i}" for i in range(300)], dtype=object)
    graph = helper.make_graph(
        [helper.make_node("Identity", ["S"], ["Y"])],
        "strings",
        [],
        [helper.make_tensor_value_info("Y", TensorProto.STRING, [300])],
        [numpy_helper.from_array(words, "S")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    path = save(model, tmp_path / "m.onnx", external_data=True)
    assert not uses_external_data(onnx.load(str(path), load_external_data=False).graph.initializer[0])
    assert list(numpy_helper.to_array(load(path).graph.initializer[0])) == list(words)
    assert list(_session(path).run(None, {})[0]) == list(words)


def test_external_save_without_initializers(tmp_path: Path) -> None:
    (tmp_path / "m.onnx.data").write_bytes(b"left from an earlier save")
    graph = helper.make_graph(
        [helper.make_node("Relu", ["X"], ["Y"])],
        "plain",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    path = save(model, tmp_path / "m.onnx", external_data=True)
    assert _listing(tmp_path) == ["m.onnx"], "an empty data file is not written; the stale one is removed"
    x = np.array([-1.0, 0.5, 2.0], np.float32)
    np.testing.assert_array_equal(_session(path).run(None, {"X": x})[0], np.maximum(x, 0))


def test_typed_tensors_in_subgraphs_go_external(tmp_path: Path) -> None:
    """A Constant node (float_data) in one If branch and an initializer (float_data) in the other."""
    up, down = np.arange(512, dtype=np.float32), -np.arange(512, dtype=np.float32)
    then_branch = helper.make_graph(
        [
            helper.make_node(
                "Constant", [], ["c"], value=helper.make_tensor("C", TensorProto.FLOAT, [512], up.tolist())
            )
        ],
        "then",
        [],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [512])],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Identity", ["D"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [512])],
        [helper.make_tensor("D", TensorProto.FLOAT, [512], down.tolist())],
    )
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["Y"], then_branch=then_branch, else_branch=else_branch)],
        "branches",
        [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [512])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    before = model.SerializeToString()
    path = save(model, tmp_path / "m.onnx", external_data=True)
    assert model.SerializeToString() == before
    assert (tmp_path / "m.onnx.data").stat().st_size >= 2 * 512 * 4
    for name, want in ((True, up), (False, down)):
        np.testing.assert_array_equal(_session(path).run(None, {"cond": np.array(name)})[0], want)
    # Lazily loaded and saved again elsewhere: the weights are streamed from the first data file.
    again = save(to_graph(load(path, load_weights=False)), tmp_path / "b" / "m.onnx")
    np.testing.assert_array_equal(_session(again).run(None, {"cond": np.array(False)})[0], down)


def test_save_relative_path_into_new_folder(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = save(_mlp(rng), Path("new") / "deeper" / "m.onnx", external_data=True)
    assert path == tmp_path / "new" / "deeper" / "m.onnx" and path.is_absolute()
    assert _listing(path.parent) == ["m.onnx", "m.onnx.data"]
    lazy = load("new/deeper/m.onnx", load_weights=False)
    monkeypatch.chdir(tmp_path / "new")  # lazy weights remember their folder, not the working directory
    _assert_bit_identical(_graph_weights(lazy), _weights(load(path)))


def test_save_under_a_file_or_onto_a_folder(tmp_path: Path, rng: np.random.Generator) -> None:
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(GskitError, match=r"file/m\.onnx: cannot create its folder"):
        save(_mlp(rng), tmp_path / "file" / "m.onnx")
    (tmp_path / "dir.onnx").mkdir()
    with pytest.raises(GskitError, match=r"dir\.onnx: is a folder"):
        save(_mlp(rng), tmp_path / "dir.onnx")
    assert _listing(tmp_path) == ["dir.onnx", "file"] and _listing(tmp_path / "dir.onnx") == []


def test_resolve_output_sees_through_symlinks(tmp_path: Path) -> None:
    model = tmp_path / "models" / "m.onnx"
    model.parent.mkdir()
    model.write_bytes(b"")
    (tmp_path / "link.onnx").symlink_to(model)
    (tmp_path / "linked_dir").symlink_to(model.parent)
    for alias in (tmp_path / "link.onnx", tmp_path / "linked_dir" / "m.onnx"):
        with pytest.raises(GskitError, match="overwrite the input"):
            resolve_output(model, alias, in_place=False)
        with pytest.raises(GskitError, match="overwrite the input"):
            resolve_output(alias, model, in_place=False)
    assert resolve_output(model, tmp_path / "linked_dir" / "other.onnx", in_place=False).name == "other.onnx"


# Bad files --------------------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.onnx"
    with pytest.raises(GskitError, match="absent.onnx"):
        load(path)


def test_truncated_file(tmp_path: Path, rng: np.random.Generator) -> None:
    full = save(_mlp(rng), tmp_path / "full.onnx")
    path = tmp_path / "cut.onnx"
    path.write_bytes(full.read_bytes()[:100])
    with pytest.raises(GskitError, match="cut.onnx"):
        load(path)


def test_text_file(tmp_path: Path) -> None:
    path = tmp_path / "notes.onnx"
    path.write_text("These are notes about a model, not a model.\n" * 20)
    with pytest.raises(GskitError, match="notes.onnx"):
        load(path)


@pytest.mark.parametrize("load_weights", [True, False])
def test_missing_external_data(tmp_path: Path, rng: np.random.Generator, load_weights: bool) -> None:
    path = save(_mlp(rng), tmp_path / "m.onnx", external_data=True)
    (tmp_path / "m.onnx.data").unlink()
    with pytest.raises(GskitError, match=r"m\.onnx.*m\.onnx\.data.*missing"):
        load(path, load_weights=load_weights)


def test_external_data_that_is_a_pipe_is_named_as_one(tmp_path: Path, rng: np.random.Generator) -> None:
    """A pipe (or folder) where the data file should be is said to be one, not "missing", and is never
    opened (a reader would wait for a writer)."""
    import os

    path = save(_mlp(rng), tmp_path / "m.onnx", external_data=True)
    (tmp_path / "m.onnx.data").unlink()
    os.mkfifo(tmp_path / "m.onnx.data")
    with pytest.raises(GskitError, match=r"m\.onnx\.data.*is no regular file \(a folder, device or pipe\)"):
        load(path, load_weights=True)


@pytest.mark.parametrize("load_weights", [True, False])
def test_short_external_data(tmp_path: Path, rng: np.random.Generator, load_weights: bool) -> None:
    path = save(_mlp(rng), tmp_path / "m.onnx", external_data=True)
    data = tmp_path / "m.onnx.data"
    data.write_bytes(data.read_bytes()[:-10])
    with pytest.raises(GskitError, match=r"m\.onnx.*m\.onnx\.data.*too short"):
        load(path, load_weights=load_weights)


@pytest.mark.parametrize("offset", ["abc", "-8"])
def test_bad_external_data_offset(tmp_path: Path, rng: np.random.Generator, offset: str) -> None:
    path = save(_mlp(rng), tmp_path / "m.onnx", external_data=True)
    model = onnx.load(str(path), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "offset":
                entry.value = offset
    path.write_bytes(model.SerializeToString())
    with pytest.raises(GskitError, match=r"m\.onnx: tensor .* external data offset"):
        load(path, load_weights=False)


def test_external_location_outside_folder(tmp_path: Path, rng: np.random.Generator) -> None:
    path = save(_mlp(rng), tmp_path / "m.onnx", external_data=True)
    model = onnx.load(str(path), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "../elsewhere.data"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(GskitError, match="invalid external data location"):
        load(path)


# empty list attributes ------------------------------------------------------------------------------------


def _empty_list_model() -> onnx.ModelProto:
    """ReduceSum-11 with ``axes=[]`` (reduce over everything) and a custom node with empty FLOATS/STRINGS."""
    graph = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["x"], ["y"], name="sum", keepdims=0),
            helper.make_node("Tagged", ["x"], ["t"], name="tagged", domain="custom.ops"),
        ],
        "empty_lists",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 11), helper.make_opsetid("custom.ops", 1)]
    )
    model.graph.node[0].attribute.append(onnx.AttributeProto(name="axes", type=onnx.AttributeProto.INTS))
    model.graph.node[1].attribute.extend(
        onnx.AttributeProto(name=name, type=kind)
        for name, kind in (("scales", onnx.AttributeProto.FLOATS), ("labels", onnx.AttributeProto.STRINGS))
    )
    model.ir_version = MAX_ORT_IR_VERSION
    return model


def _attribute_kinds(model: onnx.ModelProto) -> dict[tuple[str, str], int]:
    return {(node.name, a.name): a.type for node in model.graph.node for a in node.attribute}


def _reduce_all(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(["y"], {"x": x})[0]


def test_empty_list_attributes_round_trip_with_their_kind(tmp_path: Path) -> None:
    model = _empty_list_model()
    onnx.checker.check_model(model)
    out = to_model(to_graph(load(save(model, tmp_path / "m.onnx"))))
    assert _attribute_kinds(out) == {
        ("sum", "keepdims"): onnx.AttributeProto.INT,
        ("sum", "axes"): onnx.AttributeProto.INTS,
        ("tagged", "scales"): onnx.AttributeProto.FLOATS,
        ("tagged", "labels"): onnx.AttributeProto.STRINGS,
    }
    assert not any(a.ints or a.floats or a.strings for node in out.graph.node for a in node.attribute)
    onnx.checker.check_model(out)


def test_empty_list_attribute_survives_fold(tmp_path: Path) -> None:
    model = _empty_list_model()
    del model.graph.node[1]  # onnxruntime cannot run the custom node
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    src = save(model, tmp_path / "m.onnx")
    assert cli.main(["fold", str(src), "-o", str(tmp_path / "f.onnx")]) == 0
    folded = load(tmp_path / "f.onnx")
    assert _attribute_kinds(folded)[("sum", "axes")] == onnx.AttributeProto.INTS
    onnx.checker.check_model(folded)
    np.testing.assert_array_equal(_reduce_all(folded, x), _reduce_all(model, x))
    assert float(_reduce_all(folded, x)) == 15.0


def _optional_model() -> onnx.ModelProto:
    """y = OptionalGetElement(Optional(x)), with the optional's type in value_info."""
    graph = helper.make_graph(
        [
            helper.make_node("Optional", ["x"], ["opt"], name="wrap"),
            helper.make_node("OptionalGetElement", ["opt"], ["y"], name="unwrap"),
        ],
        "optional",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    element = helper.make_tensor_type_proto(TensorProto.FLOAT, [2, 3])
    graph.value_info.append(helper.make_value_info("opt", helper.make_optional_type_proto(element)))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = MAX_ORT_IR_VERSION
    return model


def test_optional_value_type_round_trips(tmp_path: Path) -> None:
    """graphsurgeon failed to export an optional value_info (UnboundLocalError) from sanitize or prepare."""
    model = _optional_model()
    out = to_model(to_graph(model))
    assert {i.name: i.type for i in out.graph.value_info}["opt"] == model.graph.value_info[0].type
    onnx.checker.check_model(out, full_check=True)
    src = save(model, tmp_path / "m.onnx")
    assert cli.main(["sanitize", str(src), "-o", str(tmp_path / "s.onnx")]) == 0
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    session = ort.InferenceSession(str(tmp_path / "s.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(["y"], {"x": x})[0], x)


# CLI error handling -----------------------------------------------------------------------------------


def test_cli_missing_file_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "absent.onnx"
    assert cli.main(["inspect", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err
    assert lines[0].startswith("gskit inspect: error: ") and str(path) in lines[0]


def test_cli_debug_prints_the_traceback_and_still_exits_2(tmp_path: Path, capsys) -> None:
    # --debug used to re-raise, so Python exited 1, which gskit keeps for "validation failed".
    assert cli.main(["--debug", "inspect", os.fspath(tmp_path / "absent.onnx")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "GskitError" in err
    assert err.rstrip().splitlines()[-1].startswith("gskit inspect: error: ") and "absent.onnx" in err


def _mlp_with_new_weight(tmp_path: Path, rng: np.random.Generator):
    """The MLP saved with W on disk, loaded weightless, with a second weight made in memory (Y + C, 4 KiB)."""
    import onnx_graphsurgeon as gs

    path = save(_mlp(rng), tmp_path / "in" / "m.onnx", external_data=True)
    graph = to_graph(load(path, load_weights=False))
    added = gs.Constant("C", rng.standard_normal((32, 32)).astype(np.float32))
    out = gs.Variable("Z", dtype=np.float32, shape=["batch", 32])
    graph.nodes.append(gs.Node("MatMul", inputs=[graph.outputs[0], added], outputs=[out]))
    graph.outputs = [out]
    return path, graph


def test_save_linked_links_the_weights_on_disk_and_writes_those_in_memory(tmp_path, rng) -> None:
    """The snapshot's folder has a hard link to the original's data (nothing of W copied) and a data file of
    its own for the new weight; gskit and onnxruntime read it and compute what a full save computes."""
    from gskit.backends import ort as gsort

    path, graph = _mlp_with_new_weight(tmp_path, rng)
    snapshot = save_linked(graph, tmp_path / "snap" / "model.onnx")
    data = path.with_name("m.onnx.data")
    assert (snapshot.parent / "m.onnx.data").samefile(data)
    assert (snapshot.parent / "model.onnx.data").stat().st_size == 32 * 32 * 4  # only C
    full = save(graph, tmp_path / "full" / "model.onnx")
    _assert_bit_identical(_graph_weights(load(snapshot)), _graph_weights(load(full)))
    feeds = {"X": rng.standard_normal((2, 64)).astype(np.float32)}
    np.testing.assert_array_equal(gsort.run(snapshot, feeds)["Z"], gsort.run(full, feeds)["Z"])


def test_save_linked_copies_the_weights_where_no_link_can_be_made(tmp_path, rng) -> None:
    """A snapshot on another file system (no hard link across them) gets a copy of the weights instead."""
    other = Path("/dev/shm")
    if not other.is_dir() or other.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs /dev/shm on another file system")
    path, graph = _mlp_with_new_weight(tmp_path, rng)
    folder = Path(tempfile.mkdtemp(dir=other))
    try:
        snapshot = save_linked(graph, folder / "model.onnx")
        assert sorted(p.name for p in folder.iterdir()) == ["model.onnx", "model.onnx.data"]
        assert (folder / "model.onnx.data").stat().st_size >= (64 * 32 + 32 * 32) * 4  # W and C
        _assert_bit_identical(
            _graph_weights(load(snapshot)), _graph_weights(load(save(graph, tmp_path / "f.onnx")))
        )
    finally:
        shutil.rmtree(folder)


@pytest.mark.parametrize("through_graphsurgeon", [False, True], ids=["proto", "graph"])
def test_save_linked_copies_the_weights_a_subgraph_reads(tmp_path, rng, through_graphsurgeon) -> None:
    """onnxruntime checks a weight read inside an If branch with onnx's loader, which refuses a data file
    with a second name: such weights are copied (the others still linked), and the snapshot loads and runs.
    Before, prepare's validate failed on any such model with external data ("multiple hard links")."""
    import onnx
    from onnx import TensorProto, helper

    from gskit.backends import ort as gsort

    value = helper.make_tensor_value_info
    then = helper.make_graph(
        [helper.make_node("MatMul", ["h", "B"], ["b"])], "then", [], [value("b", TensorProto.FLOAT, None)]
    )
    other = helper.make_graph(
        [helper.make_node("Neg", ["h"], ["o"])], "else", [], [value("o", TensorProto.FLOAT, None)]
    )
    nodes = [
        helper.make_node("MatMul", ["x", "A"], ["h"]),
        helper.make_node("ReduceSum", ["h"], ["t"], keepdims=0),
        helper.make_node("Greater", ["t", "zero"], ["c"]),
        helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
    ]
    weights = {name: rng.standard_normal((32, 32)).astype(np.float32) for name in ("A", "B")}
    graph = helper.make_graph(
        nodes,
        "g",
        [value("x", TensorProto.FLOAT, [2, 32])],
        [value("y", TensorProto.FLOAT, [2, 32])],
        [onnx.numpy_helper.from_array(w, n) for n, w in weights.items()]
        + [onnx.numpy_helper.from_array(np.zeros((), np.float32), "zero")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    path = save(model, tmp_path / "in" / "m.onnx", external_data=True)
    weightless = load(path, load_weights=False)
    snapshot = save_linked(
        to_graph(weightless) if through_graphsurgeon else weightless, tmp_path / "snap" / "model.onnx"
    )
    assert (snapshot.parent / "m.onnx.data").samefile(path.with_name("m.onnx.data"))  # A: linked
    assert (snapshot.parent / "model.onnx.data").stat().st_size == 32 * 32 * 4  # B: copied
    feeds = {"x": np.abs(rng.standard_normal((2, 32))).astype(np.float32)}
    np.testing.assert_array_equal(gsort.run(snapshot, feeds)["y"], gsort.run(path, feeds)["y"])


def test_a_hard_link_gskit_did_not_make_is_still_refused(tmp_path, rng) -> None:
    """Linking a model's data for a snapshot does not make another name of any other file acceptable."""
    path, graph = _mlp_with_new_weight(tmp_path, rng)
    save_linked(graph, tmp_path / "snap" / "model.onnx")
    other = save(_mlp(rng), tmp_path / "other" / "o.onnx", external_data=True)
    os.link(other.with_name("o.onnx.data"), tmp_path / "other" / "second-name")
    with pytest.raises(GskitError, match="hard links"):
        load(other, load_weights=False)


def test_large_weights_exported_apart_make_the_model_graphsurgeons_export_makes(
    rng: np.random.Generator, monkeypatch
) -> None:
    """``to_model`` writes large weights into the model after graphsurgeon's export (``weights_apart``): the
    model is byte for byte the one graphsurgeon's export makes of them, for arrays of several dtypes, a
    weight held as a TensorProto, one that is also a graph output, one with a data location and small ones,
    and the graph keeps its own values."""
    import onnx_graphsurgeon as gs

    from gskit.io import weights_apart

    big = (128, 512)
    held = numpy_helper.from_array(rng.standard_normal(big).astype(np.float32), "held")
    x = gs.Variable("x", np.float32, big)
    weights = {
        "f32": rng.standard_normal(big).astype(np.float32),
        "f16": rng.standard_normal(big).astype(np.float16),
        "i64": rng.integers(-9, 9, big).astype(np.int64),
        "flag": rng.integers(0, 2, big).astype(bool),
        "small": rng.standard_normal((4,)).astype(np.float32),
        "strided": rng.standard_normal((512, 128)).astype(np.float32).T,
    }
    constants = {name: gs.Constant(name, values) for name, values in weights.items()}
    constants["held"] = gs.Constant("held", gs.ir.tensor.LazyValues(held))
    located = rng.standard_normal(big).astype(np.float32)  # the export writes its data_location field
    constants["located"] = gs.Constant("located", located, data_location=onnx.TensorProto.DEFAULT)
    constants["as_output"] = gs.Constant("as_output", rng.standard_normal(big).astype(np.float32))
    nodes = [
        gs.Node("Add", name=f"add_{name}", inputs=[x, constant], outputs=[gs.Variable(f"y_{name}")])
        for name, constant in constants.items()
        if name not in ("small", "flag", "i64", "f16")
    ]
    nodes.append(gs.Node("Identity", name="id", inputs=[constants["small"]], outputs=[gs.Variable("s")]))
    for name in ("flag", "i64", "f16"):
        nodes.append(
            gs.Node(
                "Identity", name=f"id_{name}", inputs=[constants[name]], outputs=[gs.Variable(f"{name}_copy")]
            )
        )
    outputs = [out for node in nodes for out in node.outputs] + [constants["as_output"]]
    graph = gs.Graph(nodes=nodes, inputs=[x], outputs=outputs, opset=17)
    before = {name: c._values for name, c in constants.items()}

    with weights_apart.exporting_weights_apart(graph) as apart:
        taken = sorted(name for name, constant in constants.items() if constant._values is not before[name])
        assert len(apart.sources) == len(taken) and not apart.everywhere
    assert taken == ["as_output", "f16", "f32", "flag", "held", "i64", "strided"]  # not small, not located
    apart_bytes = to_model(graph).SerializeToString()
    monkeypatch.setattr(weights_apart, "APART_MIN_BYTES", 1 << 62)  # graphsurgeon exports every weight
    with weights_apart.exporting_weights_apart(graph) as apart:
        assert not apart.sources
    assert to_model(graph).SerializeToString() == apart_bytes
    assert {name: c._values for name, c in constants.items()} == before  # the same objects


def test_the_external_data_threshold_counts_data_not_serialized_bytes(tmp_path: Path, monkeypatch) -> None:
    """``save`` chooses external data when the tensors hold more than the threshold, counted as their data
    (the raw bytes, or dims x item size for typed fields), not their serialized size, which it reads first
    as a bound: small int64 values serialize in 2 bytes each, raw data in a few bytes more than it holds."""
    import gskit.io.model as gsm

    raw = numpy_helper.from_array(np.zeros(1000, np.float32), "raw")  # 4000 bytes of data
    typed = helper.make_tensor("typed", TensorProto.INT64, [1000], [1] * 1000)  # 8000 bytes, ~2000 serialized
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1000])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1000])
    graph = helper.make_graph([helper.make_node("Add", ["x", "raw"], ["y"])], "g", [x], [y], [raw, typed])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    for limit, external in ((11_999, True), (12_000, False), (3_999, True), (4_000, False)):
        monkeypatch.setattr(gsm, "EXTERNAL_DATA_THRESHOLD", limit)
        tensors = [raw] if limit < 5000 else [raw, typed]
        model.graph.ClearField("initializer")
        model.graph.initializer.extend(tensors)
        written = gsm.save(model, tmp_path / str(limit) / "m.onnx")
        assert (written.parent / "m.onnx.data").is_file() == external, limit


@pytest.mark.parametrize("external_data", [False, True])
def test_the_check_of_a_save_judges_the_bytes_written(
    tmp_path: Path, monkeypatch, external_data: bool
) -> None:
    """A model saved as one file is checked from the bytes just written, not read back from the file (a copy
    of every weight); with external data the file is checked by path (its folder holds the data). Either
    way the verdict and its message are those of onnx's checker on the file."""
    checked: list[object] = []
    real_check = onnx.checker.check_model

    def recording(model, *args, **kwargs):
        checked.append(model)
        return real_check(model, *args, **kwargs)

    monkeypatch.setattr(onnx.checker, "check_model", recording)
    with pytest.raises(ModelCheckError) as failed:
        save(_bad_model(), tmp_path / "m.onnx", external_data=external_data)
    unchecked = save(_bad_model(), tmp_path / "plain" / "m.onnx", check=False, external_data=external_data)
    with pytest.raises(ModelCheckError) as from_file:
        check_file(unchecked)
    assert str(failed.value) == str(from_file.value)
    assert "nowhere" in str(failed.value)
    assert isinstance(checked[0], bytes) != external_data
    if not external_data:
        assert checked[0] == unchecked.read_bytes()


@pytest.mark.parametrize("held", [False, True])
def test_a_large_weight_a_subgraph_reads_is_exported_in_full_there_too(
    rng: np.random.Generator, monkeypatch, held: bool
) -> None:
    """graphsurgeon writes an outer weight that an If branch reads as an initializer of that branch as well:
    each copy gets the payload, and the model is the one graphsurgeon's export makes."""
    import onnx_graphsurgeon as gs

    from gskit.io import weights_apart

    shape = (128, 512)
    values = rng.standard_normal(shape).astype(np.float32)
    weight = gs.Constant(
        "w", gs.ir.tensor.LazyValues(numpy_helper.from_array(values, "w")) if held else values
    )
    x, cond = gs.Variable("x", np.float32, shape), gs.Variable("c", np.bool_, ())
    branches = {}
    for name, op in (("then_branch", "Add"), ("else_branch", "Sub")):
        out = gs.Variable(f"{name}_out", np.float32, shape)
        branches[name] = gs.Graph(nodes=[gs.Node(op, inputs=[x, weight], outputs=[out])], outputs=[out])
    y, z = gs.Variable("y", np.float32, shape), gs.Variable("z", np.float32, shape)
    nodes = [
        gs.Node("If", inputs=[cond], outputs=[y], attrs=branches),
        gs.Node("Mul", inputs=[y, weight], outputs=[z]),
    ]
    graph = gs.Graph(nodes=nodes, inputs=[x, cond], outputs=[z], opset=17)

    apart = to_model(graph)
    then_branch = apart.graph.node[0].attribute[0].g
    assert [numpy_helper.to_array(t).tobytes() for t in then_branch.initializer] == [values.tobytes()]
    monkeypatch.setattr(weights_apart, "APART_MIN_BYTES", 1 << 62)
    assert to_model(graph).SerializeToString() == apart.SerializeToString()


def test_a_large_weight_also_used_as_an_attribute_is_exported_in_full_there_too(
    rng: np.random.Generator, monkeypatch
) -> None:
    """A weight that a node also holds as an attribute (a Constant node's value) is written there by
    graphsurgeon's export as well: that copy gets the payload too."""
    import onnx_graphsurgeon as gs

    from gskit.io import weights_apart

    shape = (128, 512)
    weight = gs.Constant("w", rng.standard_normal(shape).astype(np.float32))
    x, y, z = (gs.Variable(name, np.float32, shape) for name in ("x", "y", "z"))
    nodes = [
        gs.Node("Constant", name="c", attrs={"value": weight}, outputs=[y]),
        gs.Node("Add", inputs=[x, weight], outputs=[z]),
    ]
    graph = gs.Graph(nodes=nodes, inputs=[x], outputs=[y, z], opset=17)
    apart = to_model(graph)
    assert numpy_helper.to_array(apart.graph.node[0].attribute[0].t).tobytes() == weight.values.tobytes()
    monkeypatch.setattr(weights_apart, "APART_MIN_BYTES", 1 << 62)
    assert to_model(graph).SerializeToString() == apart.SerializeToString()


@pytest.mark.parametrize("side", [16, 256])  # a weight graphsurgeon exports itself, one kept apart
def test_a_renamed_weight_leaves_the_callers_model_as_it_was(side: int) -> None:
    """Exporting a graph named each held initializer after its constant in place: renaming a weight in the
    graph renamed it in the model the graph came from too, whose nodes still read the old name (found by
    renaming and exporting). The export has the new name, the caller's model the old one, in subgraphs too."""
    weight = onnx.numpy_helper.from_array(np.arange(side * side, dtype=np.float32).reshape(side, side), "W")
    inner_weight = onnx.numpy_helper.from_array(np.ones((side, side), np.float32), "V")
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, side])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, side])
    b = onnx.helper.make_tensor_value_info("b", onnx.TensorProto.FLOAT, [1, side])
    branch = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["h", "V"], ["b"])], "branch", [], [b], [inner_weight]
    )
    graph = onnx.helper.make_graph(
        [
            onnx.helper.make_node("MatMul", ["x", "W"], ["h"]),
            onnx.helper.make_node("Constant", [], ["c"], value=onnx.numpy_helper.from_array(np.array(True))),
            onnx.helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch),
        ],
        "g",
        [x],
        [y],
        [weight],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    before = model.SerializeToString()
    imported = to_graph(model)
    imported.tensors()["W"].name = "W_renamed"
    body = imported.nodes[-1].attrs["then_branch"]
    body.tensors()["V"].name = "V_renamed"
    exported = to_model(imported)
    assert model.SerializeToString() == before
    assert [t.name for t in exported.graph.initializer] == ["W_renamed"]
    assert list(exported.graph.node[0].input) == ["x", "W_renamed"]
    written = onnx.numpy_helper.to_array(exported.graph.initializer[0])
    assert np.array_equal(written, onnx.numpy_helper.to_array(weight))
    branches = {a.name: a.g for a in exported.graph.node[-1].attribute}
    assert [t.name for t in branches["then_branch"].initializer] == ["V_renamed"]
    assert [t.name for t in branches["else_branch"].initializer] == ["V"]
