"""``gskit plugin new``: a plugin folder: spec, reference, patterns, kernel, TensorRT plugin, README, test.

With ``from_node`` the spec's op name, namespace, attributes (kinds and values as defaults), input and
output counts and dtypes come from a custom node of an existing model; the dtypes of the node's tensors
are read from the model (graph inputs, initializers, value_info, after onnx shape inference), and an
output whose dtype is unknown gets the first input's dtype. The templates live in
``gskit/data/scaffold/``; nothing is overwritten.
"""

from __future__ import annotations

import keyword
import logging
import os
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from gskit.errors import GskitError
from gskit.io import model as gmodel
from gskit.passes.tensor_types import infer_types
from gskit.plugin.spec import ROUTING_ATTRIBUTES, AttrType, check_identity

log = logging.getLogger(__name__)

TEMPLATE_DIR = Path(__file__).resolve().parents[1] / "data" / "scaffold"
#: Generated file -> template.
FILES: Mapping[str, str] = {
    "__init__.py": "",
    "spec.py": "spec.py.tmpl",
    "reference.py": "reference.py.tmpl",
    "patterns.py": "patterns.py.tmpl",
    "kernel.py": "kernel.py.tmpl",
    "trt_plugin.py": "trt_plugin.py.tmpl",
    "README.md": "README.md.tmpl",
    "test_reference.py": "test_reference.py.tmpl",
    # registers the test's `gpu` mark, so pytest knows it outside gskit's repository too
    "conftest.py": "conftest.py.tmpl",
}
#: Size given to symbolic or unknown dims in the generated tests' example shapes.
EXAMPLE_DIM = 3
#: Example shape of an input whose shape is unknown.
EXAMPLE_SHAPE = (2, 3, 5)

_ATTR_KINDS: Mapping[int, AttrType] = {
    onnx.AttributeProto.INT: AttrType.INT,
    onnx.AttributeProto.FLOAT: AttrType.FLOAT,
    onnx.AttributeProto.STRING: AttrType.STRING,
    onnx.AttributeProto.INTS: AttrType.INTS,
    onnx.AttributeProto.FLOATS: AttrType.FLOATS,
    onnx.AttributeProto.STRINGS: AttrType.STRINGS,
    onnx.AttributeProto.TENSOR: AttrType.TENSOR,
}


@dataclass(frozen=True)
class NodeAttribute:
    """One attribute read from a node: name, kind and value (numpy array for TENSOR)."""

    name: str
    type: AttrType
    value: Any


@dataclass(frozen=True)
class NodeSignature:
    """What a new plugin takes from an existing node.

    Attributes:
        op_type: the node's op type (the plugin name).
        domain: the node's domain (the plugin namespace; "" becomes ``gskit``).
        node: the node's name, for the generated docs.
        inputs: per input, (numpy dtype name, example shape); None for an omitted optional input.
        outputs: numpy dtype name per output.
        attributes: the node's attributes, routing attributes left out.
    """

    op_type: str
    domain: str
    node: str
    inputs: tuple[tuple[str, tuple[int, ...]] | None, ...]
    outputs: tuple[str, ...]
    attributes: tuple[NodeAttribute, ...]


