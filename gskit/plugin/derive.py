"""``from_torch``: a plugin's patterns derived from the PyTorch code it replaces, and their caches.

``PATTERNS = from_torch(fn, example_inputs, attributes={"epsilon": 1e-5})`` in a plugin's ``patterns.py``
gives one rule per distinct graph the installed torch's exporters write for ``fn`` (see
``gskit.torch_export.derive``). The rules are built when the plugin loads, from the first of:

1. the plugin's own cache, ``derived_patterns.json`` beside the file defining ``fn`` (written by
   ``gskit plugin derive NAME``, shipped with the plugin), when it holds rules of this function for the
   installed torch and gskit versions;
2. the user cache (``$GSKIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/gskit``, else ``~/.cache/gskit``), keyed the
   same way;
3. an export now, when torch is installed (seconds; then cached in the user cache).

Rules the plugin's cache holds for other torch versions join them (other exporters' forms are real forms
too). Without torch, the plugin's cache is all there is; a plugin without it says so in one line (a
warning) and loads without derived rules. torch is imported only to export (never with a warm cache).

A function is the same function while its source, example input shapes and dtypes, attribute values,
dtypes and exporters are: the cache key hashes them (a helper the function calls is not part of the key:
``gskit plugin derive NAME`` refreshes the caches after changing one). The source is inspect's, kept in the
user cache by the hash of the file's lines (:func:`function_source`).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import inspect
import json
import linecache
import logging
import os
import stat
import sys
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gskit.errors import GskitError, PluginError
from gskit.io.dist_metadata import metadata_field
from gskit.io.outputs import write_atomic
from gskit.io.user_cache import CACHE_ENV, read_kept, user_cache_dir

if TYPE_CHECKING:  # the pattern package imports gskit.plugin.spec: imported inside the functions that need it
    from gskit.passes.patterns.derived import DerivedRuleSet
    from gskit.passes.patterns.rules import CheckFn

log = logging.getLogger(__name__)

#: The plugin's own cache file, beside the file that defines the function.
CACHE_FILE = "derived_patterns.json"
#: TorchScript exporter opsets: the default of torch < 2.6 (14, still common in the wild), 17 (its default
#: later, the first with LayerNormalization) and 18 (axes as inputs).
TORCHSCRIPT_OPSETS = (14, 17, 18)
#: dynamo exporter opsets: 18 and its own default (None).
DYNAMO_OPSETS = (18, None)
#: The exporters tried.
EXPORTERS = ("torchscript", "dynamo")
#: Input dtypes exported by default: float16 and bfloat16 bring the Casts of mixed-precision code.
DEFAULT_DTYPES = ("float32", "float16", "bfloat16")

#: What each ``from_torch`` call of this process said about its rules, by cache key (``status_of``).
_STATUS: dict[str, str] = {}


@dataclass(frozen=True)
class DerivedSource:
    """One ``from_torch`` call: what it derives from and where its caches are.

    Attributes:
        function: the function's qualified name.
        key: hash of what makes the function the same (see the module docstring).
        shipped: the plugin's own cache file.
        fn: the function or module class (to derive again).
        example_inputs: as given.
        attributes: as given.
        dtypes: exported input dtypes.
        exporters: exporters tried.
    """

    function: str
    key: str
    shipped: Path | None
    fn: Any = field(repr=False, compare=False)
    example_inputs: tuple[Any, ...] = field(repr=False, compare=False)
    attributes: Mapping[str, Any] = field(repr=False, compare=False, default_factory=dict)
    dtypes: tuple[str, ...] = DEFAULT_DTYPES
    exporters: tuple[str, ...] = EXPORTERS


@dataclass(frozen=True)
class CacheEntry:
    """The rules one torch version derived for one function."""

    function: str
    key: str
    torch: str
    gskit: str
    rules: tuple[Mapping[str, Any], ...]
    failed: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "function": self.function,
            "key": self.key,
            "torch": self.torch,
            "gskit": self.gskit,
            "failed": list(self.failed),
            "rules": list(self.rules),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CacheEntry:
        return cls(
            str(data["function"]),
            str(data["key"]),
            str(data["torch"]),
            str(data["gskit"]),
            tuple(data["rules"]),
            tuple(str(f) for f in data.get("failed", ())),
        )


def from_torch(
    fn: Any,
    example_inputs: Sequence[Any],
    attributes: Mapping[str, Any] | None = None,
    *,
    inputs: Sequence[str | None] | None = None,
    check: CheckFn | None = None,
    dtypes: Sequence[str] = DEFAULT_DTYPES,
    exporters: Sequence[str] = EXPORTERS,
    cache: str | os.PathLike | None = None,
) -> DerivedRuleSet:
    """The patterns of the computation ``fn`` describes, for ``PluginSpec(patterns=...)``.

    Args:
        fn: a function ``fn(*inputs, **attributes)`` returning the output tensor(s), or a ``torch.nn.Module``
            class built with ``fn(**attributes)`` and called with the inputs (its parameters become pattern
            inputs after the example inputs). Import torch inside the function, so that the plugin loads
            without torch from its cache.
        example_inputs: one per input: a shape (a tuple of ints: random float32 values), a numpy array or a
            torch tensor. Use sizes other than 1; every dim is exported as dynamic.
        attributes: the plugin's attributes that ``fn`` takes as keyword arguments, with typical values;
            a constant that changes with an attribute is captured as it.
        inputs: the plugin's inputs as ``fn``'s input names in the spec's order (None: absent); default
            ``fn``'s inputs in order.
        check: extra conditions on a match, ``check(match) -> MatchResult`` (e.g. weight shapes).
        dtypes: input dtypes to export with.
        exporters: ``torchscript`` and/or ``dynamo``.
        cache: the plugin's own cache file; default ``derived_patterns.json`` beside ``fn``'s file.

    Returns:
        A tuple of :class:`~gskit.passes.patterns.derived.DerivedPattern` (``status`` says where they came
        from); empty, with a warning, when torch is not installed and no cache holds them.

    Raises:
        PluginError: torch failed to export in every form, an export cannot be read as a rule (the message
            says why), or a cache file is damaged.
    """
    from gskit.passes.patterns.derived import DerivedPattern, DerivedRuleSet, RuleDescription

    attributes = dict(attributes or {})
    source = _source(fn, example_inputs, attributes, tuple(dtypes), tuple(exporters), cache)
    entries, status = _entries(source)
    descriptions: dict[Any, RuleDescription] = {}
    try:
        for entry in entries:
            for data in entry.rules:
                d = RuleDescription.from_json(data)
                descriptions.setdefault(d.canonical(), d)
        rules = [
            DerivedPattern(
                d, inputs=inputs, check=check, source=f"from_torch({source.function})", derived_from=source
            )
            for d in descriptions.values()
        ]
    except PluginError as err:
        raise PluginError(f"from_torch({source.function}): {err}") from err
    _STATUS[source.key] = status
    if not rules:
        log.warning("from_torch(%s): %s", source.function, status)
    return DerivedRuleSet(rules, status)


def status_of(source: DerivedSource) -> str:
    """The line the last ``from_torch`` call of ``source`` said about where its rules came from."""
    return _STATUS.get(source.key, "")


def _source(
    fn: Any,
    example_inputs: Sequence[Any],
    attributes: Mapping[str, Any],
    dtypes: tuple[str, ...],
    exporters: tuple[str, ...],
    cache: str | os.PathLike | None,
) -> DerivedSource:
    name = getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))
    try:
        text = function_source(fn)
        file = inspect.getsourcefile(fn)
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        text = repr((code.co_code, code.co_consts)) if code is not None else repr(fn)
        file = None
    described = [_describe_example(x) for x in example_inputs]
    material = json.dumps(
        [name, text, described, sorted((k, repr(v)) for k, v in attributes.items()), dtypes, exporters],
        default=str,
    )
    from gskit.passes.patterns.derived import FORMAT

    key = hashlib.sha256(f"{FORMAT}\n{material}".encode()).hexdigest()[:24]
    shipped = Path(cache) if cache is not None else (Path(file).parent / CACHE_FILE if file else None)
    return DerivedSource(name, key, shipped, fn, tuple(example_inputs), dict(attributes), dtypes, exporters)


def function_source(fn: Any) -> str:
    """``inspect.getsource(fn)``, read from the user cache when it holds the source of ``fn`` for these very
    lines of its file (and this Python, whose ``inspect`` finds the block); else asked of inspect and cached.

    inspect finds a function's block by tokenizing its file from the function on (4-5 ms for the shipped
    plugins' functions, most of it compiling tokenize's patterns, in each process that loads them). The
    lines are the file's as it is now (read again, and left in ``linecache`` where inspect reads them), so an
    edited file is hashed anew and never served an old block. Functions only (no class, no wrapped or
    unusual object); a missing, damaged or unwritable cache only means asking inspect.

    Raises:
        OSError, TypeError: as ``inspect.getsource`` (the source cannot be found).
    """
    if not isinstance(fn, types.FunctionType) or hasattr(fn, "__wrapped__"):
        return inspect.getsource(fn)
    file = inspect.getsourcefile(fn)
    if not file:
        return inspect.getsource(fn)
    lines = _source_lines(fn, file)
    if not lines:
        return inspect.getsource(fn)
    folder = user_cache_dir()
    if folder is None:
        return inspect.getsource(fn)
    digest = hashlib.sha256("".join(lines).encode("utf-8", "surrogatepass")).hexdigest()
    path = folder / "function-sources" / f"{digest[:40]}-{_PYTHON}.json"
    entry = f"{fn.__qualname__}:{fn.__code__.co_firstlineno}"
    known = _read_sources(path)
    text = known.get(entry)
    if isinstance(text, str):
        return text
    text = inspect.getsource(fn)
    if _source_lines(fn, file) == lines:  # inspect read the lines hashed (the file did not change between)
        _write_sources(path, {**known, entry: text})
    return text


#: The Python whose inspect found the cached blocks (its rules changed between releases).
_PYTHON = f"{sys.implementation.name}{'.'.join(str(v) for v in sys.version_info[:3])}"


def _source_lines(fn: types.FunctionType, file: str) -> list[str]:
    """The lines of ``file`` as they are now, left in ``linecache`` for inspect to read.

    Read again each time: linecache keeps a file's lines while its size and modification time stay, so a
    plugin edited within the same second to the same size (and loaded again in this process) kept the old
    lines, and its function the old source and cache key.
    """
    module = inspect.getmodule(fn, file)
    return linecache.updatecache(file, module.__dict__ if module else None)


#: The cache files this process read or wrote, by path (their names hold the hash of the lines they serve).
_SOURCES: dict[Path, dict[str, Any]] = {}


def _read_sources(path: Path) -> dict[str, Any]:
    if path not in _SOURCES:
        try:
            data = json.loads(read_kept(path) or b"{}")
        except ValueError:  # damaged: asked of inspect and written again
            data = {}
        _SOURCES[path] = data if isinstance(data, dict) else {}
    return _SOURCES[path]


#: How many function-source files the cache keeps: each edit of a plugin file adds one, so a plugin
#: author's edits would otherwise pile up. The oldest written go first; one still in use is asked of
#: inspect again.
SOURCE_FILES_KEPT = 256


def _write_sources(path: Path, sources: Mapping[str, str]) -> None:
    _SOURCES[path] = dict(sources)
    try:
        write_json_atomic(path, dict(sources))
    except (OSError, GskitError) as err:  # a read-only cache: inspect is asked again next time
        log.debug("could not cache function sources in %s: %s", path, err)
        return
    _prune_sources(path.parent, keep=path)


def _prune_sources(folder: Path, keep: Path) -> None:
    """Remove the oldest-written source files of ``folder`` beyond :data:`SOURCE_FILES_KEPT`, never
    ``keep``."""
    try:
        files = [
            (entry.stat().st_mtime_ns, Path(entry.path))
            for entry in os.scandir(folder)
            if entry.name.endswith(".json")
        ]
    except OSError:  # the folder went away or cannot be listed: nothing to prune
        return
    excess = len(files) - SOURCE_FILES_KEPT
    for _, old in sorted(files)[: max(excess, 0)]:
        if old != keep:
            try:
                old.unlink()
            except OSError:  # another process removed it, or a read-only folder
                pass


def _describe_example(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return ["shape", list(value)]
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    return ["tensor", list(shape) if shape is not None else None, str(dtype)]


@functools.lru_cache(maxsize=1)
def torch_version() -> str | None:
    """The installed torch's version (without its build tag), found without importing torch; None when it is
    not installed."""
    try:
        if importlib.util.find_spec("torch") is None:
            return None
    except (ImportError, ValueError):  # a stub torch in sys.modules (None) reads as not installed
        return None
    try:
        dist = importlib.metadata.distribution("torch")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
    version = metadata_field(dist, "Version")  # torch's long description unparsed
    return version.split("+", 1)[0]  # 2.13.0+cpu and 2.13.0+cu126 export alike


def gskit_version() -> str:
    from gskit import __version__

    return __version__


def _user_file(source: DerivedSource, torch: str) -> Path | None:
    """The user cache's file of ``source``'s rules derived with ``torch``; None without a cache folder."""
    folder = user_cache_dir()
    if folder is None:
        return None
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in source.function)
    return folder / "derived-patterns" / f"{safe}-{source.key}-torch{torch}-gskit{gskit_version()}.json"


def read_cache_file(path: Path) -> list[CacheEntry]:
    """The entries of a cache file ([] when it does not exist).

    Raises:
        PluginError: the file is not a cache file of this format (names the file).
    """
    try:
        info = path.stat()
    except OSError:
        return []
    if not stat.S_ISREG(info.st_mode):
        return []
    return list(_read_cache_file(path, info.st_mtime_ns, info.st_size))


@functools.lru_cache(maxsize=64)
def _read_cache_file(path: Path, mtime_ns: int, size: int) -> tuple[CacheEntry, ...]:
    """One parse per file version: a plugin's functions share its file (``mtime_ns`` and ``size`` key it)."""
    from gskit.passes.patterns.derived import FORMAT

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != FORMAT:
            log.info("%s: cache format %s, not %s: not used", path, data.get("format"), FORMAT)
            return ()
        return tuple(CacheEntry.from_json(e) for e in data["entries"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise PluginError(
            f"{path}: not a derived-pattern cache ({type(err).__name__}: {err}); delete it or write it again "
            "with `gskit plugin derive NAME`"
        ) from err


def _entries(source: DerivedSource) -> tuple[list[CacheEntry], str]:
    """The cache entries whose rules the plugin gets, and one line saying where they came from."""
    torch = torch_version()
    gskit = gskit_version()
    shipped_path = source.shipped
    shipped = [e for e in read_cache_file(shipped_path) if e.key == source.key] if shipped_path else []
    if torch is None:
        if not shipped:
            where = f"{shipped_path} has" if shipped_path and shipped_path.is_file() else "there are"
            return [], (
                f"no derived rules: torch is not installed and {where} no rules for {source.function} as it "
                "is now (write them with `gskit plugin derive NAME` where torch is installed)"
            )
        versions = ", ".join(sorted({e.torch for e in shipped}))
        return shipped, f"{_count(shipped)} from {shipped_path} (torch {versions}; torch is not installed)"
    current = [e for e in shipped if e.torch == torch and e.gskit == gskit]
    others = [e for e in shipped if e.torch != torch]
    if current:
        return [*current, *others], f"{_count(current)} from {shipped_path} (torch {torch})"
    user = _user_file(source, torch)
    cached = [e for e in _quiet_read(user) if e.key == source.key]
    if cached:
        return [*cached, *others], f"{_count(cached)} from the cache {user} (torch {torch})"
    entry, seconds, exports = _derive_now(source, torch, gskit)
    if user is not None:
        _write_user_cache(user, entry)
    kept = f"cached in {user}" if user is not None else f"not cached (no cache folder: set ${CACHE_ENV})"
    return [entry, *others], (
        f"{_count([entry])} derived with torch {torch} ({exports} exports, {seconds:.1f} s), {kept}"
    )


def _count(entries: Sequence[CacheEntry]) -> str:
    n = sum(len(e.rules) for e in entries)
    return f"{n} rule{'s' if n != 1 else ''}"


def _quiet_read(path: Path | None) -> list[CacheEntry]:
    if path is None:  # no user cache folder
        return []
    try:
        return read_cache_file(path)
    except PluginError as err:  # the user cache is ours: a damaged file is derived again
        log.warning("%s", err)
        return []


def _derive_now(
    source: DerivedSource, torch: str, gskit: str, *, why: str = "no cached rules"
) -> tuple[CacheEntry, float, int]:
    from gskit.torch_export import derive  # torch only when deriving

    log.warning(
        "from_torch(%s): %s for torch %s: exporting it now (once per torch and gskit version)",
        source.function,
        why,
        torch,
    )
    try:
        found = derive.derive_descriptions(
            source.fn,
            source.example_inputs,
            source.attributes,
            name=source.function.rsplit(".", 1)[-1],
            dtypes=source.dtypes,
            exporters=source.exporters,
        )
    except GskitError as err:
        raise PluginError(str(err)) from err
    entry = CacheEntry(
        source.function,
        source.key,
        torch,
        gskit,
        tuple(d.to_json() for d in found.rules),
        tuple(found.failed),
    )
    return entry, found.seconds, found.exports


def _write_user_cache(path: Path, entry: CacheEntry) -> None:
    from gskit.passes.patterns.derived import FORMAT

    try:
        write_json_atomic(path, {"format": FORMAT, "entries": [entry.to_json()]})
    except OSError as err:  # a read-only home: derive again next time rather than fail
        log.warning("could not write the derived-pattern cache %s: %s", path, err)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to ``path`` atomically (``gskit.io.outputs.write_atomic``: a temporary file, a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=1, default=_json_default) + "\n"
    umask = os.umask(0)
    os.umask(umask)
    write_atomic(path, text, mode=0o666 & ~umask)  # a shipped file, readable like the rest


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON")


def sources_of(patterns: Sequence[Any]) -> list[DerivedSource]:
    """The ``from_torch`` calls a plugin's patterns came from, each once."""
    found: dict[str, DerivedSource] = {}
    for rule in patterns:
        source = getattr(rule, "derived_from", None)
        if isinstance(source, DerivedSource):
            found.setdefault(source.key, source)
    return list(found.values())


def write_plugin_cache(sources: Sequence[DerivedSource], *, fresh: bool = False) -> list[Path]:
    """Write the plugin caches of ``sources`` for the installed torch (``gskit plugin derive``).

    The rules come from the user cache when it holds this torch's (the plugin just loaded derived them),
    else, or with ``fresh``, from exporting again. Entries of other torch versions for the same functions
    stay; entries of functions no source names any more are dropped.

    Raises:
        PluginError: torch is not installed, a function has no source file, or deriving fails.
    """
    from gskit.passes.patterns.derived import FORMAT

    torch = torch_version()
    if torch is None:
        raise PluginError("deriving rules needs torch: pip install gskit[torch]")
    by_file: dict[Path, list[CacheEntry]] = {}
    for source in sources:
        if source.shipped is None:
            raise PluginError(
                f"from_torch({source.function}): the function has no source file to cache beside"
            )
        cached = [] if fresh else [e for e in _quiet_read(_user_file(source, torch)) if e.key == source.key]
        entry = cached[0] if cached else _derive_now(source, torch, gskit_version(), why="deriving anew")[0]
        by_file.setdefault(source.shipped, []).append(entry)
    written = []
    for path, entries in by_file.items():
        keys = {e.key for e in entries}
        kept = [e for e in read_cache_file(path) if e.key in keys and e.torch != torch]
        merged = sorted([*entries, *kept], key=lambda e: (e.function, e.torch))
        write_json_atomic(path, {"format": FORMAT, "entries": [e.to_json() for e in merged]})
        written.append(path)
    return written
