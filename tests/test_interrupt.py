"""gskit.io.interrupt: native calls in a worker thread, as the caller would have run them."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest

from gskit.io import interrupt


class _Held:
    """Something only the failing call's frames hold (an onnxruntime session, in gskit)."""


def _fails(held: _Held) -> None:
    raise ValueError("inside the native call")


def test_what_the_call_returns_and_raises_comes_back() -> None:
    assert interrupt.call(lambda: 42) == 42
    with pytest.raises(ValueError, match="inside the native call"):
        interrupt.call(lambda: _fails(_Held()))
    assert not interrupt.stranded()


def test_a_failed_call_is_freed_without_the_cyclic_gc() -> None:
    """The exception's frames held the list its worker wrote it into: a cycle that the cyclic GC freed at any
    later moment, once inside another onnxruntime session's run (a plugin reference), which crashed."""
    held = _Held()
    ref = weakref.ref(held)
    gc.disable()
    try:
        try:
            interrupt.call(lambda h=held: _fails(h))
        except ValueError:
            pass
        del held
        assert ref() is None
    finally:
        gc.enable()


def test_outside_the_main_thread_the_call_runs_in_place() -> None:
    seen = []
    thread = threading.Thread(target=lambda: seen.append(interrupt.call(threading.current_thread)))
    thread.start()
    thread.join()
    assert seen == [thread]


SWALLOWED = """
import signal, sys
from gskit.io import interrupt


class Finalized:
    def __del__(self):  # where Python can only print an exception ("Exception ignored in ...")
        signal.raise_signal(signal.SIGINT)


with interrupt.signals_unwind():
    Finalized()  # freed at once: the interrupt arrives inside its finalizer
    print("arrived", interrupt.arrived() == signal.SIGINT)


class Failing:
    def __del__(self):
        raise ValueError("a finalizer's own error")


Failing()  # outside: Python's hook as before
"""


def test_an_interrupt_raised_in_a_finalizer_is_recorded_not_printed() -> None:
    """The KeyboardInterrupt that signals_unwind raises inside a finalizer or weakref callback cannot unwind
    anything: Python printed it as "Exception ignored in ..." with a traceback. It is recorded (the next call
    raises it again) and not shown; other such errors, and any outside the block, are shown as before."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", SWALLOWED], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "arrived True" in done.stdout
    assert "KeyboardInterrupt" not in done.stderr
    assert "Exception ignored in" in done.stderr and "a finalizer's own error" in done.stderr


AT_SHUTDOWN = """
import atexit, os, signal, sys

atexit.register(os.kill, os.getpid(), signal.{sig})  # run as the interpreter shuts down, after main()
sys.argv = ["gskit", "inspect", sys.argv[1]]
from gskit.cli import main

sys.exit(main())
"""


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_once_the_command_is_done_leaves_its_exit_code(sig: str) -> None:
    """Once the work is done and reported, a signal while the interpreter shuts down neither prints a
    traceback (SIGINT met Python's handler) nor kills the finished command (SIGTERM killed it silently)."""
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).parents[1] / "gskit" / "data" / "example.onnx"
    done = subprocess.run(
        [sys.executable, "-c", AT_SHUTDOWN.replace("{sig}", sig), str(example)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, (done.returncode, done.stderr[-500:])
    assert "example.onnx" in done.stdout  # the summary was printed


def test_a_second_signal_does_not_cut_the_first_ones_cleanup_short() -> None:
    """A second Ctrl-C (or a SIGTERM after it) raised again inside the first one's cleanup skipped the rest of
    it, and inside the command line's handler that prints the one line, escaped as a traceback. While an
    interrupt unwinds, another is recorded only."""
    import signal

    cleaned = []
    with pytest.raises((KeyboardInterrupt, interrupt.Terminated)) as raised:
        with interrupt.signals_unwind():
            try:
                signal.raise_signal(signal.SIGINT)
            finally:
                signal.raise_signal(signal.SIGTERM)  # arrives while the first unwinds
                cleaned.append("after")
    assert raised.type is KeyboardInterrupt and cleaned == ["after"]


def test_a_second_signal_cuts_the_grace_of_a_call_that_does_not_stop_short() -> None:
    """The second signal is recorded, not raised, while the first unwinds: it still ends the wait for an
    interrupted call that does not stop (here a sleep no cancel reaches) before CANCEL_GRACE_S."""
    import os
    import signal
    import time

    def send_twice() -> None:
        for _ in range(2):
            time.sleep(0.3)
            os.kill(os.getpid(), signal.SIGINT)

    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt), interrupt.signals_unwind():
        threading.Thread(target=send_twice, daemon=True).start()
        interrupt.call(lambda: time.sleep(5))
    assert time.monotonic() - start < 0.6 + interrupt.CANCEL_GRACE_S / 2


AS_RUN_RETURNS = """
import os, signal, sys
import gskit.cli as cli


def at_return(frame, event, arg):
    if event == "return" and frame.f_code is cli._run.__code__:
        sys.setprofile(None)
        os.kill(os.getpid(), signal.SIGTERM)  # as the command returns, before main's handlers are put back


sys.argv = ["gskit", "inspect", sys.argv[1]]
sys.setprofile(at_return)
sys.exit(cli.main())
"""


def test_a_signal_as_the_command_returns_is_no_traceback() -> None:
    """A signal between the command's own handlers and the end of signals_unwind escaped main() as a
    traceback (a second Ctrl-C just after the first one's line, exit -2 or 1)."""
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).parents[1] / "gskit" / "data" / "example.onnx"
    done = subprocess.run(
        [sys.executable, "-c", AS_RUN_RETURNS, str(example)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode in (0, 143) and "Traceback" not in done.stderr, (
        done.returncode,
        done.stderr[-800:],
    )


DURING_IMPORTS = """
import atexit, os, signal, sys
import gskit.cli as cli


def at_import(frame, event, arg):
    if event == "call" and frame.f_code.co_filename.endswith(os.path.join("cli", "compare.py")):
        sys.setprofile(None)
        os.kill(os.getpid(), signal.SIGINT)  # as the command's module starts importing (onnx next)


atexit.register(lambda: print("imported", "gskit.cli.compare" in sys.modules))
sys.argv = ["gskit", "compare", sys.argv[1], sys.argv[1]]
sys.setprofile(at_import)
sys.exit(cli.main())
"""


def test_a_signal_during_the_commands_imports_takes_effect_after_them() -> None:
    """The exception of a signal raised inside the Python code a C extension runs as it initializes (onnx's,
    imported by the command's module) aborted or crashed the process (5 of 200 compare runs signalled in
    their first 0.3 s). The command's imports finish first; then it ends with its one line."""
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).parents[1] / "gskit" / "data" / "example.onnx"
    done = subprocess.run(
        [sys.executable, "-c", DURING_IMPORTS, str(example)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 130 and done.stderr.strip().endswith("interrupted"), done.stderr[-800:]
    assert "imported True" in done.stdout and "Traceback" not in done.stderr