def read_node(model_path: str | os.PathLike, node_name: str) -> NodeSignature:
    """Read a node's signature from a model: by node name, else by op type when exactly one node has it.

    Raises:
        GskitError: the model cannot be loaded, no (or several) nodes match, an attribute kind cannot
            reach a TensorRT plugin, or an input's dtype is unknown.
    """
    proto = gmodel.load(model_path)
    nodes = [n for n in proto.graph.node if n.name == node_name]
    if not nodes:
        nodes = [n for n in proto.graph.node if n.op_type == node_name]
    if len(nodes) != 1:
        found = "no node" if not nodes else f"{len(nodes)} nodes"
        raise GskitError(f"{model_path}: {found} named (or of op type) '{node_name}'; give one node's name")
    node = nodes[0]
    try:
        inferred = infer_types(proto)
    except GskitError as err:  # fall back to what the file records
        log.warning("%s: shape inference failed (%s); using the recorded types", model_path, err)
        inferred = proto
    types = _tensor_types(inferred.graph)
    inputs: list[tuple[str, tuple[int, ...]] | None] = []
    for name in node.input:
        if not name:
            inputs.append(None)
            continue
        if name not in types:
            raise GskitError(
                f"{model_path}: dtype of input '{name}' of node '{node.name}' is unknown; "
                "run `gskit infer-shapes` on the model or give the tensor a value_info"
            )
        inputs.append(types[name])
    first = next((i[0] for i in inputs if i is not None), "float32")
    outputs = tuple(types[name][0] if name in types else first for name in node.output)
    attributes = tuple(
        _node_attribute(model_path, node, a) for a in node.attribute if a.name not in ROUTING_ATTRIBUTES
    )
    return NodeSignature(
        node.op_type, node.domain, node.name or node.op_type, tuple(inputs), outputs, attributes
    )


def new_plugin(
    name: str,
    directory: str | os.PathLike = "plugins",
    *,
    from_node: str | None = None,
    namespace: str = "gskit",
) -> list[Path]:
    """Create ``<directory>/<folder>/`` with a new plugin's files.

    Args:
        name: the folder name (snake_case, a Python identifier); without ``from_node`` the op name is its
            CamelCase form (``my_op`` -> ``MyOp``) unless it already has capitals.
        directory: the plugins folder.
        from_node: ``MODEL:NODE`` (a model path and a node name or unique op type) to copy the signature of.
        namespace: the plugin namespace when the node has no domain (or without ``from_node``).

    Returns:
        The created files.

    Raises:
        GskitError: an invalid name, an existing folder (nothing is overwritten), or a bad ``from_node``.
    """
    folder_name = _folder_name(name)
    target = Path(directory) / folder_name
    if target.exists():
        raise GskitError(
            f"{target} already exists; pick another name or remove it first (nothing overwritten)"
        )
    if from_node:
        model_path, node_name = split_from_node(from_node)
        signature = read_node(model_path, node_name)
        where = f"--from-node {from_node}: node '{signature.node}'"
        check_identity(signature.op_type, "name (the node's op type)", where)
        check_identity(signature.domain or namespace, "namespace (the node's domain)", where)
    else:
        signature = NodeSignature(_op_name(name), "", "", ((("float32", EXAMPLE_SHAPE)),), ("float32",), ())
        check_identity(namespace, "namespace", "--namespace")
    values = _template_values(signature, folder_name, namespace, from_node, str(target))
    texts = {}
    for file_name, template in FILES.items():
        text = (
            "" if not template else string.Template((TEMPLATE_DIR / template).read_text()).substitute(values)
        )
        if file_name.endswith(".py"):
            _check_python(text, target / file_name)
        texts[file_name] = text
    target.mkdir(parents=True)
    written = []
    for file_name, text in texts.items():
        path = target / file_name
        path.write_text(text)
        written.append(path)
    log.info("created plugin %s in %s", signature.op_type, target)
    return written


def split_from_node(from_node: str) -> tuple[str, str]:
    """``MODEL:NODE`` -> (MODEL, NODE); a node name may hold ":" (MODEL is the first prefix that is a file).

    Raises:
        GskitError: no ``:`` with text on both sides.
    """
    for at in [i for i, char in enumerate(from_node) if char == ":"]:
        if at and at < len(from_node) - 1 and Path(from_node[:at]).is_file():
            return from_node[:at], from_node[at + 1 :]
    model_path, sep, node_name = from_node.rpartition(":")
    if not sep or not model_path or not node_name:
        raise GskitError(f"--from-node wants MODEL:NODE, got {from_node!r}")
    return model_path, node_name  # no such file: read_node says so


def _check_python(text: str, path: Path) -> None:
    """Generated code must compile; anything a model holds is quoted, so a failure here is a gskit bug."""
    try:
        compile(text, str(path), "exec")
    except SyntaxError as err:
        raise GskitError(
            f"{path}: the generated code is not valid Python ({err.msg}, line {err.lineno}); nothing written "
            "(a gskit bug: report it with the model)"
        ) from err


