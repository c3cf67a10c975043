"""The pattern language: a plugin author writes the computation as a small Python function.

A pattern function takes a builder (``op``) and one argument per boundary input, and returns the
pattern's output value(s)::

    def layer_norm(op, x, weight, bias):
        mean = op.ReduceMean(x, axes=[-1])
        d = op.Sub(x, mean)
        var = op.ReduceMean(op.Pow(d, 2.0), axes=[-1])
        std = op.Sqrt(op.Add(var, op.capture("eps")))
        return op.Add(op.Mul(op.Div(d, std), weight), bias)

* ``op.<OpType>(*inputs, _domain="", **attrs)`` is one node. The ONNX domain is ``""``; any other
  domain is given explicitly with ``_domain=`` (never implied). ``_outputs=n`` for multi-output nodes
  (the call then returns a tuple).
* An input is another pattern value, a pattern argument (any tensor, bound consistently: the same
  argument used twice must be the same tensor), a number (a constant that must have this value, from an
  initializer or a ``Constant`` node, scalar or any shape whose elements all equal it), a list or numpy
  array (a constant with these values, leading 1-dims aside), ``op.capture(name)`` (any constant, recorded
  under ``name``) or ``None`` (an absent optional input). A float literal matches within the precision of
  the constant's dtype (float32: a relative 1e-6; float16 and bfloat16: their machine epsilon), so one
  rule written with ``0.044715`` matches float32 and float16 models alike.
* An attribute is a literal (the node's value, or the schema default when the node omits it, must be
  equal) or ``op.capture(name)`` (recorded). Attributes that newer opsets moved to inputs (``axes`` of
  Reduce*/Squeeze/Unsqueeze, ``min``/``max`` of Clip, ...) match in either form; ``axes`` and ``axis``
  compare after normalizing negative axes when the input rank is known; floats compare within a relative
  1e-6. Attributes the pattern does not name are not checked, except the attribute-or-input ones, which
  must then be absent.
* Add, Mul, Max, Min, Sum, And, Or, Xor, Equal match their two inputs in either order.
* A ``Cast`` to the dtype its input already has is looked through in the model; a ``Cast`` the pattern
  wants may be missing from the model where it would be such a no-op (see ``gskit.passes.patterns.match``).
"""

from __future__ import annotations

import functools
import inspect
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gskit.errors import PluginError

#: Ops whose two inputs can be swapped, keyed by (domain, op_type).
COMMUTATIVE = frozenset(
    ("", op)
    for op in ("Add", "Mul", "Max", "Min", "Sum", "And", "Or", "Xor", "Equal", "BitwiseAnd", "BitwiseOr")
)

#: Attributes that later opsets turned into inputs: (domain, op_type) -> {attribute: input index}.
ATTRIBUTE_INPUTS: dict[tuple[str, str], dict[str, int]] = {
    **{
        ("", op): {"axes": 1}
        for op in (
            "ReduceMean",
            "ReduceSum",
            "ReduceMax",
            "ReduceMin",
            "ReduceProd",
            "ReduceL1",
            "ReduceL2",
            "ReduceLogSum",
            "ReduceLogSumExp",
            "ReduceSumSquare",
            "Squeeze",
            "Unsqueeze",
        )
    },
    ("", "Clip"): {"min": 1, "max": 2},
    ("", "Split"): {"split": 1},
    ("", "Pad"): {"pads": 1, "value": 2},
}


@dataclass(frozen=True)
class Capture:
    """A constant (as an input) or an attribute value recorded under ``name`` in the match."""

    name: str


@dataclass(frozen=True, eq=False)
class Var:
    """A boundary input of the pattern: any tensor, bound consistently."""

    name: str


@dataclass(frozen=True, eq=False)
class ConstValue:
    """A constant input: equal to ``value`` (``capture`` None) or captured (``value`` None).

    ``value`` is a number or an array; ``dtype`` is the precision the value is known to (a numpy dtype
    name: a rule derived from a float16 export knows its literals to float16 precision), None for exact.
    """

    value: float | int | np.ndarray | None = None
    capture: str | None = None
    dtype: str | None = None

    @functools.cached_property
    def literal_key(self) -> tuple[Any, ...]:
        """What a constant is compared against (value and precision), as a hashable key."""
        value = self.value
        if isinstance(value, np.ndarray):
            return (value.dtype.str, value.shape, value.tobytes(), self.dtype)
        return (type(value).__name__, value, self.dtype)


@dataclass(eq=False)
class PNode:
    """One node of a pattern."""

    op_type: str
    domain: str
    inputs: tuple[Value | None, ...]
    attrs: dict[str, Any]
    num_outputs: int = 1
    index: int = 0  # creation order, for stable messages

    @property
    def label(self) -> str:
        return f"{self.domain + '::' if self.domain else ''}{self.op_type}#{self.index}"

    @property
    def commutative(self) -> bool:
        return (self.domain, self.op_type) in COMMUTATIVE and len(self.inputs) == 2

    @functools.cached_property
    def orders(self) -> tuple[tuple[Value | None, ...], ...]:
        """The input orders to try: both for a two-input commutative op."""
        return tuple(input_orders(self))

    @functools.cached_property
    def attribute_inputs(self) -> dict[str, int]:
        """The op's attributes that may be inputs instead (``ATTRIBUTE_INPUTS``), name -> input index."""
        return ATTRIBUTE_INPUTS.get((self.domain, self.op_type), {})

    @functools.cached_property
    def attribute_key(self) -> int:
        """A number equal for pattern nodes whose attribute checks are the same (op, input count, attributes
        in order), so a node's attributes are checked once for all of them."""
        shape = (
            self.op_type,
            self.domain,
            len(self.inputs),
            tuple((k, _key(v)) for k, v in self.attrs.items()),
        )
        return _ATTRIBUTE_KEYS.setdefault(shape, len(_ATTRIBUTE_KEYS))

    @functools.cached_property
    def input_limit(self) -> int:
        """Inputs a matching node may have: the pattern's, and those its attributes stand for."""
        table = self.attribute_inputs
        return max([len(self.inputs), *(i + 1 for n, i in table.items() if n in self.attrs)])


