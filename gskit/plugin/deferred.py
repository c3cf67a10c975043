"""A plugin's patterns imported when something first reads them (:func:`patterns_in`).

A plugin's rules are built when its ``patterns.py`` is imported: that imports gskit's pattern machinery and
traces every rule (about 50 ms for the shipped plugins, more than the rest of their loading). Only replacing
(and the commands that show or check patterns) reads them; ``compare``, ``check-trt`` and validation need a
plugin's output rule and reference alone. So ``PluginSpec(patterns=patterns_in(".patterns", __package__))``
leaves the import to the first reader, and the checks made of patterns when a spec loads
(``gskit.plugin.spec.check_patterns``, ``PluginRegistry.check_plugin_ops``) run then, with the same messages.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import Any, overload

from gskit.errors import PluginError


class DeferredPatterns(Sequence[Any]):
    """The rules a module of a plugin package holds (its ``PATTERNS``), imported on first use.

    A sequence like the tuple of rules it stands for. The checks that need the rules wait in
    :meth:`check_when_loaded`; one that fails makes every later read raise the same error (a rule found bad
    is never used).
    """

    def __init__(self, module: str, package: str | None = None, attribute: str = "PATTERNS") -> None:
        self.module = importlib.util.resolve_name(module, package) if module.startswith(".") else module
        self.attribute = attribute
        parent = self.module.rpartition(".")[0]
        # The plugin package as it is now: a later load of the same folder replaces it in sys.modules, and
        # the rules of this spec must come from this one's folder.
        self._package: ModuleType | None = sys.modules.get(parent)
        self._rules: tuple[Any, ...] | None = None
        self._error: PluginError | None = None
        self._checks: dict[str, Callable[[], None]] = {}

    @property
    def loaded(self) -> bool:
        """Whether the rules were imported (and checked) already."""
        return self._rules is not None and self._error is None

    def check_when_loaded(self, key: str, check: Callable[[], None]) -> None:
        """Run ``check`` (it raises PluginError) once the rules are imported: now when they are. A second
        check under the same ``key`` replaces the first (a spec validated again)."""
        if self._rules is None:
            self._checks[key] = check
        elif self._error is None:
            check()

    def rules(self) -> tuple[Any, ...]:
        """The rules, imported and checked on the first call.

        Raises:
            PluginError: the module cannot be imported, holds no sequence under the attribute, or a check
                found a rule bad (raised again on every call).
        """
        if self._error is not None:
            raise self._error
        if self._rules is None:
            try:
                self._rules = self._import()
                checks, self._checks = self._checks, {}
                for check in checks.values():
                    check()
            except PluginError as err:
                self._error = err
                raise
        return self._rules

    def _import(self) -> tuple[Any, ...]:
        from gskit.plugin.discovery import import_plugin_module  # discovery builds specs of this module

        module = import_plugin_module(self.module, self._package)
        found = getattr(module, self.attribute, None)
        if not isinstance(found, (list, tuple)):
            raise PluginError(
                f"{getattr(module, '__file__', self.module)}: {self.attribute} must be a list or tuple of "
                f"pattern rules, not {type(found).__name__}"
            )
        return tuple(found)

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Any]: ...

    def __getitem__(self, index: int | slice) -> Any:
        return self.rules()[index]

    def __len__(self) -> int:
        return len(self.rules())

    def __iter__(self) -> Iterator[Any]:
        return iter(self.rules())

    def __eq__(self, other: object) -> bool:
        """Equal to the same rules as a tuple or list (what the spec would hold without deferring)."""
        if other is self:
            return True
        if not isinstance(other, (tuple, list, DeferredPatterns)):
            return NotImplemented
        return self.rules() == tuple(other)

    def __hash__(self) -> int:
        return hash(self.rules())  # as the tuple it stands for: equal sequences hash alike

    def __repr__(self) -> str:
        state = f"{len(self._rules or ())} rules" if self.loaded else "not imported yet"
        return f"patterns_in({self.module!r}, {self.attribute!r}: {state})"


def patterns_in(module: str, package: str | None = None, attribute: str = "PATTERNS") -> DeferredPatterns:
    """A plugin's patterns, for ``PluginSpec(patterns=...)``, imported when first read.

    In a plugin's ``spec.py``: ``patterns=patterns_in(".patterns", __package__)`` (the rules are the
    ``PATTERNS`` of the plugin's ``patterns.py``; ``__package__`` names the plugin's package both when gskit
    loads ``spec.py`` as the package and when a test imports it as ``NAME.spec``).

    Args:
        module: the module that holds the rules; relative (``.patterns``) to ``package``.
        package: the package of a relative ``module``: ``__package__`` in a plugin's ``spec.py``.
        attribute: the name of the rules' tuple in that module.
    """
    return DeferredPatterns(module, package, attribute)


def check_when_read(patterns: Sequence[Any], key: str, check: Callable[[], None]) -> None:
    """Run ``check`` of a spec's ``patterns`` now where they are built (a tuple, or imported already), else
    when a reader first imports them (:meth:`DeferredPatterns.check_when_loaded`)."""
    if isinstance(patterns, DeferredPatterns):
        patterns.check_when_loaded(key, check)
    else:
        check()
