"""Checks that a loaded model is well formed enough for gskit to handle it, so a damaged or crafted file
ends in one line naming what is wrong instead of a traceback deep inside onnx, graphsurgeon or numpy.

``gskit.io.model.load`` runs :func:`check_wellformed` on every model it reads. It is cheap (one walk over the
protobuf messages, weights skipped) and looks only for what breaks the tools downstream:

* a string field that is not UTF-8 (protobuf hands such a field over as ``bytes``);
* a tensor or type with an element type onnx does not define;
* a value_info whose sequence, optional or map type leaves its element type out (or UNDEFINED);
* an attribute of kind TENSOR, GRAPH, SPARSE_TENSOR or TYPE_PROTO that holds none;
* a cycle (a self-loop included) among the nodes of a graph or subgraph;
* a model-local function that calls itself, directly or through others.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from gskit.errors import GskitError
from gskit.io.text import is_utf8

#: Element types onnx defines (0, UNDEFINED, is how a value_info says "unknown").
_DATA_TYPES = frozenset(onnx.TensorProto.DataType.values())
#: Element types a tensor may hold (UNDEFINED is not one).
_TENSOR_TYPES = _DATA_TYPES - {onnx.TensorProto.UNDEFINED}
#: Attribute kinds whose bytes are text (onnx: UTF-8 strings), decoded by graphsurgeon.
_TEXT_ATTRIBUTES = frozenset({onnx.AttributeProto.STRING, onnx.AttributeProto.STRINGS})
#: Attribute kinds whose value is one message, with its field (graphsurgeon reads it even when unset).
_MESSAGE_ATTRIBUTES = {
    onnx.AttributeProto.TENSOR: "t",
    onnx.AttributeProto.GRAPH: "g",
    onnx.AttributeProto.SPARSE_TENSOR: "sparse_tensor",
    onnx.AttributeProto.TYPE_PROTO: "tp",
}
#: (message type, field) pairs that hold an element type.
_DTYPE_FIELDS = {("TensorProto", "data_type"), ("Tensor", "elem_type"), ("SparseTensor", "elem_type")}


def check_wellformed(model: onnx.ModelProto, source: object) -> None:
    """Raise a GskitError naming ``source`` and the first malformed part of ``model``.

    Raises:
        GskitError: a string that is not UTF-8, an unknown element type, a cycle in a graph, or a
            recursive local function.
    """
    for where, problem in _field_problems(model):
        raise GskitError(f"{source}: {where} {problem}; the file is damaged or was written incorrectly")
    for index, value in enumerate(model.graph.input):
        if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type == 0:
            raise GskitError(
                f"{source}: graph input '{value.name}' (model.graph.input[{index}]) has no element type; "
                "set it with `gskit edit --input-dtype`"
            )
    for info, where in _value_infos(model):
        problem = _type_problem(info.type)
        if problem is not None:
            raise GskitError(
                f"{source}: {where} '{info.name}' {problem}; the file is damaged or was written incorrectly"
            )
    for graph, where in _graphs(model.graph, "graph"):
        cycle = _cycle_node(graph)
        if cycle is not None:
            raise GskitError(
                f"{source}: {where} has a cycle through node '{cycle}' (its inputs depend on its outputs); "
                "an ONNX graph must be acyclic"
            )
    for function in model.functions:
        for graph_attr in _function_subgraphs(function):
            cycle = _cycle_node(graph_attr)
            if cycle is not None:
                raise GskitError(f"{source}: function {function.name} has a cycle through node '{cycle}'")
    recursive = _recursive_function(model)
    if recursive is not None:
        raise GskitError(
            f"{source}: model-local function {recursive} calls itself (directly or through other functions); "
            "ONNX functions must not be recursive"
        )


def _field_problems(model: onnx.ModelProto) -> Iterator[tuple[str, str]]:
    """``(where, what is wrong)`` for non-UTF-8 strings and unknown element types, depth first.

    Places are kept as ``(parent, field, index)`` tuples and written out only for a problem: the walk visits
    every node of a model, so it stays cheap.
    """
    string, message_type = FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_MESSAGE
    pending: list[tuple[Message, tuple | None]] = [(model, None)]
    while pending:
        message, where = pending.pop()
        type_name = message.DESCRIPTOR.name
        if type_name == "TensorProto":
            if message.data_type not in _TENSOR_TYPES:
                problem = f"is element type {message.data_type}, which a tensor cannot have"
                yield _place((where, "data_type", None)), problem
            elif (size := _data_size_problem(message)) is not None:
                yield _place(where), size
        if type_name == "AttributeProto":
            field_name = _MESSAGE_ATTRIBUTES.get(message.type)
            if field_name and not message.ref_attr_name and not message.HasField(field_name):
                kind = onnx.AttributeProto.AttributeType.Name(message.type)
                yield _place(where), f"(attribute '{message.name}') is of kind {kind} but holds no value"
            for text in (message.s, *message.strings) if message.type in _TEXT_ATTRIBUTES else ():
                if not is_utf8(text):
                    yield _place((where, "s", None)), f"is not valid UTF-8 text ({text[:40]!r})"
        for field, value in message.ListFields():
            kind = field.type
            if kind == message_type:
                if field.is_repeated:
                    pending.extend((item, (where, field.name, i)) for i, item in enumerate(value))
                else:
                    pending.append((value, (where, field.name, None)))
            elif kind == string:
                for item in value if field.is_repeated else (value,):
                    if isinstance(item, bytes):
                        yield _place((where, field.name, None)), f"is not valid UTF-8 ({item[:40]!r})"
            elif (type_name, field.name) in _DTYPE_FIELDS and value not in _DATA_TYPES:
                problem = f"is element type {value}, which onnx does not define"
                yield _place((where, field.name, None)), problem


#: Element types whose values are stored one per entry of a typed field, with their field and item size.
_TYPED_DATA = {
    onnx.TensorProto.FLOAT: ("float_data", 4),
    onnx.TensorProto.DOUBLE: ("double_data", 8),
    onnx.TensorProto.INT32: ("int32_data", 4),
    onnx.TensorProto.INT64: ("int64_data", 8),
    onnx.TensorProto.UINT8: ("int32_data", 1),
    onnx.TensorProto.INT8: ("int32_data", 1),
    onnx.TensorProto.BOOL: ("int32_data", 1),
    onnx.TensorProto.FLOAT16: ("int32_data", 2),
}


def _data_size_problem(tensor: onnx.TensorProto) -> str | None:
    """Why an inline tensor's data does not fill its dims (numpy would fail to reshape it), or None."""
    if tensor.data_type == onnx.TensorProto.STRING and tensor.HasField("raw_data"):
        return "is a STRING tensor with raw data (strings are stored in string_data)"
    if tensor.data_location == onnx.TensorProto.EXTERNAL or tensor.data_type not in _TYPED_DATA:
        return None
    count = 1
    for dim in tensor.dims:
        if dim < 0:
            return f"has a negative dim {list(tensor.dims)}"
        count *= dim
    field, itemsize = _TYPED_DATA[tensor.data_type]
    if tensor.HasField("raw_data"):
        have = len(tensor.raw_data) // itemsize if len(tensor.raw_data) % itemsize == 0 else -1
    else:
        have = len(getattr(tensor, field))
    if have != count:
        return f"holds {max(have, 0)} values for dims {list(tensor.dims)} ({count} values)"
    return None


