"""gskit.io.text's plain tables: the bytes rich prints for gskit's tables where it writes no escapes."""

from __future__ import annotations

import random

import pytest

from gskit.io import report
from gskit.io.text import plain_line, plain_table, wrap_words

#: Words of the titles and cells drawn below: short, long, empty-ish, with markup-like and control text.
WORDS = ["x", "y", "output", "max abs err", "2x4x8x8", "[bold]x[/]", "a\x1bb", "inputs", "-", "1e-05", "FAIL"]
#: Longer phrases, as prepare's step summaries hold (they make tables wider than the console).
PHRASES = ["ok: 3 replaced, 1 skipped (gskit::ClampSwish v1: 2 plugin;", "build with full TensorRT (docker/)"]


def _rich(
    title: str, columns: list[str], rows: list[list[str]], lines: list[str], capsys, width: int = 160
) -> str:
    """What gskit printed through rich (``report.console()`` on a captured, non-terminal stdout)."""
    capsys.readouterr()
    out = report.console()
    out.width = width
    out.print(report.table(title, columns, rows))
    for line in lines:
        out.print(report.styled(line))
    return capsys.readouterr().out


def _text(rng: random.Random, longest: int, most: int = 12) -> str:
    """Up to ``most`` words and spaces, sometimes with one word far longer than a line."""
    words = [rng.choice(WORDS) for _ in range(rng.randint(0, most))]
    if rng.random() < 0.2:
        words.append("w" * rng.randint(1, longest))
    return (" " * rng.randint(1, 2)).join(words)


def test_plain_tables_are_the_bytes_rich_prints(capsys, monkeypatch) -> None:
    """Random titles (wrapped, with words longer than the table), columns and cells, and the lines below:
    where plain_table and plain_line answer, the text is rich's; they answer for most of them."""
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "COLUMNS", "NO_COLOR"):
        monkeypatch.delenv(name, raising=False)
    rng = random.Random(5)
    answered = 0
    for _ in range(300):
        columns = [_text(rng, 20, most=3) or "c" for _ in range(rng.randint(1, 7))]
        rows = [[_text(rng, 30, most=4) for _ in columns] for _ in range(rng.randint(0, 4))]
        title = _text(rng, 120)
        lines = [_text(rng, 200) for _ in range(rng.randint(0, 2))]
        table = plain_table(title, columns, rows, 160)
        shown = [plain_line(line, 160) for line in lines]
        if table is None or None in shown:
            continue
        answered += 1
        assert table + "".join(shown) == _rich(title, columns, rows, lines, capsys), (title, columns, rows)
    assert answered > 150


def test_wide_tables_and_long_lines_are_the_bytes_rich_prints(capsys, monkeypatch) -> None:
    """Tables wider than the console (rich narrows the widest columns and wraps their cells, the header's
    cells at the bottom of their row) and lines longer than it (wrapped, a line keeping its trailing
    spaces), at several console widths: where plain_table and plain_line answer, the text is rich's."""
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "COLUMNS", "NO_COLOR"):
        monkeypatch.delenv(name, raising=False)
    rng = random.Random(7)
    answered = wide = 0
    for _ in range(400):
        width = rng.choice([160, 160, 80, 40, 20, 12])
        columns = [_text(rng, 20, most=3) or "c" for _ in range(rng.randint(1, 7))]
        rows = [[_long_text(rng, rng.choice([4, 12, 30])) for _ in columns] for _ in range(rng.randint(0, 4))]
        title = _text(rng, 120)
        lines = [_long_text(rng, rng.choice([5, 40, 80]), longest=200) for _ in range(rng.randint(0, 2))]
        table = plain_table(title, columns, rows, width)
        shown = [plain_line(line, width) for line in lines]
        if table is None or None in shown:
            continue
        answered += 1
        wide += max(len(line) for line in table.splitlines()) >= width - 1
        expected = _rich(title, columns, rows, lines, capsys, width)
        assert table + "".join(shown) == expected, (width, title, columns, rows, lines)
    assert answered > 80 and wide > 40


def _long_text(rng: random.Random, most: int, longest: int = 12) -> str:
    """Up to ``most`` words and phrases, sometimes with a long word and spaces at the end."""
    words = [rng.choice(WORDS + PHRASES) for _ in range(rng.randint(0, most))]
    if rng.random() < 0.3:
        words.append("w" * rng.randint(1, longest))
    end = " " * rng.randint(1, 3) if rng.random() < 0.2 else ""
    return (" " * rng.randint(1, 3)).join(words) + end


def test_plain_tables_leave_to_rich_what_rich_lays_out_otherwise() -> None:
    """Text that is not ASCII (cell widths differ from lengths), a word longer than its narrowed column
    (rich cuts it with an ellipsis) and columns with no room for their text: None."""
    assert plain_table("t", ["a" * 100, "b" * 100], [], 160) is None
    assert plain_table("t", ["a"], [["é"]], 160) is None
    assert plain_table("t", ["a b"] * 40, [], 80) is None
    assert plain_line("\u202eevil", 160) == "\\u202eevil\n"  # escaped first, as rich's console shows it
    assert plain_line("x" * 161, 160) == "x" * 160 + "\nx\n"  # a word longer than the line: folded


@pytest.mark.parametrize(
    ("text", "width", "lines"),
    [
        ("original vs prepared (atol=1e-05)", 20, ["original vs prepared", "(atol=1e-05)"]),
        ("abcdefghij klm", 4, ["abcd", "efgh", "ij", "klm"]),
        ("", 5, [""]),
    ],
)
def test_titles_wrap_at_words_and_long_words_are_cut(text: str, width: int, lines: list[str]) -> None:
    assert wrap_words(text, width) == lines
