"""Text from models, paths and files, shown to people: always data, never markup or terminal control.

A node name, a tensor name, a path or a message quoting them may hold anything a file can: an escape sequence
that clears the screen, sets the window title or writes a hidden link, a bidi override that shows text
backwards, a lone surrogate (a path that is not UTF-8) that a UTF-8 terminal cannot even print. Whatever
shows such text to a person (the terminal tables and lines of :mod:`gskit.io.report`, the error line of the
command line, ``report.html``) passes it through :func:`visible` first, so each of those characters appears
as its escape (``\\x1b``, ``\\u202e``), on a terminal and in a pipe alike. JSON output keeps the exact strings
(``json`` escapes them itself).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

#: Characters that are never shown as they are: C0 controls, DEL and C1 controls (escape sequences, CSI,
#: OSC), the line and paragraph separators, the bidi formatting controls (embeddings, overrides, isolates,
#: marks) and lone surrogates.
_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u2028\u2029\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)

#: The usual short escapes; every other unsafe character is ``\xNN`` or ``\uNNNN``.
_SHORT = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def escape_char(char: str) -> str:
    """How :func:`visible` writes one unsafe character: ``\\n``, ``\\x1b``, ``\\u202e``."""
    if char in _SHORT:
        return _SHORT[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str, keep: str = "") -> str:
    """``text`` with every control, bidi-control and lone-surrogate character written as its escape.

    Args:
        text: text that may come from a model, a path or a file.
        keep: characters to leave as they are (``"\\n"`` for a message laid out on several lines by gskit
            itself).

    Example: ``visible("y\\x1b[2J")`` is ``"y\\\\x1b[2J"`` (the ``[2J`` is then harmless text).
    """
    return _UNSAFE.sub(lambda m: m[0] if m[0] in keep else escape_char(m[0]), text)


def is_visible(text: str, keep: str = "") -> bool:
    """Whether ``text`` shows as it is (nothing for :func:`visible` to escape)."""
    return all(m[0] in keep for m in _UNSAFE.finditer(text))


def is_utf8(text: str | bytes) -> bool:
    """Whether text is UTF-8: bytes that decode (a model's strings), or a str without lone surrogates
    (Python shows the other bytes of argv and of file names as lone surrogates)."""
    try:
        text.decode("utf-8") if isinstance(text, bytes) else text.encode("utf-8")
    except UnicodeError:
        return False
    return True


#: The width of gskit's console where it writes to a pipe or a file (``gskit.io.report.console``).
PLAIN_WIDTH = 160

#: rich's ``HEAVY_HEAD`` box, which gskit's tables use (:func:`gskit.io.report.table`): the top edge, the
#: header row, the line under it, a body row and the bottom edge, each as (left, line, between, right).
_HEAVY_HEAD = {
    "top": "┏━┳┓",
    "head": "┃ ┃┃",
    "under_head": "┡━╇┩",
    "row": "│ ││",
    "bottom": "└─┴┘",
}


def plain_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]], width: int) -> str | None:
    """A table as rich draws gskit's tables (:func:`gskit.io.report.table`) where it writes no escapes (a
    pipe, a file): the title wrapped at the table's width, then a ``HEAVY_HEAD`` box with every column as
    wide as its widest cell plus a space on each side; ``width`` is the console's width. A table wider than
    that is narrowed as rich narrows it (:func:`_narrowed`), and its cells are wrapped at words.

    The same text, byte for byte (``tests/test_text.py`` checks it against rich), without importing rich for
    the tables of a command's plain output. None where rich would do more than this: text that is not
    printable ASCII after :func:`visible` (wide characters, combining marks), or columns so narrow that rich
    has no room for their padding.

    Args:
        title: the title, as given to ``table`` (made :func:`visible` here).
        columns: the column headers.
        rows: the cells, as text (made :func:`visible` here).
        width: the console's width in columns.
    """
    head = [visible(c) for c in columns]
    body = [[visible(c) for c in row] for row in rows]
    name = visible(title)
    if not all(_printable_ascii(text) for text in (name, *head, *(c for row in body for c in row))):
        return None
    available = width - len(head) - 1  # the borders: one between columns and one at each edge
    if available < 1:
        return None
    # a column's natural width: its widest cell and a space of padding on each side
    natural = [min(max([len(h), *(len(row[i]) for row in body)]) + 2, available) for i, h in enumerate(head)]
    sizes = natural if sum(natural) <= available else _narrowed(natural, available)
    if min(sizes) < 3:
        return None  # rich lays out cells without room for their text otherwise
    if any(
        not _fits(cell, size - 2) for cells in (head, *body) for cell, size in zip(cells, sizes, strict=True)
    ):
        return None  # rich cuts a word longer than its cell's line, ending it with an ellipsis
    table_width = sum(sizes) + len(sizes) + 1

    def rule(chars: str) -> str:
        left, line, between, right = chars
        return left + between.join(line * size for size in sizes) + right

    def row(chars: str, cells: Sequence[str], bottom: bool = False) -> list[str]:
        """A row's lines: each cell wrapped at its column's width, the shorter cells filled with blank
        lines below (above, for the header: ``bottom``) to the height of the tallest."""
        left, _, between, right = chars
        wrapped = [wrap_words(cell, size - 2) for cell, size in zip(cells, sizes, strict=True)]
        height = max(len(lines) for lines in wrapped)
        filled = [[""] * (height - len(lines)) + lines if bottom else lines for lines in wrapped]
        return [
            left
            + between.join(
                f" {lines[i] if i < len(lines) else ''}".ljust(size)
                for lines, size in zip(filled, sizes, strict=True)
            )
            + right
            for i in range(height)
        ]

    lines = [line.ljust(table_width) for line in wrap_words(name, table_width)] if name else []
    lines += [
        rule(_HEAVY_HEAD["top"]),
        *row(_HEAVY_HEAD["head"], head, bottom=True),
        rule(_HEAVY_HEAD["under_head"]),
    ]
    lines += [line for cells in body for line in row(_HEAVY_HEAD["row"], cells)]
    lines.append(rule(_HEAVY_HEAD["bottom"]))
    return "\n".join(lines) + "\n"


def _narrowed(widths: list[int], available: int) -> list[int]:
    """Column widths (padding included) that fit ``available``, as rich's ``Table`` narrows a table wider
    than its console: the widest columns shrink together towards the next widest (towards nothing where
    all are as wide) until the table fits, then, if it still does not, every column gives its share of what
    is left over; a column never ends wider than its natural width."""
    narrowed = list(widths)
    excess = sum(narrowed) - available
    while sum(narrowed) and excess > 0:
        widest = max(narrowed)
        difference = widest - max(w if w != widest else 0 for w in narrowed)
        if not difference:
            break
        ratios = [1 if w == widest else 0 for w in narrowed]
        narrowed = _ratio_reduce(excess, ratios, [min(excess, difference)] * len(narrowed), narrowed)
        excess = sum(narrowed) - available
    if excess > 0:
        narrowed = _ratio_reduce(excess, [1] * len(narrowed), narrowed, narrowed)
    return [min(natural, width) for natural, width in zip(widths, narrowed, strict=True)]


def _fits(text: str, width: int) -> bool:
    """Whether every word of ``text`` fits a line of ``width`` (as rich measures a word: with the spaces
    before it where it starts the text)."""
    return all(len(match.group().rstrip()) <= width for match in _WORD.finditer(text))


def _ratio_reduce(total: int, ratios: list[int], maximums: list[int], values: list[int]) -> list[int]:
    """``values`` less ``total`` shared out by ``ratios`` (each share at most its maximum), shares rounded
    as rich rounds them (Python's ``round``), the last share taking what rounding left."""
    ratios = [ratio if maximum else 0 for ratio, maximum in zip(ratios, maximums, strict=True)]
    total_ratio = sum(ratios)
    if not total_ratio:
        return list(values)
    remaining, result = total, []
    for ratio, maximum, value in zip(ratios, maximums, values, strict=True):
        if ratio and total_ratio > 0:
            share = min(maximum, round(ratio * remaining / total_ratio))
            result.append(value - share)
            remaining -= share
            total_ratio -= ratio
        else:
            result.append(value)
    return result


def plain_line(text: str, width: int) -> str | None:
    """A line as rich prints it where it writes no escapes: :func:`visible`, wrapped at words where it is
    longer than ``width`` (a line keeps the spaces that end it, up to ``width``), then ``\\n``; None where
    rich would do more (text that is not printable ASCII)."""
    shown = visible(text)
    if not _printable_ascii(shown):
        return None
    if len(shown) <= width:
        return shown + "\n"
    lines = []
    for piece in _pieces(shown, width):
        excess = len(piece) - width
        if excess > 0:  # spaces past the width go (rich's rstrip_end), then anything still past it
            piece = piece[: len(piece) - min(excess, len(piece) - len(piece.rstrip()))][:width]
        lines.append(piece)
    return "\n".join(lines) + "\n"


def wrap_words(text: str, width: int) -> list[str]:
    """``text`` (printable ASCII) in lines of at most ``width`` characters, as rich wraps a title: broken
    before a word that does not fit (a word keeps the spaces after it), a word longer than a line cut into
    pieces of ``width``, each line without its trailing spaces."""
    return [piece.rstrip() for piece in _pieces(text, width)]


def _pieces(text: str, width: int) -> list[str]:
    """``text`` cut where rich breaks it to wrap it at ``width`` (rich's ``divide_line``), each piece with
    the spaces that end it."""
    breaks: list[int] = []
    offset = 0
    for match in _WORD.finditer(text):
        start, word = match.start(), match.group()
        length = len(word.rstrip())
        if width - offset >= length:
            offset += len(word)
        elif length > width:
            pieces = [word[i : i + width] for i in range(0, len(word), width)]
            for index, piece in enumerate(pieces):
                if start:
                    breaks.append(start)
                if index == len(pieces) - 1:
                    offset = len(piece)
                else:
                    start += len(piece)
        elif offset and start:
            breaks.append(start)
            offset = len(word)
    bounds = [0, *breaks, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)] or [""]


#: A word and the spaces around it, as rich splits text to wrap it.
_WORD = re.compile(r"\s*\S+\s*")


def is_terminal(stream: object) -> bool:
    """Whether ``stream`` is a terminal (False for a pipe, a file, a closed stream or one without
    ``isatty``): where rich draws colours and progress bars."""
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


def writes_plain(stream: object) -> bool:
    """Whether gskit's rich console (``gskit.io.report.console``) writes ``stream`` without escapes and in
    the box characters that :func:`plain_table` draws: not a terminal, nothing in the environment that makes
    rich draw as for one (``FORCE_COLOR``, ``TTY_COMPATIBLE``), a UTF-8 stream, not Windows' console."""
    environ = os.environ
    if is_terminal(stream) or "FORCE_COLOR" in environ or "TTY_COMPATIBLE" in environ:
        return False
    encoding = getattr(stream, "encoding", None) or "utf-8"
    return encoding.lower().startswith("utf") and os.name != "nt"


#: A line of text: plain parts and (text, style) parts, as ``gskit.io.report.styled`` takes them (the style
#: only where rich prints it).
Line = tuple[str | tuple[str, str], ...]
#: A table: its title, its columns and its rows of cells (``None``: an empty cell).
Table = tuple[str, Sequence[str], Sequence[Sequence[object]]]


def plain_output(tables: Sequence[Table], lines: Sequence[Line], width: int = PLAIN_WIDTH) -> str | None:
    """Tables, then lines, as gskit's rich console prints them where it writes no escapes
    (:func:`plain_table`, :func:`plain_line`; a cell is its ``str``, ``None`` empty as rich shows it); None
    where this text cannot say one of them."""
    texts = [
        plain_table(title, columns, [["" if c is None else str(c) for c in row] for row in rows], width)
        for title, columns, rows in tables
    ]
    texts += [plain_line("".join(p if isinstance(p, str) else p[0] for p in line), width) for line in lines]
    return None if None in texts else "".join(text for text in texts if text is not None)


def _printable_ascii(text: str) -> bool:
    return text.isascii() and text.isprintable()
