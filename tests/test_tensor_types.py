"""The one owner of element types, weightless views and shape inference (gskit.passes.tensor_types).

Each routine that infers shapes (inspect, isolate, edit, fold's tensor types, the infer_shapes pass) asks
the owner, so they see one threshold and one answer; the cases here went wrong in one of the five copies
that existed before.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto

from gskit.io import model as gsmodel
from gskit.passes import edit, inspect, isolate, shapes, tensor_types
from gskit.passes.plugin_schemas import deregister_schemas
from gskit.passes.sanitize import sanitize
from gskit.passes.tensor_types import (
    WEIGHTLESS_MAX_BYTES,
    constant_elem_type,
    elem_type,
    gs_dtype,
    infer_tensor_types,
    weightless_view,
)
from gskit.passes.transform import run_pass
from gskit.plugin.registry import PluginRegistry
from gskit.plugin.spec import PluginSpec, TensorInfo


def _twice_last_dim(inputs, attrs):
    x = inputs[0]
    return [TensorInfo(x.dtype, None if x.shape is None else (*x.shape[:-1], 2 * x.shape[-1]))]


#: A plugin whose output rule doubles the last dim: a shape no ONNX op would give.
TWICE = PluginSpec(name="Twice", namespace="acme.types", infer=_twice_last_dim)


def _plugin_graph() -> gs.Graph:
    """x[2,3] -> acme.types::Twice -> y (no type in the model) -> Relu -> z."""
    x = gs.Variable("x", dtype=np.float32, shape=[2, 3])
    y = gs.Variable("y")
    z = gs.Variable("z", dtype=np.float32)
    nodes = [
        gs.Node("Twice", "twice", inputs=[x], outputs=[y], domain="acme.types"),
        gs.Node("Relu", "relu", inputs=[y], outputs=[z]),
    ]
    return gs.Graph(
        nodes=nodes,
        inputs=[x],
        outputs=[z],
        opset=17,
        import_domains=[onnx.helper.make_opsetid("", 17), onnx.helper.make_opsetid("acme.types", 1)],
    )


# -- plugin-aware inference everywhere -----------------------------------------------------------------------


@pytest.fixture
def no_schemas():
    """Schemas stay registered with onnx for the process once a registry asked: start and end without."""
    deregister_schemas()
    yield
    deregister_schemas()


def test_insert_after_a_plugin_node_sees_the_plugin_output_shape(no_schemas):
    """Before, edit inferred without plugins: the new node after a plugin node had no dtype and no shape."""
    unknown = _plugin_graph()  # without the plugin nothing says what Twice gives
    node = edit.insert_after(unknown, "y", "Neg")
    assert node.outputs[0].dtype is None and node.outputs[0].shape is None

    graph = _plugin_graph()
    node = edit.insert_after(graph, "y", "Neg", plugins=PluginRegistry([TWICE]))
    assert node.outputs[0].dtype == np.float32
    assert list(node.outputs[0].shape) == [2, 6]


def test_the_recipe_edit_step_passes_its_plugins_on(no_schemas):
    graph = _plugin_graph()
    options = edit.EditOptions(insert_after=({"tensor": "y", "op": "Neg"},), expose=("y_before_neg",))
    run_pass(edit.EDIT, graph, options, plugins=PluginRegistry([TWICE]))
    exposed = next(t for t in graph.outputs if t.name == "y_before_neg")
    assert exposed.dtype == np.float32 and list(exposed.shape) == [2, 6]


def test_expose_after_a_plugin_node_needs_and_uses_its_rule(no_schemas):
    with pytest.raises(Exception, match="cannot infer the dtype of tensor 'y'; load the plugin"):
        edit.expose_tensors(_plugin_graph(), ["y"])
    graph = edit.expose_tensors(_plugin_graph(), ["y"], plugins=PluginRegistry([TWICE]))
    assert list(graph.outputs[-1].shape) == [2, 6]


# -- one threshold -------------------------------------------------------------------------------------------


def _weights(view: onnx.ModelProto) -> tuple[list[str], list[tuple[str, list[int]]]]:
    """The view's initializers (with data) and the inputs that stand for constants (name, dims)."""
    typed = [(v.name, [d.dim_value for d in v.type.tensor_type.shape.dim]) for v in view.graph.input]
    return [t.name for t in view.graph.initializer], [(n, dims) for n, dims in typed if n != "x"]


def test_weightless_view_keeps_values_up_to_the_threshold():
    at = np.arange(WEIGHTLESS_MAX_BYTES, dtype=np.uint8)
    over = np.arange(WEIGHTLESS_MAX_BYTES + 1, dtype=np.uint8)
    x = gs.Variable("x", dtype=np.uint8, shape=[1])
    a, b = gs.Variable("a", dtype=np.uint8), gs.Variable("b", dtype=np.uint8)
    graph = gs.Graph(
        nodes=[
            gs.Node("Add", inputs=[x, gs.Constant("at", at)], outputs=[a]),
            gs.Node("Add", inputs=[x, gs.Constant("over", over)], outputs=[b]),
        ],
        inputs=[x],
        outputs=[a, b],
        opset=17,
    )
    expected = (["at"], [("over", [len(over)])])
    assert _weights(weightless_view(graph)) == expected
    assert np.array_equal(graph.tensors()["over"].values, over)  # the graph's own values are back
    model = gsmodel.to_model(graph)
    assert _weights(weightless_view(model)) == expected
    assert [t.name for t in model.graph.initializer] == ["at", "over"]  # the model is left as it was


