"""Input data for running a model: random within each input's dtype and a sensible range, or from a file."""

from __future__ import annotations

import os
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from gskit.errors import GskitError
from gskit.io.limits import check_int64
from gskit.io.model import graph_protos, not_a_file

#: Most bytes of inputs gskit loads from a file or draws at random for one run.
MAX_FEED_BYTES = 2**30
#: Size used for a symbolic or unknown dim that the caller did not fix with ``shapes``.
DEFAULT_DYNAMIC_DIM = 2
#: What an inputs file is called in messages ("give a .npz inputs file").
INPUTS_FILE = ".npz inputs"


def random_feeds(
    model: onnx.ModelProto | gs.Graph,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    *,
    seed: int = 0,
    dim_values: Mapping[str, int] | None = None,
    default_dim: int = DEFAULT_DYNAMIC_DIM,
    image_dim: int | None = None,
) -> dict[str, np.ndarray]:
    """Random inputs for every graph input that is not an initializer.

    Floats are uniform in [-1, 1), signed ints in [0, 8) (safe as indices and sizes), bools are fair coins.

    Args:
        model: the model (or graph) whose inputs to fill.
        shapes: full shapes per input name, overriding the model's dims.
        seed: seed of the generator, so two runs get the same data.
        dim_values: values for symbolic dims by name (e.g. ``{"batch": 4}``); for a ModelProto, symbolic dims
            that its metadata fixes (``metadata_props`` ``height = 640``) come first, overridden by these.
        default_dim: the size of a symbolic or unknown dim that nothing else fixes.
        image_dim: the size of unknown height and width of an image input (rank 4, 1-4 channels fixed), so
            the image survives the model's down-sampling; ``None``: ``default_dim``.

    Raises:
        GskitError: ``shapes`` names an unknown input, or an input has no dtype.
    """
    declared = _declared_inputs(model) if isinstance(model, onnx.ModelProto) else None
    if declared is None:  # a graph, or a model whose inputs only graphsurgeon's view says fully
        graph = model if isinstance(model, gs.Graph) else gs.import_onnx(model)
        inputs: list[_Input | gs.Tensor] = [t for t in graph.inputs if not isinstance(t, gs.Constant)]
        compared = compared_constants(graph)
    else:
        inputs, compared = list(declared), {}
    shapes = dict(shapes or {})
    metadata = metadata_dim_values(model) if isinstance(model, onnx.ModelProto) else {}
    dim_values = {**metadata, **(dim_values or {})}
    known = {t.name for t in inputs}
    unknown = set(shapes) - known
    if unknown:
        raise GskitError(
            f"--shape names unknown input(s) {sorted(unknown)}; model inputs are {sorted(known)}"
        )
    check_seed(seed)
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    total = 0
    for tensor in inputs:
        if tensor.dtype is None:
            raise GskitError(f"input '{tensor.name}' has no dtype; set it with `gskit edit --input-dtype`")
        shape = shapes.get(tensor.name)
        if shape is None:
            shape = _concrete_shape(tensor, dim_values, default_dim, image_dim)
        else:
            _check_fits(tensor, tuple(shape))
        dtype = np.dtype(_np_dtype(tensor.dtype))
        total += _feed_nbytes(tensor.name, shape, dtype, total)
        if tensor.name in compared and np.prod(shape, dtype=np.int64) == 1:
            feeds[tensor.name] = np.full(shape, compared[tensor.name], dtype=dtype)
        else:
            feeds[tensor.name] = random_array(rng, dtype, shape)
    return feeds


class _Input(NamedTuple):
    """A graph input as ``gs.import_onnx`` shows it: name, numpy dtype, dims (int, symbol or None; None:
    unknown rank)."""

    name: str
    dtype: np.dtype
    shape: list[int | str | None] | None


