"""Loading and saving ONNX models of any size, and converting between ModelProto and gs.Graph.

Protobuf cannot serialize a message over 2 GB, so large weights live in one external data file beside
the model (``<model>.onnx.data``). gskit never copies weights it does not need to:

* ``load(path, load_weights=False)`` leaves external weights on disk; each such tensor remembers the
  folder it came from in the ``basepath`` entry of its external-data record, so it can be read later
  (``to_graph`` gives it lazy values that read from there) and streamed into a new file on save.
* ``save`` writes large tensors to the data file itself and strips them from the proto only for the
  time of serialization, so the caller's model is left as it was and never copied.

Every save goes to a temporary folder beside the destination, is checked there, and is then renamed
into place: a crash never leaves a half-written model under the final name.

Files are handled safely by default:

* ``load`` reads external data only from regular files inside the model's own folder: a ``location``
  that leads out of it through a symbolic link is refused, and so is a hard-linked data file unless
  ``GSKIT_ALLOW_HARDLINKED_DATA=1`` (a hard link can be a second name of any file on the same disk).
* Where outputs take their final names, and what may be replaced there, is decided in
  :mod:`gskit.io.outputs` (``place_file``, ``write_atomic``, ``guarding_inputs``): never a file a loaded model
  reads, never anything but a regular file or a link, a link replaced and never followed.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from google.protobuf.message import DecodeError
from onnx import TensorProto
from onnx.external_data_helper import _get_all_tensors, uses_external_data

from gskit.errors import GskitError, ModelCheckError
from gskit.io import gs_export
from gskit.io.outputs import (
    blaming,
    check_output,
    check_replaceable,
    make_scratch_folder,
    output_entry,
    place_file,
    remember_input,
    remove_scratch_folder,
)
from gskit.io.weights_apart import exporting_weights_apart, held_names_kept, restore_weights
from gskit.io.wellformed import check_wellformed

log = logging.getLogger(__name__)

#: Kept here for its callers: it lives in gs_export, which weights_apart (below this module) walks with too.
node_subgraphs = gs_export.node_subgraphs

#: Highest IR version that onnxruntime 1.31 loads; onnx 1.23 writes 14 by default.
MAX_ORT_IR_VERSION = 13
#: Past this many bytes of tensor data a model is saved with external data (protobuf's hard limit is 2 GiB).
EXTERNAL_DATA_THRESHOLD = 1_800_000_000
#: Tensors smaller than this stay inside the proto when a model is saved with external data.
EXTERNAL_TENSOR_MIN_BYTES = 1024
_COPY_CHUNK = 64 * 1024 * 1024
_TYPED_FIELDS = ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data")
_BASEPATH = "basepath"
#: Set to 1 to accept external data files that have more than one hard link.
ALLOW_HARDLINKS_ENV = "GSKIT_ALLOW_HARDLINKED_DATA"


ModelLike = onnx.ModelProto | gs.Graph


def load(
    path: str | os.PathLike, *, load_weights: bool = True, allow_missing_data: bool = False
) -> onnx.ModelProto:
    """Load an ONNX model from ``path``.

    Args:
        path: the ``.onnx`` file; external data is looked up relative to its folder.
        load_weights: read external weights into memory. With ``False`` they stay on disk and are read
            only when needed (``gs.Constant.values``, ``save``); use it for inspection and for editing
            models larger than memory allows.
        allow_missing_data: with ``load_weights=False``, an external data file that does not exist is no
            error (``gskit inspect`` reads no weights; :func:`missing_data_files` names them). Locations
            are still checked.

    Raises:
        GskitError: the file is missing, is not an ONNX model, or names an external data file that is
            missing or too short.
    """
    path = Path(path)
    if not path.is_file():
        raise GskitError(not_a_file(path, "model"))
    try:
        model = onnx.load(str(path), load_external_data=False)
    except PermissionError as err:
        raise GskitError(f"{path}: no permission to read the model file") from err
    except (DecodeError, RuntimeError, ValueError) as err:
        raise GskitError(f"{path}: not a readable ONNX model (truncated or another format): {err}") from err
    if not model.HasField("graph") or model.ir_version <= 0:
        raise GskitError(f"{path}: not an ONNX model (no graph or no IR version); check the file")
    base_dir = str(path.resolve().parent)
    remember_input(path, path)
    for tensor in _external_tensors(model):
        if allow_missing_data and not load_weights and _missing_data(tensor, base_dir, path):
            continue
        _check_external_data(tensor, base_dir, path)
        remember_input(_data_file(tensor, base_dir), path)
        if load_weights:
            tensor.raw_data = _read_external(tensor, base_dir)
            tensor.data_location = TensorProto.DEFAULT
            del tensor.external_data[:]
        else:
            _set_entry(tensor, _BASEPATH, base_dir)
    identity = _file_identity(path, load_weights)
    if identity not in _WELLFORMED_FILES:
        check_wellformed(model, path)
        _WELLFORMED_FILES.add(identity)
    return model


#: Files ``load`` found well-formed, by :func:`_file_identity`: ``compare`` and ``prepare`` load one model
#: several times (weightless views, sessions), and the check is most of a load's time on a large graph.
_WELLFORMED_FILES: set[tuple] = set()


def _file_identity(path: Path, load_weights: bool) -> tuple:
    """The file as it is now: a rewritten or replaced file (new size, time or inode) is checked again."""
    stat = path.stat()
    return (str(path.resolve()), stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, load_weights)


def not_a_file(path: Path, what: str) -> str:
    """Why ``path`` cannot be read as a ``what`` file: missing, a folder, or not a regular file."""
    if path.is_dir():
        return f"{path} is a folder, not a {what} file; give the file itself"
    if path.exists():
        return f"{path}: not a regular file (a device or pipe); give a {what} file"
    return f"{path}: no such {what} file"


def save(
    model: ModelLike,
    path: str | os.PathLike,
    *,
    external_data: bool | None = None,
    check: bool = True,
    in_place: bool = False,
) -> Path:
    """Write ``model`` to ``path`` atomically, checking it first.

    Args:
        model: a ModelProto or a gs.Graph.
        path: destination ``.onnx`` file. External data goes to ``<path>.data`` beside it.
        external_data: force (True) or forbid (False) external data; ``None`` chooses it when the
            tensors hold more than ``EXTERNAL_DATA_THRESHOLD`` bytes or some weights are still on disk.
        check: run onnx's checker on the written file before it takes the final name.
        in_place: the model and data files may replace files that a loaded model reads (``edit
            --in-place``); never the data file that this model's own weights on disk are read from.

    Returns:
        The path written.

    Raises:
        GskitError: the destination is a folder or its folder cannot be created, would replace or delete a
            file that a loaded model reads, or the model cannot be serialized.
        ModelCheckError: the model fails onnx's checker (nothing is written under the final name).
    """
    proto = to_model(model) if isinstance(model, gs.Graph) else model
    path = output_entry(path)
    if path.is_dir() and not path.is_symlink():  # a link is replaced, whatever it points at
        raise GskitError(f"{path}: is a folder; give the path of the .onnx file to write")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise GskitError(f"{path}: cannot create its folder ({err.strerror}); choose another path") from err
    data_name = path.name + ".data"
    tensors = list(_get_all_tensors(proto))
    if external_data is None:
        external_data = any(uses_external_data(t) for t in tensors) or _tensor_bytes_over(
            tensors, EXTERNAL_DATA_THRESHOLD
        )
    data_path = path.parent / data_name
    # Both names before anything is written: the data file's name is taken (or a stale one removed) even
    # when this model keeps its weights inside.
    check_replaceable(data_path, role=f"the external data of {path.name}")
    for name in (data_path, path):  # the data file first: losing the weights is the worse of the two
        if in_place:
            check_replaceable(name)
        else:
            check_output(name)
    _refuse_overwriting_sources(tensors, data_path)

    with blaming(path):
        _write_atomically(proto, path, tensors, data_path, external_data, check, in_place)
    log.info("saved %s%s", path, " (+ external data)" if external_data else "")
    return path


def _write_atomically(
    proto: onnx.ModelProto,
    path: Path,
    tensors: list[TensorProto],
    data_path: Path,
    external_data: bool,
    check: bool,
    in_place: bool,
) -> None:
    """Write into a temporary folder beside ``path``, check, then rename into place."""
    data_name = data_path.name
    tmp_dir = make_scratch_folder(path.parent, f".{path.name}.")
    try:
        tmp_model = tmp_dir / path.name
        payload: bytes | None = None  # the file's bytes, when they are one serialized message here
        with _ir_version_for_onnxruntime(proto):
            if external_data:
                with blaming(data_path):
                    light = _write_external_data(proto, tmp_dir / data_name)
                with blaming(path):
                    _write_light_model(light, tmp_model)
            else:
                if any(uses_external_data(t) for t in tensors):
                    raise GskitError(f"{path}: model has weights on disk; save it with external_data=True")
                try:
                    payload = proto.SerializeToString()
                except ValueError as err:
                    raise GskitError(
                        f"{path}: model too large for one protobuf file; save it with external data"
                    ) from err
                with blaming(path):
                    tmp_model.write_bytes(payload)
        if check:
            check_file(tmp_model, payload)
        tmp_data = tmp_dir / data_name
        wrote_data = tmp_data.is_file() and tmp_data.stat().st_size > 0
        if wrote_data:
            place_file(tmp_data, data_path, in_place=in_place)
        place_file(tmp_model, path, in_place=in_place)
        if not wrote_data and (data_path.is_file() or data_path.is_symlink()):
            # A data file left from an earlier save to this path belongs to no model any more.
            data_path.unlink()
    finally:
        remove_scratch_folder(tmp_dir)


def check_file(path: str | os.PathLike, payload: bytes | None = None) -> None:
    """Run onnx's checker on a model file (works past 2 GB); raise ModelCheckError naming the problem.

    ``payload``: the file's bytes, when the caller has them and the model has no external data (the checker
    reads a file only to know its folder, where external data would lie): it checks them without reading
    the file again (a copy of every weight).
    """
    try:
        onnx.checker.check_model(str(path) if payload is None else payload)
    except (onnx.checker.ValidationError, onnx.onnx_cpp2py_export.checker.ValidationError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else repr(err)
        raise ModelCheckError(f"{Path(path).name}: model fails onnx's checker: {first}") from err


def to_graph(model: onnx.ModelProto) -> gs.Graph:
    """Import a ModelProto as a gs.Graph; weights still on disk stay there, readable on demand."""
    with _without_shapeless_io_value_info(model):
        graph = gs.import_onnx(model)
    if graph.import_domains is not None:
        # graphsurgeon keeps the model's own opset_import list: a plugin domain added to the graph would be
        # added to the caller's model too.
        graph.import_domains = [onnx.helper.make_opsetid(d.domain, d.version) for d in graph.import_domains]
    gs_export.mark_empty_lists(model, graph)
    for sub in (graph, *graph.subgraphs(recursive=True)):
        for tensor in sub.tensors().values():
            if not isinstance(tensor, gs.Constant):
                continue
            # graphsurgeon re-applies data_location on export even after the values were loaded into
            # memory, which would mark in-memory bytes as external.
            tensor.data_location = None
            on_disk = disk_tensor(tensor)
            if on_disk is not None:
                tensor._values = DiskValues(on_disk)
        for node in sub.nodes:
            for key, value in node.attrs.items():
                if isinstance(value, gs.Constant) and isinstance(value._values, gs.ir.tensor.LazyValues):
                    # A tensor attribute (a Constant node's value): graphsurgeon's export names the proto it
                    # reads, which is the caller's model's; a copy (attributes are small) keeps it as it was.
                    copy = onnx.TensorProto()
                    copy.CopyFrom(value._values.tensor)
                    node.attrs[key]._values = gs.ir.tensor.LazyValues(copy)
    return graph


@contextmanager
def _without_shapeless_io_value_info(model: onnx.ModelProto) -> Iterator[None]:
    """Hide value_info entries that repeat a graph input/output without the shape its declaration has.

    graphsurgeon lets such an entry override the declared type, so the output was written without a shape
    and failed onnx's checker. The entries are put back afterwards: the caller's model is left as it was.
    """
    hidden: list[tuple[onnx.GraphProto, list[onnx.ValueInfoProto]]] = []
    for proto_graph in graph_protos(model.graph):
        shaped = {
            info.name
            for info in (*proto_graph.input, *proto_graph.output)
            if info.type.HasField("tensor_type") and info.type.tensor_type.HasField("shape")
        }
        if not shaped:
            continue
        keep = [
            info
            for info in proto_graph.value_info
            if info.name not in shaped or info.type.tensor_type.HasField("shape")
        ]
        if len(keep) == len(proto_graph.value_info):
            continue
        hidden.append((proto_graph, list(proto_graph.value_info)))
        del proto_graph.value_info[:]
        proto_graph.value_info.extend(keep)
    try:
        yield
    finally:
        for proto_graph, infos in hidden:
            del proto_graph.value_info[:]
            proto_graph.value_info.extend(infos)


def to_model(graph: gs.Graph) -> onnx.ModelProto:
    """Export a gs.Graph as a ModelProto with an IR version onnxruntime can load.

    Empty list attributes (``axes=[]``), which graphsurgeon cannot export, are written with their kind;
    optional and opaque value types with theirs; map types and sequences of sequences without a type. Large
    weights go into the model once, after the export (:mod:`gskit.io.weights_apart`).
    """
    with (
        held_names_kept(graph),
        gs_export.exporting_empty_lists(graph) as marker,
        gs_export.exporting_value_types(graph) as types,
        exporting_weights_apart(graph) as weights,
    ):
        model = gs.export_onnx(graph, do_type_check=False)
    restore_weights(model, weights)
    gs_export.restore_empty_lists(model, marker)
    gs_export.restore_value_types(model, types)
    # IR 4 is the first to allow initializers that are not graph inputs, which graphsurgeon always writes.
    model.ir_version = max(4, min(model.ir_version, MAX_ORT_IR_VERSION))
    return model


def resolve_output(
    input_path: str | os.PathLike,
    output_path: str | os.PathLike,
    *,
    in_place: bool,
    has_in_place: bool = False,
) -> Path:
    """Return ``output_path`` as a Path, refusing to write over the input model unless ``in_place``, and a
    name (or the ``.data`` name beside it) that holds anything but a regular file or a link.

    ``has_in_place``: the command offers ``--in-place``, so the message may suggest it.
    """
    out = Path(output_path)
    if out.resolve() == Path(input_path).resolve() and not in_place:
        hint = "choose another -o or pass --in-place" if has_in_place else "choose another -o"
        raise GskitError(f"{out}: output would overwrite the input model; {hint}")
    # Checked again when the files are written; here so that a bad name fails before the work, not after.
    if out.name:  # "." or "/" is a folder, which the check below names
        check_replaceable(out.with_name(out.name + ".data"), role=f"the external data of {out.name}")
    check_replaceable(out)
    return out


def graph_protos(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every subgraph in it (``If`` branches, ``Loop``/``Scan`` bodies), depth first."""
    yield graph
    for node in graph.node:
        for sub in proto_subgraphs(node):
            yield from graph_protos(sub)


