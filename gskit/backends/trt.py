"""TensorRT and TensorRT-RTX: which one is installed, running the worker subprocess, plugin files, the GPU
probe, and the one TensorRT runner (:func:`trt_runner`) that runs engines in this process.

Full TensorRT (``import tensorrt``) parses, builds and runs, with custom plugins. TensorRT-RTX
(``import tensorrt_rtx``) installs on a machine without a GPU and parses and AOT-builds for a named compute
capability, but has no custom plugins. Parsing and building always happen in a child interpreter
(``gskit.backends.trt_worker``) so that a crash of TensorRT never takes the caller down.

Capability check: :mod:`gskit.backends.trt_check`. Engine build: :mod:`gskit.backends.trt_build`.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import logging
import os
import re
import selectors
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gskit.errors import GskitError
from gskit.io.interrupt import signals_held
from gskit.io.outputs import process_alive

if TYPE_CHECKING:  # numpy loads where arrays are made: `gskit prepare` starts the worker before it
    import numpy as np
    import onnx

    from gskit.backends.model_run import ModelRun

log = logging.getLogger(__name__)

#: Accepted values of ``backend`` arguments.
BACKENDS = ("auto", "tensorrt", "tensorrt_rtx", "static")
#: Seconds a worker may run before it is stopped.
WORKER_TIMEOUT_S = 600
#: A temporary folder of a dead gskit process is removed once it is this old (more than any call lasts).
ABANDONED_AFTER_S = 2 * WORKER_TIMEOUT_S
#: Lines of the worker's stderr quoted in the error when it fails.
STDERR_TAIL_LINES = 6
#: Name of a plugin folder's TensorRT Python plugin module (``plugins/<name>/trt_plugin.py``).
TRT_PLUGIN_MODULE = "trt_plugin.py"
#: Where a plugin folder keeps C++ plugin libraries (docker/Dockerfile's CMake step writes ``cpp/build``).
PLUGIN_LIBRARY_GLOBS = ("*.so", "build/*.so", "cpp/build/*.so")


def full_tensorrt_available() -> bool:
    """True when full TensorRT imports (the PyPI ``tensorrt`` stub that cannot download raises)."""
    if importlib.util.find_spec("tensorrt") is None:
        return False
    try:
        importlib.import_module("tensorrt")
    except Exception:  # the stub raises its own errors on import
        return False
    return True


def resolve_backend(backend: str = "auto") -> str:
    """The backend a call will use: ``tensorrt``, ``tensorrt_rtx`` or ``static``.

    Raises:
        GskitError: an unknown backend name, or the named one is not installed.
    """
    if backend not in BACKENDS:
        raise GskitError(f"unknown TensorRT backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "auto":
        if full_tensorrt_available():
            return "tensorrt"
        return "tensorrt_rtx" if importlib.util.find_spec("tensorrt_rtx") else "static"
    if backend == "tensorrt" and not full_tensorrt_available():
        raise GskitError("full TensorRT is not installed: pip install 'gskit[trt]' (or use docker/)")
    if backend == "tensorrt_rtx" and importlib.util.find_spec("tensorrt_rtx") is None:
        raise GskitError("TensorRT-RTX is not installed: pip install 'gskit[rtx]'")
    return backend


#: The parsers' line from TensorRT 10 on (INT64, local functions, IPluginV3): every TensorRT-RTX parser is of
#: it, and so is gskit's newest known target (``gskit.backends.trt_check`` answers with a parser of the
#: target's line only).
_RTX_LINE_MAJOR = 10


def default_check_parser(target: str | None) -> str | None:
    """The parser that ``check_trt`` with ``backend="auto"`` asks for ``target`` (a version as typed, None:
    the default target), where that is known without importing anything heavy; else None.

    Known: TensorRT-RTX without full TensorRT, for the default target (the newest gskit knows, of the
    10+ line) or a version of that line. Full TensorRT is not guessed: whether it answers takes importing it
    (:func:`full_tensorrt_available`). ``gskit prepare`` starts this parser's worker before its imports.
    """
    if importlib.util.find_spec("tensorrt") is not None or importlib.util.find_spec("tensorrt_rtx") is None:
        return None
    if target is None:
        return "tensorrt_rtx"
    major = re.fullmatch(r"(\d+)(?:\.\d+)*", target.strip())
    return "tensorrt_rtx" if major is not None and int(major[1]) >= _RTX_LINE_MAJOR else None


def source_label(flavour: str, version: str) -> str:
    """How reports name what answered: ``tensorrt 10.16``, ``tensorrt_rtx 1.7``."""
    return f"{flavour} {'.'.join(version.split('.')[:2])}"


@dataclass(frozen=True)
class PluginFiles:
    """TensorRT implementations of plugins found on disk.

    Attributes:
        libraries: C++ plugin libraries (``.so``), loaded with ``ctypes.CDLL`` before parsing.
        modules: Python plugin modules (``trt_plugin.py``), imported before parsing (full TensorRT only).
    """

    libraries: tuple[Path, ...] = ()
    modules: tuple[Path, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.libraries or self.modules)


def find_plugin_files(paths: Sequence[str | os.PathLike]) -> PluginFiles:
    """Collect plugin libraries and Python plugin modules from files and plugin folders.

    A path may be a ``.so`` file, a ``trt_plugin.py`` file, one plugin folder (libraries matching
    ``PLUGIN_LIBRARY_GLOBS`` if built, else ``<dir>/trt_plugin.py``) or a folder of plugin folders (the same
    one level down).

    Raises:
        GskitError: a path does not exist or is a file of another kind.
    """
    libraries: list[Path] = []
    modules: list[Path] = []
    for raw in paths:
        path = Path(raw).resolve()
        if path.is_file():
            if path.suffix == ".so" or ".so." in path.name:
                libraries.append(path)
            elif path.name.endswith(".py"):
                modules.append(path)
            else:
                raise GskitError(f"{path}: not a plugin library (.so) or Python plugin module (.py)")
            continue
        if not path.is_dir():
            raise GskitError(f"{path}: no such plugin file or folder")
        for folder in (path, *sorted(p for p in path.iterdir() if p.is_dir())):
            built = [lib for pattern in PLUGIN_LIBRARY_GLOBS for lib in sorted(folder.glob(pattern))]
            # One implementation per plugin: a built C++ library (no Python at run time) wins over
            # trt_plugin.py, since both register the same namespace::name and version.
            if built:
                libraries.extend(built)
            elif (folder / TRT_PLUGIN_MODULE).is_file():
                modules.append(folder / TRT_PLUGIN_MODULE)
    return PluginFiles(tuple(dict.fromkeys(libraries)), tuple(dict.fromkeys(modules)))


def run_worker(
    task: str, flavour: str, request: Mapping[str, Any], *, timeout_s: int = WORKER_TIMEOUT_S
) -> dict:
    """Run one task of ``gskit.backends.trt_worker`` in a child interpreter and return its JSON answer.

    The worker that :func:`started_worker` started for ``flavour`` takes the task, when one waits; else a
    new one is started.

    Raises:
        GskitError: the child crashed, failed or timed out (the message quotes the end of its log).
    """
    waiting = _WAITING.pop(flavour, None)
    if waiting is not None and waiting.traceback == _traceback_flag():
        return waiting.run(task, request, timeout_s)
    if waiting is not None:  # started under another log level: its failures would be told differently
        waiting.stop()
    with private_temp_folder("gskit-trt-") as tmp:
        worker = _Worker(flavour, tmp, _worker_command(tmp))
        return worker.run(task, request, timeout_s)


@contextmanager
def started_worker(flavour: str, *, debug: bool | None = None) -> Iterator[None]:
    """Start the worker of ``flavour`` now, waiting for its task: its interpreter and TensorRT load while the
    caller goes on (0.1-0.4 s), and the next :func:`run_worker` of that flavour hands its task to it.

    Nothing is started when ``flavour`` is no parser (``static``) or a worker of it already waits. On the way
    out a worker that no task took is stopped, and its folder removed.

    Args:
        flavour: ``tensorrt``, ``tensorrt_rtx`` or ``static``.
        debug: whether the task will run under --debug (the worker then prints its traceback on failure);
            None: as the "gskit" logger's level says now. ``gskit prepare`` starts its worker before logging
            is set up, and says it from the command line.
    """
    from gskit.backends.trt_worker import FLAVOURS, WAIT_FLAG

    if flavour not in FLAVOURS or flavour in _WAITING:
        yield
        return
    traceback = _traceback_flag() if debug is None else "1" if debug else "0"
    with private_temp_folder("gskit-trt-") as tmp:
        worker = _Worker(flavour, tmp, [*_worker_command(tmp), WAIT_FLAG, flavour], traceback)
        waiting = False  # True once the worker waits for a task: a task that takes it then stops it
        try:
            worker.start()
            _WAITING[flavour] = worker
            waiting = True
            yield
        finally:
            if _WAITING.get(flavour) is worker:
                del _WAITING[flavour]
                worker.stop()
            elif not waiting:  # Ctrl-C as it started (the command line starts it while it imports)
                worker.stop()


class _Worker:
    """One child interpreter running ``gskit.backends.trt_worker`` in its private folder ``folder``."""

    def __init__(self, flavour: str, folder: Path, command: list[str], traceback: str | None = None) -> None:
        self.flavour, self.folder, self.command = flavour, folder, command
        self.traceback = _traceback_flag() if traceback is None else traceback
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        """Start the child; with ``--wait FLAVOUR`` it loads TensorRT, then waits for its stdin to close."""
        from gskit.backends.trt_worker import TRACEBACK_ENV

        env = _worker_env()
        env["POLYGRAPHY_USE_TENSORRT_RTX"] = "1" if self.flavour == "tensorrt_rtx" else "0"
        env[TRACEBACK_ENV] = self.traceback  # in the debug log
        # cwd is the private request folder: the caller's folder may hold modules named like the ones the
        # worker imports (json.py), which Python would otherwise run first. A SIGINT or SIGTERM during the
        # spawn takes effect once the child is ours to stop: inside Popen it left a child nobody would stop.
        with signals_held():
            self.process = subprocess.Popen(
                self.command,
                env=env,
                cwd=self.folder,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )

    def run(self, task: str, request: Mapping[str, Any], timeout_s: int) -> dict:
        """Hand the child its task (started now unless it waits) and return its answer."""
        request_path, response_path = self.folder / REQUEST_NAME, self.folder / RESPONSE_NAME
        request_path.write_text(json.dumps({**request, "task": task, "flavour": self.flavour}))
        if self.process is None:
            self.start()
        assert self.process is not None
        try:
            stderr = self._output(timeout_s)
        except subprocess.TimeoutExpired as err:
            self.stop()
            raise GskitError(
                f"{self.flavour} {task} did not finish in {timeout_s} s; check the model size"
            ) from err
        except BaseException:  # interrupted (Ctrl-C, SIGTERM): the worker ends with the call
            self.stop()
            raise
        log.debug("%s %s worker log:\n%s", self.flavour, task, stderr)
        answer = _answer(response_path)
        if answer is not None:
            # The worker wrote its answer last and has closed its output: its exit (TensorRT's libraries
            # unmapped, 10 ms and more) goes on while the caller does, and is reaped when it ends.
            threading.Thread(target=self.process.wait, name="gskit-trt-reaper", daemon=True).start()
            return answer
        code = self.process.wait()
        how = f"crashed (signal {-code})" if code < 0 else f"failed (exit {code})"
        raise GskitError(f"{self.flavour} {task} {how}: {_tail(stderr)}")

    def _output(self, timeout_s: int) -> str:
        """Close the child's stdin (its "go") and read its stdout and stderr to their end, which it reaches
        once it has written its answer (it closes both before it exits) or died; returns its stderr.

        Raises:
            subprocess.TimeoutExpired: its output is still open after ``timeout_s``.
        """
        process = self.process
        assert process is not None and process.stdout is not None and process.stderr is not None
        with contextlib.suppress(BrokenPipeError):  # a child that died already
            process.stdin.close()  # type: ignore[union-attr]
        deadline = time.monotonic() + timeout_s
        logged: list[bytes] = []
        with selectors.DefaultSelector() as selector:
            for stream in (process.stdout, process.stderr):
                selector.register(stream, selectors.EVENT_READ)
            while selector.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise subprocess.TimeoutExpired(self.command, timeout_s)
                for key, _ in selector.select(left):
                    data = os.read(key.fd, 65536)
                    if not data:
                        selector.unregister(key.fileobj)
                    elif key.fileobj is process.stderr:
                        logged.append(data)
        process.stdout.close()
        process.stderr.close()
        return b"".join(logged).decode(errors="replace")

    def stop(self) -> None:
        """Stop the child if it still runs, reap it and close its pipes (``_output`` may have closed some)."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            process.kill()
        process.wait()
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):  # nothing is left to write to the dead child
                    stream.close()


