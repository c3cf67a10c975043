"""Plugin specs: what a plugin node is, what it computes, and which patterns it replaces.

A plugin lives in ``plugins/<name>/`` and its ``spec.py`` defines ``SPEC``, a :class:`PluginSpec`.
The spec is the single source of truth: the ONNX node gskit writes, the onnx shape-inference schema,
the numpy reference used on onnxruntime, and the TensorRT plugin registration are all derived from it.

Identity of a plugin is ``(domain, name, version)``: the node's ONNX domain, op type and ``plugin_version``.
For gskit's own plugins the domain is the TensorRT namespace. TensorRT's own plugins (``library=LIBRARY``, see
``gskit.plugin.libnvinfer``) live in TensorRT's namespace ``""``, which cannot be an ONNX domain for an op
onnx does not know, so their nodes are written in ``node_domain`` (``TRT``) with ``plugin_namespace=""``.

This module holds the spec and the rules checked when a plugin loads (:func:`validate_spec`); the registry of
loaded specs is ``gskit.plugin.registry``, where plugins come from ``gskit.plugin.discovery``.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from gskit.errors import PluginError
from gskit.plugin import libnvinfer
from gskit.plugin.deferred import check_when_read
from gskit.plugin.native import NativeForm, validate_native_forms
from gskit.plugin.ops import (
    DEFAULT_DOMAINS,
    ONNX_DOMAINS,
    ORT_DOMAINS,
    is_onnx_op,
    op_label,
    similar_onnx_ops,
)

log = logging.getLogger(__name__)

#: Names the README's Python API table lists under ``gskit.plugin.spec`` that have modules of their own now:
#: still importable from here, looked up when asked (those modules import this one).
_DOCUMENTED_ELSEWHERE = {"PluginRegistry": "gskit.plugin.registry", "load_plugins": "gskit.plugin.discovery"}


def __getattr__(name: str) -> Any:
    owner = _DOCUMENTED_ELSEWHERE.get(name)
    if owner is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(owner), name)


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


def per_channel_of(index: int = 0, weight: int = 1, *, dtype_of: int | None = None) -> InferFn:
    """Output rule for norms over the last axis: input ``index``'s dtype and shape, with an unknown last dim
    taken from the ``(C,)`` input ``weight`` (upstream ops whose output dims onnx cannot infer).

    ``dtype_of`` declares an output dtype that differs from input ``index``'s: the dtype of that input
    (RMSNorm takes its weight's, so a float32 ``x`` whose result is cast to float16 before a float16 weight
    is one plugin node).
    """

    same = same_as_input(index)

    def infer(inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any]) -> Sequence[TensorInfo]:
        (out,) = same(inputs, attrs)
        typed = inputs[dtype_of] if dtype_of is not None and dtype_of < len(inputs) else None
        if typed is not None and typed.dtype:
            out = TensorInfo(typed.dtype, out.shape)
        scale = inputs[weight] if weight < len(inputs) else None
        if out.shape and not isinstance(out.shape[-1], int) and scale is not None and scale.shape:
            last = scale.shape[-1]
            if isinstance(last, int) and last > 1:
                return [TensorInfo(out.dtype, (*out.shape[:-1], last))]
        return [out]

    infer.__name__ = f"per_channel_of_{index}_{weight}" + (
        f"_dtype_of_{dtype_of}" if dtype_of is not None else ""
    )
    return infer


@dataclass(frozen=True)
class PluginSpec:
    """Everything gskit needs to know about one plugin.

    Attributes:
        name: op type of the plugin node and the TensorRT plugin name.
        namespace: TensorRT plugin namespace (the ``plugin_namespace`` attribute); also the node's ONNX
            domain unless ``node_domain`` is given.
        version: TensorRT plugin version (the ``plugin_version`` attribute, a string).
        inputs: input names in order; a name ending in ``?`` is optional (may be the empty name).
        outputs: output names in order.
        attributes: the plugin fields the node carries.
        infer: output dtype/shape rule; must keep symbolic dims.
        reference: numpy implementation used to run plugin nodes on onnxruntime.
        patterns: what this plugin replaces (objects from ``gskit.passes.patterns``), tried in order: a
            tuple, or :func:`gskit.plugin.deferred.patterns_in` to import them when a command first reads
            them (only replacing does: ``compare`` or ``check-trt`` then never builds them).
        doc: one paragraph for people.
        source: file the spec was loaded from (set by the loader).
        supports_fp16: the plugin takes float16 inputs; otherwise ``gskit convert --fp16`` keeps its node in
            float32 with Casts around it.
        node_domain: the node's ONNX domain when it is not the namespace: required for TensorRT's own
            plugins, whose namespace ``""`` is ONNX's default domain (``libnvinfer.DOMAIN``).
        library: the shared library that implements the plugin and ships with TensorRT
            (``libnvinfer.LIBRARY``: TensorRT's own plugins, registered by ``initLibNvInferPlugins``; the
            folder then has no kernel and no ``trt_plugin.py``). None: the plugin folder brings it.
        native: the standard ONNX ops TensorRT runs natively that compute the same, each with the first
            TensorRT version that imports it (:class:`gskit.plugin.native.NativeForm`); the target of a run
            picks the form of each region (``--tensorrt``). Empty: the region always becomes the plugin node.
        plugin_form: the plugin node is one of the forms (False: the spec only names a native op, e.g. a
            decomposed GroupNorm that becomes ``GroupNormalization``; below that op's TensorRT version the
            region is left as it was).
    """

    name: str
    namespace: str
    version: str = "1"
    inputs: tuple[str, ...] = ("x",)
    outputs: tuple[str, ...] = ("y",)
    attributes: tuple[Attribute, ...] = ()
    infer: InferFn = field(default_factory=same_as_input)
    reference: ReferenceFn | None = None
    patterns: Sequence[Any] = ()
    doc: str = ""
    source: Path | None = None
    supports_fp16: bool = False
    node_domain: str | None = None
    library: str | None = None
    native: tuple[NativeForm, ...] = ()
    plugin_form: bool = True

    @property
    def domain(self) -> str:
        """The ONNX domain of the plugin's nodes: ``node_domain``, else the namespace."""
        return self.namespace if self.node_domain is None else self.node_domain

    @property
    def key(self) -> tuple[str, str, str]:
        """``(domain, name, version)``: the identity used everywhere (``gskit.plugin.ops.node_key`` of its
        nodes)."""
        return (self.domain, self.name, self.version)

    @property
    def qualified_name(self) -> str:
        return f"{self.domain}::{self.name} v{self.version}"

    @property
    def shipped(self) -> libnvinfer.ShippedPlugin | None:
        """What ``libnvinfer_plugin`` says of this plugin, for one TensorRT implements (``library``)."""
        if self.library != libnvinfer.LIBRARY:
            return None
        return libnvinfer.shipped_plugin(self.name, self.version)

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
            value = coerce_attribute(self, attr, value)
            if attr.type is AttrType.TENSOR:
                # graphsurgeon exports a bare ndarray as FLOATS/INTS (shape lost), a Constant as TENSOR.
                value = gs.Constant(f"{self.name}.{attr.name}", value)
            attrs[attr.name] = value
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

    def run_reference(
        self, inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any]
    ) -> list[np.ndarray]:
        """Run the numpy reference; attributes routed to TensorRT only are not passed."""
        if self.reference is None:
            raise PluginError(f"{self.qualified_name}: no numpy reference; write `reference` in its spec")
        plugin_attrs = {a.name: attribute_value(attrs.get(a.name, a.default)) for a in self.attributes}
        missing = [name for name, value in plugin_attrs.items() if value is REQUIRED]
        if missing:
            raise PluginError(f"{self.qualified_name}: node lacks required attribute(s) {missing}")
        result = self.reference(*inputs, **plugin_attrs)
        outputs = list(result) if isinstance(result, (tuple, list)) else [result]
        for index, output in enumerate(outputs):
            kind = np.asarray(output).dtype.kind if output is not None else None
            if kind is None or kind not in "biufc":
                got = (
                    "None"
                    if output is None
                    else f"{type(output).__name__} of dtype {np.asarray(output).dtype}"
                )
                raise PluginError(
                    f"{self.qualified_name}: the reference returned {got} as output {index}, not numbers"
                )
        return outputs


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
            value = attribute_value(value)
            wanted = None if attr.tensor_dtype is None else np.dtype(attr.tensor_dtype)
            if wanted is not None and not isinstance(value, np.ndarray):
                value = np.asarray(value, dtype=wanted)
            array = np.asarray(value)
            if wanted is not None and array.dtype != wanted:
                raise PluginError(f"{where}: tensor of {array.dtype}, the plugin expects {wanted}")
            if array.dtype not in TENSOR_DTYPES_PASSED_TO_PLUGINS:
                raise PluginError(
                    f"{where}: tensor of {array.dtype} cannot reach a TensorRT plugin "
                    f"(passable: float32/16, bfloat16, float64, int8/16/32)"
                )
            return array
    except (TypeError, ValueError) as err:
        raise PluginError(f"{where}: {value!r} is not a valid {attr.type.value}") from err
    raise PluginError(f"{where}: unsupported attribute type {attr.type!r}")