def proto_subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    """The graphs held in one node's attributes (not those nested in them)."""
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def node_reads(node: onnx.NodeProto) -> list[str]:
    """The values a node reads: its inputs and the outer-scope values its subgraphs use, once each."""
    names = [name for name in node.input if name]
    for graph in proto_subgraphs(node):
        names.extend(_outer_reads(graph))
    return list(dict.fromkeys(names))


def _outer_reads(graph: onnx.GraphProto) -> list[str]:
    """The names a subgraph (and the subgraphs inside it) reads from the scopes around it."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    defined |= {t.values.name for t in graph.sparse_initializer}
    found = []
    for node in graph.node:
        found.extend(name for name in node_reads(node) if name not in defined)
        defined.update(node.output)
    return found


def count_nodes(graph: gs.Graph) -> int:
    """Nodes of ``graph`` and of every subgraph in it."""
    return sum(len(sub.nodes) for sub in (graph, *graph.subgraphs(recursive=True)))


def data_locations(model: onnx.ModelProto) -> list[str]:
    """The external data files that the model's tensors name (their ``location``), each once, sorted."""
    return sorted({loc for t in _external_tensors(model) if (loc := _entry(t, "location"))})


def input_dtypes(model: onnx.ModelProto) -> dict[str, np.dtype]:
    """The numpy dtype of each main-graph input that declares an element type."""
    return {
        i.name: np.dtype(onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type))
        for i in model.graph.input
        if i.type.tensor_type.elem_type
    }


