"""Progress of long steps, reported by the library and shown by whoever listens (the command line).

A long loop (fold evaluating constants batch by batch, the layerwise comparison's chunks) wraps itself in
:func:`task` and calls the ``advance`` it yields. Nothing is shown unless a :class:`Display` is installed
for the current context with :func:`shown_by`; the library never draws anything itself, so scripts and
tests that call gskit see no output. ``gskit.io.report.progress_display`` is the command line's display (a
rich progress bar on stderr, only on a terminal and never with ``--json``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol


class Display(Protocol):
    """Shows tasks: one line each, from :meth:`start` to :meth:`stop`."""

    def start(self, description: str, total: int | None) -> Hashable:
        """Show a new task (``total`` None: no known end) and return its handle."""
        ...

    def advance(self, handle: Hashable, amount: int) -> None:
        """``amount`` more units of the task are done."""
        ...

    def stop(self, handle: Hashable) -> None:
        """The task ended (done, failed or interrupted): stop showing it."""
        ...


_DISPLAY: ContextVar[Display | None] = ContextVar("gskit_progress_display", default=None)


def _ignore(amount: int = 1) -> None:
    """``advance`` when nobody listens."""


@contextmanager
def task(description: str, total: int | None = None) -> Iterator[Callable[[int], None]]:
    """Report the progress of one long step; yields ``advance(amount=1)``.

    Args:
        description: what is being done, e.g. ``"fold: evaluating constant nodes"``.
        total: units of work (``None``: unknown, e.g. a step with no inner count).
    """
    display = _DISPLAY.get()
    if display is None:
        yield _ignore
        return
    handle = display.start(description, total)

    def advance(amount: int = 1) -> None:
        display.advance(handle, amount)

    try:
        yield advance
    finally:
        display.stop(handle)


@contextmanager
def shown_by(display: Display | None) -> Iterator[None]:
    """Send the progress of :func:`task` calls in this context to ``display`` (None: to nobody)."""
    token = _DISPLAY.set(display)
    try:
        yield
    finally:
        _DISPLAY.reset(token)