def _value_infos(model: onnx.ModelProto) -> Iterator[tuple[onnx.ValueInfoProto, str]]:
    """Every value_info, graph input and output of the model's graphs and functions, with where it is."""
    for graph, where in _graphs(model.graph, "graph"):
        for kind in ("input", "output", "value_info"):
            yield from ((info, f"{where} {kind}") for info in getattr(graph, kind))
    for function in model.functions:
        yield from ((info, f"function {function.name} value_info") for info in function.value_info)


def _type_problem(type_proto: onnx.TypeProto, nested: bool = False) -> str | None:
    """What is missing from a value type, or None; a tensor's element type may be unknown (0) only at the
    top (onnx's shape inference fails on one inside a sequence, optional or map)."""
    kind = type_proto.WhichOneof("value")
    if kind is None:
        return "has a sequence, optional or map type without an element type" if nested else None
    if kind in ("tensor_type", "sparse_tensor_type"):
        if nested and getattr(type_proto, kind).elem_type == onnx.TensorProto.UNDEFINED:
            return "has a sequence, optional or map of tensors of element type 0 (UNDEFINED)"
        return None
    if kind in ("sequence_type", "optional_type"):
        return _type_problem(getattr(type_proto, kind).elem_type, nested=True)
    if kind == "map_type":
        if type_proto.map_type.key_type == onnx.TensorProto.UNDEFINED:
            return "has a map type with key type 0 (UNDEFINED)"
        return _type_problem(type_proto.map_type.value_type, nested=True)
    return None


