"""``build_engine``: a TensorRT (or TensorRT-RTX) engine from an ONNX model, with a JSON sidecar.

The build runs in a child process through Polygraphy's loaders (``NetworkFromOnnxPath`` with the
strongly-typed flag, ``CreateConfig`` / ``CreateConfigRTX``, ``EngineBytesFromNetwork``). Networks are
strongly typed: precision comes from the model (fp16 weights, Q/DQ nodes), as TensorRT 11 requires.

With TensorRT-RTX the engine is compiled ahead of time for the given compute capability, on a CPU if
need be; without one it targets the current GPU. Full TensorRT builds for the GPU it runs on.

The engine and its sidecar ``ENGINE.json`` are written to temporary files beside the destination and
renamed into place, so a failed build never leaves a partial engine under the final name.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from gskit.backends.trt import (
    TRT_PLUGIN_MODULE,
    find_plugin_files,
    gpu_count,
    private_temp_folder,
    resolve_backend,
    run_worker,
)
from gskit.backends.trt_check import node_label, plugin_key, plugin_label, plugin_nodes, shipped_plugin_of
from gskit.errors import GskitError
from gskit.io import model as gsmodel
from gskit.io.outputs import check_output, output_entry, place_file, write_atomic
from gskit.io.strict_json import dumps
from gskit.plugin.discovery import load_spec_file
from gskit.plugin.spec import PluginSpec

#: Builder precision options gskit refuses, with the strongly typed way to get that precision. TensorRT 11 has
#: no weak typing (no FP16/INT8/BF16/FP8 builder flags, no implicit INT8 calibration), and gskit builds
#: strongly typed networks for every version, so the precision is the model's: ``gskit build --fp16`` or a
#: recipe's ``build: {fp16: true}`` ends in this one line.
WEAK_TYPING_REFUSED: Mapping[str, str] = {
    "fp16": "gskit builds strongly typed networks (TensorRT 11 has no fp16 builder flag): make the model "
    "fp16 instead, with `gskit convert --fp16` or `gskit prepare --fp16` (recipe: convert: {fp16: true}), "
    "and build that",
    "int8": "gskit builds strongly typed networks (TensorRT 11 has no int8 builder flag and no implicit "
    "calibration): int8 comes from QuantizeLinear/DequantizeLinear (Q/DQ) nodes in the model, e.g. from "
    "NVIDIA TensorRT Model Optimizer; build the quantized model",
}

log = logging.getLogger(__name__)

#: (min, opt, max) given to each dynamic dim of an input when ``shapes`` does not name the input.
DYNAMIC_DIM_DEFAULT = (1, 4, 16)
#: Version of the sidecar layout.
SIDECAR_FORMAT = 1
#: First bytes of a serialized timing cache, as TensorRT-RTX 1.7 writes it (``ITimingCache.serialize``).
TIMING_CACHE_MAGIC = b"ptrt"

Shape = tuple[int, ...]
#: Input name -> (min, opt, max) shapes of one optimization profile.
ProfileShapes = Mapping[str, tuple[Shape, Shape, Shape]]


@dataclass(frozen=True)
class EngineInfo:
    """What was built; also the content of the sidecar ``ENGINE.json``.

    Attributes:
        engine: the engine file.
        sidecar: the JSON file beside it.
        tensorrt: ``{"flavour": "tensorrt_rtx", "version": "1.7.1.116"}``.
        compute_capability: ``"8.9"`` for an AOT build, ``"current GPU"`` otherwise.
        strongly_typed: whether the network was created strongly typed.
        profiles: one optimization profile: ``{input: {"min": [...], "opt": [...], "max": [...]}}``.
        plugins: plugin nodes' ``namespace::name vN`` (sorted, unique).
        plugin_files: plugin libraries and Python modules loaded for the build.
        build_seconds: time TensorRT spent building.
        built_at: UTC time of the build, ISO 8601.
        model: the model file.
        model_sha256: sha256 of the model file (not of its external data).
    """

    engine: Path
    sidecar: Path
    tensorrt: dict[str, str]
    compute_capability: str
    strongly_typed: bool
    profiles: list[dict[str, dict[str, list[int]]]]
    plugins: list[str]
    plugin_files: list[str]
    build_seconds: float
    built_at: str
    model: Path
    model_sha256: str


def build_engine(
    model_path: str | os.PathLike,
    engine_path: str | os.PathLike,
    *,
    plugins: Sequence[str | os.PathLike] = (),
    shapes: ProfileShapes | None = None,
    timing_cache: str | os.PathLike | None = None,
    compute_capability: str | None = None,
    backend: str = "auto",
) -> EngineInfo:
    """Build an engine for a model and write it with its sidecar.

    Args:
        model_path: the ``.onnx`` file.
        engine_path: where the engine goes; the sidecar is ``<engine_path>.json``.
        plugins: plugin libraries (``.so``), Python plugin modules or plugin folders (full TensorRT).
        shapes: (min, opt, max) per input; inputs not named get their fixed dims, and
            ``DYNAMIC_DIM_DEFAULT`` for each dynamic dim.
        timing_cache: a timing cache file read if it exists and written after the build; an existing file
            must be a timing cache (or empty): anything else is refused, never read or replaced.
        compute_capability: ``"8.9"``-style target for an ahead-of-time TensorRT-RTX build.
        backend: ``auto``, ``tensorrt`` or ``tensorrt_rtx``.

    Raises:
        GskitError: no TensorRT is installed, the options do not fit the model or the backend
            (a plugin node with TensorRT-RTX, a compute capability with full TensorRT), or the build fails.
    """
    model_path, engine_path = Path(model_path), Path(engine_path)
    flavour = resolve_backend(backend)
    if flavour == "static":
        raise GskitError(
            "building an engine needs TensorRT or TensorRT-RTX: pip install 'gskit[trt]' or 'gskit[rtx]'"
        )
    if engine_path.resolve() == model_path.resolve():
        raise GskitError(f"{engine_path}: the engine would overwrite the model; choose another -o")
    model = gsmodel.load(model_path, load_weights=False)
    plugin_names = _plugin_names(model)
    if plugin_names and flavour == "tensorrt_rtx":
        raise GskitError(
            f"{model_path}: TensorRT-RTX has no custom plugins; the model needs {', '.join(plugin_names)}; "
            f"build with full TensorRT (docker/run-gpu-tests.sh) or check the rest with gskit check-trt"
        )
    capability = _parse_capability(compute_capability, flavour)
    if flavour == "tensorrt_rtx" and capability is None and gpu_count() < 1:
        # Without a target TensorRT-RTX builds for the GPU it runs on; with none it fails deep inside
        # Polygraphy ("Invalid Engine"), after the work. Say what to give instead, before trying.
        raise GskitError(
            "TensorRT-RTX on a machine without a GPU builds ahead of time only: give --compute-capability "
            "of the target GPU, e.g. 8.9 (recipe: build: {compute_capability: '8.9'})"
        )
    profile = derive_profile(model, shapes)
    files = find_plugin_files(plugins)
    if files and flavour == "tensorrt_rtx":
        raise GskitError("TensorRT-RTX cannot load custom plugins; drop --plugins or use full TensorRT")
    check_python_plugin_inputs(model, files.modules)
    for output in (engine_path, sidecar_path(engine_path)):
        check_output(output)
    cache = _timing_cache(timing_cache)
    engine_path.parent.mkdir(parents=True, exist_ok=True)
    tmp_fd, tmp_name = tempfile.mkstemp(prefix=f".{engine_path.name}.", suffix=".tmp", dir=engine_path.parent)
    os.close(tmp_fd)
    tmp_engine = Path(tmp_name)
    # TensorRT reads and writes the cache in a private folder (Polygraphy leaves a .lock file beside it);
    # the result replaces the user's file only if it is a timing cache.
    cache_dir = ExitStack()
    work_cache = cache_dir.enter_context(private_temp_folder("gskit-timing-")) / "timing.cache"
    try:
        if cache is not None and cache.is_file() and cache.stat().st_size > 0:
            shutil.copyfile(cache, work_cache)
        answer = run_worker(
            "build",
            flavour,
            {
                "model": str(model_path.resolve()),
                "engine": str(tmp_engine),
                "profiles": [{k: [list(s) for s in v] for k, v in profile.items()}] if profile else [],
                "timing_cache": str(work_cache) if cache is not None else None,
                "compute_capability": list(capability) if capability else None,
                "plugin_libraries": [str(p) for p in files.libraries],
                "plugin_modules": [str(p) for p in files.modules],
                "tensorrt_plugins": needs_tensorrt_plugins(model),
            },
        )
        if tmp_engine.stat().st_size == 0:
            raise GskitError(f"{model_path}: TensorRT wrote an empty engine")
        info = EngineInfo(
            engine=engine_path,
            sidecar=sidecar_path(engine_path),
            tensorrt={"flavour": answer["flavour"], "version": answer["version"]},
            compute_capability=".".join(map(str, capability)) if capability else "current GPU",
            strongly_typed=bool(answer["strongly_typed"]),
            profiles=[
                {k: dict(zip(("min", "opt", "max"), map(list, v), strict=True)) for k, v in profile.items()}
            ]
            if profile
            else [],
            plugins=plugin_names,
            plugin_files=[str(p) for p in (*files.libraries, *files.modules)],
            build_seconds=round(float(answer["build_seconds"]), 3),
            built_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            model=model_path,
            model_sha256=_sha256(model_path),
        )
        write_atomic(info.sidecar, dumps(_sidecar(info)))
        place_file(tmp_engine, engine_path)
        if cache is not None:
            _save_timing_cache(work_cache, cache)
    finally:
        tmp_engine.unlink(missing_ok=True)
        cache_dir.close()
    log.info("built %s (%s %s)", engine_path, info.tensorrt["flavour"], info.tensorrt["version"])
    return info


def sidecar_path(engine_path: str | os.PathLike) -> Path:
    """The sidecar of an engine: ``ENGINE.json`` beside ``ENGINE``."""
    engine_path = Path(engine_path)
    return engine_path.with_name(engine_path.name + ".json")


def derive_profile(
    model: onnx.ModelProto, shapes: ProfileShapes | None = None
) -> dict[str, tuple[Shape, Shape, Shape]]:
    """One optimization profile for the model's inputs; empty when every input has fixed dims.

    A symbolic or unknown dim gets ``DYNAMIC_DIM_DEFAULT``; inputs named in ``shapes`` take those shapes.

    Raises:
        GskitError: ``shapes`` names a tensor that is not an input, has the wrong rank or is not
            ordered min <= opt <= max, or an input of unknown rank is not given.
    """
    shapes = dict(shapes or {})
    initializers = {t.name for t in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in initializers]
    names = {v.name for v in inputs}
    unknown = sorted(set(shapes) - names)
    if unknown:
        raise GskitError(f"--shape names {unknown}, which are not model inputs (inputs: {sorted(names)})")
    profile: dict[str, tuple[Shape, Shape, Shape]] = {}
    dynamic = False
    for value in inputs:
        tensor_type = value.type.tensor_type
        rank = len(tensor_type.shape.dim) if tensor_type.HasField("shape") else None
        if value.name in shapes:
            low, opt, high = (tuple(int(d) for d in s) for s in shapes[value.name])
            if rank is not None and not len(low) == len(opt) == len(high) == rank:
                raise GskitError(f"--shape {value.name}: the input has rank {rank}, the shapes do not")
            if not all(a <= b <= c for a, b, c in zip(low, opt, high, strict=True)):
                raise GskitError(f"--shape {value.name}: needs min <= opt <= max in every dim")
            profile[value.name] = (low, opt, high)
            dynamic = True
            continue
        if rank is None:
            raise GskitError(f"input '{value.name}' has an unknown rank; give its shapes with --shape")
        dims = [
            d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
            for d in tensor_type.shape.dim
        ]
        dynamic |= any(d is None for d in dims)
        profile[value.name] = tuple(  # type: ignore[assignment]
            tuple(d if d is not None else DYNAMIC_DIM_DEFAULT[k] for d in dims) for k in range(3)
        )
    return profile if dynamic else {}


def check_python_plugin_inputs(model: onnx.ModelProto, modules: Sequence[Path]) -> None:
    """Refuse plugin nodes that leave out optional inputs when a ``trt_plugin.py`` implements them.

    ``tensorrt.plugin`` plugins take a fixed input count, so a node of a spec with ``bias?`` / ``mask?``
    must pass all of them; otherwise TensorRT fails deep in the parser. Only C++ plugins take fewer.

    Raises:
        GskitError: naming the node, its input count, the count the Python plugin takes and what to do.
    """
    specs: dict[tuple[str, str], tuple[PluginSpec, Path]] = {}
    for module in modules:
        spec_file = module.parent / "spec.py"
        if module.name == TRT_PLUGIN_MODULE and spec_file.is_file():
            for spec in load_spec_file(spec_file):
                specs[(spec.namespace, spec.name)] = spec, module
    if not specs:
        return
    for index, node in plugin_nodes(model):
        namespace, name, _ = plugin_key(node)
        spec, module = specs.get((namespace, name), (None, None))
        given = sum(1 for tensor in node.input if tensor)  # an empty name is an absent optional input
        if spec is None or given >= len(spec.inputs):
            continue
        raise GskitError(
            f"node '{node_label(index, node)}' ({namespace}::{name}) has {given} inputs, but the "
            f"Python plugin {module} takes all {len(spec.inputs)} "
            f"({', '.join(spec.inputs)}); pass a C++ plugin library built for it (--plugins lib.so), or "
            "give the node every input"
        )


def _plugin_names(model: onnx.ModelProto) -> list[str]:
    keys = {plugin_key(node) for _, node in plugin_nodes(model)}
    return sorted(plugin_label(ns, name, version) for ns, name, version in keys)


def needs_tensorrt_plugins(model: onnx.ModelProto) -> bool:
    """The model has nodes of TensorRT's own plugins (``libnvinfer_plugin``), which the build registers."""
    return any(shipped_plugin_of(node) is not None for _, node in plugin_nodes(model))


