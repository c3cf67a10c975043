"""Where plugins come from: the plugin sources and their precedence (shipped, installed packages'
``gskit.plugins`` entry points, ``$GSKIT_PLUGINS``, ``./plugins``, ``--plugins``), loading their ``spec.py``
files into a :class:`~gskit.plugin.registry.PluginRegistry`, and the implementation files beside each spec.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import logging
import os
import py_compile
import sys
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib.metadata import EntryPoint, distributions
from importlib.metadata import entry_points as _entry_points
from pathlib import Path
from typing import Any

from gskit.errors import PLUGIN_CODE_FAILURES, PluginError
from gskit.io.code_files import import_file
from gskit.io.dist_metadata import metadata_field
from gskit.plugin.registry import PluginRegistry
from gskit.plugin.spec import PluginSpec

log = logging.getLogger(__name__)

#: Environment variable listing plugin folders (``os.pathsep``-separated).
PLUGINS_ENV = "GSKIT_PLUGINS"
#: Entry point group whose entries load to a PluginSpec or a list of them.
ENTRY_POINT_GROUP = "gskit.plugins"
#: Parent package under which each plugin folder is imported (``gskit_plugins.<folder>``).
PLUGIN_PACKAGE = "gskit_plugins"

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
        resolved = spec_file.resolve()
        if resolved in loaded_files:
            continue
        loaded_files.add(resolved)
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
    for ep in group_entry_points(ENTRY_POINT_GROUP):
        # the Name header alone: ep.dist.name parses the whole metadata (gskit's README: 1-2 ms)
        dist = metadata_field(ep.dist, "Name") if ep.dist is not None else "?"
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


def group_entry_points(group: str) -> list[EntryPoint]:
    """``importlib.metadata.entry_points(group=group)``: the same entry points, in the same order.

    The standard call parses every installed distribution's entry points and sorts them all by group (4-8
    ms of each command that loads plugins); here a distribution's ``entry_points.txt`` is parsed only when
    its text names ``group``, which it must to hold an entry of it. Each distribution name counts once, the
    first found on the path, as the standard call does (by the same normalized name).
    """
    seen: set[str] = set()
    found: list[EntryPoint] = []
    for dist in distributions():
        name = getattr(dist, "_normalized_name", None)  # the key importlib.metadata tells them apart by
        if not isinstance(name, str):  # an importlib.metadata without it: ask it
            return list(_entry_points(group=group))
        if name in seen:
            continue
        seen.add(name)
        text = dist.read_text("entry_points.txt")
        if text and group in text:
            found += dist.entry_points.select(group=group)
    return found


def _normalized(dist_name: str) -> str:
    return dist_name.lower().replace("_", "-").replace(".", "-")


def load_spec_file(path: str | os.PathLike, module_name: str | None = None) -> list[PluginSpec]:
    """Import one ``spec.py`` as a package and return its specs with ``source`` set.

    The specs are validated when added to a :class:`PluginRegistry` (``load_plugins`` does both).

    Raises:
        PluginError: the file cannot be imported, defines no SPEC/SPECS, or SPEC is not a PluginSpec.
    """
    path = Path(path).resolve()
    module_name = module_name or f"{PLUGIN_PACKAGE}.{path.parent.name}"
    _ensure_parent_package()
    for name in _package_modules(module_name):
        del sys.modules[name]  # a reload must see the files as they are now
    # No bytecode written by the import: a timestamp-checked .pyc would be stale after two edits of a file
    # within a second (the same size). The files it imported get hash-checked ones instead, below.
    no_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        module = import_file(module_name, path, PLUGIN_CODE_FAILURES)
    except PLUGIN_CODE_FAILURES as err:  # user code: any failure becomes one line naming the file
        raise PluginError(f"{path}: cannot import plugin: {type(err).__name__}: {err}") from err
    finally:
        sys.dont_write_bytecode = no_bytecode
    if not no_bytecode:  # the process may write bytecode (no PYTHONDONTWRITEBYTECODE, no -B)
        _hash_checked_bytecode(_imported_files(module_name, path.parent))
    if module is None:
        raise PluginError(f"{path}: cannot be imported as a Python module")
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


def import_plugin_module(name: str, package: types.ModuleType | None = None) -> types.ModuleType:
    """Import the module ``name`` of a plugin package as :func:`load_spec_file` imports the package: no
    timestamp-checked bytecode written, hash-checked bytecode after, any failure one line naming the file.

    Args:
        name: the module's full name (``gskit_plugins.rms_norm.patterns``).
        package: the package module it belongs to, as it was when its spec loaded: the module comes from
            that package's folder even when a later load put another package under the same name.

    Raises:
        PluginError: the module's code failed or it cannot be found.
    """
    parent = name.rpartition(".")[0]
    where = getattr(package, "__file__", None) or parent or name
    before = set(sys.modules)
    no_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        with _package_in_place(parent, package):
            module = importlib.import_module(name)
            added = [sys.modules[n] for n in sys.modules.keys() - before]
    except PLUGIN_CODE_FAILURES as err:  # user code: any failure becomes one line naming the file
        raise PluginError(f"{where}: cannot import {name}: {type(err).__name__}: {err}") from err
    finally:
        sys.dont_write_bytecode = no_bytecode
    folders = [Path(p) for p in getattr(package, "__path__", ())]
    if not no_bytecode and folders:  # the files this import read (the spec's were cached when it loaded)
        _hash_checked_bytecode(_files_in(added, folders[0]))
    return module


@contextlib.contextmanager
def _package_in_place(parent: str, package: types.ModuleType | None) -> Iterator[None]:
    """``package`` under its name in ``sys.modules`` while one of its modules is imported: a later load of
    a folder of the same name put another package there (its modules are put back afterwards)."""
    if package is None or sys.modules.get(parent) is package:
        yield
        return
    current = {n: sys.modules.pop(n) for n in _package_modules(parent)}
    sys.modules[parent] = package
    try:
        yield
    finally:
        for n in _package_modules(parent):
            del sys.modules[n]
        sys.modules.update(current)


def _imported_files(module_name: str, folder: Path) -> list[Path]:
    """The files in ``folder`` that the plugin module ``module_name`` and its submodules come from."""
    return _files_in([sys.modules.get(name) for name in _package_modules(module_name)], folder)


def _files_in(modules: Sequence[types.ModuleType | None], folder: Path) -> list[Path]:
    """The Python files in ``folder`` that ``modules`` come from."""
    files = []
    for module in modules:
        file = getattr(module, "__file__", None)
        if file and file.endswith(".py") and Path(file).resolve().is_relative_to(folder):
            files.append(Path(file))
    return files


def _package_modules(module_name: str) -> list[str]:
    """The loaded modules ``module_name`` and its submodules (one pass over the loaded modules' names)."""
    prefix = module_name + "."
    return [name for name in list(sys.modules) if name == module_name or name.startswith(prefix)]


def _hash_checked_bytecode(sources: Sequence[Path]) -> None:
    """Cache the bytecode of a plugin's Python files as ``.pyc`` files that the import checks against the
    source's hash (``py_compile``'s CHECKED_HASH): never stale, and not compiled again on each load
    (compiling the shipped plugins took 20-40 ms a run).

    A file whose ``.pyc`` is current is left alone; one that cannot be compiled or written keeps being
    compiled by its import, as before.
    """
    checked_hash = (1 | 2).to_bytes(4, "little")  # PEP 552 flags: hash-based, checked
    for source in sources:
        cached = Path(importlib.util.cache_from_source(str(source)))
        try:
            code = source.read_bytes()
            header = cached.read_bytes()[:16] if cached.is_file() else b""
        except OSError:
            continue
        current = importlib.util.MAGIC_NUMBER + checked_hash + importlib.util.source_hash(code)
        if header == current or not _writable(cached.parent):
            continue
        try:
            py_compile.compile(
                str(source),
                cfile=str(cached),
                doraise=True,
                invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
            )
        except (py_compile.PyCompileError, OSError, ValueError):
            continue


def _writable(folder: Path) -> bool:
    """Whether a file can be made in ``folder`` (in its nearest existing parent, while it is not made)."""
    while not folder.exists() and folder.parent != folder:
        folder = folder.parent
    return os.access(folder, os.W_OK)


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
        package = types.ModuleType(
            PLUGIN_PACKAGE, "Plugin folders loaded by gskit.plugin.discovery.load_plugins."
        )
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