#: The worker :func:`started_worker` started, by flavour, until a task takes it.
_WAITING: dict[str, _Worker] = {}
#: The files of a task in the worker's folder (the worker's arguments name them).
REQUEST_NAME, RESPONSE_NAME = "request.json", "response.json"


def _answer(path: Path) -> dict | None:
    """The worker's answer; None when it wrote none, or not all of it (it died while writing)."""
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def _worker_command(folder: Path) -> list[str]:
    command = [sys.executable, *_SAFE_PATH_FLAG, "-m", "gskit.backends.trt_worker"]
    return command + [str(folder / REQUEST_NAME), str(folder / RESPONSE_NAME), str(os.getpid())]


def _traceback_flag() -> str:
    """The worker's ``TRACEBACK_ENV``: "1" under --debug (its traceback goes to the debug log)."""
    return "1" if log.isEnabledFor(logging.DEBUG) else "0"


@contextmanager
def private_temp_folder(prefix: str) -> Iterator[Path]:
    """A temporary folder ``<prefix><pid>-XXXX``, removed on the way out.

    A process killed by SIGKILL cannot remove its folders: they are removed here later, by the next call
    with the same prefix, once their process is gone and they are older than any call can last.
    """
    _remove_abandoned(prefix)
    with tempfile.TemporaryDirectory(prefix=f"{prefix}{os.getpid()}-") as tmp:
        yield Path(tmp)


