"""CLI flags derived from a pass's options dataclass, and the dataclass built back from the parsed args.

Each field made with ``gskit.passes.transform.option`` carries its help text and CLI spelling; the flag's
default is the field's default, so a command, the library call and the recipe step cannot disagree. A boolean
whose default is False is a plain ``--name`` switch; one whose default is True is ``--name/--no-name``. A
sequence is a repeatable flag (or ``nargs`` / a ``parse`` function giving the whole tuple, as the field says).
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
        if meta.get("parse"):
            kwargs["type"] = meta["parse"]
        elif kind is tuple and "nargs" not in kwargs:
            kwargs.update(action="append", type=item)
        else:
            kwargs["type"] = item if kind is tuple else kind
        # a repeatable flag starts from None (argparse appends to its default); the field's default comes back
        # in options_from_args
        kwargs["default"] = None if kwargs.get("action") == "append" else default
        if default is not False and default not in (None, (), {}):  # 0 == False: a default 0 is shown
            kwargs["help"] += f" (default {default})"
        parser.add_argument(flag_of(field), **kwargs)


def options_from_args(args: argparse.Namespace, options: type) -> Any:
    """The ``options`` dataclass from parsed args (lists become tuples, absent repeated flags the default)."""
    values: dict[str, Any] = {}
    for field in cli_fields(options):
        value = getattr(args, field.name)
        if value is None and isinstance(_default(field), tuple):
            value = _default(field)
        values[field.name] = tuple(value) if isinstance(value, list) else value
    return options(**values)


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
