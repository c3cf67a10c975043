"""A plugin's native forms: the standard ONNX op that TensorRT runs natively from some version on.

A region a plugin's patterns match can be written in one of the plugin's forms: its plugin node, or the ONNX
op that the target TensorRT imports natively (``LayerNormalization`` from 8.6, ``RMSNormalization`` from
10.15). The spec declares each native form with the op, the opset that op needs, the first TensorRT version
that runs it, and how the plugin's inputs and attributes map onto the op's (:class:`NativeForm`).
:func:`choose_form` picks per region: the first native form the target runs and whose own check accepts the
region, else the plugin node, else (a spec without a plugin node, ``plugin_form=False``) nothing: the region
is left as it was.

The replace pass asks this module only; no TensorRT version is written in the pass itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import onnx
import onnx_graphsurgeon as gs

from gskit.errors import PluginError
from gskit.passes.tensor_types import InferenceFailed, infer_types
from gskit.plugin.target import TensorRTTarget

if TYPE_CHECKING:
    from gskit.plugin.spec import PluginSpec

#: ``check(attributes) -> None`` when the native op can take this region, else why not (one line). The
#: attributes are the plugin's, as the region's rewrite gives them (defaults filled in).
NativeCheck = Callable[[Mapping[str, Any]], "str | None"]


@dataclass(frozen=True)
class NativeForm:
    """A standard ONNX op that computes what the plugin computes, run natively by TensorRT >= ``tensorrt``.

    Attributes:
        op_type: the ONNX op (``LayerNormalization``).
        opset: the default-domain opset the op needs (17 for LayerNormalization); a model below it is
            converted up (onnx's version converter) when this form is chosen.
        tensorrt: the first TensorRT version whose ONNX parser imports the op natively (``"8.6"``).
        inputs: for each op input, the index of the plugin input it takes (None: absent); None: the plugin's
            inputs in order.
        attributes: op attribute -> plugin attribute it takes its value from.
        fixed: op attributes with a fixed value (``{"axis": -1}``: the plugin normalizes the last axis).
        check: what the op cannot express although the plugin can (asymmetric pads), per region.
        domain: the op's domain (ONNX: ``""``).
        doc: one line for ``gskit plugin list`` and reports (restrictions, where the fact comes from).
    """

    op_type: str
    opset: int
    tensorrt: str
    inputs: tuple[int | None, ...] | None = None
    attributes: Mapping[str, str] = field(default_factory=dict)
    fixed: Mapping[str, Any] = field(default_factory=dict)
    check: NativeCheck | None = None
    domain: str = ""
    doc: str = ""

    @property
    def label(self) -> str:
        """``LayerNormalization-17``: the op and the opset it needs."""
        name = f"{self.domain}::{self.op_type}" if self.domain else self.op_type
        return f"{name}-{self.opset}"

    def make_node(
        self,
        inputs: Sequence[gs.Tensor | None],
        outputs: Sequence[gs.Tensor],
        attrs: Mapping[str, Any],
        name: str | None = None,
    ) -> gs.Node:
        """The op's node from the plugin's inputs (spec order, None absent) and attribute values."""
        order = self.inputs if self.inputs is not None else tuple(range(len(inputs)))
        taken = [inputs[i] if i is not None and i < len(inputs) else None for i in order]
        while taken and taken[-1] is None:
            taken.pop()
        values = {op_attr: attrs[plugin_attr] for op_attr, plugin_attr in self.attributes.items()}
        values.update(self.fixed)
        return gs.Node(
            self.op_type,
            name=name,
            domain=self.domain,
            attrs=values,
            inputs=[t if t is not None else gs.Variable.empty() for t in taken],
            outputs=list(outputs),
        )


@dataclass(frozen=True)
class FormChoice:
    """What one region becomes for a target, and why (one line for reports).

    Attributes:
        kind: ``native`` (the ONNX op ``native``), ``plugin`` (the plugin node) or ``none`` (left as it was:
            the spec has no plugin node and no native form fits).
        why: the reason, naming the target and the version that decided.
        native: the chosen native form (``kind == "native"``).
    """

    kind: Literal["native", "plugin", "none"]
    why: str
    native: NativeForm | None = None


def choose_form(
    spec: PluginSpec,
    target: TensorRTTarget,
    attrs: Mapping[str, Any],
    *,
    opset_refused: Mapping[int, str] | None = None,
    dtypes: Sequence[int | None] = (),
    out_dtypes: Sequence[int | None] = (),
) -> FormChoice:
    """The form of one region for ``target``: the first native form the target runs and that accepts the
    region, else the plugin node, else none.

    Args:
        spec: the plugin whose pattern matched.
        target: the TensorRT version the model is prepared for.
        attrs: the plugin attribute values of the region's rewrite.
        opset_refused: opsets the model could not be converted to, with onnx's reason; a native form needing
            one of them is not chosen.
        dtypes: the ONNX element type of each plugin input (spec order; None or 0 unknown): a native op whose
            schema wants one type where the region has two (LayerNormalization of a float32 x with a float16
            weight) is not chosen.
        out_dtypes: the element type of each region output: a native op for which onnx's type inference gives
            another (onnx 1.23 types RMSNormalization's output like X, its schema like the scale) is not
            chosen.
    """
    refused = opset_refused or {}
    reasons = []
    for form in spec.native:
        if not target.at_least(form.tensorrt):
            reasons.append(f"TensorRT {target} < {form.tensorrt}, the first to run {form.op_type} natively")
            continue
        problem = form.check(attrs) if form.check is not None else None
        problem = problem or _types_misfit(form, dtypes) or _inferred_misfit(form, dtypes, out_dtypes)
        if problem:
            reasons.append(f"{form.op_type} cannot take it: {problem}")
            continue
        blocked = next((why for opset, why in sorted(refused.items()) if opset <= form.opset), None)
        if blocked is not None:
            reasons.append(
                f"{form.op_type} needs opset {form.opset}, which the model cannot reach: {blocked}"
            )
            continue
        return FormChoice(
            "native", f"TensorRT {target} >= {form.tensorrt} runs {form.label} natively", native=form
        )
    if not spec.native:
        reasons.append(f"{spec.name} declares no native form")
    missing = spec.shipped.problem(str(target)) if spec.shipped is not None else None
    if spec.plugin_form and missing:  # TensorRT's own plugin, not in the target's libnvinfer_plugin
        return FormChoice("none", "; ".join([*reasons, f"{missing}, so the region is left as it was"]))
    why = "; ".join(reasons)
    if spec.plugin_form:
        return FormChoice("plugin", why)
    return FormChoice("none", f"{why}; {spec.name} has no plugin node, so the region is left as it was")


def _types_misfit(form: NativeForm, dtypes: Sequence[int | None]) -> str | None:
    """Why the op's schema cannot take these input element types (inputs sharing a type parameter must agree,
    and each must be one the op allows), or None."""
    if not dtypes:
        return None
    schema = onnx.defs.get_schema(form.op_type, form.opset, form.domain)
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    order = form.inputs if form.inputs is not None else tuple(range(len(dtypes)))
    seen: dict[str, tuple[str, int]] = {}
    for formal, index in zip(schema.inputs, order, strict=False):
        dtype = dtypes[index] if index is not None and index < len(dtypes) else None
        if not dtype:
            continue
        name = _type_name(dtype)
        param = formal.type_str
        if param in allowed and f"tensor({name})" not in allowed[param]:
            return f"{form.op_type} does not take {name} for {formal.name}"
        other = seen.setdefault(param, (formal.name, dtype))
        if other[1] != dtype:
            first = _type_name(other[1])
            return (
                f"{form.op_type} takes one type for {other[0]} and {formal.name}, the region has {first} and "
                f"{name}"
            )
    return None


def _inferred_misfit(
    form: NativeForm, dtypes: Sequence[int | None], out_dtypes: Sequence[int | None]
) -> str | None:
    """What onnx's type inference gives the op's outputs for these input types, where it differs from what the
    region writes (a written model must pass inference, and onnxruntime runs what it infers), or None."""
    order = form.inputs if form.inputs is not None else tuple(range(len(dtypes)))
    taken = [dtypes[i] if i is not None and i < len(dtypes) else None for i in order]
    while taken and taken[-1] is None:
        taken.pop()
    if not out_dtypes or any(t == 0 for t in taken) or any(not t for t in out_dtypes):
        return None  # an unknown type: nothing to compare
    names = [f"i{k}" if t else "" for k, t in enumerate(taken)]
    node = onnx.helper.make_node(
        form.op_type, names, [f"o{k}" for k in range(len(out_dtypes))], domain=form.domain, **dict(form.fixed)
    )
    graph = onnx.helper.make_graph(
        [node],
        "native_form",
        [onnx.helper.make_tensor_value_info(n, t, None) for n, t in zip(names, taken, strict=True) if n],
        [onnx.helper.make_tensor_value_info(f"o{k}", 0, None) for k in range(len(out_dtypes))],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid(form.domain, form.opset)])
    try:
        inferred = infer_types(model, strict=True)
    except InferenceFailed as err:  # onnx's inference refusing these types is as good a reason
        return f"onnx's type inference refuses {form.op_type} on these types: {err.reason[:120]}"
    for info, want in zip(inferred.graph.output, out_dtypes, strict=False):
        got = info.type.tensor_type.elem_type
        if got and got != want:
            return (
                f"onnx infers {_type_name(got)} for {form.op_type}'s output where the region writes "
                f"{_type_name(want)}"
            )
    return None


def _type_name(dtype: int) -> str:
    return onnx.helper.tensor_dtype_to_string(dtype).removeprefix("TensorProto.").lower()


def validate_native_forms(spec: PluginSpec, where: str) -> None:
    """Check a spec's native forms against onnx's schemas and the spec itself.

    Raises:
        PluginError: an op unknown at its opset, an attribute the op or the plugin does not have, an input
            index past the plugin's inputs, a version that is not one, or a spec with no form at all.
    """
    if not isinstance(spec.native, tuple) or not all(isinstance(f, NativeForm) for f in spec.native):
        raise PluginError(f"{where}: native must be a tuple of gskit.plugin.native.NativeForm")
    if not spec.plugin_form and not spec.native:
        raise PluginError(f"{where}: plugin_form=False needs at least one native form (else it has no form)")
    plugin_attrs = {a.name for a in spec.attributes}
    for form in spec.native:
        try:
            schema = onnx.defs.get_schema(form.op_type, form.opset, form.domain)
        except onnx.defs.SchemaError as err:
            raise PluginError(f"{where}: native form {form.label}: no such ONNX op at that opset") from err
        if schema.since_version > form.opset:  # pragma: no cover - get_schema returns the version in force
            raise PluginError(f"{where}: native form {form.label}: the op is newer than opset {form.opset}")
        try:
            TensorRTTarget.parse(form.tensorrt, "")
        except Exception as err:
            raise PluginError(
                f"{where}: native form {form.label}: tensorrt {form.tensorrt!r}: {err}"
            ) from err
        for op_attr, plugin_attr in form.attributes.items():
            if op_attr not in schema.attributes:
                raise PluginError(f"{where}: native form {form.label} has no attribute '{op_attr}'")
            if plugin_attr not in plugin_attrs:
                raise PluginError(
                    f"{where}: native form {form.label}: the plugin has no attribute '{plugin_attr}'"
                )
        unknown = [name for name in form.fixed if name not in schema.attributes]
        if unknown:
            raise PluginError(f"{where}: native form {form.label} has no attribute(s) {unknown}")
        indices = form.inputs if form.inputs is not None else tuple(range(len(spec.inputs)))
        variadic = (
            bool(schema.inputs)
            and schema.inputs[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic
        )
        if len(indices) > len(schema.inputs) and not variadic:
            raise PluginError(
                f"{where}: native form {form.label} takes {len(schema.inputs)} inputs, not {len(indices)}"
            )
        bad = [i for i in indices if i is not None and not 0 <= i < len(spec.inputs)]
        if bad:
            raise PluginError(f"{where}: native form {form.label}: input indices {bad} are not plugin inputs")