def _remove_abandoned(prefix: str) -> None:
    too_old = time.time() - ABANDONED_AFTER_S
    for folder in Path(tempfile.gettempdir()).glob(f"{prefix}*-*"):
        pid = folder.name[len(prefix) :].split("-", 1)[0]
        try:
            info = folder.lstat()
        except FileNotFoundError:
            continue
        mine = info.st_uid == os.getuid() and stat.S_ISDIR(info.st_mode)
        if pid.isdigit() and mine and info.st_mtime < too_old and not process_alive(int(pid)):
            log.info("removing %s, left by a killed gskit process", folder)
            shutil.rmtree(folder, ignore_errors=True)


#: Keep the working folder off the child's import path (Python >= 3.11); the private cwd covers 3.10.
_SAFE_PATH_FLAG = ("-P",) if sys.version_info >= (3, 11) else ()


def _worker_env() -> dict[str, str]:
    """The caller's environment, with a PYTHONPATH that finds this gskit and no folder relative to cwd.

    gskit may be importable only from the caller's working folder (a source checkout); its root is named
    explicitly. Relative and empty PYTHONPATH entries would name the worker's folder, so they are dropped.
    """
    import gskit

    env = dict(os.environ)
    root = str(Path(gskit.__file__).resolve().parents[1])
    entries = [e for e in env.get("PYTHONPATH", "").split(os.pathsep) if os.path.isabs(e)]
    if root not in _site_folders():
        entries.insert(0, root)
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(entries))
    return env


