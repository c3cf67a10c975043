"""OUTDIR's lock and work folder: one ``gskit prepare`` run at a time writes to an OUTDIR.

A run holds ``flock`` on ``OUTDIR/.gskit.lock`` (the kernel releases it when the process dies), clears the
work folders that killed runs left, and writes its files into a work folder of its own inside OUTDIR
(``gskit.pipeline.prepare`` then puts them in place together).
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gskit.errors import GskitError, write_error
from gskit.io.outputs import (
    make_scratch_folder,
    remove_abandoned_scratch,
    remove_scratch_folder,
)

log = logging.getLogger(__name__)

#: OUTDIR's lock file: one run at a time writes there.
LOCK_NAME = ".gskit.lock"
#: Prefix of a run's work folder inside OUTDIR.
WORK_PREFIX = ".gskit-work-"


@contextmanager
def claim_outdir(out_dir: Path) -> Iterator[Path]:
    """Lock OUTDIR for this run, clear what killed runs left there, and give a work folder inside it.

    The lock (``flock`` on ``OUTDIR/.gskit.lock``, released by the kernel even when the process is killed)
    keeps two runs from mixing their files. The work folder is a scratch folder marked as this process's
    (``gskit.io.outputs.make_scratch_folder``); holding the lock, the marked scratch folders of gskit
    processes that are gone are removed, and nothing else (a folder without the mark, whatever its name, or
    one holding the input model, stays). The work folder is removed on the way out (errors, Ctrl-C, SIGTERM).

    Raises:
        GskitError: OUTDIR is a file or cannot be created, or another run holds it.
    """
    if out_dir.exists() and not out_dir.is_dir():
        raise GskitError(f"{out_dir}: OUTDIR is a file, not a folder; choose another -o")
    lock = out_dir / LOCK_NAME
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as err:
        raise GskitError(f"{out_dir}: cannot create OUTDIR ({err.strerror}); choose another -o") from err
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # The holder before us removes the file on its way out: the lock must be on the file there now.
            locked = os.fstat(fd).st_ino == os.stat(lock, follow_symlinks=False).st_ino
        except (BlockingIOError, FileNotFoundError):
            locked = False
        if not locked:
            raise GskitError(
                f"{out_dir}: another gskit prepare is writing there; wait for it to end or choose another -o"
            )
        for left in remove_abandoned_scratch(out_dir):
            log.info("removed %s, left by an interrupted gskit run", left)
        work = None
        try:
            try:
                work = make_scratch_folder(out_dir, WORK_PREFIX)
            except OSError as err:
                raise write_error(out_dir, err) from err
            yield work
        finally:
            if work is not None:
                remove_scratch_folder(work)
            lock.unlink(missing_ok=True)  # still locked: a run that opened it meanwhile sees it is gone
    finally:
        os.close(fd)
