"""Export a PyTorch model to ONNX and check it on onnxruntime against PyTorch ("always validate").

:func:`export` wraps ``torch.onnx.export`` for both exporters; :func:`export_as_plugins` exports chosen
module classes as model-local functions (TorchScript exporter, opset >= 15) and replaces their calls by
plugin nodes with :func:`gskit.passes.patterns.replace`. Both save with :func:`gskit.io.model.save` and then
run the written file on onnxruntime, plugin nodes through their numpy references, on the same inputs as
PyTorch: a mismatch beyond tolerance raises.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from gskit.backends import ort as ort_backend
from gskit.errors import GskitError
from gskit.io import model as gsmodel
from gskit.passes.patterns import FunctionPattern, Match, ReplaceReport, replace
from gskit.passes.patterns.replace import ReplaceOptions
from gskit.plugin.registry import PluginRegistry
from gskit.plugin.spec import PluginSpec
from gskit.torch_export._torch import require

log = logging.getLogger(__name__)

#: Lowest opset at which the TorchScript exporter writes modules as local functions.
MIN_FUNCTION_OPSET = 15


@dataclass
class ExportResult:
    """What :func:`export` wrote and how well it matches PyTorch.

    Attributes:
        path: the written model.
        model: the written model (weights in memory).
        errors: max absolute error per output (by graph output name); empty if not validated.
        plugin_nodes: count of plugin nodes by ``namespace::name``.
        replace_report: for :func:`export_as_plugins`, the function-call replacement report.
    """

    path: Path
    model: onnx.ModelProto
    errors: dict[str, float] = field(default_factory=dict)
    plugin_nodes: dict[str, int] = field(default_factory=dict)
    replace_report: ReplaceReport | None = None

    @property
    def max_error(self) -> float:
        """Largest absolute difference between onnxruntime and PyTorch over all outputs."""
        return max(self.errors.values(), default=0.0)


@dataclass(frozen=True)
class ModulePlugin:
    """How calls of one module class become plugin nodes in :func:`export_as_plugins`.

    Attributes:
        spec: the plugin.
        attrs: the plugin attributes of one module instance: a function of the module (e.g.
            ``lambda m: {"epsilon": m.eps}``) or fixed values.
        inputs: indices of the function call's inputs in the plugin's input order (the call's inputs are
            the module's tensor arguments, then its parameters and buffers as the exporter lists them);
            None or an index past the end: absent. Default: all, in order.
    """

    spec: PluginSpec
    attrs: Callable[[Any], Mapping[str, Any]] | Mapping[str, Any] | None = None
    inputs: Sequence[int | None] | None = None


def export(
    model: Any,
    args: tuple[Any, ...],
    path: str | os.PathLike,
    *,
    dynamo: bool = False,
    opset: int = 17,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    plugins: PluginRegistry | Iterable[PluginSpec] = (),
    functions: Iterable[type] = (),
    custom_translation_table: Mapping[Any, Callable[..., Any]] | None = None,
    check: bool = True,
    atol: float = 1e-5,
    rtol: float = 1e-5,
    **export_kwargs: Any,
) -> ExportResult:
    """Export ``model`` with ``torch.onnx.export``, save it, and validate it against PyTorch.

    Symbolics registered with :func:`~gskit.torch_export.register_symbolic` apply to the TorchScript
    exporter; ``custom_translation_table`` (and the tables of ``functions``) to the dynamo exporter.

    Args:
        model: the ``torch.nn.Module`` (put in eval mode by the caller).
        args: example inputs (tensors), also used for validation.
        path: where to write the model.
        dynamo: use the dynamo exporter (``torch.export``) instead of TorchScript.
        opset: ONNX opset.
        input_names: graph input names.
        output_names: graph output names.
        plugins: specs of the plugin nodes the export writes; they run through their references.
        functions: ``autograd.Function`` classes decorated with :func:`~gskit.torch_export.as_plugin`;
            their specs join ``plugins`` and their translations the dynamo table.
        custom_translation_table: dynamo translations (see :func:`~gskit.torch_export.translation`).
        check: validate on onnxruntime against PyTorch.
        atol: absolute tolerance of the validation.
        rtol: relative tolerance of the validation.
        **export_kwargs: passed to ``torch.onnx.export`` (``dynamic_axes``, ``dynamic_shapes``, ...).

    Returns:
        The result, with per-output errors when validated.

    Raises:
        GskitError: the export fails (the message keeps the exporter's first line), or the model does
            not match PyTorch within tolerance (naming the output and the error).
    """
    torch = require()
    functions = list(functions)
    specs = _specs(plugins, [f.gskit_plugin for f in functions])
    table = dict(custom_translation_table or {})
    for function in functions:
        table.update(getattr(function, "translation_table", {}))
    kwargs: dict[str, Any] = dict(
        opset_version=opset,
        input_names=list(input_names or []) or None,
        output_names=list(output_names or []) or None,
        **export_kwargs,
    )
    if dynamo:
        kwargs["custom_translation_table"] = table
    proto = _torch_export(torch, model, args, dynamo, kwargs)
    return _finish(proto, path, model, args, specs, check, atol, rtol)


def export_as_plugins(
    model: Any,
    args: tuple[Any, ...],
    path: str | os.PathLike,
    modules: Mapping[type, PluginSpec | ModulePlugin],
    *,
    opset: int = 17,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    keep_function: bool = ReplaceOptions().keep_function,
    tensorrt: str | None = ReplaceOptions().tensorrt,
    check: bool = True,
    atol: float = 1e-5,
    rtol: float = 1e-5,
    **export_kwargs: Any,
) -> ExportResult:
    """Export with ``export_modules_as_functions`` and replace each module's calls by plugin nodes.

    The TorchScript exporter writes each listed module class as a local function named like the class
    (domain: the class's Python module) called once per instance; each call becomes a plugin node and
    the function is removed (kept with ``keep_function``: see :func:`gskit.passes.patterns.replace`). Where
    the plugin declares a native form the target TensorRT runs (``tensorrt``), the call becomes that ONNX op
    instead, as in ``gskit replace``.

    Args:
        model: the module (eval mode).
        args: example inputs, also used for validation.
        path: where to write the model.
        modules: module class -> its plugin (a spec, or a :class:`ModulePlugin` with attributes/inputs).
        opset: ONNX opset, at least 15.
        input_names: graph input names.
        output_names: graph output names.
        keep_function: keep the function body as a local function named like the plugin.
        tensorrt: the TensorRT version to prepare for (``gskit.passes.patterns.replace``); None: the installed
            TensorRT, else the newest gskit knows.
        check: validate on onnxruntime against PyTorch.
        atol: absolute tolerance.
        rtol: relative tolerance.
        **export_kwargs: passed to ``torch.onnx.export``.

    Raises:
        GskitError: opset below 15, the export fails, a listed module has no call in the exported model,
            or the result does not match PyTorch.
    """
    if opset < MIN_FUNCTION_OPSET:
        raise GskitError(
            f"export_as_plugins needs opset >= {MIN_FUNCTION_OPSET} (local functions), got {opset}"
        )
    torch = require()
    plans = {cls: p if isinstance(p, ModulePlugin) else ModulePlugin(p) for cls, p in modules.items()}
    kwargs: dict[str, Any] = dict(
        opset_version=opset,
        input_names=list(input_names or []) or None,
        output_names=list(output_names or []) or None,
        export_modules_as_functions=set(plans),
        **export_kwargs,
    )
    proto = _torch_export(torch, model, args, False, kwargs)
    graph = gsmodel.to_graph(proto)
    instances = dict(model.named_modules())
    specs = [
        dataclasses.replace(plan.spec, patterns=(_call_pattern(cls, plan, instances),))
        for cls, plan in plans.items()
    ]
    report = replace(graph, specs, keep_function=keep_function, tensorrt=tensorrt)
    for cls, plugin_report in zip(plans, report.plugins, strict=True):
        if plugin_report.replaced == 0:
            reasons = "; ".join(s.reason for s in plugin_report.skipped) or "no call of it was exported"
            raise GskitError(
                f"module {cls.__module__}.{cls.__qualname__} -> {plugin_report.plugin}: "
                f"nothing replaced ({reasons})"
            )
    result = _finish(
        gsmodel.to_model(graph), path, model, args, [p.spec for p in plans.values()], check, atol, rtol
    )
    result.replace_report = report
    return result


def validate(
    onnx_model: onnx.ModelProto | str | os.PathLike,
    model: Any,
    args: tuple[Any, ...],
    *,
    plugins: PluginRegistry | Iterable[PluginSpec] = (),
    atol: float = 1e-5,
    rtol: float = 1e-5,
) -> dict[str, float]:
    """Run ``onnx_model`` on onnxruntime and ``model`` in PyTorch on ``args``; compare outputs in order.

    Returns:
        Max absolute error per ONNX output name.

    Raises:
        GskitError: input or output counts differ, or an output differs beyond ``atol + rtol * |torch|``.
    """
    torch = require()
    proto = gsmodel.load(onnx_model) if not isinstance(onnx_model, onnx.ModelProto) else onnx_model
    initializers = {t.name for t in proto.graph.initializer}
    names = [i.name for i in proto.graph.input if i.name not in initializers]
    tensors = [a for a in _flatten(args) if isinstance(a, torch.Tensor)]
    if len(names) != len(tensors):
        raise GskitError(
            f"the exported model has {len(names)} input(s) {names} but {len(tensors)} tensor argument(s) "
            "were given; an input PyTorch does not use is dropped by the exporter"
        )
    feeds = {name: t.detach().cpu().numpy() for name, t in zip(names, tensors, strict=True)}
    with torch.no_grad():
        expected = [t.detach().cpu().numpy() for t in _flatten(model(*args)) if isinstance(t, torch.Tensor)]
    registry = specs if isinstance(specs := plugins, PluginRegistry) else PluginRegistry(_specs(plugins, []))
    got = ort_backend.run(proto, feeds, plugins=registry)
    outputs = [o.name for o in proto.graph.output]
    if len(outputs) != len(expected):
        raise GskitError(f"the exported model has {len(outputs)} output(s), PyTorch returned {len(expected)}")
    errors: dict[str, float] = {}
    for name, want in zip(outputs, expected, strict=True):
        have = got[name]
        if have.shape != want.shape:
            raise GskitError(f"output '{name}': onnxruntime shape {have.shape}, PyTorch {want.shape}")
        diff = np.abs(have.astype(np.float64) - want.astype(np.float64))
        errors[name] = float(diff.max(initial=0.0))
        bad = diff > atol + rtol * np.abs(want.astype(np.float64))
        if bad.any():
            raise GskitError(
                f"output '{name}' differs from PyTorch: max abs error {errors[name]:.3g} "
                f"(atol={atol}, rtol={rtol}, {int(bad.sum())} of {bad.size} values); check the symbolic "
                f"or translation and the plugin's reference"
            )
    log.info("validated against PyTorch: max abs error %s", max(errors.values(), default=0.0))
    return errors


def _torch_export(
    torch: Any, model: Any, args: tuple[Any, ...], dynamo: bool, kwargs: dict[str, Any]
) -> onnx.ModelProto:
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    try:
        with torch.no_grad():
            if dynamo:
                program = torch.onnx.export(model, args, dynamo=True, **kwargs)
                return program.model_proto
            buffer = io.BytesIO()
            torch.onnx.export(model, args, buffer, dynamo=False, **kwargs)
    except Exception as err:  # the exporters raise many types; keep their first line
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        hint = (
            " (register a symbolic with gskit.torch_export.register_symbolic)"
            if "not supported" in first
            else ""
        )
        raise GskitError(
            f"torch.onnx.export ({'dynamo' if dynamo else 'TorchScript'}) failed: {first}{hint}"
        ) from err
    return onnx.load_from_string(buffer.getvalue())


def _finish(
    proto: onnx.ModelProto,
    path: str | os.PathLike,
    model: Any,
    args: tuple[Any, ...],
    specs: list[PluginSpec],
    check: bool,
    atol: float,
    rtol: float,
) -> ExportResult:
    written = gsmodel.save(proto, path)
    result = ExportResult(Path(written), proto, plugin_nodes=_plugin_counts(proto, specs))
    if check:
        result.errors = validate(proto, model, args, plugins=specs, atol=atol, rtol=rtol)
    return result


def _call_pattern(cls: type, plan: ModulePlugin, instances: Mapping[str, Any]) -> FunctionPattern:
    """A rule matching calls of ``cls``'s exported function; attributes come from the called instance."""

    def attrs(match: Match) -> Mapping[str, Any]:
        if plan.attrs is None:
            return {}
        if not callable(plan.attrs):
            return plan.attrs
        scope = ".".join((match.anchor.name or "").strip("/").split("/")[:-1])
        module = instances.get(scope)
        if module is None or not isinstance(module, cls):
            raise GskitError(
                f"call '{match.anchor.name}' of {cls.__qualname__}: no such submodule '{scope}' "
                "to read attributes from"
            )
        return plan.attrs(module)

    return FunctionPattern(
        cls.__name__, cls.__module__, inputs=plan.inputs, attrs=attrs, name=f"module {cls.__qualname__}"
    )


def _specs(plugins: PluginRegistry | Iterable[PluginSpec], extra: list[PluginSpec]) -> list[PluginSpec]:
    unique: dict[tuple[str, str, str], PluginSpec] = {}
    for spec in [*plugins, *extra]:
        unique.setdefault(spec.key, spec)
    return list(unique.values())


def _plugin_counts(proto: onnx.ModelProto, specs: list[PluginSpec]) -> dict[str, int]:
    keys = {(s.domain, s.name) for s in specs}
    counts = Counter(f"{n.domain}::{n.op_type}" for n in proto.graph.node if (n.domain, n.op_type) in keys)
    return dict(counts)


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [item for v in value for item in _flatten(v)]
    if isinstance(value, Mapping):
        return [item for v in value.values() for item in _flatten(v)]
    return [value]