def _site_folders() -> set[str]:
    import site

    folders = set(site.getsitepackages()) if hasattr(site, "getsitepackages") else set()
    folders.add(site.getusersitepackages())
    return {str(Path(f).resolve()) for f in folders}


def _tail(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[-STDERR_TAIL_LINES:]) or "no output"


#: What to do when full TensorRT or a GPU is missing.
GPU_HINT = "run in docker/ (docker/run-gpu-tests.sh) or on a GPU machine with pip install 'gskit[trt]'"


def gpu_count() -> int:
    """CUDA devices the CUDA runtime sees (0 without a runtime library or a driver); never raises."""
    import ctypes

    from polygraphy import cuda
    from polygraphy.logger import G_LOGGER

    try:
        with G_LOGGER.verbosity(G_LOGGER.CRITICAL + 1):
            handle = cuda.wrapper().handle
        count = ctypes.c_int(0)
        status = handle.cudaGetDeviceCount(ctypes.byref(count))
    except Exception:  # no CUDA runtime library, or Polygraphy's critical log raising
        return 0
    return count.value if status == 0 else 0


def require_gpu_tensorrt(what: str) -> None:
    """Raise unless full TensorRT imports and CUDA sees a GPU; ``what`` starts the message.

    Raises:
        GskitError: full TensorRT is not installed (TensorRT-RTX runs no plugins), or no GPU.
    """
    if not full_tensorrt_available():
        raise GskitError(f"{what} needs TensorRT and a GPU (full TensorRT is not installed); {GPU_HINT}")
    if gpu_count() < 1:
        raise GskitError(f"{what} needs TensorRT and a GPU (CUDA sees no GPU); {GPU_HINT}")