def _reshape_graph() -> gs.Graph:
    """x[6] -> Reshape(shape=[2, 3] as a 16-byte int64 constant) -> y (no type): y's dims come from the
    constant's values only, so they are known when the view keeps its data."""
    x = gs.Variable("x", dtype=np.float32, shape=[6])
    y = gs.Variable("y")
    z = gs.Variable("z", dtype=np.float32)
    shape = gs.Constant("target", np.array([2, 3], dtype=np.int64))
    nodes = [
        gs.Node("Reshape", "reshape", inputs=[x, shape], outputs=[y]),
        gs.Node("Relu", "relu", inputs=[y], outputs=[z]),
    ]
    return gs.Graph(nodes=nodes, inputs=[x], outputs=[z], opset=17)


def _shapes_seen() -> dict[str, object]:
    """The shape of ``y`` as each routine that infers shapes sees it."""
    seen: dict[str, object] = {}
    summary = inspect.list_tensors(gsmodel.to_model(_reshape_graph()))
    seen["inspect"] = next(t.shape for t in summary if t.name == "y")
    cut = isolate.isolate(_reshape_graph(), ["x"], ["y"])
    seen["isolate"] = tuple(cut.outputs[0].shape) if cut.outputs[0].shape is not None else None
    exposed = edit.expose_tensors(_reshape_graph(), ["y"])
    seen["edit"] = tuple(exposed.outputs[-1].shape)
    graph = _reshape_graph()
    infer_tensor_types(graph, symbolic=False)
    seen["tensor_types"] = tuple(graph.tensors()["y"].shape)
    graph = shapes.infer_graph_shapes(_reshape_graph(), PluginRegistry(), strict=False)
    seen["shapes"] = tuple(graph.tensors()["y"].shape)
    return seen


def test_every_routine_that_infers_shapes_reads_the_one_threshold(monkeypatch):
    """Before, inspect kept 1 KiB, isolate 4 KiB, and edit, tensor_types and shapes 64 KiB of values each:
    lowering the owner's one constant below the shape operand's 16 bytes now hides its values from all."""
    seen = _shapes_seen()
    assert all(shape == (2, 3) for shape in seen.values()), seen
    monkeypatch.setattr(tensor_types, "WEIGHTLESS_MAX_BYTES", 8)
    seen = _shapes_seen()
    assert all(shape != (2, 3) for shape in seen.values()), seen


# -- element types: where the copies disagreed ---------------------------------------------------------------


def test_elem_type_takes_graphsurgeon_numpy_and_onnx_spellings():
    assert elem_type(np.float32) == elem_type(np.dtype("float32")) == elem_type("float") == TensorProto.FLOAT
    assert elem_type(TensorProto.BFLOAT16) == elem_type("bfloat16") == TensorProto.BFLOAT16
    assert elem_type(ml_dtypes.float8_e4m3fnuz) == TensorProto.FLOAT8E4M3FNUZ
    assert elem_type(None) is None and elem_type(0) is None and elem_type(999) is None
    assert elem_type("nonsense") is None and elem_type(True) is None
    assert gs_dtype(TensorProto.FLOAT16) == np.float16
    assert gs_dtype(TensorProto.BFLOAT16) == TensorProto.BFLOAT16  # as graphsurgeon's importer stores it


def test_a_bfloat16_constant_in_memory_has_its_export_type():
    """graphsurgeon holds bfloat16 values as float32 with export_dtype BFLOAT16: fold's batched feeds
    and its cost model called np.dtype(16) on it (TypeError), tensor_types gave onnx its float32 dtype."""
    values = np.zeros(WEIGHTLESS_MAX_BYTES, dtype=np.float32)  # over the threshold: a stub
    weight = gs.Constant("w", values, export_dtype=TensorProto.BFLOAT16)
    assert constant_elem_type(weight) == TensorProto.BFLOAT16
    out = gs.Variable("out")
    graph = gs.Graph(nodes=[gs.Node("Identity", inputs=[weight], outputs=[out])], outputs=[out], opset=17)
    infer_tensor_types(graph, symbolic=False)
    assert elem_type(out.dtype) == TensorProto.BFLOAT16


def test_a_float8_fnuz_constant_stub_keeps_its_type():
    """shapes' stub took graphsurgeon's own dtype_to_onnx, which writes FLOAT8E4M3FNUZ as FLOAT8E4M3FN."""
    values = np.zeros(WEIGHTLESS_MAX_BYTES + 1, dtype=ml_dtypes.float8_e4m3fnuz)
    out = gs.Variable("out")
    graph = gs.Graph(
        nodes=[gs.Node("Identity", inputs=[gs.Constant("w", values)], outputs=[out])], outputs=[out], opset=21
    )
    shapes.infer_graph_shapes(graph, PluginRegistry(), strict=False)
    assert elem_type(out.dtype) == TensorProto.FLOAT8E4M3FNUZ


def test_sanitize_removes_a_bfloat16_cast_to_bfloat16_as_patterns_do():
    """sanitize asked numpy for the type of a bfloat16 tensor (none), so it kept a Cast that the pattern
    matcher's is_noop_cast already looked through."""
    x = gs.Variable("x", dtype=TensorProto.BFLOAT16, shape=[2])
    cast = gs.Variable("cast", dtype=TensorProto.BFLOAT16, shape=[2])
    y = gs.Variable("y", dtype=TensorProto.BFLOAT16, shape=[2])
    graph = gs.Graph(
        nodes=[
            gs.Node("Cast", inputs=[x], outputs=[cast], attrs={"to": TensorProto.BFLOAT16}),
            gs.Node("Relu", inputs=[cast], outputs=[y]),
        ],
        inputs=[x],
        outputs=[y],
        opset=17,
    )
    sanitized, _ = sanitize(graph)
    assert [n.op for n in sanitized.nodes] == ["Relu"]
