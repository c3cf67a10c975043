"""The child side of gskit's TensorRT calls: ``python -P -m gskit.backends.trt_worker REQUEST RESPONSE PID``.

With ``--wait FLAVOUR`` after them the worker imports TensorRT (``tensorrt`` or ``tensorrt_rtx``) first and
then waits until its stdin is closed: the parent starts it before it knows the task
(``gskit.backends.trt.started_worker``), writes REQUEST, and closes the pipe to say "go".

TensorRT-RTX aborts the process on some plugin nodes, Polygraphy picks TensorRT or TensorRT-RTX once at
import time (``POLYGRAPHY_USE_TENSORRT_RTX``), and a builder can crash on a bad plugin: so every parse
and build runs here, in a fresh interpreter, and the parent (``gskit.backends.trt``) turns a crash into a
GskitError. The request and the response are JSON files; the worker imports nothing of gskit's heavy
modules and never prints to stdout (TensorRT logs go to stderr).

Tasks:
    ``check``: capability partitioning and parse errors of one model file.
    ``ops``: ``supports_operator`` for a list of op types.
    ``build``: an engine via Polygraphy loaders, written to a given path.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import importlib.util
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gskit.io.code_files import import_file

FLAVOURS = ("tensorrt", "tensorrt_rtx")
#: After the three arguments: import this flavour, then wait for stdin to close before reading REQUEST.
WAIT_FLAG = "--wait"


def main(argv: list[str]) -> int:
    if len(argv) == 5 and argv[3] == WAIT_FLAG:
        return _wait_then_run(argv[:3], argv[4])
    request_path, response_path, parent = argv
    _die_with_parent(int(parent))
    request = json.loads(Path(request_path).read_text())
    flavour = request["flavour"]
    if flavour not in FLAVOURS:
        raise SystemExit(f"unknown TensorRT flavour {flavour!r}")
    trt = importlib.import_module(flavour)
    if request.get("tensorrt_plugins"):
        load_tensorrt_plugins(trt)
    load_plugins(request.get("plugin_libraries", ()), request.get("plugin_modules", ()))
    task = request["task"]
    result: dict[str, Any] = {"flavour": flavour, "version": trt.__version__}
    if task == "check":
        result.update(_check(trt, request["model"]))
    elif task == "ops":
        result.update(_ops(trt, request["ops"]))
    elif task == "build":
        result.update(_build(trt, request))
    else:
        raise SystemExit(f"unknown task {task!r}")
    Path(response_path).write_text(json.dumps(result))
    return 0


def _wait_then_run(argv: list[str], flavour: str) -> int:
    """Load TensorRT, wait for the parent to close stdin, then run the task it wrote (none: it gave up)."""
    _die_with_parent(int(argv[2]))
    if flavour not in FLAVOURS:
        raise SystemExit(f"unknown TensorRT flavour {flavour!r}")
    importlib.import_module(flavour)  # the slow part, while the parent still works
    sys.stdin.read()
    if not Path(argv[0]).is_file():
        return 0
    return main(argv)


def _die_with_parent(parent: int) -> None:
    """Ask Linux to kill this worker when the process that started it dies (even by SIGKILL).

    An orphaned worker would go on building (GPU memory, CPU) for nobody. If the parent is already gone
    by now, stop at once.
    """
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        try:
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # no prctl in this C library: the check below still runs
            pass
    try:
        os.kill(parent, 0)
    except ProcessLookupError:
        raise SystemExit("gskit's TensorRT worker: the process that started it is gone") from None
    except PermissionError:  # alive, under another user (a launcher that changed user)
        pass


def load_tensorrt_plugins(trt: Any) -> None:
    """Register TensorRT's own plugins (``libnvinfer_plugin``) in namespace "", as ``initLibNvInferPlugins``
    does in C++. Polygraphy's ONNX and engine loaders call it too; the parser check does not use them."""
    if not trt.init_libnvinfer_plugins(trt.Logger(trt.Logger.WARNING), ""):
        raise ImportError(f"{trt.__name__} {trt.__version__}: init_libnvinfer_plugins failed")


#: C++ plugin libraries loaded into this process (TensorRT refuses a second registration of a creator).
_LOADED_LIBRARIES: set[Path] = set()


def _load_library(path: Path) -> None:
    """Load one C++ plugin library, through TensorRT's own loader when full TensorRT is importable.

    ``IPluginRegistry.load_library`` imports ``libnvinfer`` first and calls the library's ``getCreators``
    entry point, so registration does not depend on what this process loaded before. A library without
    that entry point (registration in a static initializer only) is loaded with ``ctypes.CDLL``.
    """
    if path in _LOADED_LIBRARIES:
        return
    try:
        import tensorrt  # optional and heavy: only when a library is given

        registry = tensorrt.get_plugin_registry()
    except Exception:  # not installed, the PyPI stub, or TensorRT-RTX only
        registry = None
    handle = None
    if registry is not None:
        try:
            handle = registry.load_library(str(path))
        except Exception:  # no getCreators: a library that registers itself when loaded
            handle = None
    if handle is None:
        try:
            ctypes.CDLL(str(path))
        except OSError as err:  # the loader's message names the missing symbol or dependency
            raise ImportError(f"{path}: cannot load the plugin library: {err}") from err
    _LOADED_LIBRARIES.add(path)