def _declared_inputs(model: onnx.ModelProto) -> list[_Input] | None:
    """The model's graph inputs (initializers left out) read from the protobuf, as graphsurgeon's import
    would give them, without importing the whole graph (seconds on a large model); None when only that
    import says it exactly: a node ``Equal`` somewhere (:func:`compared_constants` looks for one reading an
    input), ``value_info`` for an input (graphsurgeon merges it in), sparse initializers, an input named
    twice, or an input whose type is not a tensor of a numpy dtype."""
    graph = model.graph
    if graph.sparse_initializer or any(n.op_type == "Equal" for g in graph_protos(graph) for n in g.node):
        return None
    initializers = {t.name for t in graph.initializer}
    described = {v.name for v in graph.value_info}
    found: list[_Input] = []
    for value in graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        if value.name in described or not value.type.HasField("tensor_type"):
            return None
        if any(value.name == other.name for other in found):  # graphsurgeon keeps the first's type
            return None
        if tensor.elem_type not in _NUMPY_ELEM_TYPES:
            return None
        shape = None
        if tensor.HasField("shape"):
            shape = [
                d.dim_param if d.HasField("dim_param") else d.dim_value if d.HasField("dim_value") else None
                for d in tensor.shape.dim
            ]
        found.append(_Input(value.name, _NUMPY_ELEM_TYPES[tensor.elem_type], shape))
    return found


def _numpy_elem_types() -> dict[int, np.dtype]:
    """ONNX element types whose numpy dtype is numpy's own bool, integer or float (graphsurgeon maps them the
    same way); bfloat16, the float8 and 4-bit types (ml_dtypes' types) are left to its import."""
    found = {}
    for elem_type in onnx.helper.get_all_tensor_dtypes():
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
        if dtype.kind in "biuf" and dtype.isbuiltin == 1:
            found[elem_type] = dtype
    return found


_NUMPY_ELEM_TYPES = _numpy_elem_types()