def _parse_capability(text: str | None, flavour: str) -> tuple[int, int] | None:
    if text is None:
        return None
    if flavour != "tensorrt_rtx":
        raise GskitError(
            "--compute-capability is for TensorRT-RTX ahead-of-time builds; full TensorRT builds "
            "for the GPU it runs on"
        )
    try:
        major, minor = (int(part) for part in text.split("."))
    except ValueError as err:
        raise GskitError(f"--compute-capability {text!r}: write it as MAJOR.MINOR, e.g. 8.9") from err
    return major, minor


def _sidecar(info: EngineInfo) -> dict[str, Any]:
    return {
        "format": SIDECAR_FORMAT,
        "engine": info.engine.name,
        "tensorrt": info.tensorrt,
        "compute_capability": info.compute_capability,
        "strongly_typed": info.strongly_typed,
        "profiles": info.profiles,
        "plugins": info.plugins,
        "plugin_files": info.plugin_files,
        "build_seconds": info.build_seconds,
        "built_at": info.built_at,
        "model": str(info.model),
        "model_sha256": info.model_sha256,
    }


def _timing_cache(path: str | os.PathLike | None) -> Path | None:
    """The timing cache to use: a new path, an empty file, or a file that is a TensorRT timing cache.

    Raises:
        GskitError: the path is a folder, a device, a FIFO or a socket, or a file that is not a timing
            cache (the model, a text file): it would be fed to TensorRT and then replaced.
    """
    if not path:
        return None
    cache = output_entry(path)
    if cache.is_dir():
        raise GskitError(f"{path}: --timing-cache is a folder; give a file path (new or an existing cache)")
    check_output(cache)  # before reading it too: a FIFO or a device would block or never end
    if cache.is_file() and cache.stat().st_size > 0 and not _is_timing_cache(cache):
        raise GskitError(
            f"{path}: not a TensorRT timing cache (no {TIMING_CACHE_MAGIC!r} header); give a new path or a "
            f"cache that gskit build wrote"
        )
    return cache


def _is_timing_cache(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(len(TIMING_CACHE_MAGIC)) == TIMING_CACHE_MAGIC


def _save_timing_cache(written: Path, cache: Path) -> None:
    if not written.is_file() or not _is_timing_cache(written):
        log.warning("TensorRT wrote no timing cache; %s is left as it was", cache)
        return
    cache.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(cache, written.read_bytes())


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
