"""Plugin specs: what a plugin node is, what it computes, and which patterns it replaces.

A plugin lives in ``plugins/<name>/`` and its ``spec.py`` defines ``SPEC``, a :class:`PluginSpec`.
The spec is the single source of truth: the ONNX node gskit writes, the onnx shape-inference schema,
the numpy reference used on onnxruntime, and the TensorRT plugin registration are all derived from it.

Identity of a plugin is ``(namespace, name, version)``; the node's domain is the namespace.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs

from gskit.errors import PluginError


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


#: Default of an attribute that every node must set.
REQUIRED: Any = _Required()


class AttrType(str, enum.Enum):
    """ONNX attribute kinds that the TensorRT ONNX parser can pass to a plugin as PluginFields."""

    INT = "int"  # narrowed to int32 by the parser
    FLOAT = "float"  # float32
    STRING = "string"
    INTS = "ints"
    FLOATS = "floats"
    STRINGS = "strings"
    TENSOR = "tensor"  # only the dtypes in TENSOR_DTYPES_PASSED_TO_PLUGINS


#: numpy dtypes of TENSOR attributes the parser turns into PluginFields (TENSORRT_NOTES.md).
TENSOR_DTYPES_PASSED_TO_PLUGINS = frozenset(
    np.dtype(t) for t in ("float32", "int8", "int16", "int32", "float16", "float64")
) | {"bfloat16"}

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


@dataclass(frozen=True)
class Attribute:
    """One plugin attribute (a PluginField on the TensorRT side).

    Attributes:
        name: attribute name on the ONNX node and field name in the TensorRT creator.
        type: the ONNX attribute kind.
        default: value used when a match does not provide one; ``REQUIRED`` if it must.
        doc: one line for ``gskit plugin list`` and the plugin README.
        tensor_dtype: for ``TENSOR`` attributes, the numpy dtype the plugin expects.
    """

    name: str
    type: AttrType
    default: Any = REQUIRED
    doc: str = ""
    tensor_dtype: np.dtype | str | None = None


@dataclass(frozen=True)
class TensorInfo:
    """dtype and shape of one tensor as shape inference sees it.

    Attributes:
        dtype: onnx ``TensorProto`` element type (e.g. ``TensorProto.FLOAT``); 0 when unknown.
        shape: one entry per dim, an int (fixed), a str (symbolic) or None (unknown); None for unknown rank.
    """

    dtype: int
    shape: tuple[int | str | None, ...] | None


#: Output rule: input infos (None for an omitted optional input) and attribute values -> output infos.
InferFn = Callable[[Sequence["TensorInfo | None"], Mapping[str, Any]], Sequence[TensorInfo]]
#: Numpy reference: ``reference(*inputs, **attributes)`` -> one array or a tuple of arrays.
ReferenceFn = Callable[..., "np.ndarray | tuple[np.ndarray, ...]"]


def same_as_input(index: int = 0) -> InferFn:
    """Output rule for single-output plugins whose output has input ``index``'s dtype and shape."""

    def infer(inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any]) -> Sequence[TensorInfo]:
        source = inputs[index]
        if source is None:
            raise PluginError(f"output shape rule needs input {index}, which is absent")
        return [source]

    infer.__name__ = f"same_as_input_{index}"
    return infer


