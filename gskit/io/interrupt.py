"""Long calls into native code kept interruptible: SIGINT and SIGTERM end a command within seconds.

Python runs a signal handler (Ctrl-C's ``KeyboardInterrupt``, SIGTERM's :class:`Terminated` inside
:func:`signals_unwind`, which the command line uses) only in the main thread and only between bytecodes.
While onnxruntime evaluates a node in C++ (a constant ``Loop`` of 10^12 iterations) no handler runs, so
neither signal ended the command; only SIGKILL did.

:func:`call` runs such a call in a worker thread while the main thread waits in a way a signal interrupts. On
an interrupt it asks the call to stop (``cancel``: onnxruntime's ``RunOptions.terminate``, which its
executors check between nodes and between loop iterations) and gives it :data:`CANCEL_GRACE_S` to do so,
then lets the interrupt unwind the command, whose cleanup (work folders, temporary files) runs as usual. A
call that does not stop (one long node, or a library's session gskit cannot cancel) is left in its daemon
thread: :func:`stranded` says so, and the command line then ends the process with ``os._exit`` after its
cleanup, since an interpreter that exits normally while onnxruntime still runs aborts in onnxruntime's
destructors.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds a call asked to stop may take before the interrupt goes on without it.
CANCEL_GRACE_S = 2.0
#: Seconds between two looks at whether a second signal arrived during that grace.
_POLL_S = 0.05
_RUNNING: set[threading.Thread] = set()
_LOCK = threading.Lock()
#: Inside :func:`signals_unwind`: the signals that arrived (a library may have swallowed their exception).
_ARRIVED: list[int] = []


class Terminated(BaseException):
    """SIGTERM arrived; a BaseException so that no ``except Exception`` of a step swallows it."""


@contextmanager
def signals_unwind() -> Iterator[None]:
    """SIGINT raises ``KeyboardInterrupt`` and SIGTERM :class:`Terminated` in the block, and they stick.

    Cleanup (work folders, temporary files, the TensorRT worker) then runs as the exception unwinds. A
    library that swallows the exception (Polygraphy's lazy import of torch has a bare ``except:``, and the
    import takes seconds) does not keep the command going: the next :func:`call` raises it again. A signal
    that arrives while an interrupt's exception unwinds is recorded, not raised: the cleanup and the
    command's report run to their end. Only in the main thread (elsewhere no handler can be set).
    """

    def unwind(signum: int, frame: object) -> None:
        _ARRIVED.append(signum)
        if isinstance(sys.exc_info()[1], (KeyboardInterrupt, Terminated)):
            # An interrupt unwinds already (a second Ctrl-C): raised again inside its cleanup or report, it
            # cut them short (a traceback from the handler printing the one line); it is recorded only.
            return
        raise _exception(signum)

    previous_hook = sys.unraisablehook

    def unraisable(report: Any) -> None:
        # The exception unwind raised inside a finalizer or weakref callback, where Python can only print it
        # ("Exception ignored in ...", a traceback): the interrupt is recorded and raised again by the next
        # call, so it is not shown; any other goes to the hook of before.
        if not (_ARRIVED and isinstance(report.exc_value, (KeyboardInterrupt, Terminated))):
            previous_hook(report)

    sys.unraisablehook = unraisable
    try:
        with _handling(unwind):
            yield
    finally:
        _ARRIVED.clear()
        sys.unraisablehook = previous_hook


@contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM that arrive in the block take effect at its end, with the handlers of before (a
    few renames that must not stop half way, ``gskit.io.outputs.replace_set``)."""
    pending: list[int] = []

    def hold(signum: int, frame: object) -> None:
        pending.append(signum)

    with _handling(hold):
        yield
    for sig in dict.fromkeys(pending):
        signal.raise_signal(sig)


@contextmanager
def _handling(handler: Callable[[int, object], None]) -> Iterator[None]:
    """``handler`` for SIGINT and SIGTERM in the block (main thread only; Python runs none elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def arrived() -> int | None:
    """Inside :func:`signals_unwind`: the first SIGINT or SIGTERM that arrived, or None.

    An exception of any kind that follows one is the interrupt's doing (an extension module whose import it
    cut short reports "initialization failed"), so the command line reports the interrupt instead.
    """
    return _ARRIVED[0] if _ARRIVED else None


def _exception(signum: int) -> BaseException:
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated()


def call(fn: Callable[[], T], *, cancel: Callable[[], None] | None = None) -> T:
    """``fn()``, run so that SIGINT and SIGTERM still interrupt the main thread while it runs.

    Outside the main thread (no signal handler runs there) ``fn`` is called directly.

    Args:
        fn: the call; what it returns or raises is returned or raised here.
        cancel: asks ``fn`` to stop early; called (from the main thread) when an interrupt arrives.

    Raises:
        BaseException: what ``fn`` raised, or the interrupt (``KeyboardInterrupt``, the CLI's SIGTERM
            exception) that arrived while it ran.
    """
    if threading.current_thread() is not threading.main_thread():
        return fn()
    if _ARRIVED:  # a signal whose exception something swallowed: the command still ends
        raise _exception(_ARRIVED[0])
    outcome: list[tuple[bool, object]] = []
    done = threading.Event()

    def work() -> None:
        try:
            outcome.append((True, fn()))
        except BaseException as err:  # noqa: BLE001  # handed to the caller below, whatever it is
            outcome.append((False, err))
        finally:
            with _LOCK:
                _RUNNING.discard(threading.current_thread())
            done.set()

    worker = threading.Thread(target=work, name="gskit-native-call", daemon=True)
    with _LOCK:
        _RUNNING.add(worker)
    worker.start()
    try:
        done.wait()
    except BaseException:
        _stop(done, cancel)
        raise
    # The list and the frames of an exception's traceback make a cycle (the worker's frame holds the list);
    # left to the cyclic GC, a session held by those frames would be freed at any later moment, even inside
    # another session's run, which onnxruntime does not survive. Emptied here, it is freed with the exception.
    ok, value = outcome.pop()
    if ok:
        return value  # type: ignore[return-value]
    try:
        raise value  # type: ignore[misc]
    finally:
        del value


def _stop(done: threading.Event, cancel: Callable[[], None] | None) -> None:
    """Ask an interrupted call to stop and wait a little for it (a second signal cuts the wait short)."""
    if cancel is not None:
        try:
            cancel()
        except Exception as err:  # noqa: BLE001  # the interrupt goes on whatever the cancel did
            log.debug("cancelling the interrupted call failed: %s", err)
    # A second signal cuts the wait short: signals_unwind's handler records it without raising (the first
    # one unwinds); Python's own handler raises it.
    arrived = len(_ARRIVED)
    deadline = time.monotonic() + CANCEL_GRACE_S
    try:
        while len(_ARRIVED) == arrived and time.monotonic() < deadline and not done.wait(_POLL_S):
            pass
    except BaseException:  # noqa: BLE001  # a second Ctrl-C: the first interrupt goes on
        pass


def stranded() -> bool:
    """A call :func:`call` ran is still running in its thread (it was interrupted and did not stop)."""
    with _LOCK:
        return any(thread.is_alive() for thread in _RUNNING)
