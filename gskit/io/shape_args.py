"""One way to write a shape, for every command and recipe option that takes one.

A shape is written ``NAME:DIMS``, with DIMS in any of three spellings:

* ``x:1x3x224x224`` (dims joined by ``x``),
* ``x:1,3,224,224`` (dims joined by commas),
* ``x:[1,3,224,224]`` (Polygraphy's spelling).

``x:`` or ``x:[]`` is a scalar. The name is everything before the last ``:``, so a tensor name may itself hold
colons. Three meanings share the tokenizer, one function each:

* :func:`parse_fixed_shape`: a concrete shape (validation and comparison inputs): every dim at least 1.
* :func:`parse_symbolic_shape`: a declared input shape (``gskit edit``): a dim may also be ``-1`` or ``?``
  (unknown) or a symbol name such as ``batch``; symbols need the comma or bracket spelling.
* :func:`parse_profile`: an optimization profile (``gskit build``): ``MIN,OPT,MAX`` shapes, each written with
  ``x`` or brackets (``x:1x3x224x224,4x3x224x224,8x3x224x224`` or ``x:[1,3,224,224],[4,3,224,224],...``), or
  one shape for all three.

:func:`check_fixed_dims`, :func:`check_symbolic_dims` and :func:`check_profile` check shapes that arrive
as lists (recipe options).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gskit.errors import GskitError
from gskit.io.limits import check_int64

Shape = tuple[int, ...]
Dim = int | str | None
Profile = tuple[Shape, Shape, Shape]

#: DIMS joined by ``x``: integers, ``-1`` or ``?`` only (a symbol such as ``max_len`` holds an ``x`` itself).
_X_JOINED = re.compile(r"(-?\d+|\?)(x(-?\d+|\?))*", re.IGNORECASE)
#: One shape in brackets, for splitting a profile written ``[..],[..],[..]``.
_BRACKETED = re.compile(r"\[[^\[\]]*\]")

FIXED_EXAMPLE = "x:1x3x224x224, x:1,3,224,224 or x:[1,3,224,224]"


def split_name(text: str, flag: str, example: str = FIXED_EXAMPLE) -> tuple[str, str]:
    """``NAME:DIMS`` -> ``(NAME, DIMS)``; the name may hold colons (the last one separates).

    Raises:
        GskitError: no colon or no name.
    """
    name, sep, dims = text.rpartition(":")
    if not sep or not name.strip():
        raise GskitError(f"{flag} {_quoted(text)}: write NAME:DIMS, e.g. {example}")
    return name.strip(), dims.strip()


def dim_tokens(dims: str) -> list[str]:
    """The dims of one shape as text: brackets dropped, split at commas or at ``x``; ``""`` -> ``[]``."""
    dims = dims.strip()
    if dims.startswith("[") and dims.endswith("]"):
        dims = dims[1:-1].strip()
    if not dims:
        return []
    if "," in dims:
        return [d.strip() for d in dims.split(",")]
    if _X_JOINED.fullmatch(dims):
        return re.split("x", dims, flags=re.IGNORECASE)
    return [dims]


def parse_fixed_shape(text: str, flag: str = "--shape") -> tuple[str, Shape]:
    """``x:1x3x224x224`` (or ``x:1,3,224,224``, ``x:[1,3,224,224]``) -> ``("x", (1, 3, 224, 224))``.

    Raises:
        GskitError: not ``NAME:DIMS``, or a dim that is not an integer of at least 1 (one line naming it).
    """
    name, dims = split_name(text, flag)
    return name, _fixed(dim_tokens(dims), f"{flag} {_quoted(text)}")


def parse_symbolic_shape(text: str, flag: str = "--input-shape") -> tuple[str, list[Dim]]:
    """``x:1,3,-1,batch`` -> ``("x", [1, 3, None, "batch"])``: ``-1``/``?``/empty are unknown (None).

    Raises:
        GskitError: not ``NAME:DIMS``, or a dim that is not an integer >= 0, ``-1``, ``?`` or a symbol name.
    """
    name, dims = split_name(text, flag, example="x:1,3,-1,batch or x:1x3x224x224")
    return name, [_symbolic(token, f"{flag} {_quoted(text)}") for token in dim_tokens(dims)]


def parse_profile(text: str, flag: str = "--shape") -> tuple[str, Profile]:
    """``x:1x4,4x4,16x4`` or ``x:[1,4],[4,4],[16,4]`` -> ``("x", ((1, 4), (4, 4), (16, 4)))``.

    One shape (in any spelling) means min = opt = max.

    Raises:
        GskitError: not ``NAME:MIN,OPT,MAX`` or one shape, a dim below 1, ranks that differ, or min > opt or
            opt > max on some dim.
    """
    where = f"{flag} {_quoted(text)}"
    example = "x:1x3x224x224,4x3x224x224,8x3x224x224 or x:[1,3,224,224],[4,3,224,224],[8,3,224,224]"
    name, dims = split_name(text, flag, example=example)
    parts = _profile_parts(dims)
    if len(parts) not in (1, 3):
        raise GskitError(f"{where}: give MIN,OPT,MAX shapes or one shape, e.g. {example}")
    shapes = tuple(_fixed(dim_tokens(part), where) for part in parts)
    profile: Profile = (shapes[0], shapes[0], shapes[0]) if len(shapes) == 1 else shapes  # type: ignore[assignment]
    check_profile(profile, where)
    return name, profile


def check_fixed_dims(dims: Sequence[object], where: str) -> Shape:
    """A concrete shape given as a list (recipe options): every dim an integer of at least 1.

    Raises:
        GskitError: a dim that is not, named with ``where``.
    """
    tokens = [str(d) if isinstance(d, int) and not isinstance(d, bool) else repr(d) for d in dims]
    return _fixed(tokens, where)


def check_symbolic_dims(dims: Sequence[object], where: str) -> list[Dim]:
    """A declared shape given as a list (recipe ``edit.input_shapes``): integers >= 0, symbol names or None.

    Raises:
        GskitError: a negative integer or a symbol that is not a name, named with ``where``.
    """
    for dim in dims:
        if isinstance(dim, int) and not isinstance(dim, bool) and dim < 0:
            raise GskitError(
                f"{where}: dim {dim} is negative; write null (or a symbol name) for an unknown dim"
            )
        if isinstance(dim, int) and not isinstance(dim, bool):
            check_int64(dim, where)
        if isinstance(dim, str) and not dim.isidentifier():
            raise GskitError(f"{where}: dim {dim!r} is not a symbol name (letters, digits, _)")
    return list(dims)  # type: ignore[arg-type]


def check_shape_options(shapes: Mapping[str, Any], check: Callable[[Any, str], object]) -> None:
    """Shape options of a recipe step follow the rules of the command-line shapes (``check`` is one of the
    ``check_*`` functions here); ValueError when not, so the recipe reports it with its line."""
    for name, dims in shapes.items():
        try:
            check(dims, f"shapes.{name} {list(dims)}")
        except GskitError as err:
            raise ValueError(str(err)) from err


def check_profile(profile: Sequence[Sequence[object]], where: str) -> Profile:
    """MIN, OPT, MAX shapes of one input: same rank, dims at least 1, min <= opt <= max on every dim.

    Raises:
        GskitError: the first problem, named with ``where``.
    """
    if len(profile) != 3:
        raise GskitError(f"{where}: a profile is three shapes, MIN, OPT and MAX; got {len(profile)}")
    low, opt, high = (check_fixed_dims(shape, where) for shape in profile)
    if not len(low) == len(opt) == len(high):
        ranks = f"{len(low)}, {len(opt)}, {len(high)}"
        raise GskitError(f"{where}: MIN, OPT and MAX have different ranks ({ranks})")
    for axis, (a, b, c) in enumerate(zip(low, opt, high, strict=True)):
        if not a <= b <= c:
            raise GskitError(f"{where}: dim {axis} must grow MIN <= OPT <= MAX, got {a}, {b}, {c}")
    return low, opt, high


def format_shape(dims: Sequence[object]) -> str:
    """``(1, 3, 224)`` -> ``1x3x224`` (the spelling gskit prints); a scalar is ``scalar``."""
    return "x".join(str(d) for d in dims) or "scalar"


def _profile_parts(dims: str) -> list[str]:
    """Split a profile's text into its shapes: bracketed shapes, or ``x``-joined shapes between commas.

    Plain comma-joined integers (``1,3,224,224``) are ONE shape, as everywhere else.
    """
    if "[" in dims:
        parts = _BRACKETED.findall(dims)
        if _BRACKETED.sub("", dims).replace(",", "").strip():
            return []  # text outside the brackets: not a profile
        return parts
    pieces = [p.strip() for p in dims.split(",")]
    if len(pieces) > 1 and any(re.search("x", p, re.IGNORECASE) for p in pieces):
        return pieces
    return [dims]


def _fixed(tokens: list[str], where: str) -> Shape:
    if len(tokens) == 1 and re.search("x", tokens[0], re.IGNORECASE) and not tokens[0].isdigit():
        # x-joined dims with a bad one (1x3xx224, 1xbatch): split anyway, so the error names that dim
        tokens = re.split("x", tokens[0], flags=re.IGNORECASE)
    dims = []
    for axis, token in enumerate(tokens):
        try:
            value = int(token)
        except ValueError:
            raise GskitError(
                f"{where}: dim {axis} is {token!r}, not an integer; write dims like {FIXED_EXAMPLE}"
            ) from None
        if value < 1:
            raise GskitError(
                f"{where}: dim {axis} is {value}; concrete shapes need dims of at least 1 "
                "(write a dynamic dim as the size to use, e.g. 1)"
            )
        dims.append(check_int64(value, f"{where}: dim {axis}"))
    return tuple(dims)


def _symbolic(token: str, where: str) -> Dim:
    if token in ("?", "-1", ""):
        return None
    try:
        value = int(token)
    except ValueError:
        if not token.isidentifier():
            raise GskitError(f"{where}: dim {token!r} is not an integer, -1, ? or a symbol name") from None
        return token
    if value < 0:
        raise GskitError(f"{where}: dim {value} is negative; write -1 or ? for an unknown dim")
    return check_int64(value, where)


def _quoted(text: str, limit: int = 60) -> str:
    """The text as a message quotes it: ``'x:1x3x224x224'``, cut after ``limit`` characters."""
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")
