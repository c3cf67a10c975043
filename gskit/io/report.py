"""Tables for people: every command's report to a terminal, a pipe or a file goes through here.

Text from models and paths is data: the console of :func:`console` never reads markup (``[/]``, ``[red]``) or
emoji codes in a string, and shows every control character as its escape (:mod:`gskit.io.text`), in the
lines it prints, in table cells and in progress bars. Styles come only from ``rich.text.Text`` objects that
gskit builds (:func:`styled`, :func:`verdict`). JSON for machines is :mod:`gskit.io.strict_json` (its names
are importable from here too), which does not import rich.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Hashable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rich.console import Console
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
from rich.text import Span, Text

from gskit.io import progress

# The JSON half lives in strict_json (no rich import); these names are kept here for callers.
from gskit.io.strict_json import NON_FINITE, dumps, print_json, to_jsonable  # noqa: F401
from gskit.io.text import escape_char, is_visible, visible


def data(value: Any) -> Text:
    """``value`` as text that is only data: never markup or emoji, every control character escaped.

    The one way text from a model, a path or a file becomes something to print (``None`` is empty).
    """
    return Text(visible("" if value is None else str(value)))


def lines(values: Iterable[Any]) -> Text:
    """One table cell of several lines, one value (shown as :func:`data`) per line."""
    return Text("\n").join(data(v) for v in values)


def styled(*parts: str | tuple[str, str] | Text) -> Text:
    """One line of styled text: each part a string (shown as :func:`data`), a ``(text, style)`` pair whose
    text is shown as data, or a ``Text`` gskit built. ``styled(("validation passed", "green"))``."""
    pieces: list[Text] = []
    for part in parts:
        if isinstance(part, Text):
            pieces.append(shown(part))
        elif isinstance(part, str):
            pieces.append(data(part))
        else:
            pieces.append(Text(visible(part[0]), style=part[1]))
    return Text.assemble(*pieces)


def shown(text: Text) -> Text:
    """A ``Text`` with its control characters escaped but for its line breaks, its styles kept in place.

    A ``Text`` is gskit's own layout (it may span lines); anything interpolated into it is still data.
    """
    plain = text.plain
    if is_visible(plain, keep="\n"):
        return text
    starts, pieces, at = [], [], 0
    for char in plain:  # where each character of the old text starts in the new one
        starts.append(at)
        piece = char if is_visible(char, keep="\n") else escape_char(char)
        pieces.append(piece)
        at += len(piece)
    starts.append(at)
    safe = text.blank_copy("".join(pieces))
    safe.spans = [Span(starts[s.start], starts[s.end], s.style) for s in text.spans]
    return safe


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
    """A table whose cells are data: ``[batch, 3]`` stays a shape, not a style tag; controls are escaped.

    Cells that are rich ``Text`` (e.g. from :func:`verdict`) keep their styling (and their line breaks).
    """
    t = Table(title=data(title), title_justify="left", header_style="bold")
    for column in columns:
        t.add_column(data(column))
    for row in rows:
        t.add_row(*(shown(v) if isinstance(v, Text) else data(v) for v in row))
    return t


def verdict(passed: bool) -> Text:
    """A green "pass" or a red "FAIL" table cell."""
    return Text("pass", style="green") if passed else Text("FAIL", style="red")


class DataConsole(Console):
    """A rich console for which every string is data (see the module's docstring).

    Strings printed or rendered anywhere (lines, table cells, titles) are shown with :func:`visible`, without
    markup, emoji codes or highlighting; ``Text`` objects keep their styles, controls escaped (:func:`shown`).
    So a name like ``x[/]`` prints as it is, and ``\\x1b[2J`` clears no screen.
    """

    def render_str(self, text: str, **kwargs: Any) -> Text:
        kwargs.update(markup=False, emoji=False, highlight=False)
        return super().render_str(visible(text), **kwargs)

    def print(self, *objects: Any, **kwargs: Any) -> None:
        super().print(*(shown(o) if isinstance(o, Text) else o for o in objects), **kwargs)


def console(stderr: bool = False) -> Console:
    """A :class:`DataConsole`; when output goes to a file or pipe, tables get 160 columns instead of 80.

    ``NO_COLOR`` (https://no-color.org, any non-empty value) turns off every ANSI escape, bold and italic
    included (rich alone keeps those), also on a terminal and with ``FORCE_COLOR``.
    """
    stream = sys.stderr if stderr else sys.stdout
    width = None if _isatty(stream) else 160
    plain = bool(os.environ.get("NO_COLOR"))
    return DataConsole(
        stderr=stderr,
        markup=False,
        emoji=False,
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
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            _Count(),
            TimeElapsedColumn(),
            console=out,
            transient=True,  # the bars go when done; the command's own lines and tables stay
        )

    def start(self, description: str, total: int | None) -> Hashable:
        return self.bars.add_task(visible(description), total=total)

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
