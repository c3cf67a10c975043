"""Tables for people and JSON for machines: every command's report goes through here."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterable, Sequence
from enum import Enum
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text


def to_jsonable(obj: Any) -> Any:
    """Turn dataclasses, paths, enums, numpy scalars and tuples into plain JSON values."""
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
        return obj.item()
    return obj


def dumps(obj: Any) -> str:
    return json.dumps(to_jsonable(obj), indent=2, sort_keys=False)


def print_json(obj: Any, file=None) -> None:
    print(dumps(obj), file=file or sys.stdout)


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
    """A table whose cells show text as it is: ``[batch, 3]`` stays a shape, not a style tag.

    Cells that are rich ``Text`` (e.g. from :func:`verdict`) keep their styling.
    """
    t = Table(title=escape(title), title_justify="left", header_style="bold")
    for column in columns:
        t.add_column(escape(column))
    for row in rows:
        t.add_row(*(v if isinstance(v, Text) else escape("" if v is None else str(v)) for v in row))
    return t


def verdict(passed: bool) -> Text:
    """A green "pass" or a red "FAIL" table cell."""
    return Text("pass", style="green") if passed else Text("FAIL", style="red")


def console(stderr: bool = False) -> Console:
    """A rich console; when output goes to a file or pipe, tables get 160 columns instead of 80."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else 160
    return Console(stderr=stderr, highlight=False, soft_wrap=False, width=width)