def _place(where: tuple | None) -> str:
    parts = []
    while where is not None:
        where, name, index = where
        parts.append(name if index is None else f"{name}[{index}]")
    return ".".join(["model", *reversed(parts)])


def _graphs(graph: onnx.GraphProto, where: str) -> Iterator[tuple[onnx.GraphProto, str]]:
    yield graph, where
    for node in graph.node:
        for attr in node.attribute:
            subgraphs = [attr.g] if attr.HasField("g") else list(attr.graphs)
            for sub in subgraphs:
                yield from _graphs(sub, f"subgraph '{attr.name}' of node '{node.name or node.op_type}'")


def _function_subgraphs(function: onnx.FunctionProto) -> Iterator[onnx.GraphProto]:
    yield onnx.helper.make_graph(list(function.node), function.name, [], [])


def _cycle_node(graph: onnx.GraphProto) -> str | None:
    """A node on a cycle of ``graph`` (Kahn's algorithm; names from outer scopes count as given), or None."""
    producers: dict[str, int] = {}
    for index, node in enumerate(graph.node):
        for name in node.output:
            if name:
                producers[name] = index
    waiting = [0] * len(graph.node)
    users: dict[int, list[int]] = {}
    for index, node in enumerate(graph.node):
        for name in {n for n in node.input if n in producers}:
            waiting[index] += 1
            users.setdefault(producers[name], []).append(index)
    ready = [i for i, count in enumerate(waiting) if count == 0]
    done = 0
    while ready:
        index = ready.pop()
        done += 1
        for user in users.get(index, ()):
            waiting[user] -= 1
            if waiting[user] == 0:
                ready.append(user)
    if done == len(graph.node):
        return None
    stuck = next(i for i, count in enumerate(waiting) if count > 0)
    node = graph.node[stuck]
    return node.name or f"#{stuck} {node.op_type}"


def _recursive_function(model: onnx.ModelProto) -> str | None:
    """``domain::name`` of a local function on a call cycle, or None."""
    local = {(f.domain, f.name): f for f in model.functions}
    calls = {key: {(n.domain, n.op_type) for n in f.node} & set(local) for key, f in local.items()}
    state: dict[tuple[str, str], int] = {}  # 1: on the current path, 2: finished
    for start in calls:
        if state.get(start):
            continue
        stack = [(start, iter(calls[start]))]
        state[start] = 1
        while stack:
            key, callees = stack[-1]
            callee = next(callees, None)
            if callee is None:
                state[key] = 2
                stack.pop()
            elif state.get(callee) == 1:
                return f"{callee[0]}::{callee[1]}"
            elif not state.get(callee):
                state[callee] = 1
                stack.append((callee, iter(calls[callee])))
    return None
