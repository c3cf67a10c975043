"""The one exception type gskit raises for problems a user can fix."""

from __future__ import annotations

import errno


class GskitError(Exception):
    """A problem with the user's model, files or options.

    The message is one line that names the file, node or tensor involved and says what to do.
    The CLI prints it without a traceback (unless ``--debug``).
    """


class ModelCheckError(GskitError):
    """A model failed onnx's checker or a pass's postcondition."""


class PluginError(GskitError):
    """A plugin spec or plugin file is invalid, or plugin code (a numpy reference) raised."""


#: What plugin code (a spec, a reference, a pattern, an output rule) raising counts as its failure, said
#: in one line naming the plugin (exit 2): any Exception, and SystemExit (``sys.exit()`` in a plugin) and
#: GeneratorExit, which would otherwise end gskit with exit 0 and no word, or with a traceback. Ctrl-C
#: (KeyboardInterrupt) and the command line's own unwinding on SIGTERM pass through as they were raised.
PLUGIN_CODE_FAILURES: tuple[type[BaseException], ...] = (Exception, SystemExit, GeneratorExit)


class ModelLoadError(GskitError):
    """A runtime (onnxruntime) cannot load the model at all: no other input or shape can make it run."""


#: What an OSError's errno means for a file gskit reads or writes, in the words of a user.
_WHY = {
    errno.ENOSPC: "no space left on the disk; free some space or choose another output folder",
    errno.EFBIG: "file too large for the disk or for the file-size limit (ulimit -f)",
    errno.EDQUOT: "disk quota exceeded; free some space or choose another output folder",
    errno.EROFS: "the file system is read-only; choose another output folder",
    errno.EACCES: "permission denied; choose a folder you can write to",
    errno.EPERM: "operation not permitted; choose a folder you can write to",
    errno.ENOENT: "no such file or folder",
    errno.ENOTDIR: "a part of the path is not a folder",
    errno.EISDIR: "is a folder, not a file",
}


def describe_os_error(err: OSError, path: object = None) -> str:
    """One line for an OSError: the file (``path``, else the error's own) and why, in plain words."""
    target = path if path is not None else err.filename
    why = _WHY.get(err.errno or 0) or err.strerror or type(err).__name__
    return f"{target}: {why}" if target is not None else why


class WriteError(GskitError):
    """A file could not be written (a full disk, a file-size limit, a read-only folder).

    Attributes:
        path: the file that could not be written.
        error: the OSError that said why.
    """

    def __init__(self, path: object, error: OSError) -> None:
        super().__init__(f"cannot write {describe_os_error(error, path)}")
        self.path = path
        self.error = error


def write_error(path: object, err: OSError) -> WriteError:
    """The error for an OSError while writing ``path``: one line naming the file and why."""
    return WriteError(path, err)