def tensor_nbytes(tensor: TensorProto) -> int:
    """Bytes of a tensor's data, wherever it is stored."""
    if uses_external_data(tensor):
        length = _entry(tensor, "length")
        if length is not None:
            return int(length)
    if tensor.HasField("raw_data"):
        return len(tensor.raw_data)
    if tensor.data_type == TensorProto.STRING:
        return sum(len(s) for s in tensor.string_data)
    itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    return int(np.prod(tensor.dims, dtype=np.int64)) * itemsize


def disk_tensor(constant: gs.Constant) -> TensorProto | None:
    """The TensorProto whose data file a constant's values are still read from (``load(load_weights=False)``
    leaves weights there), or None when its values are in memory."""
    lazy = constant._values
    if isinstance(lazy, gs.ir.tensor.LazyValues) and uses_external_data(lazy.tensor):
        return lazy.tensor
    return None


def _source_file(tensor: TensorProto) -> Path:
    """The data file an on-disk tensor's bytes are read from, resolved (one file, whatever names reach it)."""
    return _data_file(tensor, _entry(tensor, _BASEPATH) or ".").resolve()


def external_span(tensor: TensorProto) -> tuple[Path, int, int]:
    """Where an on-disk tensor's bytes are: ``(data file, offset, length)``, the file resolved (two tensors
    with the same span hold the same bytes, whatever their names)."""
    source = _source_file(tensor)
    offset = int(_entry(tensor, "offset") or 0)
    length = _entry(tensor, "length")
    return source, offset, int(length) if length is not None else source.stat().st_size - offset