def attribute_value(value: Any) -> Any:
    """A node attribute as plain Python/numpy: TENSOR values (gs.Constant or TensorProto) become arrays."""
    if isinstance(value, gs.Constant):
        return np.asarray(value.values)
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    if isinstance(value, onnx.AttributeProto):
        return attribute_value(onnx.helper.get_attribute_value(value))
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode("utf-8") for v in value]
    return value


#: Attributes gskit or TensorRT put on plugin nodes besides the spec's own, with their kinds.
ROUTING_ATTRIBUTES: Mapping[str, AttrType] = {
    "plugin_namespace": AttrType.STRING,
    "plugin_version": AttrType.STRING,
    "tensorrt_plugin_shape_input_indices": AttrType.INTS,
    "aot": AttrType.INT,
}


def check_identity(value: object, label: str, where: str) -> None:
    """A plugin's name or namespace: a non-empty string of printable characters without spaces or ':'
    (TensorRT's creator lookup joins them with '::'; a control character could only hide in a terminal).

    Raises:
        PluginError: ``where: plugin {label} must be ...``.
    """
    if not isinstance(value, str) or not value or not value.isprintable() or any(c in value for c in " :"):
        raise PluginError(
            f"{where}: plugin {label} must be a non-empty string of printable characters without spaces or "
            f"':', got {value!r}"
        )


