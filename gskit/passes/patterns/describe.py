"""Exported graphs as rules: an ONNX model in the pattern language, and what varies between two exports.

:func:`describe_model` reads one exported model (the export of the function a plugin replaces) as a
:class:`~gskit.passes.patterns.derived.RuleDescription`, normalized so that exporters' incidental
differences do not make separate rules:

* ``Identity`` nodes and no-op ``Cast`` nodes (to the dtype the input already has) are looked through (the
  matcher looks through no-op Casts in the model too);
* ``Constant`` nodes and initializers become literals: a constant is what it holds, wherever it is stored;
* attributes that newer opsets moved to inputs (``axes`` of ReduceMean, ``min``/``max`` of Clip, ...) are
  written as attributes, which match either form;
* nodes that feed no output are dropped.

:func:`with_attributes` compares the export with the plugin's attribute values against exports with other
values: a literal or node attribute that changes with an attribute becomes a capture of it, with the
relation that explains both values (:data:`~gskit.passes.patterns.derived.RELATIONS`); one that cannot be
explained is refused. :func:`with_dtypes` does the same across input dtypes for ``Cast`` targets.
:func:`distinct` drops duplicates (operand order of commutative ops, literal precision aside).
"""

from __future__ import annotations

import dataclasses
import keyword
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from gskit.errors import GskitError
from gskit.passes.patterns.derived import (
    RELATIONS,
    Arg,
    Captured,
    CaptureRule,
    InputRef,
    Literal,
    NodeDescription,
    Out,
    RuleDescription,
)
from gskit.passes.patterns.dsl import ATTRIBUTE_INPUTS
from gskit.passes.patterns.match import MAX_LITERAL_ELEMENTS, literal_tolerance
from gskit.passes.tensor_types import elem_type, with_inferred_types
from gskit.plugin.ops import canonical_domain

#: Node attributes that say nothing about the computation (debug info some exporters add).
IGNORED_ATTRIBUTES = frozenset({"onnx_name", "pkg.torch.onnx.stack_trace", "pkg.torch.onnx.name_scopes"})


class DeriveError(GskitError):
    """An export cannot be turned into a rule (the message says why and what to change)."""


class AttributeLost(DeriveError):
    """An attribute changes nothing in one export: a rule from it could not give the attribute's value (the
    dynamo exporter drops an ``Add`` of a tiny epsilon, for one)."""


def python_name(name: str) -> str:
    """A pattern argument name for a graph input: an identifier (``norm.weight`` -> ``norm_weight``)."""
    text = re.sub(r"\W", "_", name)
    if not text or text[0].isdigit() or keyword.iskeyword(text):
        text = f"t_{text}"
    return text


