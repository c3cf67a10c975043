"""The user's cache folder for what gskit keeps between runs (derived patterns, function sources, compiled
dataclass methods). Standard library only: the command line reads it before its heavy imports."""

from __future__ import annotations

import os
import stat
from pathlib import Path

#: Names the folder, overriding the default below.
CACHE_ENV = "GSKIT_CACHE_DIR"


def user_cache_dir() -> Path | None:
    """``$GSKIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/gskit`` (when absolute), else ``~/.cache/gskit``; None
    where none of them can be named (no ``$HOME`` and a user id without a passwd entry, as in ``env -i``
    under an arbitrary uid): gskit then keeps nothing between runs, and runs as well."""
    given = os.environ.get(CACHE_ENV)
    if given:
        return Path(given)
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    # The XDG specification: a relative path is invalid and ignored (it named a folder in the work folder)
    if os.path.isabs(xdg):
        return Path(xdg) / "gskit"
    try:
        home = Path.home()
    except (RuntimeError, KeyError, OSError):  # the home folder cannot be determined
        return None
    return home / ".cache" / "gskit" if home.is_absolute() else None


#: The largest cache file read (gskit writes far smaller ones): a larger one is not read, but written again.
READ_LIMIT = 64 * 2**20


def read_kept(path: Path, limit: int = READ_LIMIT) -> bytes | None:
    """The bytes of the cache file ``path``; None when it is missing or unreadable, or is no regular file
    or larger than ``limit``, so a FIFO, a device or a link to one placed at its name is not waited on or
    read without end (the file is opened without waiting, then checked), or when another user owns it: the
    cache holds code gskit runs, and a cache folder that others can write (``$GSKIT_CACHE_DIR`` or
    ``$XDG_CACHE_HOME`` naming a shared folder, another user's cache under ``sudo``) must not run theirs."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        mine = not hasattr(os, "geteuid") or info.st_uid == os.geteuid()  # POSIX: owners; elsewhere none
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit or not mine:
            return None
        with os.fdopen(fd, "rb", closefd=False) as file:
            return file.read(limit + 1)[:limit]
    except OSError:
        return None
    finally:
        os.close(fd)
