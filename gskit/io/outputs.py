"""Putting outputs under their final names: the one place that decides what gskit may replace or delete.

* :func:`place_file` and :func:`write_atomic` rename a finished file over its final name: a crash never leaves
  half a file there, a symbolic link found there is replaced (never followed), and only a regular file, a link
  or a new name is ever replaced (:func:`check_replaceable`: never a folder, a device such as ``/dev/null``,
  a FIFO or a socket).
* Inside :func:`guarding_inputs` (each CLI command, each ``prepare`` run) every file a loaded model reads is
  remembered, and no writer replaces or deletes one of them (:func:`check_output`).
* :func:`replace_set` puts several files in place of an earlier set of them (``prepare``'s OUTDIR), so that
  what is visible at any moment belongs to one set.
* :func:`make_scratch_folder` makes gskit's temporary folders beside an output, marked with their owner;
  :func:`remove_abandoned_scratch` removes only such marked folders whose owner is gone, and never one that
  holds a file an input reads.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from gskit.errors import GskitError, write_error
from gskit.io.interrupt import signals_held

#: Inside :func:`guarding_inputs`: files that loaded models read (-> the model), never written over.
_INPUT_FILES: ContextVar[dict[Path, Path] | None] = ContextVar("gskit_input_files", default=None)


def output_entry(path: str | os.PathLike) -> Path:
    """The absolute name an output takes: its folder resolved, its last part kept even if it is a link.

    Writing renames a new file over this name, so a symbolic link found there is replaced, not followed.
    """
    path = Path(os.path.abspath(path))
    return path.parent.resolve() / path.name


def _entries(path: Path) -> set[Path]:
    """The names through which a file is reached: its own and, through links, the real one."""
    return {output_entry(path), path.resolve()}


@contextmanager
def guarding_inputs() -> Iterator[None]:
    """Within this block, no gskit writer replaces or deletes a file that a model loaded in it reads.

    One command is one block: the files are those of its input model(s), not every model a long-running
    process ever loaded (a file written, read back and written again stays writable outside the block).
    Nested blocks share the outer one's files.
    """
    if _INPUT_FILES.get() is not None:
        yield
        return
    token = _INPUT_FILES.set({})
    try:
        yield
    finally:
        _INPUT_FILES.reset(token)


def remember_input(path: Path, model_path: Path) -> None:
    """Inside :func:`guarding_inputs`: the file at ``path`` is read by the model at ``model_path``."""
    files = _INPUT_FILES.get()
    if files is not None:
        for entry in _entries(path):
            files.setdefault(entry, model_path)


def input_reading(path: str | os.PathLike) -> Path | None:
    """The model loaded in :func:`guarding_inputs` that reads the file at ``path``, or None."""
    return (_INPUT_FILES.get() or {}).get(output_entry(path))


def check_output(path: str | os.PathLike) -> None:
    """Refuse an output name that gskit may not replace: anything but a regular file, a symbolic link or a new
    name (:func:`check_replaceable`), or a file that a model loaded in :func:`guarding_inputs` reads.

    Raises:
        GskitError: naming the file and what to do (for an input's file: the model that reads it).
    """
    check_replaceable(path)
    model_path = input_reading(path)
    if model_path is not None:
        raise GskitError(
            f"{path}: the input model {model_path} is still read from this file; writing it would destroy "
            f"the input; choose another output path"
        )


#: What an entry of the file system is, for entries gskit never replaces (``stat.S_IFMT`` -> words).
_NOT_REPLACED = {
    stat.S_IFDIR: "a folder",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFIFO: "a named pipe (FIFO)",
    stat.S_IFSOCK: "a socket",
}


def check_replaceable(path: str | os.PathLike, *, role: str = "") -> None:
    """Refuse an output name that holds something other than a regular file or a symbolic link.

    Writing renames a new file over the name, which would take a device's or a pipe's name away (as root,
    ``-o /dev/null`` would replace the system's ``/dev/null``) and cannot replace a folder. A link is
    replaced, never followed, so it is fine whatever it points at. A name whose folder cannot be read is
    left to the write itself to report.

    Args:
        path: the name an output takes.
        role: what gskit writes there when the user did not name it (``"the external data of out.onnx"``).

    Raises:
        GskitError: ``path`` is a folder, a device, a FIFO or a socket.
    """
    try:
        kind = stat.S_IFMT(os.lstat(path).st_mode)
    except OSError:  # a new name (or an unreadable folder, which the write reports)
        return
    what = _NOT_REPLACED.get(kind)
    if what is None:
        return
    if role:
        raise GskitError(
            f"{path}: is {what}, but gskit writes {role} under this name; move it or choose another -o"
        )
    if kind == stat.S_IFDIR:
        raise GskitError(f"{path}: is a folder; give the path of a file to write")
    raise GskitError(
        f"{path}: is {what}, not a regular file; gskit replaces only regular files, choose another path"
    )


def place_file(tmp: str | os.PathLike, path: str | os.PathLike, *, in_place: bool = False) -> Path:
    """Rename a finished temporary file to its final name ``path`` (same file system), atomically.

    The one way gskit's outputs take their final name. A link at ``path`` is replaced, never followed;
    a file that a loaded model reads is never replaced (unless ``in_place``), nor is anything but a regular
    file or a link (a folder, a device, a FIFO, a socket: :func:`check_replaceable`).

    Raises:
        GskitError: ``path`` is a file a loaded model reads, or not a regular file or a link.
    """
    target = output_entry(path)
    if in_place:
        check_replaceable(target)
    else:
        check_output(target)
    os.replace(tmp, target)
    return target


def write_atomic(path: str | os.PathLike, data: bytes | str, *, mode: int = 0o644) -> Path:
    """Write ``data`` to a temporary file beside ``path`` and rename it into place (:func:`place_file`).

    Raises:
        GskitError: ``path`` is a file a loaded model reads, or not a regular file or a link.
    """
    target = output_entry(path)
    check_output(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with blaming(target), os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.chmod(tmp, mode)  # mkstemp makes files private; outputs are meant to be shared
        return place_file(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)


@contextmanager
def blaming(path: str | os.PathLike) -> Iterator[None]:
    """An OSError in the block (a full disk, a file-size limit) becomes a WriteError naming ``path``, the
    final name of the file being written (the first such error wins: an inner block names its own file)."""
    try:
        yield
    except OSError as err:
        raise write_error(path, err) from err


#: The file inside a scratch folder that marks it as gskit's own: a header line, then ``PID HOST``.
SCRATCH_MARK = ".gskit-scratch"
_MARK_HEADER = "gskit scratch folder; removed by gskit once its process is gone"


def make_scratch_folder(parent: str | os.PathLike, prefix: str) -> Path:
    """A new, private folder ``parent/<prefix>XXXX`` for gskit's unfinished files, marked as gskit's own.

    The mark (``.gskit-scratch``: the owner's pid and host) is what lets a later run remove the folder when
    its process was killed; a folder without it is never removed, whatever its name.

    Raises:
        OSError: the folder or its mark cannot be written (a full disk, a read-only folder).
    """
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        (folder / SCRATCH_MARK).write_text(f"{_MARK_HEADER}\n{os.getpid()} {socket.gethostname()}\n")
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


def remove_scratch_folder(folder: Path) -> None:
    """Remove a scratch folder of this process, its mark last: a process killed while it removes the folder
    leaves it marked (a later run removes it, :func:`remove_abandoned_scratch`), not a folder without a mark,
    which nothing removes. Errors are ignored, as ``shutil.rmtree(..., ignore_errors=True)`` does."""
    try:
        entries = [entry for entry in os.scandir(folder) if entry.name != SCRATCH_MARK]
    except OSError:
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
    with contextlib.suppress(OSError):
        os.unlink(folder / SCRATCH_MARK)
    with contextlib.suppress(OSError):
        os.rmdir(folder)


def scratch_owner(folder: Path) -> tuple[int, str] | None:
    """``(pid, host)`` of the gskit process that made the scratch folder ``folder``; None when unmarked."""
    mark = folder / SCRATCH_MARK
    try:
        if not stat.S_ISREG(os.lstat(mark).st_mode) or os.lstat(mark).st_size > 4096:
            return None
        header, owner = mark.read_text().splitlines()[:2]
        pid, host = owner.split(" ", 1)
        return (int(pid), host) if header == _MARK_HEADER and pid.isdigit() else None
    except (OSError, ValueError):  # unreadable, too few lines, not text
        return None


def remove_abandoned_scratch(parent: str | os.PathLike) -> list[Path]:
    """Remove the scratch folders in ``parent`` whose gskit process is gone; return those removed.

    Only folders marked by :func:`make_scratch_folder` whose owner ran on this host and no longer runs are
    removed (a folder of another host may belong to a live process), and never one that holds a file an
    input model reads (inside :func:`guarding_inputs`). Links are never followed.
    """
    removed = []
    host = socket.gethostname()
    for path in Path(parent).iterdir():
        if path.is_symlink() or not path.is_dir():
            continue
        owner = scratch_owner(path)
        if owner is None or owner[1] != host or process_alive(owner[0]) or holds_input(path):
            continue
        remove_scratch_folder(path)
        removed.append(path)
    return removed


def process_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine (someone else's counts; this one always does)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def holds_input(folder: str | os.PathLike) -> Path | None:
    """The model loaded in :func:`guarding_inputs` that is or reads a file inside ``folder``; or None."""
    inside = Path(folder).resolve()
    for entry, model_path in (_INPUT_FILES.get() or {}).items():
        if inside in entry.parents:
            return model_path
    return None


def replace_set(
    staged: Sequence[tuple[str | os.PathLike, str | os.PathLike]], names: Sequence[str | os.PathLike]
) -> None:
    """Put a set of finished files under their final names in place of the set that those names held.

    Args:
        staged: ``(finished file, final name)`` pairs, each file on its final name's file system, in the
            order of ``names``.
        names: every name a set may hold, in the order they take their names; the last is the set's seal
            (``prepare``: ``report.json``). What the new set leaves out is removed (an earlier run's engine
            when this run built none); an empty ``staged`` leaves no set.

    What holds: at any moment the files under ``names`` all belong to one set, the earlier or the new one,
    and a seal is there only beside the rest of its set. The earlier seal is removed first, then the rest of
    the earlier set, then the new files are renamed into place, the seal last. SIGINT and SIGTERM arriving
    meanwhile take effect when it is done; a SIGKILL in between leaves part of one set and no seal (nothing
    is synced to the disk: after a power cut the file system's own ordering decides). Only regular files and
    links are removed: a folder, a device or a FIFO under a name the new set does not use is left alone, and
    so is a file an input model reads.

    Raises:
        GskitError: a final name of the new set may not be replaced (:func:`check_output`; checked before
            anything changes), or a file cannot be removed or renamed (naming it).
    """
    pairs = [(Path(tmp), output_entry(final)) for tmp, final in staged]
    for _, final in pairs:
        check_output(final)
    earlier = [output_entry(name) for name in names][::-1]  # the seal first
    with signals_held():
        for name in earlier:
            if (name.is_symlink() or name.is_file()) and input_reading(name) is None:
                with blaming(name):
                    name.unlink(missing_ok=True)
        for tmp, final in pairs:
            with blaming(final):
                place_file(tmp, final)