def external_range(tensor: TensorProto, start: int, size: int) -> bytes:
    """Up to ``size`` bytes of an on-disk tensor from byte ``start`` of its data (fewer at its end): a
    reader that compares tensors reads only as far as they are alike.

    Raises:
        GskitError: the data file ends before the tensor does.
    """
    source, offset, length = external_span(tensor)
    size = max(0, min(size, length - start))
    if not size:
        return b""
    with open(source, "rb") as src:
        src.seek(offset + start)
        chunk = src.read(size)
    if len(chunk) < size:
        raise GskitError(f"{source}: external data ends early for tensor '{tensor.name}'")
    return chunk


class DiskValues(gs.ir.tensor.LazyValues):
    """Lazy values of a tensor whose data is in an external file, read only when asked for.

    The file is found from the tensor's external-data record: ``location`` relative to the folder in
    its ``basepath`` entry (which ``load`` records; ``"."`` without one), at ``offset`` for ``length`` bytes.
    ``to_graph`` gives every on-disk constant such values; ``gskit.passes.fold`` gives them to the large
    constants it spills to disk.
    """

    def load(self) -> np.ndarray:
        tensor = TensorProto()
        tensor.CopyFrom(self.tensor)
        base_dir = _entry(tensor, _BASEPATH) or "."
        tensor.raw_data = _read_external(tensor, base_dir)
        tensor.data_location = TensorProto.DEFAULT
        del tensor.external_data[:]
        return onnx.numpy_helper.to_array(tensor)


