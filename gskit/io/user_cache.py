"""The user's cache folder for what gskit keeps between runs (derived patterns, function sources, compiled
dataclass methods). Standard library only: the command line reads it before its heavy imports."""

from __future__ import annotations

import os
from pathlib import Path

#: Names the folder, overriding the default below.
CACHE_ENV = "GSKIT_CACHE_DIR"


def user_cache_dir() -> Path:
    """``$GSKIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/gskit``, else ``~/.cache/gskit``."""
    given = os.environ.get(CACHE_ENV)
    if given:
        return Path(given)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "gskit"