def _template_values(
    sig: NodeSignature, folder: str, namespace: str, from_node: str | None, path: str
) -> dict[str, str]:
    """Template values; ``path`` is the new folder as the user named it (``plugins/my_op``), so the hints it
    appears in (``pytest plugins/my_op``) work from the folder where ``gskit plugin new`` ran."""
    inputs = _tensor_names(len(sig.inputs), "x")
    inputs = [f"{n}?" if info is None else n for n, info in zip(inputs, sig.inputs, strict=True)]
    outputs = _tensor_names(len(sig.outputs), "y")
    present = [(n, info) for n, info in zip(inputs, sig.inputs, strict=True) if info is not None]
    first_optional = next((i for i, n in enumerate(inputs) if n.endswith("?")), len(inputs))
    params = [
        f"{n.rstrip('?')}: np.ndarray | None = None" if i >= first_optional else f"{n}: np.ndarray"
        for i, n in enumerate(inputs)
    ]
    # Attribute names become keyword parameters only when they are identifiers; others arrive in **attrs.
    named = [a for a in sig.attributes if _is_parameter(a.name)]
    attr_params = [f"{a.name}: {_py_type(a)}" for a in named]
    if len(named) < len(sig.attributes):
        attr_params.append("**attrs: Any")
    signature = ", ".join(params + (["*", *attr_params] if attr_params else []))
    function = folder
    summary = f"custom op {sig.domain or namespace}::{sig.op_type} (write what it computes here)"
    origin = f" from node '{sig.node}' of {split_from_node(from_node)[0]}" if from_node else ""
    # Every value read from the model is text inside a string literal or a docstring of generated code:
    # escaped, so a crafted node name or op type stays text and never becomes code.
    return {
        "name": _escaped(sig.op_type),
        "namespace": _escaped(sig.domain or namespace),
        "folder": folder,
        "path": _escaped(path),
        "function": function,
        "typing_import": "\nfrom typing import Any\n" if "**attrs: Any" in signature else "",
        "summary": _escaped(summary),
        "origin": _escaped(origin),
        "dtype_origin": " (read from the model)" if from_node else " (edit)",
        "input_dtypes": _tuple_repr([info[0] for _, info in present]),
        "output_dtypes": _tuple_repr(list(sig.outputs)),
        "example_shapes": _tuple_repr([info[1] for _, info in present]),
        "inputs": _tuple_repr(inputs),
        "outputs": _tuple_repr(outputs),
        "attributes": "".join(f"        {_attribute_code(a, sig.node)},\n" for a in sig.attributes),
        "signature": signature,
        "returns": "np.ndarray"
        if len(outputs) == 1
        else f"tuple[{', '.join(['np.ndarray'] * len(outputs))}]",
        "kernel_signature": ", ".join(
            [f"{n.rstrip('?')}: Any" for n in inputs] + ["*", "outputs: Any", "**attrs: Any"]
        ),
        "input_list": ", ".join(f"`{n}`" for n in inputs),
        "output_list": ", ".join(f"`{n}`" for n in outputs),
        "attribute_list": _escaped(", ".join(f"`{a.name}` ({a.type.value})" for a in sig.attributes))
        or "none",
    }


def _escaped(text: str) -> str:
    """``text`` as it may stand between double quotes (``"..."`` or a docstring) of generated Python: quotes,
    backslashes, line breaks and non-ASCII characters escaped, so the literal reads back as ``text``."""
    return text.encode("unicode_escape").decode("ascii").replace('"', '\\"')


def _is_parameter(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name) and name.isascii()


def _literal(value: Any) -> str:
    """Python source for an attribute value (str, int, float, lists of them) that evaluates back to it.

    ``repr`` alone writes ``nan`` and ``inf``, which are not Python names.
    """
    if isinstance(value, float) and not np.isfinite(value):
        return f"float({str(value)!r})"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    return repr(value)