def tensor_values(tensor: TensorProto) -> np.ndarray:
    """A tensor's values, also of one whose data stayed on disk (``load(load_weights=False)``)."""
    if not uses_external_data(tensor):
        return onnx.numpy_helper.to_array(tensor)
    read = TensorProto()
    _copy_header(tensor, read)
    read.raw_data = _read_external(tensor, _entry(tensor, _BASEPATH) or ".")
    return onnx.numpy_helper.to_array(read)


def save_beside_weights(model: onnx.ModelProto, path: str | os.PathLike) -> Path:
    """Write a weightless ``model`` (``load(load_weights=False)``) whose weights stay where they are on disk.

    For a reader of ONNX files in another process (TensorRT's parser): each data file the model reads is
    linked into ``path``'s folder under the name the model gives it, so the file written holds the graph
    only, and nothing of the weights is read or copied. ``path``'s folder is a scratch folder of the caller.

    Returns:
        The path written.
    """
    path = Path(path)
    proto = onnx.ModelProto()
    proto.CopyFrom(model)
    linked: set[str] = set()
    for tensor in _external_tensors(proto):
        location = _entry(tensor, "location") or ""
        source = _source_file(tensor)
        kept = [item for item in tensor.external_data if item.key != _BASEPATH]
        del tensor.external_data[:]
        tensor.external_data.extend(kept)
        if location not in linked:
            link = path.parent / location
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(source)
            linked.add(location)
    with blaming(path):
        onnx.save_model(proto, str(path))
    return path


