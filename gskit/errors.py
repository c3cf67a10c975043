"""The one exception type gskit raises for problems a user can fix."""

from __future__ import annotations


class GskitError(Exception):
    """A problem with the user's model, files or options.

    The message is one line that names the file, node or tensor involved and says what to do.
    The CLI prints it without a traceback (unless ``--debug``).
    """


class ModelCheckError(GskitError):
    """A model failed onnx's checker or a pass's postcondition."""


class PluginError(GskitError):
    """A plugin spec or plugin file is invalid."""
