"""CLI flags derived from a pass's options dataclass, and the dataclass built back from the parsed args.

Each field made with ``gskit.passes.transform.option`` carries its help text and CLI spelling; the flag's
default is the field's default, so a command, the library call and the recipe step cannot disagree. A boolean
whose default is False is a plain ``--name`` switch; one whose default is True is ``--name/--no-name``. A
sequence is a repeatable flag (or ``nargs`` / a ``parse`` function giving the whole tuple, as the field says).
A field with an ``entry`` function (a mapping, or a tuple of structured items) takes each CLI value as text
and turns it into entries after parsing, so a malformed value ends in the command's own error line.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any


def cli_fields(options: type) -> list[dataclasses.Field]:
    """The fields of an options dataclass that the command line offers."""
    return [f for f in dataclasses.fields(options) if f.metadata.get("cli")]


def flag_of(field: dataclasses.Field) -> str:
    """The flag a field is offered as (``--with``, ``--max-passes`` ...)."""
    return field.metadata.get("flag") or "--" + field.name.replace("_", "-")


def add_options(parser: argparse.ArgumentParser, options: type) -> None:
    """Add one argparse argument per CLI field of the ``options`` dataclass (its default, help, metavar)."""
    hints = typing.get_type_hints(options)
    for field in cli_fields(options):
        meta = field.metadata
        default = _default(field)
        kind, item = _kind(hints[field.name])
        if kind is bool:
            action = argparse.BooleanOptionalAction if default else "store_true"
            text = meta["help"] + (" (default on)" if default else "")
            parser.add_argument(flag_of(field), action=action, default=default, dest=field.name, help=text)
            continue
        kwargs: dict[str, Any] = {"dest": field.name, "help": meta["help"], **meta.get("extra", {})}
        if meta.get("metavar"):
            kwargs["metavar"] = meta["metavar"]
        if meta.get("entry"):
            kwargs.setdefault("action", "append")  # the text of each value; options_from_args reads it
        elif meta.get("parse"):
            kwargs["type"] = meta["parse"]
        elif kind is tuple and "nargs" not in kwargs:
            kwargs.update(action="append", type=item)
        else:
            kwargs["type"] = item if kind is tuple else kind
        # a repeatable flag starts from None (argparse appends to its default); the field's default comes back
        # in options_from_args
        kwargs["default"] = None if kwargs.get("action") in _COLLECTING else default
        if default is not False and default not in (None, (), {}):  # 0 == False: a default 0 is shown
            kwargs["help"] += f" (default {default})"
        parser.add_argument(flag_of(field), **kwargs)


#: argparse actions that collect values into a list (its default must be None, not the field's tuple).
_COLLECTING = ("append", "extend")


def options_from_args(args: argparse.Namespace, options: type) -> Any:
    """The ``options`` dataclass from parsed args (lists become tuples, absent repeated flags the default).

    Raises:
        GskitError: a value an ``entry`` function refuses (the first, in field order).
    """
    values: dict[str, Any] = {}
    for field in cli_fields(options):
        value = getattr(args, field.name)
        if value is None and isinstance(_default(field), (tuple, dict)):
            value = _default(field)
        elif field.metadata.get("entry"):
            value = _entries(value, field)
        values[field.name] = tuple(value) if isinstance(value, list) else value
    return options(**values)


def _entries(texts: list[str], field: dataclasses.Field) -> Any:
    """A field's value from its CLI texts through its ``entry`` function: a tuple of items, or a mapping."""
    entry = field.metadata["entry"]
    if not isinstance(_default(field), dict):
        return tuple(entry(text) for text in texts)
    merged: dict[str, Any] = {}
    for text in texts:
        for key, value in entry(text).items():
            old = merged.get(key)
            if isinstance(old, dict) and isinstance(value, dict):
                value = {**old, **value}
            elif isinstance(old, tuple) and isinstance(value, tuple):
                value = old + value
            merged[key] = value
    return merged


def _default(field: dataclasses.Field) -> Any:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def _kind(hint: Any) -> tuple[type, type]:
    """(the field's kind: bool, int, float, str or tuple; the type of one CLI value) from its annotation."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return _kind(args[0])
    if typing.get_origin(hint) is tuple:
        return tuple, args[0]
    return hint, hint