def save_linked(model: ModelLike, path: str | os.PathLike) -> Path:
    """Write ``model`` as a file for readers of files (onnxruntime, TensorRT, gskit's own checks) without
    writing the weights it still reads from disk again.

    Each data file that its on-disk weights come from is hard-linked into ``path``'s folder (a second name of
    the same file, which onnxruntime and onnx's checker accept where they refuse a symbolic link): nothing of
    those weights is read or copied. Where no link can be made (the data on another disk, a file system
    without hard links) those weights are copied into ``<path>.data``, as :func:`save` does. Weights held in
    memory go to ``<path>.data`` too (small ones stay in the proto); a model without weights on disk is
    saved by :func:`save`. :func:`load` accepts the links this process made. onnx's checker refuses any data
    file with a second name, so a model with linked data is not run through it: the readers check what they
    read (``load``'s well-formedness check, onnxruntime's), and the final :func:`save` of the model checks it.

    ``path``'s folder is a scratch folder of the caller, and nothing may write into its files afterwards: a
    linked file is the original's data.

    Returns:
        The path written.

    Raises:
        GskitError: the model cannot be serialized or its folder written.
        ModelCheckError: the model fails onnx's checker.
    """
    proto = to_model(model) if isinstance(model, gs.Graph) else model
    path = Path(path)
    if not any(_external_tensors(proto)):
        return save(proto, path)
    with blaming(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        links = _link_data_files(proto, path.parent)
        data_name = _free_name(path.name + ".data", set(links.values()))
        light = onnx.ModelProto()
        _copy_fields(proto, light, skip=("graph",))
        _copy_fields(proto.graph, light.graph, skip=("initializer",))
        # onnxruntime checks a weight that a subgraph (an If branch, a Loop body) reads with onnx's loader,
        # which refuses a data file with a second name ("multiple hard links ... hardlink attack"): those
        # weights are copied, the others linked
        inner = _read_in_subgraphs(proto.graph)
        with _ir_version_for_onnxruntime(light), open(path.parent / data_name, "wb") as data:
            # outside the initializer list (copied above, rare): tensor attributes, the subgraphs' tensors
            for tensor in _attribute_tensors(light.graph):
                _write_linked(tensor, tensor, links, data, data_name)
            for tensor in _subgraph_tensors(light.graph):
                _write_linked(tensor, tensor, {}, data, data_name)
            for source in proto.graph.initializer:
                target = light.graph.initializer.add()
                if _goes_external(source):
                    _copy_header(source, target)
                    _write_linked(source, target, {} if source.name in inner else links, data, data_name)
                else:
                    target.CopyFrom(source)
            wrote_data = data.tell() > 0
            _write_light_model(light, path)
    if not wrote_data:
        (path.parent / data_name).unlink()
    if not links:  # every weight was copied: the checker can read the files
        check_file(path)
    return path


def _read_in_subgraphs(graph: onnx.GraphProto) -> set[str]:
    """The names read by the nodes of ``graph``'s subgraphs (outer-scope values among them)."""
    subgraphs = [sub for sub in graph_protos(graph) if sub is not graph]
    return {name for sub in subgraphs for node in sub.node for name in node.input}


def _subgraph_tensors(graph: onnx.GraphProto) -> Iterator[TensorProto]:
    """The tensors that ``graph``'s subgraphs hold: their initializers and their nodes' tensor attributes."""
    for sub in graph_protos(graph):
        if sub is not graph:
            yield from sub.initializer
            yield from _attribute_tensors(sub)


def _attribute_tensors(graph: onnx.GraphProto) -> Iterator[TensorProto]:
    """The tensor attributes of ``graph``'s own nodes (not those of its subgraphs)."""
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors


#: ``(st_dev, st_ino)`` of the data files that :func:`save_linked` gave a second name: :func:`load` takes
#: them although they have more than one hard link (each was a file a checked model read, or gskit's own).
_LINKED_BY_GSKIT: set[tuple[int, int]] = set()


def _link_data_files(model: onnx.ModelProto, folder: Path) -> dict[Path, str]:
    """Hard-link each data file that ``model``'s on-disk weights come from into ``folder``; returns the name
    of each linked file there, by the file's resolved path (a file that cannot be linked is left out)."""
    links: dict[Path, str] = {}
    refused: set[Path] = set()
    for tensor in _external_tensors(model):
        source = _source_file(tensor)
        if source in links or source in refused:
            continue
        name = _free_name(Path(_entry(tensor, "location") or source.name).name, set(links.values()))
        try:
            os.link(source, folder / name)
        except OSError as err:  # another disk, no hard links there: those weights are copied instead
            log.info("cannot link %s into %s (%s): its weights are copied", source, folder, err.strerror)
            refused.add(source)
            continue
        stat = source.stat()
        _LINKED_BY_GSKIT.add((stat.st_dev, stat.st_ino))
        links[source] = name
    return links


def _free_name(name: str, taken: set[str]) -> str:
    """``name``, or ``N_name`` with the smallest N that is not taken."""
    found, number = name, 0
    while found in taken:
        number += 1
        found = f"{number}_{name}"
    return found


def _write_linked(
    source: TensorProto, target: TensorProto, links: dict[Path, str], data, data_name: str
) -> None:
    """Point ``target`` at ``source``'s bytes in a linked data file, or write them to ``data``."""
    if uses_external_data(source):
        span = external_span(source)
        linked = links.get(span[0])
        if linked is not None:
            for name in ("raw_data", *_TYPED_FIELDS):
                target.ClearField(name)
            del target.external_data[:]
            target.data_location = TensorProto.EXTERNAL
            for key, value in (("location", linked), ("offset", str(span[1])), ("length", str(span[2]))):
                _set_entry(target, key, value)
            return
    if _goes_external(source):
        _externalize(source, target, data, data_name)


def _external_tensors(model: onnx.ModelProto) -> Iterator[TensorProto]:
    return (t for t in _get_all_tensors(model) if uses_external_data(t))


def _entry(tensor: TensorProto, key: str) -> str | None:
    for item in tensor.external_data:
        if item.key == key:
            return item.value
    return None


def _set_entry(tensor: TensorProto, key: str, value: str) -> None:
    for item in tensor.external_data:
        if item.key == key:
            item.value = value
            return
    item = tensor.external_data.add()
    item.key, item.value = key, value


def _data_file(tensor: TensorProto, base_dir: str) -> Path:
    return Path(base_dir) / (_entry(tensor, "location") or "")


def missing_data_files(model: onnx.ModelProto, path: str | os.PathLike) -> list[str]:
    """The external data files the model at ``path`` names that do not exist beside it."""
    folder = Path(path).parent
    return [location for location in data_locations(model) if not (folder / location).is_file()]


def _missing_data(tensor: TensorProto, base_dir: str, model_path: Path) -> bool:
    """True when the tensor's data file does not exist (its location checked first)."""
    location = _entry(tensor, "location")
    if not location or os.path.isabs(location) or ".." in Path(location).parts:
        return False  # _check_external_data refuses it
    data = _data_file(tensor, base_dir)
    return not data.exists() and not data.is_symlink()  # a dangling link is refused, not skipped


def _check_external_data(tensor: TensorProto, base_dir: str, model_path: Path) -> None:
    location = _entry(tensor, "location")
    if not location or os.path.isabs(location) or ".." in Path(location).parts:
        raise GskitError(
            f"{model_path}: tensor '{tensor.name}' has an invalid external data location {location!r}"
        )
    data = _data_file(tensor, base_dir)
    if not data.is_file():
        what = "is no regular file (a folder, device or pipe)" if data.exists() else "is missing"
        raise GskitError(
            f"{model_path}: external data file '{location}' for tensor '{tensor.name}' {what}; "
            f"copy it next to the model"
        )
    _refuse_linked_data(tensor, data, base_dir, model_path)
    try:
        offset, length = int(_entry(tensor, "offset") or 0), _entry(tensor, "length")
        end = offset + (int(length) if length is not None else 0)
    except ValueError as err:
        raise GskitError(
            f"{model_path}: tensor '{tensor.name}' has a non-integer external data offset or length"
        ) from err
    if offset < 0 or end < offset:
        raise GskitError(
            f"{model_path}: tensor '{tensor.name}' has a negative external data offset or length"
        )
    if not os.access(data, os.R_OK):
        raise GskitError(f"{model_path}: no permission to read external data file '{location}'")
    if end > data.stat().st_size:
        raise GskitError(
            f"{model_path}: external data file '{location}' is too short for tensor '{tensor.name}' "
            f"(needs {end} bytes, has {data.stat().st_size}); the file is truncated"
        )


def _refuse_linked_data(tensor: TensorProto, data: Path, base_dir: str, model_path: Path) -> None:
    """Data must be a file of the model's own folder: a link could point at any file (a secret)."""
    location = _entry(tensor, "location")
    if not data.resolve().is_relative_to(Path(base_dir)):
        raise GskitError(
            f"{model_path}: external data '{location}' of tensor '{tensor.name}' is a link to "
            f"{data.resolve()}, outside the model's folder; copy the data file next to the model"
        )
    stat = data.stat()
    linked_by_gskit = (stat.st_dev, stat.st_ino) in _LINKED_BY_GSKIT
    if stat.st_nlink > 1 and os.environ.get(ALLOW_HARDLINKS_ENV) != "1" and not linked_by_gskit:
        raise GskitError(
            f"{model_path}: external data '{location}' of tensor '{tensor.name}' has "
            f"{data.stat().st_nlink} hard links (it may be any file); copy it, or set "
            f"{ALLOW_HARDLINKS_ENV}=1 if you trust it"
        )


def _read_external(tensor: TensorProto, base_dir: str) -> bytes:
    offset = int(_entry(tensor, "offset") or 0)
    length = _entry(tensor, "length")
    with open(_data_file(tensor, base_dir), "rb") as f:
        f.seek(offset)
        return f.read(int(length)) if length is not None else f.read()


def _tensor_bytes_over(tensors: list[TensorProto], limit: int) -> bool:
    """Whether the tensors (none of them on disk) hold more than ``limit`` bytes of data.

    A tensor's serialized size bounds its ``raw_data`` from above and is known without reading the data out
    (each read of ``raw_data`` is a copy of it): the data are counted only when that bound is over the limit.
    """
    bound = sum(t.ByteSize() if t.HasField("raw_data") else tensor_nbytes(t) for t in tensors)
    if bound <= limit:
        return False
    return sum(tensor_nbytes(t) for t in tensors) > limit


def _refuse_overwriting_sources(tensors: list[TensorProto], data_path: Path) -> None:
    for tensor in tensors:
        if uses_external_data(tensor):
            source = _source_file(tensor)
            if source == data_path.resolve():
                raise GskitError(
                    f"{data_path}: weights of tensor '{tensor.name}' are still read from this file; "
                    f"save to another path (or load with load_weights=True first)"
                )


@contextmanager
def _ir_version_for_onnxruntime(model: onnx.ModelProto) -> Iterator[None]:
    original = model.ir_version
    model.ir_version = min(original, MAX_ORT_IR_VERSION)
    try:
        yield
    finally:
        model.ir_version = original


def _write_external_data(model: onnx.ModelProto, data_path: Path) -> onnx.ModelProto:
    """Write the weights to one data file; return a light copy of the model that points at them.

    The caller's model is only read: large tensors are never copied into a second proto, and nothing has
    to be put back afterwards (protobuf does not return the memory of a cleared field, so stripping and
    restoring the caller's tensors would double the process's memory).
    """
    data_name = data_path.name
    light = onnx.ModelProto()
    _copy_fields(model, light, skip=("graph",))
    _copy_fields(model.graph, light.graph, skip=("initializer",))
    with open(data_path, "wb") as data:
        # Tensors outside the initializer list (Constant attributes, subgraphs, functions) are rare and
        # small; they were copied above and are moved out of the light copy itself.
        for tensor in _get_all_tensors(light):
            if _goes_external(tensor):
                _externalize(tensor, tensor, data, data_name)
        for source in model.graph.initializer:
            target = light.graph.initializer.add()
            if _goes_external(source):
                _copy_header(source, target)
                _externalize(source, target, data, data_name)
            else:
                target.CopyFrom(source)
    return light


def _write_light_model(light: onnx.ModelProto, model_path: Path) -> None:
    """Write the model whose weights :func:`_write_external_data` wrote."""
    try:
        payload = light.SerializeToString()
    except ValueError as err:
        raise GskitError(f"{model_path.name}: graph itself exceeds protobuf's 2 GB limit") from err
    model_path.write_bytes(payload)


def _goes_external(tensor: TensorProto) -> bool:
    # ONNX external data holds fixed-size elements only: string tensors always stay in the proto.
    if uses_external_data(tensor):
        return True
    return tensor.data_type != TensorProto.STRING and tensor_nbytes(tensor) >= EXTERNAL_TENSOR_MIN_BYTES


def _copy_fields(source, target, *, skip: tuple[str, ...]) -> None:
    for field_desc, value in source.ListFields():
        if field_desc.name in skip:
            continue
        if _is_repeated(field_desc):
            getattr(target, field_desc.name).extend(value)
        elif field_desc.type == field_desc.TYPE_MESSAGE:
            getattr(target, field_desc.name).CopyFrom(value)
        else:
            setattr(target, field_desc.name, value)


def _is_repeated(field_desc) -> bool:
    # protobuf 7 dropped FieldDescriptor.label in favour of is_repeated.
    if hasattr(field_desc, "is_repeated"):
        return bool(field_desc.is_repeated)
    return field_desc.label == field_desc.LABEL_REPEATED


def _copy_header(source: TensorProto, target: TensorProto) -> None:
    """Everything of a tensor but its payload."""
    target.name = source.name
    target.data_type = source.data_type
    target.dims.extend(source.dims)
    if source.doc_string:
        target.doc_string = source.doc_string
    if source.HasField("segment"):
        target.segment.CopyFrom(source.segment)
    target.metadata_props.extend(source.metadata_props)


def _externalize(source: TensorProto, target: TensorProto, data, data_name: str) -> None:
    """Append ``source``'s payload to ``data`` and make ``target`` point at it."""
    offset = _align(data)
    if uses_external_data(source):
        length = _copy_external(source, data)
    elif source.HasField("raw_data"):
        payload = source.raw_data
        data.write(payload)
        length = len(payload)
    else:  # typed fields (float_data, ...)
        payload = onnx.numpy_helper.to_array(source).tobytes()
        data.write(payload)
        length = len(payload)
    for name in ("raw_data", *_TYPED_FIELDS):
        target.ClearField(name)
    del target.external_data[:]
    target.data_location = TensorProto.EXTERNAL
    for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(length))):
        _set_entry(target, key, value)


