"""Rules derived from PyTorch code: export a function with every exporter form, read each graph as a rule.

``gskit.plugin.from_torch`` calls :func:`derive_descriptions` when no cached rules fit (the plugin's own
cache file, or the user cache for the installed torch). Each exporter form the installed torch offers
(TorchScript at :data:`TORCHSCRIPT_OPSETS`, dynamo at :data:`DYNAMO_OPSETS` and its default opset) exports
the function at each dtype, with every dim dynamic (so no example size is baked into a constant; a form
that cannot export with dynamic dims is exported with the example's sizes), once with the given attribute
values and once more per attribute with another value. ``gskit.passes.patterns.describe`` reads the graphs,
finds which constants follow which attribute, and drops duplicate rules.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from gskit.errors import PLUGIN_CODE_FAILURES, GskitError
from gskit.passes.patterns.derived import RuleDescription
from gskit.passes.patterns.describe import (
    AttributeLost,
    AttributeSlots,
    DeriveError,
    attribute_slots,
    describe_model,
    distinct,
    python_name,
    rule_name,
    structure,
    with_dtypes,
)
from gskit.plugin.derive import DEFAULT_DTYPES, DYNAMO_OPSETS, EXPORTERS, TORCHSCRIPT_OPSETS
from gskit.torch_export._torch import require

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Form:
    """One exporter form: ``exporter`` (``torchscript``/``dynamo``) and its opset (None: its default)."""

    exporter: str
    opset: int | None

    def label(self, opset: int | None = None) -> str:
        return f"{self.exporter}-{opset if opset is not None else self.opset or 'default'}"


def forms(exporters: Sequence[str] = EXPORTERS) -> list[Form]:
    """The exporter forms tried, TorchScript first."""
    found = []
    if "torchscript" in exporters:
        found += [Form("torchscript", o) for o in TORCHSCRIPT_OPSETS]
    if "dynamo" in exporters:
        found += [Form("dynamo", o) for o in DYNAMO_OPSETS]
    return found


@dataclass
class Derivation:
    """What :func:`derive_descriptions` found: the rules, and the forms that could not be exported."""

    rules: list[RuleDescription]
    failed: list[str]
    exports: int
    seconds: float


def derive_descriptions(
    fn: Any,
    example_inputs: Sequence[Any],
    attributes: Mapping[str, Any],
    *,
    name: str,
    dtypes: Sequence[str] = DEFAULT_DTYPES,
    exporters: Sequence[str] = EXPORTERS,
) -> Derivation:
    """Export ``fn`` in every form and read the rules.

    Args:
        fn: a function ``fn(*inputs, **attributes)`` or a ``torch.nn.Module`` class built with
            ``fn(**attributes)`` and called with the inputs (its parameters and floating buffers become
            pattern inputs after the example inputs).
        example_inputs: tensors, numpy arrays or shapes (a tuple of ints: a float32 tensor of that shape).
        attributes: plugin attribute values (numbers), passed to ``fn`` as keyword arguments.
        name: the function's name in rule names.
        dtypes: dtypes of the floating inputs to export with.
        exporters: ``torchscript`` and/or ``dynamo``.

    Raises:
        GskitError: no form could be exported, or an export cannot be read as a rule (a constant that
            follows an attribute in a way no simple relation explains, ...).
    """
    torch = require("torch")
    start = time.perf_counter()
    base_inputs = [_tensor(torch, x, i) for i, x in enumerate(example_inputs)]
    names = _input_names(fn, len(base_inputs))
    found: list[RuleDescription] = []
    run = _Run(torch, fn, names, dict(attributes), name)
    for form in forms(exporters):
        members: list[tuple[str, RuleDescription, list[Any]]] = []
        for dtype in dtypes:
            if dtype == "bfloat16" and len({structure(d) for _, d, _ in members}) == 1 and len(members) > 1:
                continue  # float16 changed nothing float32 had: no Cast follows the dtype, bfloat16 neither
            inputs = [_as_dtype(torch, t, dtype) for t in base_inputs]
            model = run.export(form, dtype, inputs, run.attributes)
            if model is None:
                if not members and dtype == dtypes[0]:
                    break  # a form that cannot export the first dtype will not export the others
                continue
            members.append(
                (dtype, describe_model(model, name, f"{form.label(_opset(model))}:{dtype}"), inputs)
            )
        found += _merge_dtypes(members, functools.partial(run.attribute_slots, form))
    if not found:
        raise GskitError(
            f"from_torch({name}): no exporter form could export the function: " + "; ".join(run.failed[:3])
        )
    rules = [
        RuleDescription(rule_name(name, d.forms), d.forms, d.inputs, d.nodes, d.outputs, d.captures)
        for d in distinct(found)
    ]
    return Derivation(rules, run.failed, run.exports, time.perf_counter() - start)


@dataclass
class _Run:
    """The exports of one derivation: the function, its attributes, and what failed."""

    torch: Any
    fn: Any
    names: list[str]
    attributes: dict[str, Any]
    function: str
    exports: int = 0

    def __post_init__(self) -> None:
        self.failed: list[str] = []

    def export(
        self, form: Form, dtype: str, inputs: list[Any], attributes: dict[str, Any]
    ) -> onnx.ModelProto | None:
        label = f"{form.label()}:{dtype}"
        try:
            model = _export(self.torch, self.fn, inputs, attributes, self.names, form, dtype)
        except _ExportFailed as err:
            self.failed.append(f"{label}: {err}")
            log.info("from_torch(%s): %s cannot export: %s", self.function, label, err)
            return None
        self.exports += 1
        return model

    def attribute_slots(
        self, form: Form, member: tuple[str, RuleDescription, list[Any]]
    ) -> AttributeSlots | None:
        """Export ``member`` again with each attribute changed, and find where the attributes sit; None (and
        a note) when an attribute does not reach the graph."""
        dtype, base, inputs = member
        variants = {}
        for attribute, value in self.attributes.items():
            other = _other_value(attribute, value)
            model = self.export(form, dtype, inputs, {**self.attributes, attribute: other})
            if model is None:
                raise DeriveError(
                    f"from_torch({self.function}): {form.label()}:{dtype} exports with {attribute}={value!r} "
                    f"but not with {attribute}={other!r}"
                )
            variants[attribute] = (value, other, describe_model(model, base.name, base.forms[0]))
        try:
            return attribute_slots(base, variants)
        except AttributeLost as err:
            self.failed.append(f"{base.forms[0]}: {err}")
            log.info("from_torch(%s): %s", self.function, err)
            return None


def _merge_dtypes(
    members: list[tuple[str, RuleDescription, list[Any]]],
    slots_of: Callable[[tuple[str, RuleDescription, list[Any]]], AttributeSlots | None],
) -> list[RuleDescription]:
    """Exports of one form at several dtypes: those of one structure share where the attributes sit (found
    on the most precise of them) and become one rule where they differ only in dtypes (Cast targets), else
    stay separate rules."""
    groups: dict[Any, list[tuple[str, RuleDescription, list[Any]]]] = {}
    for member in members:
        groups.setdefault(structure(member[1]), []).append(member)
    merged: list[RuleDescription] = []
    for group in groups.values():
        slots = slots_of(group[0])  # the first dtype given is the most precise (float32 before float16)
        if slots is None:
            continue
        captured = [(dtype, slots.apply(d)) for dtype, d, _ in group]
        one = with_dtypes(captured) if len(captured) > 1 else None
        merged += [one] if one is not None else distinct([d for _, d in captured])
    return merged


class _ExportFailed(Exception):
    """One form could not be exported (the exporter's own failure, in one line)."""


def _export(
    torch: Any,
    fn: Any,
    inputs: list[Any],
    attributes: dict[str, Any],
    names: list[str],
    form: Form,
    dtype: str,
) -> onnx.ModelProto:
    module, args, all_names = _module(torch, fn, inputs, attributes, names, dtype)
    try:
        return _export_module(torch, module, args, all_names, form, dynamic=True)
    except _ExportFailed as dynamic_err:
        if "Unsupported" in str(dynamic_err):
            raise  # an op the exporter does not have at this opset: static sizes change nothing
        try:
            return _export_module(torch, module, args, all_names, form, dynamic=False)
        except _ExportFailed:
            raise dynamic_err from None


@contextlib.contextmanager
def _silenced() -> Iterator[None]:
    """Exporters print progress and failed graphs from Python and C++: hide both (stdout and stderr fds)."""
    quiet = io.StringIO()
    saved = []
    try:
        for fd in (1, 2):
            saved.append((fd, os.dup(fd)))
        null = os.open(os.devnull, os.O_WRONLY)
        for fd, _ in saved:
            os.dup2(null, fd)
        os.close(null)
    except OSError:  # no real fds (an embedding host): Python-level redirection still applies
        pass
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            warnings.simplefilter("ignore")
            yield
    finally:
        for fd, copy in saved:
            os.dup2(copy, fd)
            os.close(copy)


def _export_module(
    torch: Any, module: Any, args: tuple[Any, ...], names: list[str], form: Form, *, dynamic: bool
) -> onnx.ModelProto:
    try:
        with _silenced():
            logging.disable(logging.WARNING)
            try:
                if form.exporter == "torchscript":
                    buffer = io.BytesIO()
                    axes = {
                        n: {d: f"{n}_{d}" for d in range(a.dim())} for n, a in zip(names, args, strict=True)
                    }
                    torch.onnx.export(
                        module,
                        args,
                        buffer,
                        dynamo=False,
                        opset_version=form.opset,
                        input_names=names,
                        dynamic_axes=axes if dynamic else None,
                    )
                    return onnx.load_from_string(buffer.getvalue())
                shapes = None
                if dynamic:
                    auto = torch.export.Dim.AUTO
                    shapes = (tuple({d: auto for d in range(a.dim())} for a in args),)
                return _dynamo_export(torch, module, args, names, form.opset, shapes)
            finally:
                logging.disable(logging.NOTSET)
    except PLUGIN_CODE_FAILURES as err:  # many kinds (sys.exit too): each is one form that does not export
        text = str(err).strip().splitlines()
        raise _ExportFailed(f"{type(err).__name__}: {text[0][:200] if text else ''}") from err


#: The dynamo exporter's op registries by opset: building one takes a second or two, and torch.onnx.export
#: builds it again on every call.
_REGISTRIES: dict[int, Any] = {}


def _dynamo_export(
    torch: Any, module: Any, args: tuple[Any, ...], names: list[str], opset: int | None, shapes: Any
) -> onnx.ModelProto:
    """``torch.onnx.export(..., dynamo=True)``, with the op registry kept between calls where this torch's
    exporter has the internals it had in torch 2.6-2.13 (else the public call)."""
    kwargs = {"dynamic_shapes": shapes, "input_names": names, "verbose": False, "opset_version": opset}
    try:
        from torch.onnx import _constants
        from torch.onnx._internal.exporter import _constants as exporter_constants
        from torch.onnx._internal.exporter import _core, _registration

        opset = opset or _constants.ONNX_DEFAULT_OPSET
        registry = _REGISTRIES.get(opset)
        if registry is None:
            registry = _registration.ONNXRegistry().from_torchlib(
                opset_version=max(opset, exporter_constants.TORCHLIB_OPSET)
            )
            _REGISTRIES[opset] = registry
        export = _core.export
    except (ImportError, AttributeError, TypeError):
        return torch.onnx.export(module, args, dynamo=True, **kwargs).model_proto
    return export(
        module, args, registry=registry, optimize=True, **{**kwargs, "opset_version": opset}
    ).model_proto


def _module(
    torch: Any, fn: Any, inputs: list[Any], attributes: dict[str, Any], names: list[str], dtype: str
) -> tuple[Any, tuple[Any, ...], list[str]]:
    """A module calling ``fn`` whose forward takes every pattern input, and the example arguments."""
    count = len(inputs)
    if isinstance(fn, type) and issubclass(fn, torch.nn.Module):
        inner = fn(**attributes).eval()
        tensors = {
            **dict(inner.named_parameters()),
            **{k: v for k, v in inner.named_buffers() if v.is_floating_point()},
        }
        extra = [_as_dtype(torch, t.detach(), dtype) for t in tensors.values()]
        # Each parameter becomes a plain attribute set from the inputs on every call, so both exporters see
        # it as a graph input (torch.func.functional_call does the same, but not under TorchScript tracing).
        owners = []
        for name in tensors:
            prefix, _, attr = name.rpartition(".")
            owner = inner.get_submodule(prefix)
            owner._parameters.pop(attr, None)
            owner._buffers.pop(attr, None)
            owners.append((owner, attr))

        class Call(torch.nn.Module):
            def forward(self, *args: Any) -> Any:
                for (owner, attr), value in zip(owners, args[count:], strict=True):
                    owner.__dict__[attr] = value
                return inner(*args[:count])

        return Call(), (*inputs, *extra), [*names, *(python_name(k) for k in tensors)]

    class CallFunction(torch.nn.Module):
        def forward(self, *args: Any) -> Any:
            return fn(*args, **attributes)

    return CallFunction(), tuple(inputs), names


def _input_names(fn: Any, count: int) -> list[str]:
    """Names of the example inputs: the function's (or forward's) positional parameters."""
    target = fn.forward if isinstance(fn, type) else fn
    try:
        params = [
            p.name
            for p in inspect.signature(target).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"
        ]
    except (TypeError, ValueError):
        params = []
    names = [python_name(p) for p in params[:count]]
    return names + [f"input{i}" for i in range(len(names), count)]


def _tensor(torch: Any, value: Any, index: int) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, (tuple, list)) and all(
        isinstance(d, int) and not isinstance(d, bool) for d in value
    ):
        generator = torch.Generator().manual_seed(index)
        return torch.randn(*value, generator=generator)
    raise GskitError(
        f"from_torch: example input {index} is {type(value).__name__}; give a tensor, a numpy array or "
        "a shape (a tuple of ints)"
    )


def _as_dtype(torch: Any, tensor: Any, dtype: str) -> Any:
    return tensor.to(getattr(torch, dtype)) if tensor.is_floating_point() else tensor


def _opset(model: onnx.ModelProto) -> int | None:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


def _other_value(attribute: str, value: Any) -> Any:
    """Another value of an attribute, close enough to keep the graph's shape (epsilon 1e-5 -> 1.5e-5)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GskitError(
            f"from_torch: attribute {attribute}={value!r} is not a number; derived rules read numeric "
            "attributes only (write a hand-written rule for the others)"
        )
    if isinstance(value, int):
        return value + 1
    return value * 1.5 if value else 0.25
