"""Plugin specs: what a plugin node is, what it computes, and which patterns it replaces.

A plugin lives in ``plugins/<name>/`` and its ``spec.py`` defines ``SPEC``, a :class:`PluginSpec`.
The spec is the single source of truth: the ONNX node gskit writes, the onnx shape-inference schema,
the numpy reference used on onnxruntime, and the TensorRT plugin registration are all derived from it.

Identity of a plugin is ``(domain, name, version)``: the node's ONNX domain, op type and ``plugin_version``.
For gskit's own plugins the domain is the TensorRT namespace. TensorRT's own plugins (``library=LIBRARY``, see
``gskit.plugin.libnvinfer``) live in TensorRT's namespace ``""``, which cannot be an ONNX domain for an op
onnx does not know, so their nodes are written in ``node_domain`` (``TRT``) with ``plugin_namespace=""``.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib.util
import logging
import os
import sys
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points as _entry_points
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from gskit.errors import PLUGIN_CODE_FAILURES, PluginError
from gskit.plugin import libnvinfer
from gskit.plugin.native import NativeForm, validate_native_forms
from gskit.plugin.ops import (
    DEFAULT_DOMAINS,
    ONNX_DOMAINS,
    ORT_DOMAINS,
    is_onnx_op,
    node_key,
    op_label,
    similar_onnx_ops,
)

log = logging.getLogger(__name__)


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
        patterns: what this plugin replaces (objects from ``gskit.passes.patterns``), tried in order.
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
    patterns: tuple[Any, ...] = ()
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


# --------------------------------------------------------------------------------------------------------
# Discovery: plugins/<name>/spec.py files and the ``gskit.plugins`` entry point group.

#: Environment variable listing plugin folders (``os.pathsep``-separated).
PLUGINS_ENV = "GSKIT_PLUGINS"
#: Entry point group whose entries load to a PluginSpec or a list of them.
ENTRY_POINT_GROUP = "gskit.plugins"
#: Parent package under which each plugin folder is imported (``gskit_plugins.<folder>``).
PLUGIN_PACKAGE = "gskit_plugins"
#: Attributes gskit or TensorRT put on plugin nodes besides the spec's own, with their kinds.
ROUTING_ATTRIBUTES: Mapping[str, AttrType] = {
    "plugin_namespace": AttrType.STRING,
    "plugin_version": AttrType.STRING,
    "tensorrt_plugin_shape_input_indices": AttrType.INTS,
    "aot": AttrType.INT,
}


class PluginRegistry:
    """The loaded plugin specs, looked up by ``(namespace, name, version)`` or by node.

    Build one with :func:`load_plugins` (or from specs directly in tests); nothing is registered globally.
    """

    def __init__(self, specs: Iterable[PluginSpec] = ()) -> None:
        self._specs: dict[tuple[str, str, str], PluginSpec] = {}
        self._origins: dict[tuple[str, str, str], str] = {}
        for spec in specs:
            self.add(spec)

    def add(self, spec: PluginSpec, origin: str = "") -> None:
        """Add a validated spec; ``origin`` says where it was found (``PluginSource.origin``).

        Raises:
            PluginError: a spec with the same key is already loaded (both files are named).
        """
        spec = validate_spec(spec)
        other = self._specs.get(spec.key)
        if other is not None:
            raise PluginError(
                f"{spec.qualified_name} is defined twice: in {other.source or '?'} and in "
                f"{spec.source or '?'}; "
                f"remove one or change its version"
            )
        self._specs[spec.key] = spec
        self._origins[spec.key] = origin

    def remove(self, key: tuple[str, str, str]) -> None:
        """Forget the spec with this ``(namespace, name, version)`` (one replaced by a closer source)."""
        self._specs.pop(key, None)
        self._origins.pop(key, None)

    def origin(self, spec: PluginSpec) -> str:
        """Where the loaded spec of this key was found ("" when added without one)."""
        return self._origins.get(spec.key, "")

    def __iter__(self) -> Iterator[PluginSpec]:
        return iter(self._specs.values())

    def __len__(self) -> int:
        return len(self._specs)

    def __bool__(self) -> bool:
        return bool(self._specs)

    def __repr__(self) -> str:
        return f"PluginRegistry({self.names()})"

    def get(self, namespace: str, name: str, version: str | None = None) -> PluginSpec | None:
        """The spec with this key; with ``version=None`` the only version, or the highest if several."""
        if version is not None:
            return self._specs.get((namespace, name, version))
        found = [s for (ns, n, _), s in self._specs.items() if ns == namespace and n == name]
        if not found:
            return None
        return max(found, key=lambda s: _version_key(s.version))

    def for_node(self, node: gs.Node | onnx.NodeProto) -> PluginSpec | None:
        """The spec a node instantiates: its domain and op type, and its ``plugin_version`` (default "1")."""
        return self._specs.get(node_key(node))

    def names(self) -> list[str]:
        """Qualified names (``ns::name vN``) of all specs, sorted."""
        return sorted(s.qualified_name for s in self._specs.values())

    def domains(self) -> set[str]:
        """ONNX domains used by the plugins."""
        return {s.domain for s in self._specs.values()}

    def check_plugin_ops(self) -> None:
        """A pattern that names an op of its own plugin's namespace names a loaded plugin of it.

        Ops of other non-ONNX domains are not checked: a rule may match a third party's custom node (an
        exporter symbolic's ``custom::deform_conv2d``) that no plugin defines.

        Raises:
            PluginError: naming the pattern, the op and the plugins of that namespace.
        """
        names: dict[str, set[str]] = {}
        for spec in self._specs.values():
            names.setdefault(spec.domain, set()).add(spec.name)
        for spec in self._specs.values():
            for rule in spec.patterns:
                for domain, op in sorted(rule.ops()):
                    if domain == spec.domain and op not in names[domain]:
                        raise PluginError(
                            f"{spec.source or spec.qualified_name}: pattern '{rule.name}' names op "
                            f"'{domain}::{op}', but no loaded plugin of namespace '{domain}' is called {op} "
                            f"(there are: {', '.join(sorted(names[domain]))})"
                        )


# Where plugins come from, lowest precedence first. A plugin (namespace, name, version) found again in a
# source of a higher level replaces the lower one (a local copy of a shipped plugin is the one used); two
# sources of one level defining it are an error, since nothing says which one is meant.
SHIPPED, INSTALLED, ENVIRONMENT, WORKING_DIR, GIVEN = range(5)
#: Entry point (of the gskit distribution) naming the shipped plugin package.
SHIPPED_ENTRY_POINT = "gskit"
#: Plugin folder searched in the working directory, where ``gskit plugin new`` creates plugins by default.
LOCAL_PLUGINS = "plugins"


@dataclass(frozen=True)
class PluginSource:
    """A place plugins are loaded from, and what ``gskit plugin list`` says about it.

    Attributes:
        origin: for people: ``shipped with gskit``, ``entry point NAME from DIST``, ``folder PATH``.
        level: precedence (``SHIPPED`` ... ``GIVEN``); see the comment above.
        folder: a folder of plugin folders, or one plugin folder; None when ``specs`` are given.
        specs: the specs of an entry point that loads to specs rather than to a package.
        explicit: a missing folder is an error rather than skipped.
    """

    origin: str
    level: int
    folder: Path | None = None
    specs: tuple[PluginSpec, ...] = ()
    explicit: bool = False


def plugin_sources(dirs: Sequence[str | os.PathLike] = (), *, defaults: bool = True) -> list[PluginSource]:
    """The plugin sources, lowest precedence first.

    With ``defaults``: the shipped plugins (the ``plugins/`` folder of a source checkout that gskit is
    imported from, else the ``gskit_plugins`` package through gskit's entry point), the other packages'
    ``gskit.plugins`` entry points, the folders in ``$GSKIT_PLUGINS`` and ``./plugins`` if there is one.
    Then the folders ``dirs`` (``--plugins``), which must exist.

    Raises:
        PluginError: an entry point cannot be loaded or loads to something else than a package or specs.
    """
    sources: list[PluginSource] = []
    if defaults:
        sources += _installed_sources()
        env = os.environ.get(PLUGINS_ENV, "")
        sources += [
            PluginSource(f"folder {p} (${PLUGINS_ENV})", ENVIRONMENT, Path(p))
            for p in env.split(os.pathsep)
            if p
        ]
        local = Path(LOCAL_PLUGINS)
        if local.is_dir():
            sources.append(PluginSource(f"folder {local.resolve()} (./{LOCAL_PLUGINS})", WORKING_DIR, local))
    sources += [PluginSource(f"folder {d}", GIVEN, Path(d), explicit=True) for d in dirs]
    return sources


def default_plugin_dirs() -> list[Path]:
    """Folders of the default plugin sources (:func:`plugin_sources`), each once: shipped, installed
    plugin packages, ``$GSKIT_PLUGINS``, ``./plugins``."""
    folders = [s.folder.resolve() for s in plugin_sources() if s.folder is not None]
    return list(dict.fromkeys(folders))


def load_plugins(
    dirs: Sequence[str | os.PathLike] | None = None, *, entry_points: bool = True
) -> PluginRegistry:
    """Load plugin specs from the default sources and from folders.

    Each ``<dir>/<name>/spec.py`` is imported as the package ``gskit_plugins.<name>`` (so it can import its
    siblings relatively) and must define ``SPEC`` (a PluginSpec) or ``SPECS`` (a list). A folder that has
    ``spec.py`` itself is loaded as one plugin. A ``spec.py`` reached twice (the shipped folder is also
    ``./plugins`` in a checkout) is loaded once. Loading again re-imports the files.

    Args:
        dirs: plugin folders loaded besides the default sources (``--plugins``); they win over them.
        entry_points: also load the default sources (:func:`plugin_sources`): the shipped plugins, the
            ``gskit.plugins`` entry points of installed packages, ``$GSKIT_PLUGINS`` and ``./plugins``.
            False loads ``dirs`` only.

    Raises:
        PluginError: a given folder is missing, a plugin file cannot be imported or defines no valid spec,
            or two sources of the same precedence define the same ``(namespace, name, version)``.
    """
    registry = PluginRegistry()
    used_modules: set[str] = set()
    loaded_files: set[Path] = set()
    levels: dict[tuple[str, str, str], int] = {}
    for source in plugin_sources(dirs or (), defaults=entry_points):
        for spec in _source_specs(source, used_modules, loaded_files):
            level = levels.get(spec.key)
            if level is not None and level < source.level:
                log.info(
                    "%s from %s replaces the one from %s",
                    spec.qualified_name,
                    source.origin,
                    registry.origin(spec),
                )
                registry.remove(spec.key)
            registry.add(spec, origin=source.origin)
            levels[spec.key] = source.level
    registry.check_plugin_ops()
    log.debug("loaded plugins: %s", registry.names())
    return registry


def _source_specs(source: PluginSource, used_modules: set[str], loaded_files: set[Path]) -> list[PluginSpec]:
    if source.folder is None:
        return list(source.specs)
    specs = []
    for spec_file in _spec_files(source.folder, explicit=source.explicit):
        if spec_file.resolve() in loaded_files:
            continue
        loaded_files.add(spec_file.resolve())
        specs += load_spec_file(spec_file, _module_name(spec_file.parent.name, used_modules))
    return specs


def _installed_sources() -> list[PluginSource]:
    """The shipped plugins and the installed packages' entry points."""
    checkout = Path(__file__).resolve().parents[2]
    # gskit imported from a source checkout (editable install, or PYTHONPATH): its own plugins/ are the
    # shipped ones, even when the gskit distribution whose entry point is installed is another tree.
    from_checkout = (checkout / "pyproject.toml").is_file() and (checkout / LOCAL_PLUGINS).is_dir()
    sources = []
    if from_checkout:
        sources.append(
            PluginSource(
                f"shipped with gskit ({checkout / LOCAL_PLUGINS})", SHIPPED, checkout / LOCAL_PLUGINS
            )
        )
    for ep in _entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist.name if ep.dist is not None else "?"
        shipped = _normalized(dist) == "gskit" and ep.name == SHIPPED_ENTRY_POINT
        if shipped and from_checkout:
            continue
        origin = "shipped with gskit" if shipped else f"entry point {ep.name} from {dist}"
        folders, specs = _load_entry_point(ep)
        level = SHIPPED if shipped else INSTALLED
        sources += [PluginSource(origin, level, folder) for folder in folders]
        if specs:
            sources.append(PluginSource(origin, level, specs=tuple(specs)))
    return sources


def _normalized(dist_name: str) -> str:
    return dist_name.lower().replace("_", "-").replace(".", "-")


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


def load_spec_file(path: str | os.PathLike, module_name: str | None = None) -> list[PluginSpec]:
    """Import one ``spec.py`` as a package and return its specs with ``source`` set.

    The specs are validated when added to a :class:`PluginRegistry` (``load_plugins`` does both).

    Raises:
        PluginError: the file cannot be imported, defines no SPEC/SPECS, or SPEC is not a PluginSpec.
    """
    path = Path(path).resolve()
    module_name = module_name or f"{PLUGIN_PACKAGE}.{path.parent.name}"
    _ensure_parent_package()
    for name in [m for m in sys.modules if m == module_name or m.startswith(module_name + ".")]:
        del sys.modules[name]  # a reload must see the files as they are now
    import_spec = importlib.util.spec_from_file_location(
        module_name, path, submodule_search_locations=[str(path.parent)]
    )
    if import_spec is None or import_spec.loader is None:
        raise PluginError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(import_spec)
    sys.modules[module_name] = module
    # No bytecode: a plugin edited twice within a second would otherwise be reloaded from a stale .pyc.
    write_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        import_spec.loader.exec_module(module)
    except PLUGIN_CODE_FAILURES as err:  # user code: any failure becomes one line naming the file
        del sys.modules[module_name]
        raise PluginError(f"{path}: cannot import plugin: {type(err).__name__}: {err}") from err
    finally:
        sys.dont_write_bytecode = write_bytecode
    found = getattr(module, "SPECS", None)
    if found is None:
        found = getattr(module, "SPEC", None)
        found = None if found is None else [found]
    if found is None:
        raise PluginError(f"{path}: defines neither SPEC (a PluginSpec) nor SPECS (a list of them)")
    if not isinstance(found, (list, tuple)):
        raise PluginError(f"{path}: SPECS must be a list of PluginSpec, not {type(found).__name__}")
    specs = []
    for spec in found:
        if not isinstance(spec, PluginSpec):
            raise PluginError(
                f"{path}: SPEC must be a gskit.plugin.spec.PluginSpec, not {type(spec).__name__}"
            )
        specs.append(spec if spec.source is not None else dataclasses.replace(spec, source=path))
    return specs  # validated when added to a registry


def validate_spec(spec: Any, *, source: Path | None = None) -> PluginSpec:
    """Check a spec and return it with ``source`` set.

    Checks: identity fields are non-empty strings, inputs/outputs are names, attributes have distinct names
    that do not shadow routing attributes, and defaults are values the TensorRT parser can pass. Warns when
    the name is also an ONNX op name (the TensorRT parser ignores domains: such a node reaches the plugin
    only with TensorRT >= 10.15 and a ``plugin_namespace`` attribute).

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
    validate_native_forms(spec, where)
    check_patterns(spec, where)
    if onnx.defs.has(spec.name):
        log.warning(
            "%s: plugin name '%s' is also an ONNX op; the TensorRT parser ignores domains, so only TensorRT "
            ">= 10.15 with the plugin_namespace attribute reaches the plugin (see TENSORRT_NOTES.md)",
            where,
            spec.name,
        )
    return spec


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


def plugin_files(spec: PluginSpec) -> dict[str, Path | None]:
    """Implementation files beside ``spec.py``: reference, TensorRT Python plugin, C++ dir, kernel."""
    folder = spec.source.parent if spec.source else None

    def found(name: str) -> Path | None:
        return folder / name if folder is not None and (folder / name).exists() else None

    return {
        "reference": spec.source if spec.reference is not None else None,
        "trt_plugin": found("trt_plugin.py"),
        "cpp": found("cpp"),
        "kernel": found("kernel.py"),
    }


def implementation_paths(registry: PluginRegistry, given: Sequence[str | os.PathLike] = ()) -> list[Path]:
    """Where to look for the TensorRT implementations of the loaded plugins (``find_plugin_files``).

    The folder of each loaded spec, so a plugin that a closer source overrides brings that source's
    ``trt_plugin.py`` or library and never both; then each given path that holds no spec (a library or a
    Python plugin file, a folder of built libraries).
    """
    folders = [spec.source.parent for spec in registry if spec.source is not None]
    others = [Path(p) for p in given if not (Path(p).is_dir() and _spec_files(Path(p), explicit=True))]
    return list(dict.fromkeys([*folders, *others]))


def _spec_files(folder: Path, *, explicit: bool) -> list[Path]:
    if not folder.is_dir():
        if explicit:
            raise PluginError(f"{folder}: no such plugin folder")
        log.warning("plugin folder %s does not exist; skipped", folder)
        return []
    if (folder / "spec.py").is_file():
        return [folder / "spec.py"]
    return sorted(
        sub / "spec.py"
        for sub in folder.iterdir()
        if sub.is_dir() and not sub.name.startswith((".", "_")) and (sub / "spec.py").is_file()
    )


def _module_name(folder_name: str, used: set[str]) -> str:
    base = f"{PLUGIN_PACKAGE}.{folder_name}"
    name, n = base, 1
    while name in used:
        n += 1
        name = f"{base}_{n}"
    used.add(name)
    return name


def _ensure_parent_package() -> None:
    if PLUGIN_PACKAGE in sys.modules:
        return
    try:  # the shipped package, when installed: plugin folders from elsewhere join it
        importlib.import_module(PLUGIN_PACKAGE)
    except ImportError:
        package = types.ModuleType(PLUGIN_PACKAGE, "Plugin folders loaded by gskit.plugin.spec.load_plugins.")
        package.__path__ = []
        sys.modules[PLUGIN_PACKAGE] = package


def _load_entry_point(ep: Any) -> tuple[list[Path], list[PluginSpec]]:
    """An entry point's plugin folders (it names a package: each subfolder with a spec.py is a plugin) or
    its specs (it names a PluginSpec or a list of them)."""
    where = f"entry point '{ep.name} = {ep.value}' (group {ENTRY_POINT_GROUP})"
    try:
        loaded = ep.load()
    except PLUGIN_CODE_FAILURES as err:  # third-party code
        raise PluginError(f"{where}: cannot load: {type(err).__name__}: {err}") from err
    if isinstance(loaded, types.ModuleType):
        folders = [Path(p) for p in getattr(loaded, "__path__", ())]
        if not folders:
            raise PluginError(f"{where}: names module {loaded.__name__}, not a package of plugin folders")
        return folders, []
    specs = list(loaded) if isinstance(loaded, (list, tuple)) else [loaded]
    for spec in specs:
        if not isinstance(spec, PluginSpec):
            raise PluginError(
                f"{where}: must load to a package of plugin folders, a PluginSpec or a list of them, "
                f"got {type(spec).__name__}"
            )
    return [], specs


def _version_key(version: str) -> tuple[Any, ...]:
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in version.split("."))