def marks_unfused_debug_tensors() -> bool:
    """This TensorRT can mark every tensor that survives fusion as a debug tensor (10.x with the API)."""
    import tensorrt

    return hasattr(tensorrt.INetworkDefinition, "mark_unfused_tensors_as_debug_tensors")


def trt_runner(
    path: str | os.PathLike,
    feeds: Mapping[str, np.ndarray],
    plugins: Sequence[str | os.PathLike] = (),
    *,
    name: str = "tensorrt",
    debug_unfused: bool = False,
    mark_debug: Sequence[str] = (),
) -> Any:
    """A Polygraphy ``TrtRunner`` for an engine file or an ONNX model (built for the shapes of ``feeds``).

    The one place gskit makes a TensorRT runner: :func:`run_engine` and the comparisons use it. The caller
    checks for TensorRT and a GPU first (:func:`require_gpu_tensorrt`).

    Args:
        path: ``.onnx`` (built on activation, strongly typed, one profile min = opt = max = the fed
            shapes) or a serialized engine.
        feeds: the inputs the runner will get (their shapes fix the profile).
        plugins: plugin libraries / folders (:func:`find_plugin_files`), loaded now.
        name: the runner's name in reports.
        debug_unfused: mark every tensor that survives TensorRT's fusions as a debug tensor, so the engine
            is the one TensorRT would build anyway (ONNX models only, :func:`marks_unfused_debug_tensors`).
        mark_debug: tensors to mark as debug tensors (ONNX models only); may prevent fusions.

    Raises:
        GskitError: ``path`` does not exist, or a plugin file cannot be loaded.
    """
    import numpy as np
    import tensorrt
    from polygraphy.backend.common import BytesFromPath
    from polygraphy.backend.trt import (
        CreateConfig,
        EngineFromBytes,
        EngineFromNetwork,
        MarkDebug,
        NetworkFromOnnxPath,
        Profile,
        TrtRunner,
    )

    from gskit.backends.trt_worker import load_tensorrt_plugins
    from gskit.io.model import not_a_file

    # TensorRT's own plugins (EfficientNMS_TRT ...): Polygraphy's loaders register them too; said here so
    # that a plugin node of the ONNX model or engine never depends on that.
    load_tensorrt_plugins(tensorrt)
    load_plugin_files(find_plugin_files(plugins))
    path = Path(path)
    if not path.is_file():
        raise GskitError(not_a_file(path, "model or engine"))
    if path.suffix != ".onnx":
        return TrtRunner(EngineFromBytes(BytesFromPath(str(path))), name=name)
    profile = Profile()
    for input_name, value in feeds.items():
        shape = tuple(np.asarray(value).shape)
        profile.add(input_name, shape, shape, shape)
    options: dict[str, Any] = {"strongly_typed": True}
    if debug_unfused:
        options["mark_unfused_tensors_as_debug_tensors"] = True
    network = NetworkFromOnnxPath(str(path), **options)
    if mark_debug:
        network = MarkDebug(network, list(mark_debug))
    return TrtRunner(EngineFromNetwork(network, config=CreateConfig(profiles=[profile])), name=name)