def check_seed(seed: int) -> None:
    """A seed numpy's generator takes: a non-negative integer of at most 64 bits (as every recipe integer).

    Raises:
        GskitError: ``seed`` is negative, too large or not an integer.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise GskitError(f"seed must be an integer >= 0, got {seed!r}")
    check_int64(int(seed), "seed")


def _feed_nbytes(name: str, shape: tuple[int, ...], dtype: np.dtype, before: int) -> int:
    """Bytes of a random input of ``shape``, checked (with the inputs drawn ``before``) against
    ``MAX_FEED_BYTES`` before anything is allocated.

    Raises:
        GskitError: a negative dim, or the inputs would exceed ``MAX_FEED_BYTES``.
    """
    nbytes = int(dtype.itemsize)
    for dim in shape:
        if int(dim) < 0:
            raise GskitError(f"input '{name}' would have a negative dim {tuple(shape)}; fix it with --shape")
        nbytes *= int(dim)
    if before + nbytes > MAX_FEED_BYTES:
        raise GskitError(
            f"random input '{name}' of shape {tuple(int(d) for d in shape)} ({dtype}) would take "
            f"{nbytes} bytes, over the {MAX_FEED_BYTES}-byte limit of inputs; give smaller dims with "
            f"--shape {name}:DIMS or real inputs with --inputs"
        )
    return nbytes


def compared_constants(graph: gs.Graph) -> dict[str, int | float]:
    """Single-value inputs that the model compares with a constant (``Equal(sr, 16000)`` before an ``If``).

    Such an input is a mode switch (a sample rate, a flag), not data: a random value takes a branch that
    real inputs never take, or none that works. The model's own constant is the value to feed.
    """
    found: dict[str, int | float] = {}
    for tensor in graph.inputs:
        for node in tensor.outputs:
            if node.op != "Equal" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
                continue
            other = node.inputs[1] if node.inputs[0] is tensor else node.inputs[0]
            value = _single_constant(other)
            if value is not None:
                found.setdefault(tensor.name, value)
    return found


def _single_constant(tensor: gs.Tensor) -> int | float | None:
    values = None
    if isinstance(tensor, gs.Constant):
        values = tensor.values
    elif len(tensor.inputs) == 1 and tensor.inputs[0].op == "Constant":
        attr = tensor.inputs[0].attrs.get("value")
        values = getattr(attr, "values", None)
    if values is None:
        return None
    values = np.asarray(values)
    return values.reshape(-1)[0].item() if values.size == 1 else None


def resolve_feeds(
    model: onnx.ModelProto | gs.Graph,
    feeds: Mapping[str, np.ndarray] | None,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    *,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """The caller's ``feeds`` as numpy arrays, or ``random_feeds(model, shapes, seed=seed)`` when None.

    Raises:
        GskitError: as ``random_feeds`` when ``feeds`` is None; otherwise when ``shapes`` are given too, or
            ``feeds`` lacks an input of the model or names one it does not have.
    """
    if feeds is None:
        return random_feeds(model, shapes, seed=seed)
    if shapes:  # the given arrays fix the shapes: a shape here would be dropped without a word
        raise GskitError(f"shapes {dict(shapes)} given with the inputs: give --shape or --inputs, not both")
    graph = model if isinstance(model, gs.Graph) else None
    wanted = (
        [t.name for t in graph.inputs if not isinstance(t, gs.Constant)]
        if graph is not None
        else _runtime_inputs(model)
    )
    # Initializers listed as graph inputs may be fed too: that overrides the weight.
    allowed = set(wanted) if graph is not None else {i.name for i in model.graph.input}
    missing = [name for name in wanted if name not in feeds]
    unknown = sorted(set(feeds) - allowed)
    if missing or unknown:
        raise GskitError(
            f"inputs do not fit the model: missing {missing or 'none'}, unknown {unknown or 'none'}; "
            f"the model's inputs are {wanted}"
        )
    return {name: np.asarray(value) for name, value in feeds.items()}


def _runtime_inputs(model: onnx.ModelProto) -> list[str]:
    initializers = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in initializers]


def feed_shapes(feeds: Mapping[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    """The shape of each input in ``feeds``, as plain ints (what reports record)."""
    return {name: tuple(int(d) for d in np.shape(value)) for name, value in feeds.items()}


def random_array(rng: np.random.Generator, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(0, 8, size=shape).astype(dtype)
    return rng.uniform(-1.0, 1.0, size=shape).astype(dtype)


def load_feeds(path: str | os.PathLike, max_bytes: int | None = None) -> dict[str, np.ndarray]:
    """Inputs saved with ``np.savez`` (one array per input name), at most ``max_bytes`` in all.

    Each member's header (shape and dtype) is read and checked before any array is: a small archive that
    unpacks to gigabytes, or an array of Python objects (a pickle, which gskit never loads), is refused.

    Args:
        path: the .npz file.
        max_bytes: most bytes the arrays may take once loaded; None: ``MAX_FEED_BYTES``.

    Raises:
        GskitError: the file is missing or is not an .npz archive (a single-array .npy included), holds
            objects, or its arrays exceed ``max_bytes``.
    """
    path = Path(path)
    limit = MAX_FEED_BYTES if max_bytes is None else max_bytes
    check_inputs_file(path)
    try:
        with path.open("rb") as file:
            magic = file.read(6)
        if magic == b"\x93NUMPY":
            raise GskitError(
                f"{path}: holds one unnamed array (.npy); save the inputs by name with numpy.savez"
            )
        if not magic.startswith(b"PK"):
            raise GskitError(f"{path}: not an .npz archive; save the inputs by name with numpy.savez")
        with zipfile.ZipFile(path) as archive:
            members = [_npz_member(path, archive, info) for info in archive.infolist()]
            total = sum(nbytes for _, _, nbytes in members)
            if total > limit:
                raise GskitError(
                    f"{path}: its arrays take {total} bytes once loaded, over the limit of {limit} bytes"
                )
            feeds = {}
            for name, info, _ in members:
                with archive.open(info) as member:
                    feeds[name] = np.lib.format.read_array(member, allow_pickle=False)
            return feeds
    except _ARCHIVE_ERRORS as err:
        raise GskitError(
            f"{path}: cannot read inputs (expected an .npz written by numpy.savez): {err}"
        ) from err


def check_inputs_file(path: str | os.PathLike) -> None:
    """Raise a GskitError naming ``path`` when it is no regular file (missing, a folder, a device, a pipe)."""
    if not Path(path).is_file():
        raise GskitError(not_a_file(Path(path), INPUTS_FILE))


#: What a damaged archive raises while it is read (zipfile, zlib and numpy's header parser).
_ARCHIVE_ERRORS = (
    OSError,
    ValueError,
    EOFError,
    RuntimeError,
    NotImplementedError,
    zipfile.BadZipFile,
    zlib.error,
)


def _npz_member(
    path: Path, archive: zipfile.ZipFile, info: zipfile.ZipInfo
) -> tuple[str, zipfile.ZipInfo, int]:
    """``(input name, member, bytes once loaded)`` from a member's .npy header, without reading its data."""
    if not info.filename.endswith(".npy"):
        raise GskitError(
            f"{path}: member '{info.filename}' is not an .npy array; save inputs with numpy.savez"
        )
    with archive.open(info) as member:
        version = np.lib.format.read_magic(member)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(member)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(member)
        else:
            raise GskitError(f"{path}: member '{info.filename}' has .npy version {version}, not 1.0 or 2.0")
    if dtype.hasobject:
        raise GskitError(
            f"{path}: array '{info.filename[:-4]}' holds Python objects; gskit never loads pickled data, "
            "save numeric arrays"
        )
    nbytes = int(dtype.itemsize)
    for dim in shape:
        nbytes *= int(dim)
    return info.filename[:-4], info, nbytes