def validate_spec(spec: Any, *, source: Path | None = None) -> PluginSpec:
    """Check a spec and return it with ``source`` set.

    Checks: identity fields are non-empty strings, inputs/outputs are names, attributes have distinct names
    that do not shadow routing attributes, defaults are values the TensorRT parser can pass, and the patterns
    are rules (:func:`check_patterns`). Warns when the name is also an ONNX op name (the TensorRT parser
    ignores domains: such a node reaches the plugin only with TensorRT >= 10.15 and a ``plugin_namespace``
    attribute). With patterns given as ``patterns_in``, the native forms and the patterns are checked, and
    the name warned of, when the patterns are first read.

    Raises:
        PluginError: naming the file (or the spec) and the problem.
    """
    where = str(source or getattr(spec, "source", None) or getattr(spec, "name", "plugin spec"))
    if not isinstance(spec, PluginSpec):
        raise PluginError(f"{where}: SPEC must be a gskit.plugin.spec.PluginSpec, not {type(spec).__name__}")
    if source is not None and spec.source is None:
        spec = dataclasses.replace(spec, source=source)
    where = str(spec.source or spec.qualified_name)
    _check_identity(spec, where)
    if not isinstance(spec.version, str) or not spec.version:
        raise PluginError(f'{where}: version must be a non-empty string like "1", got {spec.version!r}')
    for label, names in (("inputs", spec.inputs), ("outputs", spec.outputs)):
        if not isinstance(names, tuple) or not all(isinstance(n, str) and n.rstrip("?") for n in names):
            raise PluginError(f"{where}: {label} must be a tuple of names, got {names!r}")
    if not spec.outputs or any(n.endswith("?") for n in spec.outputs):
        raise PluginError(f"{where}: outputs must name at least one output, none optional")
    if not callable(spec.infer):
        raise PluginError(f"{where}: infer must be callable (inputs, attrs) -> output TensorInfos")
    if spec.reference is not None and not callable(spec.reference):
        raise PluginError(f"{where}: reference must be callable or None")
    seen: set[str] = set()
    for attr in spec.attributes:
        if not isinstance(attr, Attribute) or not isinstance(attr.type, AttrType):
            raise PluginError(
                f"{where}: attributes must be gskit.plugin.spec.Attribute with an AttrType, got {attr!r}"
            )
        if attr.name in seen or attr.name in ROUTING_ATTRIBUTES:
            raise PluginError(f"{where}: attribute name '{attr.name}' is repeated or reserved")
        seen.add(attr.name)
        if attr.default is not REQUIRED:
            try:
                coerce_attribute(spec, attr, attr.default)
            except PluginError as err:
                raise PluginError(f"{where}: default of {err}") from err
    # Deferred patterns are checked when a reader imports them (replacing), with the same messages: the
    # checks start onnx's schema registry (20 ms), which a command that only runs plugin nodes never needs.
    check_when_read(spec.patterns, f"rules of {spec.qualified_name}", lambda: _check_node_making(spec, where))
    return spec


