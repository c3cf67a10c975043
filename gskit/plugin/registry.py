"""The loaded plugin specs (:class:`PluginRegistry`), looked up by ``(namespace, name, version)`` or by node;
nothing is registered globally. :func:`gskit.plugin.discovery.load_plugins` builds one from the plugin
sources."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import onnx
import onnx_graphsurgeon as gs

from gskit.errors import PluginError
from gskit.plugin.deferred import DeferredPatterns, check_when_read
from gskit.plugin.ops import node_key
from gskit.plugin.spec import PluginSpec, validate_spec


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

    def import_patterns(self) -> None:
        """Import every plugin's patterns that wait to be read (``patterns_in``), with their checks: a run
        that will replace calls it first, so that a bad rule fails before any step runs.

        Raises:
            PluginError: a plugin's patterns cannot be imported or a rule is bad (naming the file).
        """
        for spec in self._specs.values():
            if isinstance(spec.patterns, DeferredPatterns):
                spec.patterns.rules()

    def check_plugin_ops(self) -> None:
        """A pattern that names an op of its own plugin's namespace names a loaded plugin of it.

        Ops of other non-ONNX domains are not checked: a rule may match a third party's custom node (an
        exporter symbolic's ``custom::deform_conv2d``) that no plugin defines.

        Raises:
            PluginError: naming the pattern, the op and the plugins of that namespace.
        """
        for spec in self._specs.values():  # deferred patterns: against the plugins loaded when read
            check_when_read(
                spec.patterns, f"ops of {spec.qualified_name}", lambda spec=spec: self._check_plugin_ops(spec)
            )

    def _check_plugin_ops(self, spec: PluginSpec) -> None:
        names = {s.name for s in self._specs.values() if s.domain == spec.domain}
        for rule in spec.patterns:
            for domain, op in sorted(rule.ops()):
                if domain == spec.domain and op not in names:
                    raise PluginError(
                        f"{spec.source or spec.qualified_name}: pattern '{rule.name}' names op "
                        f"'{domain}::{op}', but no loaded plugin of namespace '{domain}' is called {op} "
                        f"(there are: {', '.join(sorted(names))})"
                    )


def _version_key(version: str) -> tuple[Any, ...]:
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in version.split("."))
