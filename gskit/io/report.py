"""Tables for people and JSON for machines: every command's report goes through here."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Hashable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from gskit.io import progress


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
    """A rich console; when output goes to a file or pipe, tables get 160 columns instead of 80.

    ``NO_COLOR`` (https://no-color.org, any non-empty value) turns off every ANSI escape, bold and italic
    included (rich alone keeps those), also on a terminal and with ``FORCE_COLOR``.
    """
    stream = sys.stderr if stderr else sys.stdout
    width = None if _isatty(stream) else 160
    plain = bool(os.environ.get("NO_COLOR"))
    return Console(
        stderr=stderr,
        highlight=False,
        soft_wrap=False,
        width=width,
        no_color=plain or None,
        color_system=None if plain else "auto",
    )


def _isatty(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


class _Count(MofNCompleteColumn):
    """``3/12``; nothing for a task without a total (rich would show ``3/?``)."""

    def render(self, task: Any) -> Text:
        return super().render(task) if task.total is not None else Text("")


class _RichDisplay:
    """gskit's progress tasks as rich progress bars (a spinner for a task without a total)."""

    def __init__(self, out: Console) -> None:
        self.bars = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            _Count(),
            TimeElapsedColumn(),
            console=out,
            transient=True,  # the bars go when done; the command's own lines and tables stay
        )

    def start(self, description: str, total: int | None) -> Hashable:
        return self.bars.add_task(escape(description), total=total)

    def advance(self, handle: Hashable, amount: int) -> None:
        self.bars.advance(TaskID(int(handle)), amount)  # type: ignore[call-overload]

    def stop(self, handle: Hashable) -> None:
        self.bars.remove_task(TaskID(int(handle)))  # type: ignore[call-overload]


@contextmanager
def progress_display(enabled: bool = True, out: Console | None = None) -> Iterator[None]:
    """Show the progress of long steps (:mod:`gskit.io.progress`) on stderr while the context runs.

    Nothing is drawn when ``enabled`` is False (``--json``), when ``out`` (default: a stderr console) is
    not an interactive terminal, so logs, pipes and CI files get no bars and no escapes, or under ``NO_COLOR``
    (no escape sequence at all, not even the cursor moves of a bar).
    """
    out = out or console(stderr=True)
    # is_interactive: a terminal that is not TERM=dumb; isatty: FORCE_COLOR makes rich call a CI log file a
    # terminal, and bars redrawn there would fill the log; NO_COLOR: plain text, and bars move the cursor
    # with escapes
    if not enabled or not out.is_interactive or not _isatty(out.file) or out.no_color:
        yield
        return
    display = _RichDisplay(out)
    with display.bars, progress.shown_by(display):
        yield
