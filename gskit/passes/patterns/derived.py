"""Rules derived from exported graphs: their description (JSON-able) and the rule built from it.

A :class:`RuleDescription` is one exported graph in the pattern language: the graph's inputs are the
pattern's arguments, each constant is a literal (its value and the dtype it was stored in) or a capture,
and every node keeps all of its attributes. Captures say where a plugin attribute comes from
(:class:`CaptureRule`: the constant is the attribute, or a simple function of it) or mark a ``Cast``
target that follows the dtype of the inputs. ``gskit.passes.patterns.describe`` makes descriptions from
ONNX models; ``gskit.plugin.derive`` caches them as JSON; :class:`DerivedPattern` is the rule that
``replace`` runs, a :class:`~gskit.passes.patterns.rules.GraphPattern` like a hand-written one.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gskit.errors import PluginError
from gskit.passes.patterns.dsl import COMMUTATIVE, ConstValue
from gskit.passes.patterns.match import MatchResult, literal_tolerance
from gskit.passes.patterns.rules import CheckFn, GraphPattern, Match, run_check
from gskit.passes.tensor_types import elem_type

#: Version of the JSON layout; a cache of another version is derived again.
FORMAT = 1


@dataclass(frozen=True)
class Arg:
    """The pattern argument (a graph input of the export) called ``name``."""

    name: str


@dataclass(frozen=True)
class Out:
    """Output ``index`` of pattern node ``node`` (its position in :attr:`RuleDescription.nodes`)."""

    node: int
    index: int = 0


@dataclass(frozen=True, eq=False)
class Literal:
    """A constant input that must hold ``value`` (within the precision of ``dtype`` and the model's)."""

    value: np.ndarray
    dtype: str

    def number(self) -> float | int | np.ndarray:
        """The value as the DSL takes it: a number when every element is the same, else the array."""
        flat = self.value.reshape(-1)
        if flat.size and np.all(flat == flat[0]):
            return flat[0].item()
        return self.value


@dataclass(frozen=True)
class Captured:
    """A constant input, or a node attribute, recorded under ``name`` (see :class:`CaptureRule`)."""

    name: str


InputRef = Arg | Out | Literal | Captured


@dataclass(frozen=True)
class NodeDescription:
    """One node: op, domain, inputs (None for an absent optional input), every attribute, output count."""

    op: str
    domain: str
    inputs: tuple[InputRef | None, ...]
    attrs: Mapping[str, Any]
    outputs: int = 1


#: How a captured constant ``c`` follows a plugin attribute ``a``: name -> (c from a, a from c).
RELATIONS: dict[str, tuple[Callable[[float, float], float], Callable[[float, float], float]]] = {
    "identity": (lambda a, k: a, lambda c, k: c),
    "negate": (lambda a, k: -a, lambda c, k: -c),
    "reciprocal": (lambda a, k: 1.0 / a, lambda c, k: 1.0 / c),
    "sqrt": (lambda a, k: math.sqrt(a), lambda c, k: c * c),
    "square": (lambda a, k: a * a, lambda c, k: math.copysign(math.sqrt(abs(c)), k)),
    "rsqrt": (lambda a, k: 1.0 / math.sqrt(a), lambda c, k: 1.0 / (c * c)),
    "scale": (lambda a, k: k * a, lambda c, k: c / k),
    "offset": (lambda a, k: a + k, lambda c, k: c - k),
}


@dataclass(frozen=True)
class CaptureRule:
    """What a capture means.

    Attributes:
        name: the capture's name in the pattern.
        attribute: the plugin attribute it gives (None for a dtype capture).
        relation: a key of :data:`RELATIONS` (``c = f(a)``), or ``"dtype"``: a ``Cast`` target that follows
            the dtype of the inputs (any value; the replace pass checks the plugin's output dtype).
        k: the constant of ``scale``/``offset``; for ``square``, the sign of the attribute.
        kind: ``float`` or ``int``: the attribute's Python type.
    """

    name: str
    attribute: str | None
    relation: str
    k: float = 0.0
    kind: str = "float"

    def attribute_value(self, captured: Any) -> float | int:
        """The plugin attribute from the captured value (its first element; all are checked equal)."""
        array = np.asarray(captured, dtype=np.float64).reshape(-1)
        value = RELATIONS[self.relation][1](float(array[0]), self.k)
        return int(round(value)) if self.kind == "int" else value


@dataclass(frozen=True, eq=False)
class RuleDescription:
    """One derived rule.

    Attributes:
        name: shown in reports (``function[exporters dtypes]``).
        forms: the exports it came from, ``exporter-opset:dtype`` (``torchscript-17:float32``).
        inputs: the pattern's arguments (the export's graph inputs), in the plugin's input order.
        nodes: the pattern nodes in topological order.
        outputs: the pattern's outputs (the first one's node is the anchor).
        captures: what each capture means.
    """

    name: str
    forms: tuple[str, ...]
    inputs: tuple[str, ...]
    nodes: tuple[NodeDescription, ...]
    outputs: tuple[Out, ...]
    captures: tuple[CaptureRule, ...] = ()

    @property
    def attributes(self) -> tuple[str, ...]:
        """The plugin attributes the rule gives."""
        return tuple(dict.fromkeys(c.attribute for c in self.captures if c.attribute is not None))

    def ops(self) -> set[tuple[str, str]]:
        """``(domain, op_type)`` of every node."""
        return {(n.domain, n.op) for n in self.nodes}

    def literal_rtol(self) -> float:
        """The loosest tolerance of its literals (a rule from a float32 export is more precise)."""
        return max(
            (literal_tolerance(r.dtype) for n in self.nodes for r in n.inputs if isinstance(r, Literal)),
            default=0.0,
        )

    def canonical(self) -> tuple[Any, ...]:
        """A key equal for two descriptions of the same pattern: the same nodes up to the order of
        commutative operands, literals to three significant digits, the same captures."""
        memo: dict[int, Any] = {}
        rules = {c.name: (c.attribute, c.relation, round(c.k, 6), c.kind) for c in self.captures}

        def ref(r: InputRef | None) -> Any:
            if r is None:
                return None
            if isinstance(r, Arg):
                return ("arg", r.name)
            if isinstance(r, Literal):
                return ("lit", r.value.shape, tuple(f"{v:.3g}" for v in r.value.reshape(-1).tolist()))
            if isinstance(r, Captured):
                return ("cap", rules.get(r.name))
            return (node(r.node), r.index)

        def node(i: int) -> Any:
            if i not in memo:
                n = self.nodes[i]
                ins = [ref(r) for r in n.inputs]
                if (n.domain, n.op) in COMMUTATIVE and len(ins) == 2:
                    ins.sort(key=repr)
                attrs = tuple(sorted((k, _attr_key(v, rules)) for k, v in n.attrs.items()))
                memo[i] = (n.domain, n.op, tuple(ins), attrs, n.outputs)
            return memo[i]

        return (self.inputs, tuple((node(o.node), o.index) for o in self.outputs))

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "forms": list(self.forms),
            "inputs": list(self.inputs),
            "nodes": [
                {
                    "op": n.op,
                    "domain": n.domain,
                    "inputs": [_ref_json(r) for r in n.inputs],
                    "attrs": {k: _attr_json(v) for k, v in n.attrs.items()},
                    "outputs": n.outputs,
                }
                for n in self.nodes
            ],
            "outputs": [[o.node, o.index] for o in self.outputs],
            "captures": [
                {"name": c.name, "attribute": c.attribute, "relation": c.relation, "k": c.k, "kind": c.kind}
                for c in self.captures
            ],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RuleDescription:
        """Read :meth:`to_json`'s output.

        Raises:
            PluginError: the data is not a rule description (a damaged or foreign cache file).
        """
        try:
            nodes = tuple(
                NodeDescription(
                    str(n["op"]),
                    str(n["domain"]),
                    tuple(_ref_from_json(r) for r in n["inputs"]),
                    {str(k): _attr_from_json(v) for k, v in n["attrs"].items()},
                    int(n["outputs"]),
                )
                for n in data["nodes"]
            )
            description = cls(
                str(data["name"]),
                tuple(str(f) for f in data["forms"]),
                tuple(str(i) for i in data["inputs"]),
                nodes,
                tuple(Out(int(o[0]), int(o[1])) for o in data["outputs"]),
                tuple(
                    CaptureRule(
                        str(c["name"]),
                        None if c["attribute"] is None else str(c["attribute"]),
                        str(c["relation"]),
                        float(c["k"]),
                        str(c["kind"]),
                    )
                    for c in data["captures"]
                ),
            )
        except (KeyError, TypeError, ValueError, IndexError) as err:
            raise PluginError(f"not a derived rule description ({type(err).__name__}: {err})") from err
        for c in description.captures:
            if c.relation != "dtype" and c.relation not in RELATIONS:
                raise PluginError(f"derived rule '{description.name}': unknown relation '{c.relation}'")
        return description


def _attr_key(value: Any, rules: Mapping[str, Any]) -> Any:
    if isinstance(value, Captured):
        return ("cap", rules.get(value.name))
    if isinstance(value, np.ndarray):
        return ("tensor", value.shape, tuple(value.reshape(-1).tolist()))
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        return tuple(f"{v:.6g}" if isinstance(v, float) else v for v in value)
    return value


def _ref_json(r: InputRef | None) -> Any:
    if r is None:
        return None
    if isinstance(r, Arg):
        return {"input": r.name}
    if isinstance(r, Out):
        return {"node": r.node, "output": r.index}
    if isinstance(r, Captured):
        return {"capture": r.name}
    return {"literal": r.value.tolist(), "shape": list(r.value.shape), "dtype": r.dtype}


def _ref_from_json(data: Any) -> InputRef | None:
    if data is None:
        return None
    if "input" in data:
        return Arg(str(data["input"]))
    if "node" in data:
        return Out(int(data["node"]), int(data["output"]))
    if "capture" in data:
        return Captured(str(data["capture"]))
    dtype = str(data["dtype"])
    kind = np.int64 if dtype.startswith(("int", "uint", "bool")) else np.float64
    value = np.asarray(data["literal"], dtype=kind).reshape([int(d) for d in data["shape"]])
    return Literal(value, dtype)


def _attr_json(value: Any) -> Any:
    if isinstance(value, Captured):
        return {"capture": value.name}
    if isinstance(value, np.ndarray):
        return {"tensor": value.tolist(), "shape": list(value.shape), "dtype": str(value.dtype)}
    return value


def _attr_from_json(data: Any) -> Any:
    if isinstance(data, dict):
        if "capture" in data:
            return Captured(str(data["capture"]))
        return np.asarray(data["tensor"], dtype=data["dtype"]).reshape([int(d) for d in data["shape"]])
    return data


# ---------------------------------------------------------------------------------------- the rule


class DerivedPattern(GraphPattern):
    """A :class:`GraphPattern` built from a :class:`RuleDescription`.

    Its checks, besides ``check``: every constant captured for an attribute holds one value (all elements
    equal), and the constants captured for the same attribute agree. The rewrite gives each attribute from
    its capture through the relation found when the rule was derived.

    Args:
        description: the rule.
        inputs: the plugin's inputs as argument names in the spec's order (None: absent); default the
            description's inputs in order.
        check: extra conditions on the match, ``check(match) -> MatchResult``.
        source: where the rule came from, for reports (``from_torch(rms_norm)``).
        derived_from: the ``from_torch`` call (``gskit.plugin.derive.DerivedSource``), to derive it again.

    Raises:
        PluginError: the description does not trace to a pattern (see ``gskit.passes.patterns.dsl.trace``).
    """

    def __init__(
        self,
        description: RuleDescription,
        *,
        inputs: Sequence[str | None] | None = None,
        check: CheckFn | None = None,
        source: str = "",
        derived_from: Any = None,
    ) -> None:
        self.description = description
        self.source = source
        self.derived_from = derived_from
        self.extra_check = check
        super().__init__(
            _replay(description),
            inputs=inputs,
            attrs=self._attributes,
            check=self._check,
            name=description.name,
        )

    @property
    def forms(self) -> tuple[str, ...]:
        return self.description.forms

    def __repr__(self) -> str:
        return f"DerivedPattern({self.name!r}, {len(self.graph.nodes)} nodes)"

    def _attributes(self, match: Match) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for rule in self.description.captures:
            if rule.attribute is not None and rule.attribute not in values:
                values[rule.attribute] = rule.attribute_value(match.captures[rule.name])
        return values

    def _check(self, match: Match) -> MatchResult:
        seen: dict[str, tuple[float, str]] = {}
        for rule in self.description.captures:
            if rule.attribute is None:
                continue
            captured = np.asarray(match.captures[rule.name])
            flat = captured.reshape(-1)
            if flat.size == 0 or (flat.size > 1 and not np.all(flat == flat[0])):  # one value: equal
                return MatchResult.fail(
                    f"'{rule.name}' (attribute {rule.attribute}) is a tensor of {flat.size} values, "
                    "not all equal",
                    match.anchor,
                )
            value = float(rule.attribute_value(captured))
            if rule.attribute in seen:
                first, where = seen[rule.attribute]
                rtol = literal_tolerance(captured.dtype, where)
                if not math.isclose(value, first, rel_tol=max(rtol * 4, 1e-6), abs_tol=1e-30):
                    return MatchResult.fail(
                        f"the constants of attribute {rule.attribute} disagree ({first:g} and {value:g})",
                        match.anchor,
                    )
            else:
                seen[rule.attribute] = (value, str(captured.dtype))
        dtype_check = self._dtypes_known(match)
        if not dtype_check:
            return dtype_check
        return run_check(self.extra_check, match)

    def _dtypes_known(self, match: Match) -> MatchResult:
        """A rule whose Cast follows the input dtype needs the outputs' dtypes, which replace checks against
        the plugin's output rule."""
        if not any(c.relation == "dtype" for c in self.description.captures):
            return MatchResult.success()
        for tensor in match.outputs:
            if elem_type(tensor.dtype) is None:
                return MatchResult.fail(
                    f"the dtype of output '{tensor.name}' is unknown, so the plugin's output dtype "
                    "cannot be checked",
                    match.anchor,
                )
        return MatchResult.success()


def _replay(description: RuleDescription) -> Callable[..., Any]:
    """A pattern function that builds the description's nodes (traced once by GraphPattern)."""
    captures = {c.name for c in description.captures}

    def pattern(op: Any, *args: Any) -> Any:
        bound = dict(zip(description.inputs, args, strict=True))
        made: list[tuple[Any, ...]] = []

        def value(r: InputRef | None) -> Any:
            if r is None:
                return None
            if isinstance(r, Arg):
                return bound[r.name]
            if isinstance(r, Out):
                return made[r.node][r.index]
            if isinstance(r, Captured):
                return op.capture(r.name)
            number = r.number()
            return ConstValue(value=number, dtype=r.dtype)

        for node in description.nodes:
            attrs = {k: op.capture(v.name) if isinstance(v, Captured) else v for k, v in node.attrs.items()}
            result = getattr(op, node.op)(
                *(value(r) for r in node.inputs), _domain=node.domain, _outputs=node.outputs, **attrs
            )
            made.append(result if node.outputs > 1 else (result,))
        outputs = tuple(made[o.node][o.index] for o in description.outputs)
        return outputs if len(outputs) > 1 else outputs[0]

    unknown = sorted(
        {r.name for n in description.nodes for r in (*n.inputs, *n.attrs.values()) if isinstance(r, Captured)}
        - captures
    )
    if unknown:
        raise PluginError(f"derived rule '{description.name}': captures {unknown} have no meaning recorded")
    parameters = [inspect.Parameter("op", inspect.Parameter.POSITIONAL_ONLY)]
    parameters += [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in description.inputs]
    pattern.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    pattern.__name__ = description.name
    return pattern


class DerivedRuleSet(tuple):  # noqa: SLOT001 - a tuple with a status line, nothing else
    """The rules ``from_torch`` gives: a tuple of :class:`DerivedPattern` (so ``PluginSpec(patterns=...)``
    and ``(*from_torch(...), *hand_written)`` take it) with ``status``, one line saying where they came from.
    """

    status: str = ""

    def __new__(cls, rules: Sequence[DerivedPattern] = (), status: str = "") -> DerivedRuleSet:
        made = super().__new__(cls, tuple(rules))
        made.status = status
        return made