def _attribute_code(attr: NodeAttribute, node: str) -> str:
    value = attr.value
    if attr.type is AttrType.TENSOR:
        array = np.asarray(value)
        if array.dtype.kind not in "biuf":
            raise GskitError(
                f"attribute {attr.name!r} of node {node!r} is a tensor of {array.dtype}; "
                "a plugin attribute tensor holds numbers"
            )
        default = f"np.array({_literal(array.tolist())}, dtype=np.{array.dtype.name})"
        extra = f", tensor_dtype={array.dtype.name!r}"
    else:
        default, extra = _literal(value), ""
    doc = f"from node '{node}'" if node else ""
    return f"Attribute({attr.name!r}, AttrType.{attr.type.name}, {default}, doc={doc!r}{extra})"


def _py_type(attr: NodeAttribute) -> str:
    return {
        AttrType.INT: "int",
        AttrType.FLOAT: "float",
        AttrType.STRING: "str",
        AttrType.INTS: "list[int]",
        AttrType.FLOATS: "list[float]",
        AttrType.STRINGS: "list[str]",
        AttrType.TENSOR: "np.ndarray",
    }[attr.type]


def _node_attribute(model_path: Any, node: onnx.NodeProto, attr: onnx.AttributeProto) -> NodeAttribute:
    kind = _ATTR_KINDS.get(attr.type)
    if kind is None:
        raise GskitError(
            f"{model_path}: attribute '{attr.name}' of node '{node.name}' is a "
            f"{onnx.AttributeProto.AttributeType.Name(attr.type)}, which cannot reach a TensorRT plugin"
        )
    value = helper.get_attribute_value(attr)
    if kind is AttrType.TENSOR:
        value = numpy_helper.to_array(value)
    elif kind is AttrType.STRING:
        value = _text(model_path, node, attr.name, value)
    elif kind is AttrType.STRINGS:
        value = [_text(model_path, node, attr.name, v) for v in value]
    elif kind in (AttrType.INTS, AttrType.FLOATS):
        value = list(value)
    return NodeAttribute(attr.name, kind, value)


def _text(model_path: Any, node: onnx.NodeProto, name: str, value: bytes) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as err:
        raise GskitError(
            f"{model_path}: attribute '{name}' of node '{node.name}' is not UTF-8 text ({value[:40]!r}); "
            "a plugin's string attribute must be"
        ) from err


def _tensor_types(graph: onnx.GraphProto) -> dict[str, tuple[str, tuple[int, ...]]]:
    types: dict[str, tuple[str, tuple[int, ...]]] = {}
    for init in graph.initializer:
        types[init.name] = (helper.tensor_dtype_to_np_dtype(init.data_type).name, tuple(init.dims) or (1,))
    for info in (*graph.input, *graph.value_info, *graph.output):
        tensor = info.type.tensor_type
        if not info.type.HasField("tensor_type") or tensor.elem_type == 0 or info.name in types:
            continue
        shape = EXAMPLE_SHAPE
        if tensor.HasField("shape"):
            shape = tuple(d.dim_value if d.HasField("dim_value") else EXAMPLE_DIM for d in tensor.shape.dim)
        types[info.name] = (helper.tensor_dtype_to_np_dtype(tensor.elem_type).name, shape)
    return types


def _tensor_names(count: int, stem: str) -> list[str]:
    return [stem] if count == 1 else [f"{stem}{i}" for i in range(count)]


def _tuple_repr(items: Sequence[Any]) -> str:
    return repr(tuple(items))


def _folder_name(name: str) -> str:
    folder = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()
    if not folder.isidentifier():
        raise GskitError(f"plugin name {name!r} must be a Python identifier (letters, digits, '_')")
    if keyword.iskeyword(folder):
        raise GskitError(f"plugin name {name!r} is a Python keyword; its folder could not be imported")
    if folder.startswith("_"):
        # gskit's plugin discovery skips such folders (private helpers, __pycache__): the plugin would vanish
        raise GskitError(
            f"plugin name {name!r} starts with '_', and gskit skips such folders; start with a letter"
        )
    return folder


def _op_name(name: str) -> str:
    if any(c.isupper() for c in name):
        return name
    return "".join(part.capitalize() for part in name.split("_") if part)
