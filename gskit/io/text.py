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

import re

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
