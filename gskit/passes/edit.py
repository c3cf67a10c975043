"""Graph editing primitives on a gs.Graph, in pass style: each function mutates the graph and returns it.

Tensors in onnx-graphsurgeon are shared objects: a node input, a graph output, a value_info entry and a
reference from an If/Loop body to an outer tensor are all the same Python object, so renaming or retyping
the object changes every place at once. The functions here check their preconditions first and raise a
GskitError naming the tensor or node; an error raised halfway (a cycle found after an edit) leaves the
graph as edited, so work on ``graph.copy()`` when the original must survive a failure.

``apply_edits`` runs a whole :class:`EditOptions` (what ``gskit edit`` does) in a fixed order:

1. drop initializer inputs, 2. constants to initializers, 3. renames, 4. input dtypes, 5. input shapes,
6. node removals, 7. insertions, 8. attribute changes, 9. exposed tensors.

Names given to a later step refer to the graph as earlier steps left it (after a rename, use the new name).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import TensorProto

from gskit.errors import GskitError
from gskit.io import model as gsmodel
from gskit.io.limits import check_int64, number_array, short_number
from gskit.io.shape_args import check_shape_options, check_symbolic_dims
from gskit.passes import edit_args
from gskit.passes.inspect import tensor_name_hint
from gskit.passes.tensor_types import (
    InferenceFailed,
    elem_type,
    gs_dtype,
    infer_types,
)
from gskit.passes.transform import Before, GraphPass, PassContext, PassResult, ensure, option
from gskit.plugin.ops import DEFAULT_DOMAINS, canonical_domain
from gskit.plugin.registry import PluginRegistry

log = logging.getLogger(__name__)

Dim = int | str | None
DtypeLike = np.dtype | type | str | int

#: A flag that takes one or more values, and more each time it is given (``--rename a=b c=d --rename e=f``).
_MANY = {"action": "extend", "nargs": "+"}


# --------------------------------------------------------------------------------------------- tensors


def rename_tensors(graph: gs.Graph, mapping: Mapping[str, str]) -> gs.Graph:
    """Rename tensors everywhere: graph I/O, initializers, node I/O, value_info, subgraph references.

    Args:
        graph: the graph to edit.
        mapping: old name -> new name. Swaps (``{"a": "b", "b": "a"}``) are allowed.

    Raises:
        GskitError: an old name is not a tensor of the graph, or a new name is empty, used twice, or already
            names another tensor (in the graph or in one of its subgraphs).
    """
    tensors = graph.tensors()
    taken = _all_tensor_names(graph)
    for old, new in mapping.items():
        if old not in tensors:
            raise GskitError(
                f"rename: tensor '{old}' is not in graph '{graph.name}'; {tensor_name_hint(old, tensors)}"
            )
        if not new:
            raise GskitError(f"rename: new name for tensor '{old}' is empty")
    new_names = list(mapping.values())
    for new in new_names:
        if new_names.count(new) > 1:
            raise GskitError(f"rename: several tensors would be named '{new}'; give each a distinct name")
        if new in taken and new not in mapping:
            raise GskitError(f"rename: name '{new}' is already used by another tensor; choose another name")
    for old, new in mapping.items():
        tensors[old].name = new
    log.info("renamed %d tensors", len(mapping))
    return graph


def set_input_shape(graph: gs.Graph, name: str, shape: Sequence[Dim]) -> gs.Graph:
    """Set the shape of a graph input.

    Shapes of intermediate tensors derived from the old shape are dropped and graph output dims become
    unknown (rank and dtypes are kept), since they may no longer hold; run shape inference to recompute them.

    Args:
        graph: the graph to edit.
        name: a graph input.
        shape: one entry per dim: an int >= 0 is fixed, -1 or None is unknown (dynamic), a str is symbolic.

    Raises:
        GskitError: ``name`` is not a graph input, or a dim is not one of the accepted forms.
    """
    tensor = _graph_input(graph, name)
    dims: list[Dim] = []
    for dim in shape:
        if dim is None or (isinstance(dim, int) and not isinstance(dim, bool) and dim == -1):
            dims.append(None)
        elif isinstance(dim, (int, np.integer)) and not isinstance(dim, bool) and dim >= 0:
            dims.append(int(dim))
        elif isinstance(dim, str) and dim:
            dims.append(dim)
        else:
            raise GskitError(
                f"input '{name}': invalid dim {dim!r}; use an int >= 0, -1/None or a symbol name"
            )
    tensor.shape = dims
    inputs, outputs = {id(t) for t in graph.inputs}, {id(t) for t in graph.outputs}
    for other in _all_tensors(graph):
        if not isinstance(other, gs.Variable) or id(other) in inputs:
            continue
        if id(other) in outputs and other.shape is not None:
            other.shape = [None] * len(
                other.shape
            )  # the checker wants a shape on graph outputs: keep the rank
        elif id(other) not in outputs:
            other.shape = None
    log.info("input '%s' shape set to %s", name, dims)
    return graph


def set_input_dtype(graph: gs.Graph, name: str, dtype: DtypeLike, *, cast: bool = True) -> gs.Graph:
    """Change the dtype of a graph input (e.g. int64 -> int32 for TensorRT).

    Args:
        graph: the graph to edit.
        name: a graph input; it keeps its name, so callers feed the same name with the new dtype.
        dtype: numpy dtype, a name (``"int32"``, ``"bfloat16"``) or an onnx TensorProto data type.
        cast: insert a Cast back to the original dtype right after the input, so every consumer still sees
            the dtype it was built for. With False only the declared dtype changes.

    Raises:
        GskitError: ``name`` is not a graph input, the input has no dtype, or ``dtype`` is unknown.
    """
    tensor = _graph_input(graph, name)
    new = _onnx_dtype(dtype)
    if tensor.dtype is None:
        raise GskitError(f"input '{name}' has no dtype; set one with cast=False")
    old = _onnx_dtype(tensor.dtype)
    if old == new:
        return graph
    tensor.dtype = gs_dtype(new)
    if not cast:
        return graph
    consumers = list(tensor.outputs)
    if not consumers:
        return graph
    names = _all_tensor_names(graph)
    casted = gs.Variable(
        unique_name(f"{name}_{_dtype_name(old)}", names), dtype=gs_dtype(old), shape=tensor.shape
    )
    node = gs.Node(
        "Cast",
        name=unique_name(f"{name}_cast", _node_names(graph)),
        attrs={"to": old},
        inputs=[tensor],
        outputs=[casted],
    )
    for consumer in consumers:
        _replace_input(consumer, tensor, casted)
    graph.nodes.insert(0, node)
    log.info(
        "input '%s' dtype %s -> %s (Cast '%s' added)", name, _dtype_name(old), _dtype_name(new), node.name
    )
    return _finish(graph)


def expose_tensors(
    graph: gs.Graph, names: Iterable[str], *, plugins: PluginRegistry | None = None
) -> gs.Graph:
    """Add intermediate tensors as graph outputs (for debugging: onnxruntime returns only graph outputs).

    Dtype and shape come from the graph where known, else from onnx shape inference on a weightless view of
    the graph (weights are neither loaded nor copied; plugin nodes typed by ``plugins``).

    Args:
        graph: the graph to edit.
        names: tensors to expose; ones already graph outputs are left as they are.
        plugins: loaded plugins, whose output rules type the outputs of plugin nodes for shape inference.

    Raises:
        GskitError: a name is not a tensor of the graph, is a constant, or its dtype cannot be inferred
            (a custom op without shape inference: run gskit's shape inference first).
    """
    tensors = graph.tensors()
    wanted: list[gs.Variable] = []
    for name in names:
        tensor = tensors.get(name)
        if tensor is None:
            raise GskitError(
                f"expose: tensor '{name}' is not in graph '{graph.name}'; {tensor_name_hint(name, tensors)}"
            )
        if isinstance(tensor, gs.Constant):
            raise GskitError(
                f"expose: tensor '{name}' is a constant (initializer); read it from the model instead"
            )
        if not any(t is tensor for t in graph.outputs) and not any(t is tensor for t in wanted):
            wanted.append(tensor)
    missing = [t for t in wanted if t.dtype is None or t.shape is None]
    if missing:
        types = _inferred_types(graph, plugins)
        for tensor in missing:
            dtype, shape = types.get(tensor.name, (None, None))
            if tensor.dtype is None:
                tensor.dtype = dtype
            if tensor.shape is None:
                tensor.shape = shape
            if tensor.dtype is None:
                raise GskitError(
                    f"expose: cannot infer the dtype of tensor '{tensor.name}'; load the plugin of its "
                    f"producer's custom op, or run shape inference that knows it first"
                )
    graph.outputs.extend(wanted)
    log.info("exposed %s", [t.name for t in wanted])
    return graph


# ----------------------------------------------------------------------------------------------- nodes


def insert_after(
    graph: gs.Graph,
    tensor_name: str,
    op: str,
    *,
    attrs: Mapping[str, Any] | None = None,
    extra_inputs: Sequence[np.ndarray | str] = (),
    domain: str = "",
    name: str | None = None,
    force: bool = False,
    plugins: PluginRegistry | None = None,
) -> gs.Node:
    """Insert a node that consumes a tensor and takes over its name and consumers.

    The new node's output keeps the ORIGINAL tensor name and the old producer's output is renamed, so a graph
    output stays a graph output under the same name (e.g. a Pad after a ConvTranspose whose output is the
    model output). After a graph input, whose name must stay, the new node's output gets a new name instead.

    Args:
        graph: the graph to edit.
        tensor_name: the tensor the new node consumes (its first input).
        op: op type of the new node.
        attrs: attributes of the new node.
        extra_inputs: further inputs, in order: numpy arrays become constants, strings name existing tensors
            (``""`` is an omitted optional input).
        domain: op domain of the new node (``""`` is the standard ONNX domain).
        name: node name; default ``<tensor>_<op>`` made unique.
        force: skip the check of ``attrs`` against the op's schema (see ``set_attributes``).
        plugins: loaded plugins, whose output rules type a plugin node before the new node, or the new
            plugin node itself.

    Returns:
        The new node.

    Raises:
        GskitError: the tensor or an extra input does not exist, nothing uses the tensor, ``op`` is not an
            ONNX op at the graph's opset (without ``force``), an attribute is unknown to the op's schema, or
            the edit creates a cycle (an extra input computed from the tensor), named by a node on the cycle.
    """
    tensors = graph.tensors()
    tensor = tensors.get(tensor_name)
    if tensor is None:
        raise GskitError(
            f"insert after: tensor '{tensor_name}' is not in graph '{graph.name}'; "
            f"{tensor_name_hint(tensor_name, tensors)}"
        )
    is_output = any(t is tensor for t in graph.outputs)
    if not tensor.outputs and not is_output:
        raise GskitError(f"insert after: nothing uses tensor '{tensor_name}'; expose it as an output first")
    names = _all_tensor_names(graph)
    node_name = name or unique_name(f"{tensor_name}_{op}", _node_names(graph))
    inputs: list[gs.Tensor] = [tensor]
    for i, extra in enumerate(extra_inputs):
        if isinstance(extra, str):
            if extra == "":
                inputs.append(gs.Variable.empty())
            elif extra in tensors:
                inputs.append(tensors[extra])
            else:
                raise GskitError(
                    f"insert after: extra input '{extra}' of node '{node_name}' is not a tensor of the graph"
                )
        else:
            inputs.append(gs.Constant(unique_name(f"{node_name}_input{i + 1}", names), np.asarray(extra)))
            names.add(inputs[-1].name)

    schema = _schema(graph, op, domain)
    if schema is None and (domain or "") in DEFAULT_DOMAINS and not force:
        # Caught here: the checker would only say later that the unknown op's output has no type.
        raise GskitError(
            f"insert after: '{op}' is not an ONNX op at opset {graph.opset} (node '{node_name}'); "
            f"check the spelling, or pass --force (force=True) to insert a custom op"
        )
    checked = _checked_attrs(schema, op, node_name, attrs or {}, force=force)
    consumers = list(tensor.outputs)
    if any(t is tensor for t in graph.inputs):
        output = gs.Variable(unique_name(f"{tensor_name}_{op.lower()}", names))
    else:
        output = gs.Variable(tensor_name)
        tensor.name = unique_name(f"{tensor_name}_before_{op.lower()}", names)
    node = gs.Node(op, name=node_name, attrs=checked, inputs=inputs, outputs=[output], domain=domain)
    for consumer in consumers:
        _replace_input(consumer, tensor, output)
    graph.outputs = [output if t is tensor else t for t in graph.outputs]
    graph.nodes.append(node)
    _infer_node_outputs(graph, node, plugins)
    if output.dtype is None and is_output:
        log.warning("dtype of '%s' (output of %s) unknown; assuming the input's dtype", output.name, op)
        output.dtype = tensor.dtype
    log.info("inserted %s node '%s' after '%s'", op, node_name, tensor_name)
    _finish(graph)
    return node


def remove_node(graph: gs.Graph, node_name: str, *, plugins: PluginRegistry | None = None) -> gs.Graph:
    """Remove a node with one data input and one used output, connecting its consumers to that input.

    Constant inputs (a Reshape's shape) do not count as data inputs. When the node's output is a graph output,
    the input tensor takes the graph output's name, so the model keeps its output names.

    Args:
        graph: the graph to edit.
        node_name: the node to remove.
        plugins: loaded plugins, whose output rules type the outputs of plugin nodes for shape inference.

    Raises:
        GskitError: no node or several nodes have that name, the node has several data inputs or used outputs,
            or its output is a graph output while its input is a graph input or another graph output.
    """
    node = _node(graph, node_name)
    data = [t for t in node.inputs if isinstance(t, gs.Variable) and not t.is_empty()]
    outputs = [
        t for t in node.outputs if not t.is_empty() and (t.outputs or any(o is t for o in graph.outputs))
    ]
    if len(data) != 1:
        raise GskitError(
            f"remove node: node '{node_name}' ({node.op}) has {len(data)} data inputs; "
            f"only single-input nodes can be removed"
        )
    if len(outputs) > 1:
        raise GskitError(
            f"remove node: node '{node_name}' ({node.op}) has {len(outputs)} used outputs; "
            f"only single-output nodes can be removed"
        )
    source = data[0]
    for out in outputs:
        if any(t is out for t in graph.outputs):
            if any(t is source for t in (*graph.inputs, *graph.outputs)):
                raise GskitError(
                    f"remove node: node '{node_name}' links graph input/output '{source.name}' "
                    f"to graph output '{out.name}'; removing it would merge two model I/O names"
                )
            if source.dtype is None:  # a graph output needs a type
                source.dtype, source.shape = _inferred_types(graph, plugins).get(source.name, (None, None))
            out_name = out.name
            out.name = f"{out_name}__removed"
            source.name = out_name
            graph.outputs = [source if t is out else t for t in graph.outputs]
        for consumer in list(out.outputs):
            _replace_input(consumer, out, source)
    node.inputs.clear()
    node.outputs.clear()
    graph.nodes.remove(node)
    log.info("removed node '%s' (%s)", node_name, node.op)
    return _finish(graph)


def set_attributes(
    graph: gs.Graph,
    node_name: str,
    values: Mapping[str, Any] | None = None,
    remove: Sequence[str] = (),
    *,
    force: bool = False,
) -> gs.Graph:
    """Set, add or remove attributes of a node.

    For ops with a schema in onnx (standard domains), names are checked against the schema at the graph's
    opset and values are converted to the schema's type (``"3"`` or ``3.0`` -> 3 for an INT, a scalar -> a
    list for INTS, ``"1,2"`` -> [1, 2]). Names starting with ``__`` are custom attributes: onnx's checker
    accepts them on standard ops, and tools pass them through (useful to carry hints to a plugin or TensorRT).

    Args:
        graph: the graph to edit.
        node_name: the node.
        values: attribute name -> value to set.
        remove: attribute names to delete.
        force: skip the schema checks (unknown names, removing required attributes).

    Raises:
        GskitError: the node is missing, an attribute is unknown to the op's schema, a value does not convert
            to the schema's type, or an attribute to remove is absent or required.
    """
    node = _node(graph, node_name)
    schema = _schema(graph, node.op, node.domain)
    for key in remove:
        if key not in node.attrs:
            has = ", ".join(sorted(node.attrs)) or "none"
            raise GskitError(
                f"remove attribute: node '{node_name}' ({node.op}) has no attribute '{key}' (it has: {has})"
            )
        if schema is not None and not force and key in schema.attributes and schema.attributes[key].required:
            raise GskitError(
                f"remove attribute: attribute '{key}' of node '{node_name}' ({node.op}) is required"
            )
        del node.attrs[key]
    node.attrs.update(_checked_attrs(schema, node.op, node_name, values or {}, force=force))
    log.info("node '%s': set %s, removed %s", node_name, sorted(values or {}), list(remove))
    return graph


# ------------------------------------------------------------------------------------------- constants


def constants_to_initializers(graph: gs.Graph) -> gs.Graph:
    """Turn Constant nodes (every ``value*`` form) into initializers, in the graph and its subgraphs.

    A Constant whose output is a graph output, or that holds a sparse tensor, is left as a node.

    Raises:
        GskitError: a Constant node has no value attribute.
    """
    for sub in (graph, *graph.subgraphs(recursive=True)):
        keep = []
        for node in sub.nodes:
            if node.op != "Constant" or node.domain not in DEFAULT_DOMAINS or len(node.outputs) != 1:
                keep.append(node)
                continue
            out = node.outputs[0]
            values = _constant_values(node)
            if values is None or any(t is out for t in sub.outputs):
                keep.append(node)
                continue
            node.outputs.clear()
            out.to_constant(values.values if isinstance(values, gs.Constant) else values)
        removed = len(sub.nodes) - len(keep)
        sub.nodes = keep
        if removed:
            log.info("graph '%s': %d Constant nodes -> initializers", sub.name, removed)
    return graph


def initializers_to_constants(graph: gs.Graph, names: Iterable[str] | None = None) -> gs.Graph:
    """Turn initializers of the main graph into Constant nodes (all of them, or those named).

    Initializers that are also graph inputs (overridable defaults) stay initializers.

    Raises:
        GskitError: a name is not an initializer of the graph.
    """
    tensors = graph.tensors()
    inputs = {id(t) for t in graph.inputs}
    if names is None:
        chosen = [t for t in tensors.values() if isinstance(t, gs.Constant) and id(t) not in inputs]
    else:
        chosen = []
        for name in names:
            tensor = tensors.get(name)
            if not isinstance(tensor, gs.Constant) or id(tensor) in inputs:
                raise GskitError(
                    f"initializers to constants: '{name}' is not an initializer of graph '{graph.name}'"
                )
            chosen.append(tensor)
    node_names = _node_names(graph)
    new_nodes = []
    for const in chosen:
        var = gs.Variable(const.name, dtype=const.dtype, shape=const.shape)
        for consumer in list(const.outputs):
            _replace_input(consumer, const, var)
        graph.outputs = [var if t is const else t for t in graph.outputs]
        new_nodes.append(
            gs.Node(
                "Constant",
                name=unique_name(f"{const.name}_constant", node_names),
                attrs={"value": const},
                outputs=[var],
            )
        )
    graph.nodes[0:0] = new_nodes
    log.info("%d initializers -> Constant nodes", len(new_nodes))
    return graph


def drop_initializer_inputs(graph: gs.Graph) -> gs.Graph:
    """Remove initializers from the graph inputs (they stay initializers).

    Some exporters list initializers as graph inputs too, which makes them overridable and confuses tools
    such as onnx-simplifier. ``gs.import_onnx`` already drops them; a graph that re-added them (see
    ``apply_edits``) loses them here.
    """
    dropped = [t.name for t in graph.inputs if isinstance(t, gs.Constant)]
    graph.inputs = [t for t in graph.inputs if not isinstance(t, gs.Constant)]
    if dropped:
        log.info("dropped initializer inputs %s", dropped)
    return graph


# -------------------------------------------------------------------------------------------- options


@dataclasses.dataclass
class Insertion:
    """One node to insert after a tensor (see ``insert_after``)."""

    tensor: str
    op: str
    attrs: dict[str, Any] = dataclasses.field(default_factory=dict)
    extra_inputs: list[np.ndarray | str] = dataclasses.field(default_factory=list)
    domain: str = ""


@dataclasses.dataclass(frozen=True)
class EditOptions:
    """Everything ``gskit edit`` and the recipe's ``edit`` step do in one run, applied in this module's order.

    Each field is one ``gskit edit`` flag (its text spelling read by ``gskit.passes.edit_args``) and one key
    of the recipe's ``edit:`` mapping. ``insert_after`` entries are mappings ``{tensor: NAME, op: OP, attrs:
    {...}, inputs: [...], domain: D}`` (``tensor`` and ``op`` required); an ``inputs`` item is a tensor name
    or a list of numbers (a constant).
    """

    rename: dict[str, str] = option(
        {}, help="rename a tensor", metavar="OLD=NEW", entry=edit_args.rename, **_MANY
    )
    input_shapes: dict[str, tuple[int | str | None, ...]] = option(
        {},
        help="set an input's shape: x:1x3x224x224, x:1,3,224,224 or x:[1,3,224,224]; with commas a dim may "
        "be -1 or ? (dynamic) or a word (symbolic), e.g. x:batch,3,-1,-1; x: is a scalar",
        flag="--input-shape",
        metavar="NAME:DIMS",
        entry=edit_args.input_shape,
        **_MANY,
    )
    input_dtypes: dict[str, str] = option(
        {},
        help="change an input's dtype (e.g. ids:int32); a Cast back to the old dtype follows the input",
        flag="--input-dtype",
        metavar="NAME:DTYPE",
        entry=edit_args.input_dtype,
        **_MANY,
    )
    insert_after: tuple[dict[str, Any], ...] = option(
        (),
        help="insert a node after TENSOR keeping its name; list values as k=1,2,3; keys starting "
        "with @ are extra inputs in order: numbers become an int64/float32 constant, else a "
        "tensor name (e.g. y:Pad:mode=reflect,@pads=0,0,0,0,0,0,1,0)",
        metavar="TENSOR:OP[:k=v,...]",
        entry=edit_args.insertion,
    )
    remove_nodes: tuple[str, ...] = option(
        (), help="remove a single-input single-output node", flag="--remove-node", metavar="NAME", **_MANY
    )
    set_attrs: dict[str, dict[str, Any]] = option(
        {},
        help="set an attribute (custom ones start with __); lists as 1,2,3",
        flag="--set-attr",
        metavar="NODE:KEY=VALUE",
        entry=edit_args.set_attr,
        **_MANY,
    )
    remove_attrs: dict[str, tuple[str, ...]] = option(
        {},
        help="remove an attribute",
        flag="--remove-attr",
        metavar="NODE:KEY",
        entry=edit_args.remove_attr,
        **_MANY,
    )
    expose: tuple[str, ...] = option(
        (), help="add an intermediate tensor as a graph output", metavar="TENSOR", **_MANY
    )
    constants_to_initializers: bool = option(False, help="turn Constant nodes into initializers")
    drop_initializer_inputs: bool = option(False, help="remove initializers from the graph inputs")
    #: skip attribute checks against op schemas (insertions and attribute changes)
    force: bool = option(
        False, help="accept attributes unknown to the op's schema, and --insert-after ops unknown to onnx"
    )

    def __post_init__(self) -> None:
        for entry in self.insert_after:
            _insertion(entry)  # a malformed entry fails when the recipe is read, with its line
        check_shape_options(self.input_shapes, check_symbolic_dims)


@dataclasses.dataclass
class Change:
    """One line of an edit report."""

    step: str
    target: str
    detail: str


def apply_edits(
    model: onnx.ModelProto, options: EditOptions, *, plugins: PluginRegistry | None = None
) -> tuple[gs.Graph, list[Change]]:
    """Apply edits to a model, in the order given in this module's docstring (what ``gskit edit`` does).

    Initializers that the model lists as graph inputs stay inputs unless ``options.drop_initializer_inputs``.
    ``plugins``: see :func:`apply_to_graph`.

    Returns:
        The edited graph and what changed, one Change per edit.

    Raises:
        GskitError: from the individual edits.
    """
    graph = gsmodel.to_graph(model)
    init_names = {t.name for t in model.graph.initializer}
    listed = [i.name for i in model.graph.input if i.name in init_names]
    if listed and not options.drop_initializer_inputs:
        tensors = graph.tensors()
        graph.inputs.extend(tensors[n] for n in listed if n in tensors)
    return graph, apply_to_graph(graph, options, listed_initializers=listed, plugins=plugins)


def apply_to_graph(
    graph: gs.Graph,
    options: EditOptions,
    *,
    listed_initializers: Sequence[str] = (),
    plugins: PluginRegistry | None = None,
) -> list[Change]:
    """Apply edits to a graph in place (``gskit edit`` and the recipe's ``edit`` step both run this).

    ``listed_initializers``: initializers the file listed as graph inputs, which graphsurgeon's import
    already dropped (reported as dropped when the options ask for it). ``plugins``: loaded plugins, whose
    output rules type plugin nodes' outputs where an edit needs shape inference.

    Returns:
        What changed, one Change per edit.
    """
    changes: list[Change] = []
    if options.drop_initializer_inputs:
        dropped = [*listed_initializers, *(t.name for t in graph.inputs if isinstance(t, gs.Constant))]
        drop_initializer_inputs(graph)
        changes += [Change("drop initializer input", name, "no longer a graph input") for name in dropped]
    if options.constants_to_initializers:
        before = sum(
            1 for sub in (graph, *graph.subgraphs(recursive=True)) for n in sub.nodes if n.op == "Constant"
        )
        constants_to_initializers(graph)
        after = sum(
            1 for sub in (graph, *graph.subgraphs(recursive=True)) for n in sub.nodes if n.op == "Constant"
        )
        changes.append(
            Change("constants to initializers", "graph", f"{before - after} Constant nodes converted")
        )
    if options.rename:
        rename_tensors(graph, options.rename)
        changes += [Change("rename", old, f"-> {new}") for old, new in options.rename.items()]
    for name, dtype in options.input_dtypes.items():
        old = _graph_input(graph, name).dtype
        set_input_dtype(graph, name, dtype)
        changes.append(
            Change("input dtype", name, f"{_dtype_name(old) if old is not None else '?'} -> {dtype}")
        )
    for name, shape in options.input_shapes.items():
        set_input_shape(graph, name, shape)
        changes.append(Change("input shape", name, str(["?" if d is None else d for d in shape])))
    for node_name in options.remove_nodes:
        op = _node(graph, node_name).op
        remove_node(graph, node_name, plugins=plugins)
        changes.append(Change("remove node", node_name, op))
    for ins in map(_insertion, options.insert_after):
        node = insert_after(
            graph,
            ins.tensor,
            ins.op,
            attrs=ins.attrs,
            extra_inputs=ins.extra_inputs,
            domain=ins.domain,
            force=options.force,
            plugins=plugins,
        )
        changes.append(Change("insert after", ins.tensor, f"{ins.op} node '{node.name}'"))
    for node_name in dict.fromkeys([*options.set_attrs, *options.remove_attrs]):
        values, remove = options.set_attrs.get(node_name, {}), options.remove_attrs.get(node_name, [])
        set_attributes(graph, node_name, values, remove, force=options.force)
        detail = ", ".join([*(f"{k}={v}" for k, v in values.items()), *(f"-{k}" for k in remove)])
        changes.append(Change("attributes", node_name, detail))
    if options.expose:
        expose_tensors(graph, options.expose, plugins=plugins)
        changes += [Change("expose", name, "now a graph output") for name in options.expose]
    return changes


# ------------------------------------------------------------------------------------------- internals


def _finish(graph: gs.Graph) -> gs.Graph:
    """Clean up and topologically sort once after a structural edit; name a node on a cycle if any."""
    graph.cleanup()
    cycle = _find_cycle(graph)
    if cycle:
        path = " -> ".join(f"'{n.name or n.op}'" for n in cycle)
        raise GskitError(
            f"edit created a cycle through node '{cycle[0].name or cycle[0].op}' ({path}); "
            f"an input of an inserted node is computed from its own output"
        )
    try:
        graph.toposort()
    except gs.util.exception.OnnxGraphSurgeonException as err:  # a cycle inside a subgraph, duplicate names
        raise GskitError(
            f"graph '{graph.name}' cannot be sorted after the edit: {str(err).splitlines()[0]}"
        ) from err
    return graph


def _find_cycle(graph: gs.Graph) -> list[gs.Node] | None:
    """Nodes of the main graph forming a cycle (each feeds the next), or None. Iterative DFS, linear time."""
    index = {id(n): n for n in graph.nodes}
    producer: dict[int, gs.Node] = {}
    for node in graph.nodes:
        for out in node.outputs:
            producer[id(out)] = node

    def deps(node: gs.Node) -> list[gs.Node]:
        tensors = list(node.inputs)
        for attr in node.attrs.values():
            if isinstance(attr, gs.Graph):
                for sub in (attr, *attr.subgraphs(recursive=True)):
                    for inner in sub.nodes:
                        tensors.extend(inner.inputs)
        return [producer[id(t)] for t in tensors if id(t) in producer and id(producer[id(t)]) in index]

    state: dict[int, int] = {}  # 1 on the stack, 2 done
    for root in graph.nodes:
        if id(root) in state:
            continue
        stack = [(root, iter(deps(root)))]
        state[id(root)] = 1
        while stack:
            node, it = stack[-1]
            dep = next(it, None)
            if dep is None:
                state[id(node)] = 2
                stack.pop()
            elif state.get(id(dep)) == 1:
                path = [n for n, _ in stack]
                cycle = path[next(i for i, n in enumerate(path) if n is dep) :]
                return list(reversed(cycle))
            elif id(dep) not in state:
                state[id(dep)] = 1
                stack.append((dep, iter(deps(dep))))
    return None


def _all_tensors(graph: gs.Graph) -> list[gs.Tensor]:
    seen: dict[int, gs.Tensor] = {}
    for sub in (graph, *graph.subgraphs(recursive=True)):
        for tensor in sub.tensors().values():
            seen.setdefault(id(tensor), tensor)
    return list(seen.values())


def _all_tensor_names(graph: gs.Graph) -> set[str]:
    return {t.name for t in _all_tensors(graph)}


def _node_names(graph: gs.Graph) -> set[str]:
    return {n.name for sub in (graph, *graph.subgraphs(recursive=True)) for n in sub.nodes if n.name}


def unique_name(base: str, taken: set[str]) -> str:
    """``base``, or else the first of ``base_1``, ``base_2``... not in ``taken``; added to ``taken``."""
    name, i = base, 1
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    taken.add(name)
    return name


def _graph_input(graph: gs.Graph, name: str) -> gs.Variable:
    for tensor in graph.inputs:
        if tensor.name == name and isinstance(tensor, gs.Variable):
            return tensor
    known = ", ".join(t.name for t in graph.inputs)
    raise GskitError(f"'{name}' is not a graph input of '{graph.name}' (inputs: {known})")


def _node(graph: gs.Graph, name: str) -> gs.Node:
    found = [n for n in graph.nodes if n.name == name]
    if not found:
        raise GskitError(
            f"node '{name}' is not in graph '{graph.name}'; check the name (gskit inspect --nodes lists them)"
        )
    if len(found) > 1:
        raise GskitError(f"{len(found)} nodes are named '{name}' in graph '{graph.name}'; rename them first")
    return found[0]


def _replace_input(node: gs.Node, old: gs.Tensor, new: gs.Tensor) -> None:
    for i, tensor in enumerate(node.inputs):
        if tensor is old:
            node.inputs[i] = new


def _onnx_dtype(dtype: DtypeLike) -> int:
    """An onnx TensorProto data type from a numpy dtype, a name or an onnx enum value (what a user wrote)."""
    code = elem_type(dtype)
    if code is None and isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        raise GskitError(f"unknown onnx data type {dtype}")
    if code is None:
        raise GskitError(f"unknown dtype {dtype!r}; use a name such as int32, float16, bool")
    return code


def _dtype_name(dtype: DtypeLike) -> str:
    return TensorProto.DataType.Name(_onnx_dtype(dtype)).lower()


def _schema(graph: gs.Graph, op: str, domain: str) -> onnx.defs.OpSchema | None:
    domain = domain or ""
    if domain in DEFAULT_DOMAINS:
        version = graph.opset
    else:
        version = next((d.version for d in graph.import_domains or [] if d.domain == domain), None)
        if version is None:
            return None
    try:
        return onnx.defs.get_schema(op, version, canonical_domain(domain))
    except onnx.defs.SchemaError:
        return None


def _checked_attrs(
    schema: onnx.defs.OpSchema | None, op: str, node_name: str, values: Mapping[str, Any], *, force: bool
) -> dict[str, Any]:
    """Values checked against the op's schema and converted to its types; ``__`` names pass as custom.

    Whatever the schema says (or without one: custom ops, ``force``), a value must be one ONNX can store:
    numbers (integers in 64 bits), strings, or non-empty lists of one of them; graph and tensor attributes
    come only from the Python API (a ``gs.Graph``, ``gs.Constant``, numpy array), never from plain values.
    """
    checked = {}
    for key, value in values.items():
        what = f"attribute '{key}' of node '{node_name}'"
        if schema is not None and not key.startswith("__"):
            if key in schema.attributes:
                value = _coerce(value, schema.attributes[key].type, what)
            elif not force:
                known = ", ".join(sorted(schema.attributes)) or "none"
                raise GskitError(
                    f"{op} (opset {schema.since_version}) has no attribute '{key}' (node '{node_name}'; "
                    f"known: {known}); prefix custom attributes with '__' or pass --force"
                )
        checked[key] = _storable(key, value, what)
    return checked


#: Attribute values the Python API may give as they are (graphsurgeon exports them).
_API_VALUES = (gs.Graph, gs.Tensor, np.ndarray, onnx.TensorProto, onnx.GraphProto)


def _storable(key: str, value: Any, what: str) -> Any:
    """``value`` if ONNX can store it as an attribute (asked of onnx itself); else one line naming it."""
    items = value if isinstance(value, (list, tuple)) else [value]
    if any(isinstance(item, _API_VALUES) for item in items):
        return value
    if isinstance(value, dict) or value is None:
        raise GskitError(
            f"{what}: {type(value).__name__} is no attribute value; give a number, a string or a list"
        )
    for item in items:
        if isinstance(item, int) and not isinstance(item, bool):
            check_int64(item, what)
    try:
        onnx.helper.make_attribute(key, value)
    except (TypeError, ValueError, OverflowError) as err:
        raise GskitError(f"{what}: {_shown(value)} is no attribute value ({err})") from err
    return value


def _shown(value: Any) -> str:
    """A value as an error message quotes it: long numbers shortened, long lists cut."""
    if isinstance(value, int) and not isinstance(value, bool):
        return short_number(value)
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


_A = onnx.defs.OpSchema.AttrType


#: Attribute kinds that no number, string or list can give (a Loop's ``body``, a Constant's ``value``).
_STRUCTURED = frozenset(
    {
        _A.GRAPH,
        _A.GRAPHS,
        _A.TENSOR,
        _A.TENSORS,
        _A.SPARSE_TENSOR,
        _A.SPARSE_TENSORS,
        _A.TYPE_PROTO,
        _A.TYPE_PROTOS,
    }
)


def _coerce(value: Any, kind: onnx.defs.OpSchema.AttrType, what: str) -> Any:
    if kind in _STRUCTURED and not isinstance(value, _API_VALUES):
        raise GskitError(
            f"{what}: a {kind.name} attribute cannot be given as {_shown(value)}; set it with the Python API "
            "(gskit.passes.edit) or edit the model with onnx"
        )
    try:
        if kind == _A.INT:
            return check_int64(_integer(value), what)
        if kind == _A.FLOAT:
            return float(value)
        if kind == _A.STRING:
            return value if isinstance(value, (str, bytes)) else str(value)
        if kind in (_A.INTS, _A.FLOATS, _A.STRINGS):
            items = value.split(",") if isinstance(value, str) else value
            items = list(items) if isinstance(items, (list, tuple, np.ndarray)) else [items]
            inner = {_A.INTS: _A.INT, _A.FLOATS: _A.FLOAT, _A.STRINGS: _A.STRING}[kind]
            return [_coerce(v.strip() if isinstance(v, str) else v, inner, what) for v in items]
    except (TypeError, ValueError, OverflowError) as err:
        raise GskitError(f"{what}: value {_shown(value)} is not a valid {kind.name}") from err
    return value


def _integer(value: Any) -> int:
    """An INT attribute value: an integer as it is (exactly, however large), a whole float or numeric text."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    number = float(value)
    if not number.is_integer():
        raise ValueError(value)
    return int(number)


def _constant_values(node: gs.Node) -> gs.Constant | np.ndarray | None:
    attrs = node.attrs
    if "value" in attrs and isinstance(attrs["value"], gs.Constant):
        return attrs["value"]
    forms = {
        "value_float": np.float32,
        "value_floats": np.float32,
        "value_int": np.int64,
        "value_ints": np.int64,
        "value_string": object,
        "value_strings": object,
    }
    for key, dtype in forms.items():
        if key in attrs:
            value = attrs[key]
            if dtype is object:
                value = (
                    [v.decode() if isinstance(v, bytes) else v for v in value] if key.endswith("s") else value
                )
            return np.array(value, dtype=dtype)
    if "sparse_value" in attrs:
        log.warning("Constant node '%s' holds a sparse tensor; left as a node", node.name)
        return None
    raise GskitError(f"Constant node '{node.name}' has no value attribute; fix or remove it")


def _infer_node_outputs(graph: gs.Graph, node: gs.Node, plugins: PluginRegistry | None) -> None:
    """Set dtype/shape of a new node's outputs: onnx inference on a one-node graph, or on the whole graph
    when an input's type is not known yet (a plugin node's output: its rule gives it)."""
    untyped = any(isinstance(t, gs.Variable) and not t.is_empty() and t.dtype is None for t in node.inputs)
    if untyped:
        types = _inferred_types(graph, plugins)
    else:
        one = gs.Graph(
            nodes=[node],
            inputs=[t for t in node.inputs if isinstance(t, gs.Variable) and not t.is_empty()],
            outputs=list(node.outputs),
            opset=graph.opset,
            import_domains=graph.import_domains,
        )
        try:
            types = _types(infer_types(one, plugins).graph)
        except InferenceFailed as err:
            raise GskitError(
                f"node '{node.name}' ({node.op}) is invalid for its inputs: {err.reason}"
            ) from err
    for out in node.outputs:
        out.dtype, out.shape = types.get(out.name, (None, None))


def _inferred_types(graph: gs.Graph, plugins: PluginRegistry | None = None) -> dict[str, tuple[Any, Any]]:
    """Dtype and shape of every tensor per onnx shape inference (through plugin nodes with ``plugins``),
    without loading or copying large weights."""
    try:
        inferred = infer_types(graph, plugins)
    except InferenceFailed as err:
        raise GskitError(f"shape inference failed on graph '{graph.name}': {err.reason}") from err
    return _types(inferred.graph)


def _types(graph: onnx.GraphProto) -> dict[str, tuple[Any, Any]]:
    found = {}
    for info in (*graph.value_info, *graph.input, *graph.output):
        ttype = info.type.tensor_type
        if not info.type.HasField("tensor_type") or ttype.elem_type == TensorProto.UNDEFINED:
            continue
        shape = None
        if ttype.HasField("shape"):
            shape = [d.dim_value if d.HasField("dim_value") else d.dim_param or None for d in ttype.shape.dim]
        found[info.name] = (gs_dtype(ttype.elem_type), shape)
    return found


# --- the edit pass: a recipe's edit step --------------------------------------------------------------------


_INSERTION_KEYS = frozenset({"tensor", "op", "attrs", "inputs", "domain"})


def _insertion(entry: Any) -> Any:
    """An ``insert_after`` recipe entry as an ``Insertion``; ValueError names what is wrong."""
    if not isinstance(entry, dict) or not {"tensor", "op"} <= entry.keys() or entry.keys() - _INSERTION_KEYS:
        raise ValueError(
            f"insert_after entry {entry!r}: expected {{tensor: NAME, op: OP}} with optional "
            "attrs, inputs, domain"
        )
    inputs = []
    for item in entry.get("inputs") or ():
        if isinstance(item, (str, np.ndarray)):  # a tensor name, or a constant the command line made
            inputs.append(item)
        elif isinstance(item, (list, tuple)) and item and all(isinstance(v, (int, float)) for v in item):
            try:
                inputs.append(number_array(list(item), f"insert_after input {_shown(item)}"))
            except GskitError as err:
                raise ValueError(str(err)) from err
        else:
            raise ValueError(f"insert_after input {item!r}: a tensor name or a list of numbers")
    return Insertion(
        tensor=str(entry["tensor"]),
        op=str(entry["op"]),
        attrs=dict(entry.get("attrs") or {}),
        extra_inputs=inputs,
        domain=str(entry.get("domain") or ""),
    )


class _Edit(GraphPass[EditOptions]):
    name, options, effect, keeps_outputs, takes_model = "edit", EditOptions, "in_place", False, False

    def call(self, model: Any, options: EditOptions, context: PassContext) -> PassResult:
        changes = apply_to_graph(model, options, plugins=context.plugins)
        steps = list(dict.fromkeys(c.step for c in changes))
        summary = f"{len(changes)} edit(s): {', '.join(steps)}" if changes else "no edits requested"
        return PassResult(model, modified=bool(changes), report=changes, summary=summary)

    def ensures(self, model: Any, options: EditOptions, result: PassResult, before: Before) -> None:
        outputs = {t.name for t in model.outputs}
        renamed = {options.rename.get(name, name) for name in before.outputs}
        extra = outputs - renamed - set(options.expose)
        ensure(not extra, self.name, f"output(s) {sorted(extra)} appeared that no edit asked for")


#: The edit pass (the recipe's ``edit`` step): ``run_pass(EDIT, graph, EditOptions(...))``.
EDIT = _Edit()
