"""Names that try to be markup or terminal control, for the tests that check gskit shows them as data.

Used by ``tests/test_security_text.py`` (fixed cases) and ``tests/test_fuzz.py`` (seeded random names).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable

import onnx

#: Pieces a hostile name is made of: rich markup, emoji codes, escape sequences (clear screen, colours,
#: window title, OSC 8 links, 8-bit CSI), other C0/C1 controls, DEL, bidi overrides and isolates, line breaks.
PIECES = (
    "[/]",
    "[red]",
    "[bold",
    "[link=http://evil]x[/link]",
    "\\",
    ":smile:",
    "\x1b[2J",
    "\x1b[31m",
    "\x1b]0;title\x07",
    "\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\",
    "\x9b31m",
    "\x90q\x9c",
    "\x07",
    "\x08",
    "\x7f",
    "\x00",
    "\u202e",
    "\u2066",
    "\u200f",
    "\u2028",
    "\n",
    "\t",
    "\r",
    "{0}",
    "%s",
    "é中",
)

#: What must never reach a terminal raw (as gskit.io.text decides, restated here on purpose).
UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
#: The colour and style sequences rich writes itself when it draws for a terminal.
RICH_SGR = re.compile("\x1b\\[[0-9;]*m")


def hostile_name(rng: random.Random) -> str:
    """A suffix of 1 to 4 hostile pieces."""
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 4)))


def renamed(model: onnx.ModelProto, rename: Callable[[str], str]) -> onnx.ModelProto:
    """A copy of ``model`` whose node and tensor names are ``rename(name)``, in the main graph and in every
    subgraph alike (a subgraph's reference to an outer tensor follows it); empty names stay empty."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    names: dict[str, str] = {}

    def new(name: str) -> str:
        if name and name not in names:
            names[name] = rename(name)
        return names.get(name, name)

    def visit(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            node.name = rename(node.name) if node.name else node.name
            node.input[:] = [new(n) for n in node.input]
            node.output[:] = [new(n) for n in node.output]
            for attribute in node.attribute:
                for sub in (attribute.g, *attribute.graphs) if attribute.HasField("g") else attribute.graphs:
                    visit(sub)
        for value in (*graph.input, *graph.output, *graph.value_info):
            value.name = new(value.name)
        for init in graph.initializer:
            init.name = new(init.name)

    visit(copy.graph)
    return copy


def unsafe_characters(text: str, *, colour: bool = False) -> list[str]:
    """The characters of ``text`` that a terminal would act on (line breaks excepted); with ``colour``, rich's
    own colour sequences are allowed."""
    if colour:
        text = RICH_SGR.sub("", text)
    return sorted(set(UNSAFE.findall(text)))


def strict_json(text: str) -> object:
    """``json.loads`` that rejects ``NaN``, ``Infinity`` and ``-Infinity``, as parsers outside Python do."""

    def refuse(token: str) -> None:
        raise ValueError(f"not strict JSON: {token}")

    return json.loads(text, parse_constant=refuse)
