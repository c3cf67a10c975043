"""Fields of an installed distribution's metadata, read from its header lines.

``Distribution.metadata`` (and ``.name``, ``.version``) parses the whole METADATA file with the ``email``
package, long description included: a millisecond or more a distribution (gskit's own README is in its file),
paid by every process that names plugin entry points' distributions, torch's version or the report page's
package versions.
"""

from __future__ import annotations

from importlib.metadata import Distribution


def metadata_field(dist: Distribution, name: str) -> str | None:
    """``dist.metadata[name]``, read from the header lines of ``dist``'s METADATA (or PKG-INFO).

    A field is a header line ``Name: value`` (names are not case-sensitive) before the first empty line. Where
    the header lines could read otherwise to the ``email`` package (carriage returns, a folded header, no
    such line), ``dist.metadata`` answers.
    """
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
    head = text.partition("\n\n")[0] if not text.startswith("\n") else ""
    if "\r" in head:  # line ends the email package reads otherwise than this
        return dist.metadata[name]
    lines = head.split("\n")
    prefix = name.lower() + ":"
    for index, line in enumerate(lines):
        folded = index + 1 < len(lines) and lines[index + 1][:1] in (" ", "\t")
        if line[: len(prefix)].lower() == prefix and not folded:
            return line[len(prefix) :].lstrip(" \t")  # as the email package reads a header's value
    return dist.metadata[name]
