"""The user's cache folder for what gskit keeps between runs (derived patterns, function sources, compiled
dataclass methods). Standard library only: the command line reads it before its heavy imports."""

from __future__ import annotations

import os
from pathlib import Path

#: Names the folder, overriding the default below.
CACHE_ENV = "GSKIT_CACHE_DIR"


def user_cache_dir() -> Path | None:
    """``$GSKIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/gskit``, else ``~/.cache/gskit``; None where none of
    them can be named (no ``$HOME`` and a user id without a passwd entry, as in ``env -i`` under an
    arbitrary uid): gskit then keeps nothing between runs, and runs as well."""
    given = os.environ.get(CACHE_ENV)
    if given:
        return Path(given)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg) / "gskit"
    try:
        home = Path.home()
    except (RuntimeError, KeyError, OSError):  # the home folder cannot be determined
        return None
    return home / ".cache" / "gskit" if home.is_absolute() else None