def run_engine(
    engine_or_model: str | os.PathLike,
    feeds: Mapping[str, np.ndarray],
    *,
    plugins: Sequence[str | os.PathLike] = (),
) -> dict[str, np.ndarray]:
    """Run an engine (``.engine``/``.plan``) or build-and-run an ONNX model with Polygraphy's TrtRunner.

    Needs full TensorRT and a GPU; runs in this process (the comparison engineer's runner).

    Args:
        engine_or_model: a serialized engine, or an ``.onnx`` model built on the fly (static shapes, or
            dynamic dims that ``feeds`` fix: one profile with min = opt = max = the fed shapes).
        feeds: input arrays by name.
        plugins: plugin libraries / folders loaded before deserializing or parsing.

    Raises:
        GskitError: full TensorRT is not installed, or TensorRT fails to load or run the engine.
    """
    if not full_tensorrt_available():
        raise GskitError(
            "running an engine needs full TensorRT and a GPU: pip install 'gskit[trt]' (or docker/)"
        )
    path = Path(engine_or_model)
    return run_once(trt_runner(path, feeds, plugins), feeds, f"{path}: TensorRT failed to run it")


def first_line(err: BaseException) -> str:
    """The first line of an error's message (TensorRT's and Polygraphy's run on), or its type's name."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


@contextmanager
def one_line_errors(what: str) -> Iterator[None]:
    """Any error inside becomes ``GskitError("<what>: <its first line>")``: TensorRT and Polygraphy raise
    many types, with messages that run on for pages."""
    try:
        yield
    except Exception as err:
        raise GskitError(f"{what}: {first_line(err)}") from err


def run_once(runner: Any, feeds: Mapping[str, np.ndarray], what: str) -> dict[str, np.ndarray]:
    """Activate ``runner`` (building its engine), run it once on ``feeds`` and deactivate it.

    Raises:
        GskitError: ``what``, then the first line of TensorRT's error.
    """
    import numpy as np

    with one_line_errors(what), runner:
        outputs = runner.infer(_contiguous(feeds))
    return {name: np.array(value) for name, value in outputs.items()}


def _contiguous(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """TensorRT copies inputs to the device as they lie in memory: a strided view must be made whole."""
    import numpy as np

    return {name: np.ascontiguousarray(value) for name, value in feeds.items()}


# -- the model under test of a comparison (``gskit.compare``); ``gskit.backends.ort`` offers the same ------


#: How reports name this backend.
NAME = "tensorrt"


def require_runtime(what: str) -> None:
    """Raise unless this backend can run here: full TensorRT and a GPU (``what`` starts the message).

    Raises:
        GskitError: as :func:`require_gpu_tensorrt`.
    """
    require_gpu_tensorrt(what)


@contextmanager
def model_file(model: onnx.ModelProto | str | os.PathLike) -> Iterator[Path]:
    """A path for ``model``: the file itself, or an in-memory model saved to a temporary folder."""
    import onnx

    from gskit.io import model as gsmodel

    if not isinstance(model, onnx.ModelProto):
        path = Path(model)
        if not path.is_file():
            raise GskitError(gsmodel.not_a_file(path, "model or engine"))
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="gskit-compare-") as tmp:
        yield gsmodel.save(model, Path(tmp) / "model.onnx", check=False)


@contextmanager
def comparison_runner(model_run: ModelRun) -> Iterator[Any]:
    """A ``TrtRunner`` for an engine or a model (built for the shapes of the feeds), for Polygraphy's
    ``Comparator``."""
    with model_file(model_run.model) as path:
        yield trt_runner(path, model_run.feeds, model_run.trt_plugins, name=model_run.name)


def run_unit(model_run: ModelRun, outputs: Sequence[str]) -> dict[str, np.ndarray]:
    """Build a small model (a plugin node with what feeds it) and run it once; all of its outputs come back.

    Raises:
        GskitError: TensorRT failed to build or run it (the first line of its error).
    """
    with comparison_runner(model_run) as runner:
        return run_once(runner, model_run.feeds, "TensorRT failed to build or run the node")


class DebugTensors:
    """Reads debug tensors of one TensorRT engine; each run switches on only the tensors asked for.

    The engine is built with ``mark_unfused_tensors_as_debug_tensors`` where TensorRT has it, so it is the
    engine TensorRT builds anyway (fusions intact) and only the tensors that survive fusion can be read; older
    TensorRT marks the candidates with Polygraphy's ``MarkDebug``. Each run switches the debug state of its
    tensors on (``set_tensor_debug_state``), so only those are copied to the host.
    """

    def __init__(self, runner: Any, feeds: Mapping[str, np.ndarray], name: str) -> None:
        self.runner = runner
        self.feeds = _contiguous(feeds)
        self.name = name

    def available(self, names: Sequence[str]) -> list[str]:
        is_debug = getattr(self.runner.engine, "is_debug_tensor", None)
        kept = [n for n in names if is_debug(n)] if is_debug is not None else list(names)
        if len(kept) < len(names):
            log.info("layerwise: TensorRT keeps %d of %d tensors after fusion", len(kept), len(names))
        return kept

    def run(self, names: Sequence[str]) -> dict[str, np.ndarray]:
        """Run once and return ``names`` (graph inputs among them are returned as fed).

        Raises:
            GskitError: TensorRT failed to run (the first line of its error).
        """
        context = self.runner.context
        if hasattr(context, "set_tensor_debug_state"):
            context.set_all_tensors_debug_state(False)
            for name in names:
                context.set_tensor_debug_state(name, True)
        import numpy as np

        with one_line_errors("TensorRT failed to run the prepared model"):
            outputs = self.runner.infer(self.feeds)
        values = {name: np.array(value) for name, value in outputs.items()}
        values.update({n: self.feeds[n] for n in names if n in self.feeds})
        return values


@contextmanager
def tensor_source(model_run: ModelRun, candidates: Sequence[str]) -> Iterator[DebugTensors]:
    """The intermediate tensors of the model on TensorRT (:class:`DebugTensors`), its engine built on entry;
    TensorRT parses the file (``loaded`` is onnxruntime's).

    Raises:
        GskitError: TensorRT cannot build the model (the first line of its error).
    """
    unfused = marks_unfused_debug_tensors()
    with model_file(model_run.model) as path:
        runner = trt_runner(
            path,
            model_run.feeds,
            model_run.trt_plugins,
            name=model_run.name,
            debug_unfused=unfused,
            mark_debug=() if unfused else candidates,
        )
        with one_line_errors(f"{path}: TensorRT cannot build the prepared model"):
            runner.activate()
        try:
            yield DebugTensors(runner, model_run.feeds, model_run.name)
        finally:
            runner.deactivate()


def load_plugin_files(files: PluginFiles) -> None:
    """Load plugin libraries and import Python plugin modules into this process (full TensorRT)."""
    from gskit.backends.trt_worker import load_plugins

    try:
        load_plugins(files.libraries, files.modules)
    except ImportError as err:
        raise GskitError(str(err)) from err
