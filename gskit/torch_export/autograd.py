"""``@as_plugin``: declare which plugin a ``torch.autograd.Function`` becomes on export."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from gskit.errors import GskitError
from gskit.plugin.spec import PluginSpec
from gskit.torch_export._torch import require
from gskit.torch_export.torchscript import BindFn, Call, emit_plugin

log = logging.getLogger(__name__)

T = TypeVar("T")

#: torch.library namespace of the custom ops that carry Functions through the dynamo exporter.
OP_NAMESPACE = "gskit_export"


class _NoGradContext:
    """Stands in for ``ctx`` when the Function's forward runs inside the custom op (no autograd there)."""

    needs_input_grad: tuple[bool, ...] = ()

    def save_for_backward(self, *tensors: Any) -> None:
        pass

    def mark_non_differentiable(self, *tensors: Any) -> None:
        pass

    def set_materialize_grads(self, value: bool) -> None:
        pass


def as_plugin(
    spec: PluginSpec,
    *,
    attrs: Mapping[str, Any] | None = None,
    bind: BindFn | None = None,
    fake: Callable[..., Any] | None = None,
) -> Callable[[type[T]], type[T]]:
    """Class decorator: the decorated ``torch.autograd.Function`` exports as one ``spec`` plugin node.

    * TorchScript exporter: adds the ``symbolic`` staticmethod (the node is emitted by
      :func:`~gskit.torch_export.emit_plugin`).
    * dynamo exporter: while ``torch.export`` traces, ``apply`` calls a ``torch.library`` custom op
      ``gskit_export::<Class>`` running the same forward, so the op survives tracing; the class gets
      ``custom_op`` (the op overload) and ``translation_table`` (give it to ``custom_translation_table``,
      or let :func:`~gskit.torch_export.export` collect it through ``functions=``).

    Outside export nothing changes: ``apply`` is the Function's own (training keeps its backward).
    Tensor arguments must come first in ``forward``; ``bind(*args) -> Call`` maps all forward arguments
    to node inputs and attributes (default: tensors are inputs, ``attrs`` the attributes).

    Args:
        spec: the plugin.
        attrs: fixed attribute values.
        bind: maps forward's arguments to ``Call(inputs, attrs)`` (TorchScript: values; non-tensor
            arguments arrive as Python values in both exporters).
        fake: shape function for the custom op (``fake(*args) -> tensor``); default: the forward itself,
            run on fake tensors (fine for forwards written with torch ops).

    Raises:
        GskitError: the decorated class is not a ``torch.autograd.Function``.
    """
    fixed = dict(attrs or {})

    def call_of(*args: Any) -> Call:
        if bind is not None:
            return bind(*args)
        return Call([a for a in args if _is_tensor_like(a)], fixed)

    def decorate(cls: type[T]) -> type[T]:
        torch = require()
        if not (isinstance(cls, type) and issubclass(cls, torch.autograd.Function)):
            raise GskitError(
                f"@as_plugin({spec.qualified_name}) decorates torch.autograd.Function classes, not {cls!r}"
            )

        def symbolic(g: Any, *args: Any) -> Any:
            call = call_of(*args)
            return emit_plugin(g, spec, call.inputs, call.attrs)

        cls.symbolic = staticmethod(symbolic)  # type: ignore[attr-defined]
        op = _define_custom_op(cls, fake)
        from gskit.torch_export.dynamo import translation

        cls.custom_op = op  # type: ignore[attr-defined]
        cls.translation_table = {op: translation(plugin=spec, bind=call_of)}  # type: ignore[attr-defined]

        def apply(klass: type, *args: Any) -> Any:
            if torch.compiler.is_exporting():  # torch.export (dynamo); the TorchScript tracer is not
                return op(*args)
            return super(cls, klass).apply(*args)  # type: ignore[misc]

        # A classmethod, as the original: the TorchScript tracer finds the class (and its symbolic)
        # through ``apply.__self__``.
        cls.apply = classmethod(apply)  # type: ignore[attr-defined,assignment]
        cls.gskit_plugin = spec  # type: ignore[attr-defined]
        return cls

    return decorate


def _define_custom_op(cls: type, fake: Callable[..., Any] | None) -> Any:
    torch = require()
    forward = cls.forward  # type: ignore[attr-defined]
    name = f"{OP_NAMESPACE}::{cls.__name__}_{id(cls):x}"

    def impl(*args: Any) -> Any:
        return forward(_NoGradContext(), *args)

    schema = _schema_of(forward)
    library = torch.library.Library(OP_NAMESPACE, "FRAGMENT")
    library.define(f"{name.split('::')[1]}{schema}")
    library.impl(name.split("::")[1], impl, "CompositeExplicitAutograd")
    torch.library.register_fake(name, fake or impl, lib=library)
    cls._gskit_library = library  # keeps the registration alive as long as the class
    return getattr(getattr(torch.ops, OP_NAMESPACE), name.split("::")[1]).default


def _schema_of(forward: Callable[..., Any]) -> str:
    """A torch schema ``(Tensor a, float b) -> Tensor`` from forward's annotations (after ``ctx``)."""
    import inspect

    params = list(inspect.signature(forward).parameters.values())[1:]
    kinds = {"Tensor": "Tensor", "torch.Tensor": "Tensor", "float": "float", "int": "int", "bool": "bool"}
    parts = []
    for p in params:
        annotation = p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", "")
        kind = kinds.get(annotation, "Tensor" if annotation in ("", "_empty") else None)
        if kind is None:
            raise GskitError(
                f"@as_plugin: forward argument '{p.name}' is annotated {p.annotation!r}; "
                "use Tensor, float, int or bool"
            )
        parts.append(f"{kind} {p.name}")
    return f"({', '.join(parts)}) -> Tensor"


def _is_tensor_like(value: Any) -> bool:
    return hasattr(value, "dtype") or hasattr(value, "node") or type(value).__name__.endswith("Tensor")
