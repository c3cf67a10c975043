"""Register a gskit plugin with TensorRT's Python plugin API (``tensorrt.plugin``) from its PluginSpec.

``tensorrt.plugin`` learns a plugin's inputs and attributes from the *signatures* of the decorated
functions (names, order, type annotations). gskit already knows all of that from ``SPEC``, so a plugin's
``trt_plugin.py`` writes only what is specific to it, and :func:`register_from_spec` builds functions with
the signatures TensorRT expects::

    from gskit.backends.trt_plugin import load_plugin_folder, register_from_spec

    SPEC, kernel = load_plugin_folder(__file__)
    register_from_spec(SPEC, shape=lambda inputs, attrs: [inputs[0].like()], impl=my_impl)

``load_plugin_folder`` imports ``spec.py`` and ``kernel.py`` through gskit's plugin loader, so the module
works however TensorRT's loaders import it (as a package member, or as a plain file without a package).

Callback shapes (``attrs`` maps the spec's attribute names to values as TensorRT passes them: ``int``,
``float``, ``str``, numpy arrays for lists):

* ``shape(inputs: list[TensorDesc], attrs) -> list[TensorDesc]``: the output rule, mirroring ``SPEC.infer``
  with ``tensorrt.plugin`` symbolic shape expressions.
* ``impl(inputs: list[Tensor], outputs: list[Tensor], attrs, stream: int) -> None``: runs the kernel.
* ``aot_impl(inputs: list[TensorDesc], outputs: list[TensorDesc], attrs) -> (kernel name, PTX,
  KernelLaunchParams, SymIntExprs)``: an ahead-of-time kernel, so engines run without Python.

Ahead-of-time kernels: ``gskit.backends.aot_ptx.triton_ptx`` compiles a Triton kernel to PTX in the order
TensorRT's AOT launcher passes arguments (still importable from here, as plugins/README.md names it);
:func:`launch` turns it into what an ``aot_impl`` returns and checks that the scalar count matches the
kernel's int32 parameters; :func:`triton_type` names the Triton type of a TensorRT data type.

``tensorrt`` is imported only inside :func:`register_from_spec` and :func:`launch` (full TensorRT >= 10.6;
10.9 for AOT).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

from gskit.backends.aot_ptx import TritonPtx

# plugins/README.md names gskit.backends.trt_plugin.triton_ptx: re-exported for plugin authors
from gskit.backends.aot_ptx import triton_ptx as triton_ptx
from gskit.errors import PluginError
from gskit.plugin.discovery import PLUGIN_PACKAGE, load_spec_file
from gskit.plugin.spec import AttrType, PluginSpec

log = logging.getLogger(__name__)

#: Type combinations listed by ``autotune`` when a plugin names none: every position FP32, or every FP16.
DEFAULT_TYPES: tuple[str, ...] = ("FP32", "FP16")

ShapeFn = Callable[[list[Any], Mapping[str, Any]], Sequence[Any]]
ImplFn = Callable[[list[Any], list[Any], Mapping[str, Any], int], None]
AotImplFn = Callable[[list[Any], list[Any], Mapping[str, Any]], tuple[Any, Any, Any, Any]]

#: Plugin ids this process registered (TensorRT refuses a second registration of an id).
_REGISTERED: set[str] = set()

_SCALAR_ANNOTATIONS: Mapping[AttrType, Any] = {
    AttrType.INT: int,
    AttrType.FLOAT: float,
    AttrType.STRING: str,
    AttrType.INTS: npt.NDArray[np.int32],
    AttrType.FLOATS: npt.NDArray[np.float32],
}


def plugin_id(spec: PluginSpec) -> str:
    """``namespace::name``, the id ``tensorrt.plugin`` registers (the version is TensorRT's default "1")."""
    return f"{spec.namespace}::{spec.name}"


def input_names(spec: PluginSpec) -> list[str]:
    """Input parameter names: the spec's inputs without the ``?`` of optional ones.

    ``tensorrt.plugin`` plugins have a fixed input count, so optional inputs are required there.
    """
    return [name.rstrip("?") for name in spec.inputs]


def attribute_annotation(spec: PluginSpec, name: str) -> Any:
    """The ``tensorrt.plugin`` annotation of one attribute (``int``, ``float``, ``str``, ``NDArray[...]``).

    Raises:
        PluginError: an attribute kind the Python plugin API cannot receive (STRINGS).
    """
    attr = spec.attribute(name)
    if attr.type is AttrType.TENSOR:
        dtype = np.dtype(attr.tensor_dtype or np.float32)
        return npt.NDArray[dtype.type]
    annotation = _SCALAR_ANNOTATIONS.get(attr.type)
    if annotation is None:
        raise PluginError(
            f"{spec.qualified_name}: attribute '{name}' of kind {attr.type.value} cannot reach a "
            "tensorrt.plugin plugin; use a C++ IPluginV3 plugin or change the attribute kind"
        )
    return annotation


def type_combination(spec: PluginSpec, dtypes: Sequence[str] = DEFAULT_TYPES) -> str:
    """An ``AutoTuneCombination`` type string giving all inputs and outputs the same type, for each dtype.

    ``("FP32", "FP16")`` with two inputs and one output gives ``"FP32|FP16, FP32|FP16, FP32|FP16"``:
    TensorRT pairs the alternatives position by position (all FP32, or all FP16).
    """
    alternatives = "|".join(dtypes)
    return ", ".join([alternatives] * (len(spec.inputs) + len(spec.outputs)))


def register_signature(spec: PluginSpec, trtp: Any) -> inspect.Signature:
    """Signature of the ``@trtp.register`` function: one ``TensorDesc`` per input, then the attributes."""
    params = [_param(name, trtp.TensorDesc) for name in input_names(spec)]
    params += [_param(a.name, attribute_annotation(spec, a.name)) for a in spec.attributes]
    outputs = trtp.TensorDesc if len(spec.outputs) == 1 else tuple[(trtp.TensorDesc,) * len(spec.outputs)]
    return inspect.Signature(params, return_annotation=outputs)


def impl_signature(spec: PluginSpec) -> inspect.Signature:
    """Signature of the ``@trtp.impl`` function: inputs, attributes, ``outputs``, ``stream``."""
    names = [*input_names(spec), *(a.name for a in spec.attributes), "outputs", "stream"]
    return inspect.Signature([_param(n) for n in names])


def aot_impl_signature(spec: PluginSpec, trtp: Any) -> inspect.Signature:
    """Signature of the ``@trtp.aot_impl`` function: inputs, attributes, ``outputs``, ``tactic``."""
    names = [*input_names(spec), *(a.name for a in spec.attributes), "outputs", "tactic"]
    returns = tuple[str | bytes, str | bytes, trtp.KernelLaunchParams, trtp.SymIntExprs]
    return inspect.Signature([_param(n) for n in names], return_annotation=returns)


def autotune_signature(spec: PluginSpec) -> inspect.Signature:
    """Signature of the ``@trtp.autotune`` function: inputs, then ``outputs``."""
    return inspect.Signature([_param(n) for n in [*input_names(spec), "outputs"]])


def load_plugin_folder(module_file: str | os.PathLike) -> tuple[PluginSpec, ModuleType]:
    """The spec and the kernel module of the plugin folder holding ``module_file`` (its ``trt_plugin.py``).

    ``spec.py`` is imported by :func:`gskit.plugin.discovery.load_spec_file` as the package
    ``gskit_plugins.<folder>``; ``kernel.py`` is imported as a member of that package.

    Raises:
        PluginError: the folder's spec or kernel cannot be imported, or it defines several specs.
    """
    folder = Path(module_file).resolve().parent
    package = f"{PLUGIN_PACKAGE}.trt_{folder.name}"
    specs = load_spec_file(folder / "spec.py", package)
    if len(specs) != 1:
        raise PluginError(f"{folder / 'spec.py'}: a TensorRT Python plugin folder needs exactly one SPEC")
    try:
        kernel = importlib.import_module(f"{package}.kernel")
    except Exception as err:  # user code: name the file
        raise PluginError(f"{folder / 'kernel.py'}: cannot import: {type(err).__name__}: {err}") from err
    return specs[0], kernel


def register_from_spec(
    spec: PluginSpec,
    *,
    shape: ShapeFn,
    impl: ImplFn,
    aot_impl: AotImplFn | None = None,
    dtypes: Sequence[str] = DEFAULT_TYPES,
    formats: str = "LINEAR",
    types: str | None = None,
) -> str:
    """Register ``spec``'s plugin with ``tensorrt.plugin``: register, impl, autotune and optional aot_impl.

    Args:
        spec: the plugin spec (name, namespace, inputs, outputs, attributes come from here).
        shape: output rule on TensorDescs (see the module docstring).
        impl: the JIT implementation, called with TensorRT ``Tensor``s and the CUDA stream.
        aot_impl: the ahead-of-time implementation, or None (then engines need Python at run time).
        dtypes: TensorRT type names that every input and output take together, for autotune.
        formats: tensor formats for autotune.
        types: the autotune type string itself, for plugins whose inputs and outputs differ in type (one
            ``|``-separated list per input and output, paired position by position: ``"FP32|FP16|FP32,
            FP32|FP16|FP16, FP32|FP16|FP16"`` adds a float32 x with a float16 weight and output); overrides
            ``dtypes``.

    Returns:
        The plugin id (``namespace::name``). Registering an id again in the same process is a no-op
        (TensorRT's loaders may import a plugin module more than once).

    Raises:
        PluginError: full TensorRT (>= 10.6, >= 10.9 with ``aot_impl``) is not importable, the spec's
            version is not "1" (tensorrt.plugin has no versions), or an attribute kind is not supported.
    """
    trtp = import_trtp(aot=aot_impl is not None)
    if spec.version != "1":
        raise PluginError(
            f"{spec.qualified_name}: tensorrt.plugin registers version 1 only; use a C++ IPluginV3 plugin "
            "for other versions"
        )
    pid = plugin_id(spec)
    if pid in _REGISTERED:
        log.debug("tensorrt.plugin %s is already registered in this process", pid)
        return pid
    tensors = input_names(spec)
    attr_names = [a.name for a in spec.attributes]

    def split(bound: inspect.BoundArguments) -> tuple[list[Any], dict[str, Any]]:
        args = bound.arguments
        return [args[n] for n in tensors], {n: args[n] for n in attr_names}

    reg_sig = register_signature(spec, trtp)

    def describe(*args: Any, **kwargs: Any) -> Any:
        inputs, attrs = split(reg_sig.bind(*args, **kwargs))
        outputs = list(shape(inputs, attrs))
        if len(outputs) != len(spec.outputs):
            raise PluginError(f"{spec.qualified_name}: shape rule gave {len(outputs)} outputs")
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    impl_sig = impl_signature(spec)

    def run(*args: Any, **kwargs: Any) -> None:
        bound = impl_sig.bind(*args, **kwargs)
        inputs, attrs = split(bound)
        impl(inputs, list(bound.arguments["outputs"]), attrs, int(bound.arguments["stream"]))

    tune_sig = autotune_signature(spec)

    def tune(*args: Any, **kwargs: Any) -> list[Any]:
        tune_sig.bind(*args, **kwargs)
        return [trtp.AutoTuneCombination(types or type_combination(spec, dtypes), formats)]

    for fn, sig in ((describe, reg_sig), (run, impl_sig), (tune, tune_sig)):
        fn.__signature__ = sig  # type: ignore[attr-defined]
    trtp.register(pid)(describe)
    trtp.impl(pid)(run)
    trtp.autotune(pid)(tune)
    if aot_impl is not None:
        aot_sig = aot_impl_signature(spec, trtp)

        def compile_kernel(*args: Any, **kwargs: Any) -> tuple[Any, Any, Any, Any]:
            bound = aot_sig.bind(*args, **kwargs)
            inputs, attrs = split(bound)
            return aot_impl(inputs, list(bound.arguments["outputs"]), attrs)

        compile_kernel.__signature__ = aot_sig  # type: ignore[attr-defined]
        trtp.aot_impl(pid)(compile_kernel)
    _REGISTERED.add(pid)
    log.debug("registered tensorrt.plugin %s (aot=%s)", pid, aot_impl is not None)
    return pid


@contextlib.contextmanager
def cuda_stream(stream: int | None) -> Iterator[None]:
    """Run torch/Triton launches on a raw CUDA stream handle (as TensorRT gives it); None: current stream."""
    if stream is None:
        yield
        return
    import torch

    with torch.cuda.stream(torch.cuda.ExternalStream(stream)):
        yield


def as_torch(tensors: Sequence[Any]) -> list[Any]:
    """TensorRT ``Tensor``s (``__cuda_array_interface__``) as CUDA torch tensors sharing their memory."""
    import torch

    return [torch.as_tensor(t, device="cuda") for t in tensors]


#: Triton type names of the TensorRT data types the plugins take (by ``trt.DataType`` name).
TRITON_TYPES: Mapping[str, str] = {"FLOAT": "fp32", "HALF": "fp16", "BF16": "bf16", "INT32": "i32"}


def triton_type(trt_dtype: Any) -> str:
    """``fp32``/``fp16``/... for a ``tensorrt.DataType``.

    Raises:
        PluginError: a data type the gskit kernels do not take.
    """
    name = getattr(trt_dtype, "name", str(trt_dtype)).split(".")[-1]
    if name not in TRITON_TYPES:
        raise PluginError(f"no Triton type for TensorRT data type {trt_dtype}")
    return TRITON_TYPES[name]


def launch(ptx: TritonPtx, grid: Sequence[Any], scalars: Sequence[Any]) -> tuple[Any, Any, Any, Any]:
    """What an ``aot_impl`` returns: kernel name, PTX, launch parameters and the int32 scalar arguments.

    Args:
        ptx: the compiled kernel.
        grid: up to three grid dims (ints or shape expressions).
        scalars: the kernel's int32 parameters in order (ints or shape expressions), ``ptx.scalars``.

    Raises:
        PluginError: the number of scalars differs from the kernel's int32 parameters (TensorRT would
            pass the output pointers in the wrong slots), or full TensorRT >= 10.9 is not importable.
    """
    if len(scalars) != len(ptx.scalars):
        raise PluginError(
            f"{ptx.name}: launch() got {len(scalars)} int32 scalars but the kernel takes "
            f"{len(ptx.scalars)} ({', '.join(ptx.scalars) or 'none'}); pass one per int32 parameter, in order"
        )
    trtp = import_trtp(aot=True)
    params = trtp.KernelLaunchParams()
    for axis, dim in zip(("grid_x", "grid_y", "grid_z")[: len(grid)], grid, strict=True):
        setattr(params, axis, dim)
    params.block_x = ptx.block_x
    params.shared_mem = ptx.shared_mem
    extra = trtp.SymIntExprs.from_tuple([trtp.SymInt32(s) for s in scalars])
    return ptx.name.encode(), ptx.ptx.encode(), params, extra


def _param(name: str, annotation: Any = inspect.Parameter.empty) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=annotation)


def import_trtp(*, aot: bool) -> Any:
    """``tensorrt.plugin``; with ``aot``, one that has ``aot_impl``.

    Raises:
        PluginError: full TensorRT >= 10.6 (>= 10.9 with ``aot``) is not importable.
    """
    try:
        import tensorrt.plugin as trtp
    except Exception as err:  # the PyPI stub raises various errors on import
        raise PluginError(
            "TensorRT Python plugins need full TensorRT >= 10.6: pip install 'gskit[trt]' (or docker/)"
        ) from err
    if aot and not hasattr(trtp, "aot_impl"):
        raise PluginError(
            "ahead-of-time TensorRT Python plugins need TensorRT >= 10.9 (tensorrt.plugin.aot_impl)"
        )
    return trtp
