"""Models and data in and out: the lowest part of the core layer.

``model``: loading and saving ONNX models of any size (external data, atomic saves) and converting between
``ModelProto`` and ``gs.Graph``; ``outputs``: putting outputs under their final names (what may be replaced,
sets of files, gskit's own scratch folders); ``interrupt``: long native calls that SIGINT and SIGTERM still
end; ``wellformed``: the checks ``model.load`` runs on every model it reads (non-UTF-8 strings, unknown
element types, cycles, recursive functions). ``feeds``: input data for running a model, random or from a file.
``report``: the tables and JSON every command prints; ``html_report``: ``report.html``; ``progress``: progress
of long steps, reported by the library and shown by the command line. ``shape_args``: how a shape is written
on the command line and in recipes. ``text``: text from models and paths shown as data (controls escaped);
``limits``: the numbers ONNX holds (64-bit integers).

Core layer (docs/architecture.md): nothing here imports a backend, compare, the pipeline or the CLI.
"""