def _check_node_making(spec: PluginSpec, where: str) -> None:
    """What concerns the nodes a spec's rules make, each read against onnx's schemas: the native forms, the
    rules themselves, and a name ONNX has too."""
    validate_native_forms(spec, where)
    check_patterns(spec, where)
    if onnx.defs.has(spec.name):
        log.warning(
            "%s: plugin name '%s' is also an ONNX op; the TensorRT parser ignores domains, so only TensorRT "
            ">= 10.15 with the plugin_namespace attribute reaches the plugin (see TENSORRT_NOTES.md)",
            where,
            spec.name,
        )


def _check_identity(spec: PluginSpec, where: str) -> None:
    """Name, namespace and node domain are names; a TensorRT-implemented plugin is one gskit knows."""
    names = [("name", spec.name), ("namespace", spec.namespace)]
    if spec.node_domain is not None:
        names.append(("node_domain", spec.node_domain))
    for label, value in names:
        if label == "namespace" and value == "":
            if spec.node_domain is not None:
                continue  # TensorRT's own plugins: namespace "", found through their node domain
            raise PluginError(
                f'{where}: plugin namespace must be a non-empty string; "" (TensorRT\'s own plugins) needs a '
                "node_domain"
            )
        check_identity(value, label, where)
    if spec.domain in ORT_DOMAINS:
        raise PluginError(
            f"{where}: the node domain {spec.domain!r} is one onnx or onnxruntime implements; a plugin node "
            f"needs a domain of its own (TensorRT's own plugins use {libnvinfer.DOMAIN!r})"
        )
    if spec.library is None:
        return
    if spec.library != libnvinfer.LIBRARY:
        raise PluginError(
            f"{where}: library must be {libnvinfer.LIBRARY!r} (a plugin TensorRT implements) or None, "
            f"got {spec.library!r}"
        )
    if spec.shipped is None:
        raise PluginError(
            f"{where}: {spec.name} v{spec.version} is not a {libnvinfer.LIBRARY} creator gskit knows; add it "
            "to gskit/plugin/libnvinfer.py with the TensorRT releases that ship it"
        )


def check_patterns(spec: PluginSpec, where: str) -> None:
    """Each pattern is a rule, names ops ONNX defines (in ONNX's domains) and attributes the spec has.

    Raises:
        PluginError: naming the rule and what to fix (an op ONNX does not have would never match: the
            replacement would report "0 replaced" and pass validation, hiding the typo).
    """
    from gskit.passes.patterns.rules import Rule  # the pattern package imports this module

    known = {a.name for a in spec.attributes}
    for rule in spec.patterns:
        if not isinstance(rule, Rule):
            raise PluginError(
                f"{where}: pattern {rule!r} is not a gskit.passes.patterns rule (GraphPattern, OpPattern, "
                "FunctionPattern, or from_torch(...))"
            )
        for domain, op in sorted(rule.ops()):
            if domain in ONNX_DOMAINS and not is_onnx_op(domain, op):
                close = similar_onnx_ops(op) if domain in DEFAULT_DOMAINS else []
                hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
                raise PluginError(
                    f"{where}: pattern '{rule.name}' names op '{op_label(domain, op)}', which ONNX does not "
                    f"define{hint}; ONNX op types are case-sensitive"
                )
        named = getattr(rule, "attrs", None)
        description = getattr(rule, "description", None)
        wanted = set(named) if isinstance(named, Mapping) else set()
        wanted |= set(getattr(description, "attributes", ()))
        unknown = sorted(wanted - known)
        if unknown:
            raise PluginError(
                f"{where}: pattern '{rule.name}' sets attribute(s) {unknown}, which the spec does not "
                f"declare (declared: {sorted(known) or 'none'})"
            )