_ATTRIBUTE_KEYS: dict[tuple[Any, ...], int] = {}


def _key(value: Any) -> Any:
    """An attribute's wanted value as a hashable key (equal keys: equal values of the same types)."""
    if isinstance(value, Capture):
        return ("capture", value.name)
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_key(v) for v in value))
    try:
        hash(value)
    except TypeError:
        return ("repr", type(value).__name__, repr(value))
    return (type(value).__name__, value)


@dataclass(frozen=True, eq=False)
class NodeOutput:
    """Output ``index`` of a pattern node."""

    node: PNode
    index: int = 0


Value = Var | ConstValue | NodeOutput


@dataclass
class OpBuilder:
    """The ``op`` argument of a pattern function: ``op.Relu(x)`` adds a pattern node."""

    nodes: list[PNode] = field(default_factory=list)

    def capture(self, name: str) -> Capture:
        """Any constant input or any attribute value, recorded under ``name``."""
        return Capture(name)

    def __getattr__(self, op_type: str) -> Callable[..., Any]:
        if op_type.startswith("_"):
            raise AttributeError(op_type)

        def make(*inputs: Any, _domain: str = "", _outputs: int = 1, **attrs: Any) -> Any:
            node = PNode(
                op_type, _domain, tuple([_as_value(v) for v in inputs]), attrs, _outputs, len(self.nodes)
            )
            self.nodes.append(node)
            if _outputs == 1 and isinstance(_outputs, int):  # most nodes (loading the plugins makes 700)
                return NodeOutput(node, 0)
            outs = tuple([NodeOutput(node, i) for i in range(_outputs)])
            return outs[0] if _outputs == 1 else outs

        return make


def _as_value(v: Any) -> Value | None:
    if v is None or isinstance(v, (Var, ConstValue, NodeOutput)):
        return v
    if isinstance(v, Capture):
        return ConstValue(capture=v.name)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return ConstValue(value=v)
    if isinstance(v, (list, tuple, np.ndarray)):
        array = np.asarray(v)
        if array.dtype.kind in "biuf" and array.size:
            return ConstValue(value=array)
    raise PluginError(
        f"pattern input {v!r} is not a pattern value, a number, a list of numbers, op.capture(...) or None"
    )


@dataclass(frozen=True, eq=False)
class PatternGraph:
    """A pattern function traced once: its nodes, boundary inputs and outputs.

    Attributes:
        name: the function's name.
        inputs: the boundary inputs (the function's parameters after ``op``), in order.
        outputs: the pattern's outputs; the producer of the first is the anchor.
        nodes: every pattern node, in creation order.
    """

    name: str
    inputs: tuple[Var, ...]
    outputs: tuple[NodeOutput, ...]
    nodes: tuple[PNode, ...]

    @property
    def anchor(self) -> PNode:
        return self.outputs[0].node


def trace(fn: Callable[..., Any]) -> PatternGraph:
    """Run a pattern function on a builder and check the result.

    Raises:
        PluginError: the function returns no node output, or some node is not reachable from the
            first output through inputs (the matcher walks from the anchor backwards).
    """
    params = list(inspect.signature(fn).parameters)[1:]
    builder = OpBuilder()
    variables = tuple(Var(p) for p in params)
    result = fn(builder, *variables)
    outputs = result if isinstance(result, tuple) else (result,)
    where = f"pattern '{getattr(fn, '__name__', fn)}'"
    if not outputs or not all(isinstance(o, NodeOutput) for o in outputs):
        raise PluginError(f"{where}: must return node outputs (op.X(...) results)")
    reached: set[int] = set()
    stack = [outputs[0].node]
    while stack:
        node = stack.pop()
        if id(node) in reached:
            continue
        reached.add(id(node))
        stack.extend(v.node for v in node.inputs if isinstance(v, NodeOutput))
    missing = [n.label for n in builder.nodes if id(n) not in reached]
    if missing:
        raise PluginError(f"{where}: nodes {missing} do not feed the first output; make it the last node")
    used = {v.name for n in builder.nodes for v in n.inputs if isinstance(v, Var)}
    unused = [v.name for v in variables if v.name not in used]
    if unused:
        raise PluginError(f"{where}: arguments {unused} are not used by any node")
    return PatternGraph(getattr(fn, "__name__", "pattern"), variables, tuple(outputs), tuple(builder.nodes))


def input_orders(node: PNode) -> Sequence[tuple[Value | None, ...]]:
    """The input orders to try for ``node``: both for a two-input commutative op."""
    if node.commutative:
        return list(itertools.permutations(node.inputs))[:2]
    return [node.inputs]