def _check_fits(tensor: gs.Variable | _Input, shape: tuple[int, ...]) -> None:
    """A ``--shape`` keeps the rank and fixed dims of its input; name the dim that differs, early."""
    if tensor.shape is None:
        return
    declared = "[" + ", ".join(str(d) for d in tensor.shape) + "]"
    if len(shape) != len(tensor.shape):
        raise GskitError(
            f"--shape {tensor.name}:{'x'.join(map(str, shape))} has rank {len(shape)}, but input "
            f"'{tensor.name}' is {declared}"
        )
    for axis, (given, dim) in enumerate(zip(shape, tensor.shape, strict=True)):
        if isinstance(dim, int) and dim >= 0 and given != dim:
            raise GskitError(
                f"--shape {tensor.name}:{'x'.join(map(str, shape))} sets dim {axis} to {given}, but input "
                f"'{tensor.name}' is {declared} (dim {axis} is fixed at {dim})"
            )


def _concrete_shape(
    tensor: gs.Variable | _Input, dim_values: Mapping[str, int], default_dim: int, image_dim: int | None
) -> tuple[int, ...]:
    if tensor.shape is None:
        raise GskitError(
            f"input '{tensor.name}' has unknown rank; give its shape with --shape {tensor.name}:DIMS"
        )
    image = (
        image_dim is not None
        and len(tensor.shape) == 4
        and isinstance(tensor.shape[1], int)
        and 1 <= tensor.shape[1] <= 4
    )
    dims = []
    for axis, dim in enumerate(tensor.shape):
        if isinstance(dim, int) and dim >= 0:
            dims.append(dim)
        elif isinstance(dim, str) and dim in dim_values:
            dims.append(int(dim_values[dim]))
        elif image and axis >= 2:
            dims.append(int(image_dim))  # type: ignore[arg-type]
        else:
            dims.append(default_dim)
    return tuple(dims)


def metadata_dim_values(model: onnx.ModelProto) -> dict[str, int]:
    """Symbolic input dims that the model's own metadata fixes: a ``metadata_props`` key named like the dim
    (``height``, or ``dim:height``) with a positive integer value."""
    names = {
        d.dim_param
        for i in model.graph.input
        if i.type.HasField("tensor_type")
        for d in i.type.tensor_type.shape.dim
        if d.dim_param
    }
    found = {}
    for prop in model.metadata_props:
        key = prop.key.removeprefix("dim:")
        if key in names and prop.value.strip().isdigit() and int(prop.value) > 0:
            found[key] = int(prop.value)
    return found


def _np_dtype(dtype) -> np.dtype:
    if isinstance(dtype, int):
        return onnx.helper.tensor_dtype_to_np_dtype(dtype)
    return np.dtype(dtype)