def load_plugins(libraries: Sequence[str | os.PathLike], modules: Sequence[str | os.PathLike]) -> None:
    """Load C++ plugin libraries (their static registration runs) and import Python plugin modules.

    Shared with the parent process (``gskit.backends.trt.load_plugin_files``); it imports only the standard
    library (and ``gskit.io.code_files``, which does too), so the parent can call it without this module's
    TensorRT imports. A module is imported once per process, with its folder as package path so that it may
    import its siblings.

    Raises:
        ImportError: a library cannot be loaded or a module cannot be imported; the message names the
            file and the cause.
    """
    for library in libraries:
        _load_library(Path(library).resolve())
    for index, path in enumerate(modules):
        module_path = Path(path)
        name = f"gskit_trt_plugin_{index}_{module_path.parent.name}"
        if name in sys.modules:
            continue
        try:
            module = import_file(name, module_path)
        except Exception as err:  # user code: name the file
            cause = f"{type(err).__name__}: {err}"
            raise ImportError(f"{module_path}: cannot import TensorRT plugin: {cause}") from err
        if module is None:
            raise ImportError(f"{module_path}: cannot be imported as a Python module")


def _parser(trt: Any) -> tuple[Any, Any, Any]:
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    return builder, network, trt.OnnxParser(network, logger)


def _check(trt: Any, model_path: str) -> dict[str, Any]:
    builder, network, parser = _parser(trt)
    data = Path(model_path).read_bytes()
    supported = bool(parser.supports_model_v2(data, model_path))
    subgraphs = [
        {
            "supported": bool(parser.is_subgraph_supported(i)),
            "nodes": [int(n) for n in parser.get_subgraph_nodes(i)],
        }
        for i in range(parser.num_subgraphs)
    ]
    errors = []
    for i in range(parser.num_errors):
        error = parser.get_error(i)
        errors.append(
            {
                "node": int(error.node()),
                "node_name": error.node_name(),
                "op": error.node_operator(),
                "code": str(error.code()).rsplit(".", 1)[-1],
                "desc": error.desc(),
                "func": error.func(),
                "file": error.file(),
            }
        )
    del parser, network, builder
    return {"supported": supported, "subgraphs": subgraphs, "errors": errors}


def _ops(trt: Any, ops: list[str]) -> dict[str, Any]:
    builder, network, parser = _parser(trt)
    return {"supports": {op: bool(parser.supports_operator(op)) for op in ops}}


def _build(trt: Any, request: dict[str, Any]) -> dict[str, Any]:
    # Polygraphy reads POLYGRAPHY_USE_TENSORRT_RTX at import; the parent sets it in our environment.
    from polygraphy.backend.trt import CreateConfig, EngineBytesFromNetwork, NetworkFromOnnxPath, Profile

    profiles = []
    for profile in request["profiles"]:
        p = Profile()
        for name, (low, opt, high) in profile.items():
            p.add(name, low, opt, high)
        profiles.append(p)
    options: dict[str, Any] = {"profiles": profiles or None}
    cache = request.get("timing_cache")
    if cache and Path(cache).is_file():
        options["load_timing_cache"] = cache
    if request["flavour"] == "tensorrt_rtx":
        from polygraphy.backend.tensorrt_rtx import CreateConfigRTX

        capability = request.get("compute_capability")
        if capability:
            config = CreateConfigRTX(compute_capabilities=[tuple(capability)], **options)
        else:
            config = CreateConfigRTX(use_gpu=True, **options)
    else:
        config = CreateConfig(**options)
    network = NetworkFromOnnxPath(request["model"], strongly_typed=_strongly_typed_available(trt))
    start = time.perf_counter()
    engine = EngineBytesFromNetwork(network, config=config, save_timing_cache=cache or None)()
    seconds = time.perf_counter() - start
    if engine is None:
        raise SystemExit("TensorRT returned no engine (see the builder log above)")
    Path(request["engine"]).write_bytes(bytes(engine))
    return {"build_seconds": seconds, "strongly_typed": _strongly_typed_available(trt)}


def _strongly_typed_available(trt: Any) -> bool:
    return hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED")


#: Set by the parent when gskit runs with --debug: the worker prints its traceback on failure.
TRACEBACK_ENV = "GSKIT_WORKER_TRACEBACK"


def _run(argv: list[str]) -> int:
    """``main``, with a failure said in one last line (the parent quotes the end of stderr in its error)."""
    try:
        return main(argv)
    except Exception as err:  # TensorRT, Polygraphy and a plugin library raise many types
        if os.environ.get(TRACEBACK_ENV) == "1":
            import traceback

            traceback.print_exc()
        text = str(err).strip().splitlines()
        print(f"{type(err).__name__}: {text[0] if text else ''}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    code = _run(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    # The answer is written: the parent reads it once both outputs are closed, without waiting for the exit
    # (TensorRT's libraries unmapped: 10 ms and more). No interpreter teardown either: TensorRT's destructors
    # would add as much, for nothing.
    os.close(1)
    os.close(2)
    with contextlib.suppress(OSError):  # the exit's work yields to the parent's, which goes on meanwhile
        os.nice(19)
    os._exit(code)