def _align(data) -> int:
    # 4 KiB alignment lets runtimes mmap each tensor.
    offset = data.tell()
    pad = (-offset) % 4096
    if pad:
        data.write(b"\0" * pad)
    return offset + pad


def _copy_external(tensor: TensorProto, data) -> int:
    """Append an on-disk tensor's bytes to ``data``; returns how many.

    The kernel copies them from file to file where it can (``os.copy_file_range``: no pass through this
    process's memory; 2.5 GB in 1-3 s here against 8-20 s read and written in chunks), else they are read and
    written in chunks, so that no copy of the whole tensor is made.

    Raises:
        GskitError: the data file ends before the tensor does.
        OSError: the copy failed (a full disk).
    """
    source, offset, length = external_span(tensor)
    done = _copy_in_kernel(source, offset, length, data)
    if done == length:
        return done
    with open(source, "rb") as src:
        src.seek(offset + done)
        while done < length:
            chunk = src.read(min(_COPY_CHUNK, length - done))
            if not chunk:
                raise GskitError(f"{source}: external data ends early for tensor '{tensor.name}'")
            data.write(chunk)
            done += len(chunk)
    return done


#: What ``os.copy_file_range`` raises where the system cannot copy in the kernel (another file system, an
#: old kernel, a special file): the bytes are then copied through memory instead.
_NO_KERNEL_COPY = frozenset(
    {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EBADF, errno.EPERM}
)


def _copy_in_kernel(source: Path, offset: int, length: int, data) -> int:
    """Copy up to ``length`` bytes of ``source`` from ``offset`` to the end of ``data`` in the kernel;
    returns how many were copied (0 where the system cannot, fewer at the source's end)."""
    if not hasattr(os, "copy_file_range"):
        return 0
    data.flush()
    start, done = data.tell(), 0
    with open(source, "rb") as src:
        while done < length:
            try:
                copied = os.copy_file_range(
                    src.fileno(), data.fileno(), length - done, offset + done, start + done
                )
            except OSError as err:
                if err.errno not in _NO_KERNEL_COPY:
                    raise
                log.debug("copy_file_range from %s: %s; copying through memory", source, err.strerror)
                break
            if not copied:  # the source ends early: the caller's read says so
                break
            done += copied
    data.seek(start + done)
    return done
