"""The compiled code of the methods ``dataclasses`` writes, kept between runs of the command line.

``dataclasses`` makes each class's ``__init__``, ``__repr__``, ``__eq__`` ... by compiling source text it
writes (``exec`` of a string). gskit's command line creates about 100 dataclasses as it starts, 400
functions: 30-40 ms of compiling the same text on every run (Python 3.11). In :func:`code_kept` the module's
``exec`` takes the compiled code of a text it has seen before from a file in the user cache, compiled as
``exec`` compiles a string (no ``__future__`` flags inherited): the functions are the ones compiling makes.
Only the command line's own process does this (``gskit.cli``); a library caller's process is left as it is.

The file holds code objects (``marshal``), as ``__pycache__`` does, in the user's own cache folder, after a
header (this Python's bytecode magic number and the SHA-256 of the rest): ``marshal`` checks little of what it
loads (a damaged file raised SystemError, or asked for gigabytes, at every command's start), so only the bytes
gskit wrote are loaded. One that cannot be read is ignored, and one is written (atomically) only when the run
compiled new text.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import hashlib
import importlib.util
import marshal
import sys
from collections.abc import Iterator
from pathlib import Path
from types import CodeType
from typing import Any

from gskit.io.user_cache import read_kept, user_cache_dir

#: Above this many kept texts the file keeps only the run's own (texts of older gskit versions go).
KEPT_TEXTS = 4000


#: What the file starts with: its format, then the bytecode magic number of the Python that wrote it (code
#: objects of another build are not loaded), then the SHA-256 of what follows.
_HEADER = b"gskit dataclass code 1\n" + importlib.util.MAGIC_NUMBER


def cache_file() -> Path | None:
    """The file of this Python's compiled code (code objects differ between Python versions); None without
    a user cache folder."""
    folder = user_cache_dir()
    return None if folder is None else folder / f"dataclass-code-{sys.implementation.cache_tag}.marshal"


@contextlib.contextmanager
def code_kept(path: Path | None = None) -> Iterator[None]:
    """Within the block, ``dataclasses`` compiles each text once across runs (see the module docstring);
    the file is written on the way out when the block compiled text the file did not have."""
    path = path or cache_file()
    # No cache folder, or a module global named exec already (not the dataclasses this was written for):
    # dataclasses compiles as always.
    if path is None or "exec" in vars(dataclasses):
        yield
        return
    kept = _read(path)
    used: dict[str, CodeType] = {}
    compiled: list[str] = []

    def exec_kept(source: Any, globals: Any = None, locals: Any = None) -> None:  # noqa: A002
        if not isinstance(source, str):
            return builtins.exec(source, globals, locals)
        code = kept.get(source)
        if code is None:
            code = compile(source, "<string>", "exec", dont_inherit=True)  # as exec(source) compiles it
            compiled.append(source)
        used[source] = code
        return builtins.exec(code, globals, locals)

    # A module global named exec is what the module's own calls find first (before the builtin).
    dataclasses.exec = exec_kept  # type: ignore[attr-defined]
    try:
        yield
    finally:
        del dataclasses.exec  # type: ignore[attr-defined]
        if compiled:
            _write(path, {**kept, **used} if len(kept) + len(compiled) <= KEPT_TEXTS else used)


def _read(path: Path) -> dict[str, CodeType]:
    data = read_kept(path)
    if data is None:  # missing, unreadable, or no regular file
        return {}
    start = len(_HEADER) + hashlib.sha256().digest_size
    if data[: len(_HEADER)] != _HEADER or data[len(_HEADER) : start] != hashlib.sha256(data[start:]).digest():
        return {}  # another format or Python, or damaged
    try:
        loaded = marshal.loads(data[start:])
    except (ValueError, EOFError, TypeError):  # not this Python's marshal
        return {}
    if not isinstance(loaded, dict):
        return {}
    return {k: v for k, v in loaded.items() if isinstance(k, str) and isinstance(v, CodeType)}


def _write(path: Path, codes: dict[str, CodeType]) -> None:
    """Replace the file at once (``gskit.io.outputs.write_atomic``: a reader never sees half of it); a cache
    that cannot be written is none."""
    from gskit.errors import GskitError
    from gskit.io.outputs import write_atomic  # only when writing: the command line's start imports this

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = marshal.dumps(codes)
        write_atomic(path, _HEADER + hashlib.sha256(data).digest() + data, mode=0o600)
    except (OSError, ValueError, GskitError):
        pass