def describe_model(model: onnx.ModelProto, name: str, form: str) -> RuleDescription:
    """The model's graph as a rule description with every constant a literal.

    Args:
        model: an exported model (graph inputs: the pattern's arguments; graph outputs: its outputs).
        name: the rule's name.
        form: the export it came from, ``exporter-opset:dtype``.

    Raises:
        DeriveError: the graph has subgraphs, an input no node reads, an output that is an input or a
            constant, or a constant too large to be a literal.
    """
    try:
        model = with_inferred_types(model)
    except GskitError:  # the dtypes only serve to find no-op Casts; without them the Casts stay
        pass
    graph = model.graph
    where = f"export {form} of {name}"
    dtypes = _dtypes(graph)
    constants: dict[str, tuple[np.ndarray, str]] = {}
    for init in graph.initializer:
        constants[init.name] = _array(init)
    alias: dict[str, str] = {}
    kept: list[onnx.NodeProto] = []
    for node in graph.node:
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            raise DeriveError(
                f"{where}: node {node.op_type} holds a subgraph; a rule cannot describe control flow"
            )
        inputs = [alias.get(i, i) for i in node.input]
        if node.op_type == "Constant" and canonical_domain(node.domain) == "":
            constants[node.output[0]] = _constant_node_value(node)
            continue
        if canonical_domain(node.domain) == "" and node.op_type == "Identity":
            alias[node.output[0]] = inputs[0]
            continue
        if canonical_domain(node.domain) == "" and node.op_type == "Cast":
            to = _attr(node, "to")
            source = inputs[0]
            if source in constants:
                value, _ = constants[source]
                target = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(to)))
                cast = value.astype(target)
                wide = cast.astype(np.float64) if target.kind == "f" or int(to) == 16 else cast
                constants[node.output[0]] = (wide, "bfloat16" if int(to) == 16 else str(target))
                continue
            if dtypes.get(source) == to:
                alias[node.output[0]] = source
                continue
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        del copy.input[:]
        copy.input.extend(inputs)
        kept.append(copy)
    arguments = {i.name: python_name(i.name) for i in graph.input if i.name not in constants}
    outputs = [alias.get(o.name, o.name) for o in graph.output]
    for out in outputs:
        if out in arguments or out in constants:
            raise DeriveError(
                f"{where}: output '{out}' is an input or a constant; the function computes nothing"
            )
    kept = _live(kept, outputs)
    produced = {t: (i, k) for i, n in enumerate(kept) for k, t in enumerate(n.output) if t}
    nodes: list[NodeDescription] = []
    for node in kept:
        domain = canonical_domain(node.domain)
        table = ATTRIBUTE_INPUTS.get((domain, node.op_type), {})
        attrs = {
            a.name: _attribute_value(onnx.helper.get_attribute_value(a))
            for a in node.attribute
            if a.name not in IGNORED_ATTRIBUTES
        }
        refs: list[InputRef | None] = []
        for index, tensor in enumerate(node.input):
            if not tensor:
                refs.append(None)
            elif tensor in constants:
                value, dtype = constants[tensor]
                moved = next((a for a, i in table.items() if i == index), None)
                if moved is not None and moved not in attrs:
                    attrs[moved] = _attribute_value(value.tolist())
                    refs.append(None)
                    continue
                if value.size > MAX_LITERAL_ELEMENTS:
                    raise DeriveError(
                        f"{where}: constant '{tensor}' has {value.size} elements, too many for a literal; "
                        "pass it to the function as an input (or a module parameter)"
                    )
                refs.append(Literal(value, dtype))
            elif tensor in produced:
                refs.append(Out(*produced[tensor]))
            elif tensor in arguments:
                refs.append(Arg(arguments[tensor]))
            else:
                raise DeriveError(f"{where}: tensor '{tensor}' has no producer")
        # Trailing absent inputs (moved to attributes or never given) are left off: the DSL reads them so.
        while refs and refs[-1] is None:
            refs.pop()
        nodes.append(NodeDescription(node.op_type, domain, tuple(refs), attrs, len(node.output)))
    used = {r.name for n in nodes for r in n.inputs if isinstance(r, Arg)}
    unused = [a for a in arguments.values() if a not in used]
    if unused:
        raise DeriveError(
            f"{where}: inputs {unused} are not read by any node of the export; drop them from the function "
            "or make it use them"
        )
    return RuleDescription(
        name,
        (form,),
        tuple(arguments.values()),
        tuple(nodes),
        tuple(Out(*produced[o]) for o in outputs),
    )


def _dtypes(graph: onnx.GraphProto) -> dict[str, int]:
    found: dict[str, int] = {}
    for info in (*graph.input, *graph.value_info, *graph.output):
        if info.type.HasField("tensor_type") and info.type.tensor_type.elem_type:
            found[info.name] = info.type.tensor_type.elem_type
    for init in graph.initializer:
        found[init.name] = init.data_type
    return found


def _array(tensor: onnx.TensorProto) -> tuple[np.ndarray, str]:
    """A constant's value (floats widened to float64, so bfloat16 reads like the rest) and dtype name."""
    name = onnx.TensorProto.DataType.Name(tensor.data_type).lower()
    name = {"float": "float32", "double": "float64"}.get(name, name)
    value = np.asarray(onnx.numpy_helper.to_array(tensor))
    if name.startswith(("float", "bfloat")):
        value = value.astype(np.float64)
    return value, name


