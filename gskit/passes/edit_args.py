"""How an edit is spelled on the command line: one flag value -> entries of ``EditOptions``' fields.

Each function reads one value of a ``gskit edit`` flag and returns what ``gskit.cli.options`` merges into the
field (a mapping's entries, or one item of a tuple); a malformed value raises ``GskitError`` naming the
flag and the value. The recipe writes the same options as YAML mappings and lists.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gskit.errors import GskitError
from gskit.io.limits import number_array
from gskit.io.shape_args import parse_symbolic_shape


def rename(item: str) -> dict[str, str]:
    """``OLD=NEW``."""
    old, sep, new = item.partition("=")
    if not sep or not old or not new:
        raise GskitError(f"--rename {item!r}: expected OLD=NEW")
    return {old: new}


def input_shape(item: str) -> dict[str, tuple[int | str | None, ...]]:
    """``NAME:DIMS`` in any of ``gskit.io.shape_args``' symbolic spellings."""
    name, dims = parse_symbolic_shape(item)
    return {name: tuple(dims)}


def input_dtype(item: str) -> dict[str, str]:
    """``NAME:DTYPE``; the name itself may contain ':'."""
    name, sep, dtype = item.rpartition(":")
    if not sep or not name or not dtype:
        raise GskitError(f"--input-dtype {item!r}: expected NAME:DTYPE such as ids:int32")
    return {name: dtype}


def insertion(item: str) -> dict[str, Any]:
    """``TENSOR:OP`` or ``TENSOR:OP:k=v,...`` as an ``insert_after`` entry; the tensor name may contain ':'.

    Keys starting with ``@`` are extra inputs in order: numbers become a constant, other text a tensor name.
    """
    parts = item.split(":")
    spec = ""
    if len(parts) >= 3 and "=" in parts[-1]:
        spec = parts.pop()
    if len(parts) < 2 or not parts[-1] or not all(parts[:-1]):
        raise GskitError(f"--insert-after {item!r}: expected TENSOR:OP[:k=v,...]")
    op = parts.pop()
    attrs: dict[str, Any] = {}
    inputs: list[np.ndarray | str] = []
    for key, value in _pairs(spec, item):
        if key.startswith("@"):
            inputs.append(_extra_input(value))
        else:
            attrs[key] = attribute_value(value)
    return {"tensor": ":".join(parts), "op": op, "attrs": attrs, "inputs": inputs}


def set_attr(item: str) -> dict[str, dict[str, Any]]:
    """``NODE:KEY=VALUE``; the node name may contain ':'."""
    left, sep, value = item.partition("=")
    node, colon, key = left.rpartition(":")
    if not sep or not colon or not node or not key:
        raise GskitError(f"--set-attr {item!r}: expected NODE:KEY=VALUE")
    return {node: {key: attribute_value(value)}}


def remove_attr(item: str) -> dict[str, tuple[str, ...]]:
    """``NODE:KEY``."""
    node, colon, key = item.rpartition(":")
    if not colon or not node or not key:
        raise GskitError(f"--remove-attr {item!r}: expected NODE:KEY")
    return {node: (key,)}


def attribute_value(text: str) -> int | float | str | list[int] | list[float]:
    """An attribute value from text: int, float, a comma list of them, or a string."""
    items = text.split(",")
    parsed = [_number(t.strip()) for t in items]
    if all(p is not None for p in parsed):
        return parsed if len(items) > 1 else parsed[0]  # type: ignore[return-value]
    return text


def _pairs(spec: str, item: str) -> list[tuple[str, str]]:
    """Split ``a=1,b=2,3`` into [(a, "1"), (b, "2,3")]: a piece without '=' continues the previous value."""
    pairs: list[tuple[str, str]] = []
    for piece in spec.split(",") if spec else []:
        key, sep, value = piece.partition("=")
        if sep:
            pairs.append((key.strip(), value))
        elif pairs:
            pairs[-1] = (pairs[-1][0], f"{pairs[-1][1]},{piece}")
        else:
            raise GskitError(f"--insert-after {item!r}: expected k=v after the op")
    return pairs


def _extra_input(text: str) -> np.ndarray | str:
    numbers = [_number(t.strip()) for t in text.split(",")]
    if text and all(n is not None for n in numbers):
        return number_array(numbers, f"--insert-after input @{text[:40]}")  # type: ignore[arg-type]
    return text


def _number(text: str) -> int | float | None:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return None