@dataclass(frozen=True)
class PluginSpec:
    """Everything gskit needs to know about one plugin.

    Attributes:
        name: op type of the plugin node and the TensorRT plugin name.
        namespace: TensorRT plugin namespace; also the node's ONNX domain.
        version: TensorRT plugin version (the ``plugin_version`` attribute, a string).
        inputs: input names in order; a name ending in ``?`` is optional (may be the empty name).
        outputs: output names in order.
        attributes: the plugin fields the node carries.
        infer: output dtype/shape rule; must keep symbolic dims.
        reference: numpy implementation used to run plugin nodes on onnxruntime.
        patterns: what this plugin replaces (objects from ``gskit.patterns``), tried in order.
        doc: one paragraph for people.
        source: file the spec was loaded from (set by the loader).
    """

    name: str
    namespace: str
    version: str = "1"
    inputs: tuple[str, ...] = ("x",)
    outputs: tuple[str, ...] = ("y",)
    attributes: tuple[Attribute, ...] = ()
    infer: InferFn = field(default_factory=same_as_input)
    reference: ReferenceFn | None = None
    patterns: tuple[Any, ...] = ()
    doc: str = ""
    source: Path | None = None

    @property
    def domain(self) -> str:
        return self.namespace

    @property
    def key(self) -> tuple[str, str, str]:
        """``(namespace, name, version)``: the identity used everywhere."""
        return (self.namespace, self.name, self.version)

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace}::{self.name} v{self.version}"

    def attribute(self, name: str) -> Attribute:
        for attr in self.attributes:
            if attr.name == name:
                return attr
        raise PluginError(f"{self.qualified_name}: no attribute '{name}'")

    def node_attrs(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Attribute dict for a node: defaults filled in, values checked, TensorRT routing fields added.

        Raises:
            PluginError: an unknown or missing attribute, or a value the parser cannot pass.
        """
        known = {a.name for a in self.attributes}
        unknown = set(values) - known
        if unknown:
            raise PluginError(f"{self.qualified_name}: unknown attribute(s) {sorted(unknown)}")
        attrs: dict[str, Any] = {}
        for attr in self.attributes:
            value = values.get(attr.name, attr.default)
            if value is REQUIRED:
                raise PluginError(f"{self.qualified_name}: attribute '{attr.name}' is required")
            attrs[attr.name] = coerce_attribute(self, attr, value)
        attrs["plugin_namespace"] = self.namespace
        attrs["plugin_version"] = self.version
        return attrs

    def make_node(
        self,
        inputs: Sequence[gs.Tensor],
        outputs: Sequence[gs.Tensor],
        attrs: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> gs.Node:
        """A graphsurgeon node for this plugin (not yet added to a graph)."""
        return gs.Node(
            op=self.name,
            name=name,
            domain=self.domain,
            attrs=self.node_attrs(attrs or {}),
            inputs=list(inputs),
            outputs=list(outputs),
        )

    def run_reference(self, inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any]) -> list[np.ndarray]:
        """Run the numpy reference; attributes routed to TensorRT only are not passed."""
        if self.reference is None:
            raise PluginError(f"{self.qualified_name}: no numpy reference; write `reference` in its spec")
        plugin_attrs = {a.name: attrs.get(a.name, a.default) for a in self.attributes}
        result = self.reference(*inputs, **plugin_attrs)
        return list(result) if isinstance(result, (tuple, list)) else [result]


def coerce_attribute(spec: PluginSpec, attr: Attribute, value: Any) -> Any:
    """Check ``value`` against what the TensorRT parser passes to a plugin and return it normalized."""
    where = f"{spec.qualified_name} attribute '{attr.name}'"

    def int32(v: Any) -> int:
        iv = int(v)
        if iv != v or not INT32_MIN <= iv <= INT32_MAX:
            raise PluginError(f"{where}: {v!r} does not fit in int32 (TensorRT narrows INT attributes)")
        return iv

    try:
        if attr.type is AttrType.INT:
            return int32(value)
        if attr.type is AttrType.FLOAT:
            return float(value)
        if attr.type is AttrType.STRING:
            return str(value)
        if attr.type is AttrType.INTS:
            return [int32(v) for v in value]
        if attr.type is AttrType.FLOATS:
            return [float(v) for v in value]
        if attr.type is AttrType.STRINGS:
            return [str(v) for v in value]
        if attr.type is AttrType.TENSOR:
            array = np.asarray(value)
            if array.dtype not in TENSOR_DTYPES_PASSED_TO_PLUGINS:
                raise PluginError(
                    f"{where}: tensor of {array.dtype} cannot reach a TensorRT plugin "
                    f"(passable: float32/16, bfloat16, float64, int8/16/32)"
                )
            return array
    except (TypeError, ValueError) as err:
        raise PluginError(f"{where}: {value!r} is not a valid {attr.type.value}") from err
    raise PluginError(f"{where}: unsupported attribute type {attr.type!r}")