def _constant_node_value(node: onnx.NodeProto) -> tuple[np.ndarray, str]:
    attr = node.attribute[0]
    value = onnx.helper.get_attribute_value(attr)
    if isinstance(value, onnx.TensorProto):
        return _array(value)
    if attr.name in ("value_float", "value_floats"):
        return np.asarray(value, dtype=np.float32).astype(np.float64), "float32"
    return np.asarray(value, dtype=np.int64), "int64"


def _attr(node: onnx.NodeProto, name: str) -> Any:
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return None


def _attribute_value(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    if isinstance(value, (list, tuple)):
        return [_attribute_value(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _live(nodes: list[onnx.NodeProto], outputs: Sequence[str]) -> list[onnx.NodeProto]:
    """The nodes some output depends on, in their order."""
    producer = {t: n for n in nodes for t in n.output}
    needed: set[int] = set()
    stack = [producer[o] for o in outputs if o in producer]
    while stack:
        node = stack.pop()
        if id(node) in needed:
            continue
        needed.add(id(node))
        stack.extend(producer[t] for t in node.input if t in producer)
    return [n for n in nodes if id(n) in needed]


# -------------------------------------------------------------------------------- what varies


@dataclasses.dataclass(frozen=True)
class Slot:
    """A place holding a value: a literal input (``index`` an int) or an attribute (``index`` its name)."""

    node: int
    index: int | str


def structure(description: RuleDescription) -> tuple[Any, ...]:
    """What two exports must share to be compared slot by slot: ops, wiring, attribute names."""

    def ref(r: InputRef | None) -> Any:
        if isinstance(r, Literal):
            return ("lit", r.value.shape)
        if isinstance(r, Captured):
            return ("cap",)
        return r

    return (
        description.inputs,
        tuple(
            (n.op, n.domain, tuple(ref(r) for r in n.inputs), tuple(sorted(n.attrs)), n.outputs)
            for n in description.nodes
        ),
        description.outputs,
    )


def slots(description: RuleDescription) -> dict[Slot, Any]:
    """Every literal and attribute value of a description by its slot."""
    found: dict[Slot, Any] = {}
    for i, node in enumerate(description.nodes):
        for k, r in enumerate(node.inputs):
            if isinstance(r, Literal):
                found[Slot(i, k)] = r
        for name, value in node.attrs.items():
            found[Slot(i, name)] = value
    return found


def _numbers(value: Any) -> np.ndarray | None:
    if isinstance(value, Literal):
        return value.value.astype(np.float64).reshape(-1)
    if isinstance(value, bool) or not isinstance(value, (int, float, list, np.ndarray)):
        return None
    try:
        array = np.asarray(value, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        return None
    return array


def _precision(value: Any) -> str | None:
    return value.dtype if isinstance(value, Literal) else None


def same_value(a: Any, b: Any) -> bool:
    """Whether two slot values are equal (floats within the precision of the coarser dtype)."""
    x, y = _numbers(a), _numbers(b)
    if x is None or y is None:
        return bool(_plain(a) == _plain(b))
    if x.shape != y.shape:
        return False
    rtol = literal_tolerance(_precision(a), _precision(b))
    return bool(np.allclose(x, y, rtol=rtol, atol=0))


def _plain(value: Any) -> Any:
    return value.tolist() if isinstance(value, np.ndarray) else value


def differing(base: RuleDescription, other: RuleDescription) -> dict[Slot, tuple[Any, Any]]:
    """The slots whose values differ between two descriptions of the same structure."""
    a, b = slots(base), slots(other)
    return {s: (a[s], b[s]) for s in a if not same_value(a[s], b[s])}


def find_relation(pairs: Sequence[tuple[float, float]], rtol: float) -> tuple[str, float] | None:
    """The simplest relation ``c = f(a)`` that gives each ``(a, c)`` pair, as ``(name, k)``; None if none.

    Tried in this order: identity, negate, reciprocal, sqrt, square, rsqrt, scale (``c = k a``) and offset
    (``c = a + k``); ``k`` comes from the first pair and must fit the others.
    """

    def fits(name: str, k: float) -> bool:
        forward = RELATIONS[name][0]
        for a, c in pairs:
            try:
                want = forward(a, k)
            except (ValueError, ZeroDivisionError, OverflowError):
                return False
            if not math.isclose(want, c, rel_tol=rtol, abs_tol=1e-30):
                return False
        return True

    a0, c0 = pairs[0]
    for name in ("identity", "negate", "reciprocal", "sqrt", "square", "rsqrt"):
        k = math.copysign(1.0, a0) if name == "square" else 0.0
        if fits(name, k):
            return name, k
    if a0 != 0 and fits("scale", c0 / a0):
        return "scale", c0 / a0
    if fits("offset", c0 - a0):
        return "offset", c0 - a0
    return None


@dataclasses.dataclass(frozen=True)
class AttributeSlots:
    """Where the plugin attributes sit in an export: the slots that become captures, and their meanings."""

    replaced: Mapping[Slot, Captured]
    captures: tuple[CaptureRule, ...]

    def apply(self, description: RuleDescription) -> RuleDescription:
        """``description`` (an export of the same structure) with these slots captured."""
        return _substitute(description, self.replaced, (*description.captures, *self.captures))


def attribute_slots(
    base: RuleDescription,
    variants: Mapping[str, tuple[Any, Any, RuleDescription]],
) -> AttributeSlots:
    """The slots of ``base`` that follow plugin attributes, each with the relation that explains it.

    Args:
        base: the export with the plugin's attribute values.
        variants: attribute -> (its value in ``base``, the other value, the export with that value).

    Raises:
        AttributeLost: an attribute changes no slot.
        DeriveError: a variant has another structure, a slot follows two attributes, a value is not a
            number, or no relation explains a slot's two values.
    """
    where = f"{base.name} ({', '.join(base.forms)})"
    owner: dict[Slot, str] = {}
    captures: list[CaptureRule] = []
    replaced: dict[Slot, Captured] = {}
    for attribute, (value, other, variant) in variants.items():
        if structure(variant) != structure(base):
            raise DeriveError(
                f"{where}: with {attribute}={other!r} the export has other nodes than with "
                f"{attribute}={value!r}; the attribute changes the graph itself, so it cannot be read from a "
                "constant"
            )
        changed = differing(base, variant)
        if not changed:
            raise AttributeLost(
                f"{where}: {attribute}={value!r} and {attribute}={other!r} give the same graph, so a rule "
                f"from it could not tell the model's {attribute}"
            )
        for slot, (was, now) in changed.items():
            if slot in owner:
                raise DeriveError(
                    f"{where}: a constant of node {base.nodes[slot.node].op} follows both {owner[slot]} and "
                    f"{attribute}; a rule can derive an attribute only from a constant that follows it alone"
                )
            owner[slot] = attribute
            x, y = _numbers(was), _numbers(now)
            if x is None or y is None or not isinstance(value, (int, float)) or isinstance(value, bool):
                raise DeriveError(
                    f"{where}: attribute {attribute} changes '{slot.index}' of node "
                    f"{base.nodes[slot.node].op} ({_plain(was)!r} -> {_plain(now)!r}); only numeric "
                    "attributes and constants can be related"
                )
            rtol = max(literal_tolerance(_precision(was)), 1e-6) * 4
            relation = find_relation([(float(value), float(x[0])), (float(other), float(y[0]))], rtol)
            if relation is None or not (np.all(x == x[0]) and np.all(y == y[0])):
                raise DeriveError(
                    f"{where}: {attribute}={value!r} gives {_plain(x.tolist())} and {attribute}={other!r} "
                    f"gives {_plain(y.tolist())} at node {base.nodes[slot.node].op}; no simple relation "
                    "(identity, negation, reciprocal, sqrt, square, rsqrt, scale, offset) explains both"
                )
            count = sum(c.attribute == attribute for c in captures)
            name = attribute if count == 0 else f"{attribute}.{count + 1}"
            kind = "int" if isinstance(value, int) else "float"
            captures.append(CaptureRule(name, attribute, relation[0], relation[1], kind))
            replaced[slot] = Captured(name)
    return AttributeSlots(replaced, tuple(captures))


def with_attributes(
    base: RuleDescription, variants: Mapping[str, tuple[Any, Any, RuleDescription]]
) -> RuleDescription:
    """``base`` with the slots that follow plugin attributes captured (:func:`attribute_slots`)."""
    return attribute_slots(base, variants).apply(base)


def with_dtypes(members: Sequence[tuple[str, RuleDescription]]) -> RuleDescription | None:
    """One description for exports of the same structure at several input dtypes, or None if they differ
    in a way a dtype does not explain.

    ``members`` are ``(dtype, description)``; a ``Cast`` target (or any integer attribute) that equals the
    ONNX type of each member's dtype becomes a dtype capture; literals keep the most precise member's value.
    """
    if len(members) < 2:
        return None
    ordered = sorted(members, key=lambda m: literal_tolerance(m[0]))  # the most precise first
    base = ordered[0][1]
    replaced: dict[Slot, Captured] = {}
    captures = list(base.captures)
    for slot in slots(base):
        values = [slots(d)[slot] for _, d in ordered]
        if all(same_value(values[0], v) for v in values[1:]):
            continue
        types = [elem_type(dtype) for dtype, _ in ordered]
        if all(isinstance(v, int) and v == t for v, t in zip(values, types, strict=True)):
            name = f"dtype.{len([c for c in captures if c.relation == 'dtype']) + 1}"
            captures.append(CaptureRule(name, None, "dtype", 0.0, "int"))
            replaced[slot] = Captured(name)
            continue
        return None
    forms = tuple(f for _, d in ordered for f in d.forms)
    merged = _substitute(base, replaced, captures)
    return dataclasses.replace(merged, forms=forms)


def _substitute(
    base: RuleDescription, replaced: Mapping[Slot, Captured], captures: Sequence[CaptureRule]
) -> RuleDescription:
    nodes = []
    for i, node in enumerate(base.nodes):
        inputs = tuple(replaced.get(Slot(i, k), r) for k, r in enumerate(node.inputs))
        attrs = {k: replaced.get(Slot(i, k), v) for k, v in node.attrs.items()}
        nodes.append(dataclasses.replace(node, inputs=inputs, attrs=attrs))
    return dataclasses.replace(base, nodes=tuple(nodes), captures=tuple(captures))


def distinct(descriptions: Sequence[RuleDescription]) -> list[RuleDescription]:
    """Descriptions without duplicates, in first-seen order; a duplicate's forms join the one kept, which
    takes the most precise literals of the two."""
    kept: dict[Any, RuleDescription] = {}
    for d in descriptions:
        key = d.canonical()
        if key not in kept:
            kept[key] = d
            continue
        first = kept[key]
        forms = tuple(dict.fromkeys((*first.forms, *d.forms)))
        better = d if d.literal_rtol() < first.literal_rtol() else first
        kept[key] = dataclasses.replace(better, forms=forms)
    return list(kept.values())


def rule_name(function: str, forms: Sequence[str]) -> str:
    """``function[torchscript-14/17/18 dynamo-18 float32/float16]``: the exports a rule stands for."""
    exporters: dict[str, list[str]] = {}
    dtypes: list[str] = []
    for form in forms:
        export, _, dtype = form.partition(":")
        exporter, _, opset = export.rpartition("-")
        exporters.setdefault(exporter, [])
        if opset not in exporters[exporter]:
            exporters[exporter].append(opset)
        if dtype and dtype not in dtypes:
            dtypes.append(dtype)
    text = " ".join(f"{e}-{'/'.join(o)}" for e, o in exporters.items())
    return f"{function}[{text} {'/'.join(dtypes)}]".replace(" ]", "]")
