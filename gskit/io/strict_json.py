"""Strict JSON (RFC 8259) for machines: every command's ``--json`` output and report.json go through here.

A float that is not finite is written as the string ``"inf"``, ``"-inf"`` or ``"nan"`` (``float()`` reads each
back), never as the ``Infinity``/``NaN`` tokens other parsers reject. Kept apart from :mod:`gskit.io.report`'s
tables so that writing JSON does not import rich.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from enum import Enum
from pathlib import Path
from typing import Any

#: How JSON output writes a float that is not finite (strict JSON has no token for them).
NON_FINITE = {math.inf: "inf", -math.inf: "-inf"}


def to_jsonable(obj: Any) -> Any:
    """Turn dataclasses, paths, enums, numpy scalars and tuples into plain JSON values.

    A float that is not finite becomes ``"inf"``, ``"-inf"`` or ``"nan"``.
    """
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else NON_FINITE.get(obj, "nan")
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, Enum):
        return obj.value
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalar
        return to_jsonable(obj.item())
    return obj


def dumps(obj: Any) -> str:
    """Strict JSON (``allow_nan=False``; :func:`to_jsonable` has mapped inf and NaN to strings)."""
    return json.dumps(to_jsonable(obj), indent=2, sort_keys=False, allow_nan=False)


def print_json(obj: Any, file=None) -> None:
    print(dumps(obj), file=file or sys.stdout)
