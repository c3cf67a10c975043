"""Finding pattern instances in one graph: the graph index, the backtracking matcher and the tracer.

The matcher starts at an anchor node (a node whose ``(domain, op_type)`` is the pattern's last node)
and walks the pattern backwards through producers, depth first. Every choice (the two orders of a
commutative op, a Cast the model may leave out) is a branch: each step is handed the rest of the search
and returns its first complete binding, and a branch that fails takes back what it bound (one binding per
attempt, changed in place, with a trail of its changes), so the next branch starts from the same binding.
When tracing is on, each failure is recorded with the number of pattern nodes matched so far; the deepest
one is what ``--explain`` reports.

Exporters leave no-op ``Cast`` nodes (a Cast to the dtype its input already has; TorchScript writes one
for every ``.to(dtype)`` in Hugging Face norms) inside computations. Where the pattern wants another op,
the matcher looks through such a Cast: between two pattern nodes the Cast joins the match (it is replaced
with the rest and its output must not be used outside), in front of a pattern argument the argument binds
to the Cast's input. So matching does not depend on a cleanup having run first. A Cast is a no-op only
when its input's dtype is known; ``gskit.passes.patterns.replace`` learns the missing ones it needs first
(``gskit.passes.patterns.dtypes``).

The other way round, a ``Cast`` the pattern wants may be missing from the model where it would be a no-op (the
tensor already has the dtype the Cast names; ``sanitize`` removed it, or this exporter never wrote it): the
pattern's Cast then matches no node and its input is that same tensor. So a rule derived from a float16
export, ``Cast(x, to=float)`` first, also matches where ``x`` is float32 and nothing casts it.
"""

from __future__ import annotations

import functools
import logging
import sys
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from gskit.passes.patterns.dsl import (
    Capture,
    ConstValue,
    NodeOutput,
    PatternGraph,
    PNode,
    Value,
    Var,
)
from gskit.passes.patterns.dtypes import DtypeLearner
from gskit.passes.tensor_types import elem_type  # the one owner; importable from here for plugin patterns
from gskit.plugin.ops import canonical_domain

log = logging.getLogger(__name__)

#: Python frames the matcher's search may nest per pattern node (4.4 measured on a chain; room to spare).
_FRAMES_PER_PATTERN_NODE = 8

#: Constants larger than this are never compared element by element against a literal.
MAX_LITERAL_ELEMENTS = 4096


def op_key(node: gs.Node) -> tuple[str, str]:
    """``(domain, op_type)`` of a node; ``ai.onnx`` and the empty domain are the same."""
    domain = node.domain
    return ("" if not domain else canonical_domain(domain), node.op)  # most nodes: no domain


@dataclass
class GraphIndex:
    """Per-graph lookups built once: anchors by op, node positions, outputs and outer uses.

    Producers and consumers come from graphsurgeon's own links (``tensor.inputs`` / ``tensor.outputs``),
    which it maintains; ``used_in_subgraphs`` adds the tensors that nested If/Loop/Scan bodies read
    implicitly, which graphsurgeon does not list as consumers.
    """

    graph: gs.Graph
    by_op: dict[tuple[str, str], list[gs.Node]]
    position: dict[int, int]
    graph_outputs: frozenset[int]
    used_in_subgraphs: frozenset[str]
    functions: Mapping[tuple[str, str], gs.Function] = field(default_factory=dict)
    #: where the matcher asks for a tensor's element type (None: the tensor's own ``dtype``)
    dtypes: DtypeLearner | None = None
    #: the op-type pre-check's answers, shared by every rule and anchor (see ``Matcher._skeleton``): per
    #: skeleton key, by ``id`` of the graph node or tensor (a dict per key: no key tuple per question)
    skeletons: dict[int, dict[int, bool]] = field(default_factory=dict)
    #: whether a constant holds a pattern's literal, by ``(id(tensor), ConstValue.literal_key)``
    literals: dict[tuple[int, tuple[Any, ...]], bool] = field(default_factory=dict)
    #: a node's attributes checked against alike pattern nodes, by ``(PNode.attribute_key, id(node))``
    attributes: dict[tuple[int, int], Any] = field(default_factory=dict)
    #: ``through_noop_casts`` of each tensor asked about, by ``id(tensor)``
    sources: dict[int, gs.Tensor] = field(default_factory=dict)
    #: one matcher per pattern for the attempts that explain nothing (``Matcher.on``)
    matchers: dict[PatternGraph, Matcher] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        graph: gs.Graph,
        functions: Mapping[tuple[str, str], gs.Function] | None = None,
        dtypes: DtypeLearner | None = None,
    ) -> GraphIndex:
        """Index ``graph``; ``functions`` are the model's local functions as ``(domain, name)``; ``dtypes``
        learns the element types matching needs (``replace`` gives one learner to every graph it indexes)."""
        by_op: dict[tuple[str, str], list[gs.Node]] = {}
        position: dict[int, int] = {}
        for i, node in enumerate(graph.nodes):
            by_op.setdefault(op_key(node), []).append(node)
            position[id(node)] = i
        used: set[str] = set()
        for node in graph.nodes:
            if not node.attrs:  # most nodes: nothing to look at, no list made
                continue
            for attr in node.attrs.values():
                for sub in attr if isinstance(attr, list) else (attr,):
                    if isinstance(sub, gs.Graph):
                        used.update(_names_read(sub))
        return cls(
            graph,
            by_op,
            position,
            frozenset(id(t) for t in graph.outputs),
            frozenset(used),
            dict(functions or {}),
            dtypes,
        )

    def external_use(self, tensor: gs.Tensor, inside: set[int]) -> str | None:
        """Why ``tensor`` is needed outside the nodes ``inside`` (ids), or None if it is not."""
        if id(tensor) in self.graph_outputs:
            return f"tensor '{tensor.name}' is a graph output"
        if tensor.name in self.used_in_subgraphs:
            return f"tensor '{tensor.name}' is read inside a subgraph"
        for consumer in tensor.outputs:
            if id(consumer) not in inside:
                return f"tensor '{tensor.name}' is also used by node '{label(consumer)}' outside the match"
        return None


def graphs_of(root: gs.Graph) -> list[gs.Graph]:
    """``[root, *root.subgraphs(recursive=True)]``, in that order, asking graphsurgeon only about the nodes
    that hold a graph (its walk sets up a queue and a set at every node: a tenth of a 10k-node replace, which
    needs the list three times)."""
    graphs = [root]
    for node in root.nodes:
        if node.attrs and any(isinstance(a, gs.Graph) for a in node.attrs.values()):
            graphs.extend(node.subgraphs(recursive=True))
    return graphs


def _names_read(graph: gs.Graph) -> set[str]:
    names = {t.name for node in graph.nodes for t in node.inputs}
    names.update(t.name for t in graph.outputs)
    for node in graph.nodes:
        for attr in node.attrs.values():
            for sub in attr if isinstance(attr, list) else [attr]:
                if isinstance(sub, gs.Graph):
                    names |= _names_read(sub)
    return names


@dataclass(frozen=True)
class MatchResult:
    """Outcome of a check: success, or the reason and the culprit node's name.

    Return ``MatchResult.success()`` or ``MatchResult.fail("why", node)`` from a pattern's ``check``.
    """

    ok: bool
    reason: str = ""
    culprit: str | None = None

    def __bool__(self) -> bool:
        return self.ok

    @classmethod
    def success(cls) -> MatchResult:
        # one shared instance (it is frozen): every check of every match returns it, often several times
        return _SUCCESS if cls is MatchResult else cls(True)

    @classmethod
    def fail(cls, reason: str, culprit: gs.Node | str | None = None) -> MatchResult:
        name = label(culprit) if isinstance(culprit, gs.Node) else culprit
        return cls(False, reason, name)


_SUCCESS = MatchResult(True)


@dataclass(frozen=True)
class Failure:
    """The deepest point a pattern reached from one anchor before it failed."""

    depth: int
    node: str | None
    reason: str


class Tracer:
    """Records the deepest failure of one match attempt."""

    def __init__(self) -> None:
        self.best: Failure | None = None

    def fail(self, depth: int, node: gs.Node | None, reason: str) -> None:
        if self.best is None or depth > self.best.depth:
            self.best = Failure(depth, label(node) if node is not None else None, reason)


class _NullTracer(Tracer):
    def fail(self, depth: int, node: gs.Node | None, reason: str) -> None:
        return None


NULL_TRACER: Tracer = _NullTracer()


#: Marks a key that was absent before a trail entry set it.
_ABSENT = object()


class Binding:
    """A partial match: pattern node -> graph node, argument -> tensor, captures.

    One binding per match attempt, changed in place as the search goes deeper; every change is recorded on a
    trail, and a branch that fails takes its changes back (:meth:`undo`). (A copy per step, the binding being
    immutable, was most of the matcher's time: the 7 rules that match each LayerNorm of a transformer made
    about 25 copies each.)
    """

    __slots__ = ("nodes", "used", "vars", "captures", "constants", "casts", "virtual", "_trail")

    def __init__(self) -> None:
        self.nodes: dict[int, gs.Node] = {}
        self.used: set[int] = set()
        self.vars: dict[str, gs.Tensor] = {}
        self.captures: dict[str, Any] = {}
        self.constants: list[gs.Tensor] = []
        #: no-op Casts the matcher looked through between pattern nodes; they are replaced with the match
        self.casts: list[gs.Node] = []
        #: pattern Casts the model does not need (its tensor has that dtype already) -> that tensor
        self.virtual: dict[int, gs.Tensor] = {}
        # (container, key, previous value) for a dict, (container, key, None) for a set, (list, None, None)
        self._trail: list[tuple[Any, Any, Any]] = []

    def mark(self) -> int:
        """Where the trail is now: :meth:`undo` with it takes back every later change."""
        return len(self._trail)

    def undo(self, mark: int) -> None:
        trail = self._trail
        while len(trail) > mark:
            container, key, previous = trail.pop()
            if type(container) is list:
                container.pop()
            elif type(container) is set:
                container.discard(key)
            elif previous is _ABSENT:
                del container[key]
            else:
                container[key] = previous

    def _set(self, mapping: dict[Any, Any], key: Any, value: Any) -> None:
        self._trail.append((mapping, key, mapping.get(key, _ABSENT)))
        mapping[key] = value

    def _use(self, node: gs.Node) -> None:
        key = id(node)
        if key not in self.used:  # set elsewhere: nothing to take back
            self.used.add(key)
            self._trail.append((self.used, key, None))

    def add_var(self, name: str, tensor: gs.Tensor) -> None:
        self._set(self.vars, name, tensor)

    def add_capture(self, name: str, value: Any) -> None:
        self._set(self.captures, name, value)

    def add_constant(self, tensor: gs.Tensor) -> None:
        self.constants.append(tensor)
        self._trail.append((self.constants, None, None))

    def add_cast(self, node: gs.Node) -> None:
        self._use(node)
        self.casts.append(node)
        self._trail.append((self.casts, None, None))

    def add_virtual(self, pnode: PNode, tensor: gs.Tensor) -> None:
        self._set(self.virtual, id(pnode), tensor)


def label(node: gs.Node) -> str:
    """A node's name, or ``Op(first output)`` for an unnamed node, for messages."""
    if node.name:
        return node.name
    return f"{node.op}({node.outputs[0].name})" if node.outputs else node.op


def producer(tensor: gs.Tensor) -> gs.Node | None:
    return tensor.inputs[0] if tensor.inputs else None


def elem_type_name(dtype: Any) -> str:
    """``FLOAT16``, ``BFLOAT16`` ... for messages; ``unknown dtype`` when unknown."""
    code = elem_type(dtype)
    return "unknown dtype" if code is None else onnx.TensorProto.DataType.Name(code)


def is_noop_cast(node: gs.Node | None) -> bool:
    """A ``Cast`` to the dtype its input is known to have already."""
    if node is None or node.op != "Cast" or op_key(node) != ("", "Cast") or not node.inputs:
        return False  # node.op first: most producers are not Casts, and op_key builds a tuple
    have = elem_type(node.inputs[0].dtype)
    return have is not None and have == node.attrs.get("to")


def through_noop_casts(tensor: gs.Tensor) -> gs.Tensor:
    """The tensor a chain of no-op Casts ending at ``tensor`` starts from (``tensor`` itself if none)."""
    while is_noop_cast(producer(tensor)):
        tensor = tensor.inputs[0].inputs[0]
    return tensor


def present(node: gs.Node, i: int) -> bool:
    return i < len(node.inputs) and bool(node.inputs[i].name)


def constant_value(tensor: gs.Tensor) -> np.ndarray | None:
    """The value of an initializer or of a ``Constant`` node's output; None for anything else."""
    if isinstance(tensor, gs.Constant):
        return np.asarray(tensor.values)
    node = producer(tensor)
    if node is None or op_key(node) != ("", "Constant"):
        return None
    for name, value in node.attrs.items():
        if name == "value" and isinstance(value, gs.Constant):
            return np.asarray(value.values)
        if name == "value_float":
            return np.asarray(value, dtype=np.float32)
        if name == "value_floats":
            return np.asarray(value, dtype=np.float32)
        if name in ("value_int", "value_ints"):
            return np.asarray(value, dtype=np.int64)
    return None


@functools.lru_cache(maxsize=512)
def schema_default(domain: str, op_type: str, name: str) -> Any:
    try:
        schema = onnx.defs.get_schema(op_type, domain)
    except onnx.defs.SchemaError:
        return None
    attr = schema.attributes.get(name)
    if attr is None or not attr.default_value.name:
        return None
    return onnx.helper.get_attribute_value(attr.default_value)


def _plain(value: Any) -> Any:
    """Attribute or constant value as plain Python (lists of numbers, numbers, strings)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, tuple):
        return list(value)
    return value


def _rank(tensor: gs.Tensor) -> int | None:
    shape = getattr(tensor, "shape", None)
    return len(shape) if shape is not None else None


def _same_value(name: str, want: Any, have: Any, rank: int | None) -> bool:
    want, have = _plain(want), _plain(have)
    if name == "axis" and isinstance(want, int) and isinstance(have, int) and want != have:
        return rank is not None and rank > 0 and want % rank == have % rank  # -1 is the last axis
    if name == "axes" and isinstance(want, list) and isinstance(have, list):
        if len(want) != len(have):
            return False
        if all(w == h for w, h in zip(want, have, strict=True)):
            return True
        if rank is None:
            return False
        return sorted(a % rank for a in want) == sorted(a % rank for a in have)
    if isinstance(want, float) or isinstance(have, float):
        try:
            return bool(
                np.allclose(
                    np.asarray(have, dtype=np.float64), np.asarray(want, dtype=np.float64), rtol=1e-6, atol=0
                )
            )
        except (TypeError, ValueError):
            return False
    return want == have


class Matcher:
    """Matches one traced pattern against anchors of one graph."""

    def __init__(
        self, pattern: PatternGraph, tracer: Tracer = NULL_TRACER, index: GraphIndex | None = None
    ) -> None:
        """``index``: the graph's index, whose dtype learner and pre-check answers the matcher uses."""
        self.pattern = pattern
        self.tracer = tracer
        self._outputs = [o.node for o in pattern.outputs]
        self._dtypes = None if index is None else index.dtypes
        self._literals: dict[tuple[int, tuple[Any, ...]], bool] = {} if index is None else index.literals
        self._attributes: dict[tuple[int, int], _Checked] = {} if index is None else index.attributes
        self._sources: dict[int, gs.Tensor] = {} if index is None else index.sources
        self._answers: dict[int, dict[int, bool]] = {} if index is None else index.skeletons
        #: the pre-check's plan from the pattern's anchor, with the answers of each skeleton key (made at the
        #: first pre-check)
        self._anchor_check: _NodeCheck | None = None

    @classmethod
    def on(cls, pattern: PatternGraph, index: GraphIndex) -> Matcher:
        """The matcher of ``pattern`` on ``index``'s graph without a tracer, made once per pattern and graph
        (it keeps nothing between matches)."""
        matcher = index.matchers.get(pattern)
        if matcher is None:
            matcher = index.matchers[pattern] = cls(pattern, index=index)
        return matcher

    def could_match(self, anchor: gs.Node) -> bool:
        """Whether the op types of ``anchor`` and its producers fit the pattern (no attributes, constants or
        bindings checked): False means :meth:`match` finds nothing there."""
        check = self._anchor_check
        if check is None:
            check = self._anchor_check = _checks_of(self.pattern, self._answers)
        fits = check.answers.get(id(anchor))  # asked before, by this rule or an alike one
        return self._skeleton(check, anchor) if fits is None else fits

    def match(self, anchor: gs.Node) -> Binding | None:
        """The first complete binding with ``anchor`` as the pattern's last node, or None."""
        if self.tracer is NULL_TRACER and not self.could_match(anchor):
            return None  # op types alone rule it out; the full matcher would fail too, only slower
        outputs = self.pattern.outputs

        def complete(binding: Binding) -> Binding | None:
            if all(id(o.node) in binding.nodes for o in outputs):  # outputs are real nodes
                return binding
            self.tracer.fail(len(binding.nodes), anchor, "some pattern outputs are not produced by the match")
            return None

        need = _FRAMES_PER_PATTERN_NODE * len(self.pattern.nodes) + sys.getrecursionlimit() // 2
        if need <= sys.getrecursionlimit():
            return self._node(self.pattern.anchor, anchor, Binding(), complete)
        # the search nests a few frames per pattern node (a continuation runs inside the step before it): a
        # pattern of hundreds of nodes gets the room it needs (Python-to-Python calls use no C stack)
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(need)
        try:
            return self._node(self.pattern.anchor, anchor, Binding(), complete)
        finally:
            sys.setrecursionlimit(limit)

    def _skeleton(self, check: _NodeCheck, node: gs.Node) -> bool:
        """Whether the op types of the producers fit the pattern (no bindings, attributes or constants)."""
        if node.op != check.op_type:
            return False
        domain = node.domain
        if (canonical_domain(domain) if domain else "") != check.domain:
            return False
        answers = check.answers  # alike pattern nodes of any rule share the answers
        fits = answers.get(id(node))
        if fits is None:
            answers[id(node)] = True  # provisional: a DAG pattern reaches a node twice
            inputs = node.inputs
            fits = False
            # loops, not any(all(...)), and each input's answer looked up here before a call: this runs for
            # every rule and anchor
            for needed, values in check.orders:
                if needed > len(inputs):
                    continue
                for i, value in values:
                    tensor = inputs[i]
                    ok = value.answers.get(id(tensor))
                    if ok is None:
                        ok = self._skeleton_value(value, tensor)
                    if not ok:
                        break
                else:
                    fits = True
                    break
            answers[id(node)] = fits
        return fits

    def _skeleton_value(self, check: _ValueCheck, tensor: gs.Tensor) -> bool:
        answers = check.answers
        fits = answers.get(id(tensor))
        if fits is None:
            source = tensor if check.direct else self._sources.get(id(tensor))  # _through's table, read here
            if source is None:
                source = self._through(tensor)
            fits = False
            if source.inputs:
                node = source.inputs[0]
                fits = check.node.answers.get(id(node))  # an answer is kept only for a node of that op
                if fits is None:
                    fits = self._skeleton(check.node, node)
            fits = fits or (
                # a pattern Cast the model may not need: its input stands where the Cast would be
                check.castlike
                and self._may_be_virtual(check.pnode, tensor)
                and (check.first is None or self._skeleton_value(check.first, tensor))
            )
            answers[id(tensor)] = fits
        return fits

    def _may_be_virtual(self, pn: PNode, tensor: gs.Tensor) -> bool:
        """A pattern Cast (not an output) to the dtype ``tensor`` has already: the model needs no node."""
        if pn.op_type != "Cast" or pn.domain or len(pn.inputs) != 1 or pn in self._outputs:
            return False
        have = self._elem_type(tensor)
        want = pn.attrs.get("to")
        return have is not None and (isinstance(want, Capture) or want == have)

    def _elem_type(self, tensor: gs.Tensor) -> int | None:
        return elem_type(tensor.dtype) if self._dtypes is None else self._dtypes.elem_type(tensor)

    def _through(self, tensor: gs.Tensor) -> gs.Tensor:
        """``through_noop_casts(tensor)``, remembered per graph (every rule asks it of the same tensors)."""
        source = self._sources.get(id(tensor))
        if source is None:
            source = self._sources[id(tensor)] = through_noop_casts(tensor)
        return source

    def _fail(self, binding: Binding, node: gs.Node | None, reason: str) -> None:
        self.tracer.fail(len(binding.nodes), node, reason)

    # The search below is depth first in continuation-passing style: each step gets ``then``, the rest of the
    # search, and returns the first complete binding or None. A step that returns None has taken back what
    # it added to the binding, so the caller tries its next branch on the binding it had. (Generators, one
    # per step, yielded the same bindings in the same order; resuming them was most of the matching time.)

    def _node(self, pn: PNode, node: gs.Node, b: Binding, then: _Then) -> Binding | None:
        domain = node.domain  # op_key(node) written out: this runs for every pattern node of every attempt
        if node.op != pn.op_type or (canonical_domain(domain) if domain else "") != pn.domain:
            key = op_key(node)
            want = f"{pn.domain}::{pn.op_type}" if pn.domain else pn.op_type
            self._fail(
                b,
                node,
                f"node '{label(node)}' is {key[0] + '::' if key[0] else ''}{key[1]}, pattern wants {want}",
            )
            return None
        if id(node) in b.used:
            self._fail(b, node, f"node '{label(node)}' would match two pattern nodes")
            return None
        if len(node.outputs) < pn.num_outputs:
            self._fail(
                b,
                node,
                f"node '{label(node)}' has {len(node.outputs)} outputs, pattern wants {pn.num_outputs}",
            )
            return None
        # the node bound to pn, each change on the trail (written out here: this runs for every pattern node
        # of every attempt; the node is not in b.used, asked above)
        trail, nodes, at = b._trail, b.nodes, id(pn)
        mark = len(trail)
        trail.append((nodes, at, nodes.get(at, _ABSENT)))
        nodes[at] = node
        b.used.add(id(node))
        trail.append((b.used, id(node), None))
        key = (pn.attribute_key, id(node))
        checked = self._attributes.get(key)
        if checked is None:  # alike pattern nodes of other rules check the same node's attributes alike
            checked = self._attributes[key] = _check_attributes(pn, node)
        steps, reason, actual = checked
        for tensor, capture, value in steps:
            if tensor is not None:
                b.add_constant(tensor)
            else:
                b.add_capture(capture, value)
        if reason is None:
            for order in pn.orders:
                found = self._inputs(order, 0, actual, b, then)
                if found is not None:
                    return found
        else:
            self._fail(b, node, reason)
        b.undo(mark)
        return None

    def _inputs(
        self,
        values: tuple[Value | None, ...],
        first: int,
        tensors: list[gs.Tensor | None],
        b: Binding,
        then: _Then,
    ) -> Binding | None:
        """Bind ``values[first:]`` to ``tensors[first:]``, then go on with ``then``."""
        # Leading inputs with at most one way to bind (absent, an argument, a constant) are bound here, in
        # order; the first node output is where the search may branch.
        mark = len(b._trail)
        last = len(values) - 1
        while first <= last and not isinstance(values[first], NodeOutput):
            if not self._bind_simple(values[first], tensors[first], b):
                b.undo(mark)
                return None
            first += 1
        if first > last:
            found = then(b)
        elif first == last:
            found = self._value(values[first], tensors[first], b, then)
        else:
            rest = first + 1
            found = self._value(
                values[first], tensors[first], b, lambda b: self._inputs(values, rest, tensors, b, then)
            )
        if found is None:
            b.undo(mark)
        return found

    def _bind_simple(self, pv: Value | None, tensor: gs.Tensor | None, b: Binding) -> bool:
        """Bind an input that binds one way or not at all (absent, an argument, a constant); False: no way
        (``b`` unchanged)."""
        if pv is None:
            if tensor is None:
                return True
            self._fail(
                b, producer(tensor), f"tensor '{tensor.name}' is present where the pattern wants no input"
            )
            return False
        if tensor is None:
            self._fail(b, None, "an input the pattern needs is absent")
            return False
        if isinstance(pv, Var):
            source = self._sources.get(id(tensor))  # the argument is what the no-op Casts read (_through)
            tensor = self._through(tensor) if source is None else source
            bound = b.vars.get(pv.name)
            if bound is None:
                b.add_var(pv.name, tensor)
                return True
            if bound is tensor:
                return True
            self._fail(
                b,
                producer(tensor),
                f"'{pv.name}' is '{label(bound)}' in one place and '{tensor.name}' in another",
            )
            return False
        return self._constant(pv, tensor, b)  # type: ignore[arg-type]

    def _value(self, pv: Value | None, tensor: gs.Tensor | None, b: Binding, then: _Then) -> Binding | None:
        mark = len(b._trail)
        if not isinstance(pv, NodeOutput) or tensor is None:
            if not self._bind_simple(pv, tensor, b):
                return None
            found = then(b)
            if found is None:
                b.undo(mark)
            return found
        virtual = b.virtual.get(id(pv.node))
        if virtual is not None:  # a Cast the model does not need, reached again through another path
            if virtual is tensor:
                return then(b)
            self._fail(b, producer(tensor), f"'{tensor.name}' and '{virtual.name}' would be one Cast's input")
            return None
        cast_wanted = pv.node.op_type == "Cast"
        if (
            cast_wanted
            and self._may_be_virtual(pv.node, tensor)
            and not (tensor.inputs and op_key(tensor.inputs[0]) == ("", "Cast"))
        ):
            return self._virtual_cast(pv.node, tensor, b, then)  # no Cast there: it would be a no-op
        # where to look for the node: past no-op Casts unless the pattern wants a Cast
        source = tensor if cast_wanted else self._sources.get(id(tensor))  # _through's table, read here
        if source is None:
            source = self._through(tensor)
        while tensor is not source:  # no-op Casts between two pattern nodes join the match
            cast = producer(tensor)
            if any(c is cast for c in b.casts):  # reached again through another pattern path
                tensor = cast.inputs[0]
                continue
            if id(cast) in b.used:
                self._fail(b, cast, f"node '{label(cast)}' would match two pattern nodes")
                b.undo(mark)
                return None
            b.add_cast(cast)
            tensor = cast.inputs[0]
        # pv's node as the producer of tensor (no-op Casts passed), then, where the pattern node is a Cast the
        # model may not need, none (written out here, not a call: this runs for every pattern node)
        node = tensor.inputs[0] if tensor.inputs else None
        if node is None:
            self._fail(
                b,
                None,
                f"tensor '{tensor.name}' is not computed by a node (the pattern wants {pv.node.op_type})",
            )
            b.undo(mark)
            return None
        if not (pv.index < len(node.outputs) and node.outputs[pv.index] is tensor):
            self._fail(b, node, f"tensor '{tensor.name}' is not output {pv.index} of node '{label(node)}'")
            b.undo(mark)
            return None
        bound = b.nodes.get(id(pv.node))
        if bound is not None:
            if bound is node:
                found = then(b)
            else:
                self._fail(
                    b,
                    node,
                    f"pattern node {pv.node.label} would be both '{label(bound)}' and '{label(node)}'",
                )
                found = None
        elif node.op != pv.node.op_type:  # cheap rejection before the checks of _node
            self._fail(b, node, _wrong_op(node, pv.node.op_type))
            found = None
        else:
            found = self._node(pv.node, node, b, then)
            if found is None and cast_wanted and self._may_be_virtual(pv.node, tensor):
                # the model's Cast, or none: its output is already that dtype
                found = self._virtual_cast(pv.node, tensor, b, then)
        if found is None:
            b.undo(mark)
        return found

    def _virtual_cast(self, pn: PNode, tensor: gs.Tensor, b: Binding, then: _Then) -> Binding | None:
        """The pattern Cast ``pn`` is a no-op here: it matches no node, its input is ``tensor`` itself."""
        mark = b.mark()
        want = pn.attrs.get("to")
        if isinstance(want, Capture):
            b.add_capture(want.name, self._elem_type(tensor))
        b.add_virtual(pn, tensor)
        found = self._value(pn.inputs[0], tensor, b, then)
        if found is None:
            b.undo(mark)
        return found

    def _constant(self, pv: ConstValue, tensor: gs.Tensor, b: Binding) -> bool:
        value = constant_value(tensor)
        if value is None:
            self._fail(b, producer(tensor), f"tensor '{tensor.name}' is not a constant")
            return False
        if pv.capture is not None:
            b.add_capture(pv.capture, value)
            b.add_constant(tensor)
            return True
        key = (id(tensor), pv.literal_key)
        holds = self._literals.get(key)
        if holds is None:  # rules alike in part test the same constant against the same literal
            holds = self._literals[key] = literal_matches(value, pv.value, pv.dtype)
        if not holds:
            shown = value.tolist() if value.size <= 4 else f"a {value.shape} tensor"
            want = pv.value.tolist() if isinstance(pv.value, np.ndarray) else pv.value
            self._fail(b, producer(tensor), f"constant '{tensor.name}' is {shown}, pattern wants {want}")
            return False
        b.add_constant(tensor)
        return True


#: The rest of a search: given the binding so far, the first complete binding, or None (``b`` as it was).
_Then = Callable[[Binding], "Binding | None"]


#: One small number per distinct pattern-node structure, as the op-type pre-check sees it (see skeleton_keys).
_SKELETON_KEYS: dict[tuple[Any, ...], int] = {}
_PATTERN_KEYS: weakref.WeakKeyDictionary[PatternGraph, dict[int, int]] = weakref.WeakKeyDictionary()


def skeleton_keys(pattern: PatternGraph) -> dict[int, int]:
    """``id(pattern node)`` -> a number equal for two pattern nodes (of any patterns) on which
    ``Matcher._skeleton`` gives the same answer at every graph node; the same for each node output the
    pattern reads (``Matcher._skeleton_value``, at every tensor).

    The pre-check reads a pattern node's op and, per input order, for each input that is a node output: that
    node's own key, and whether it is a Cast the model may leave out (its ``to``). So rules that share a tail
    (the variance of 30 LayerNorm variants) check it once per graph node, not once per rule.
    """
    keys = _PATTERN_KEYS.get(pattern)
    if keys is not None:
        return keys
    outputs = [o.node for o in pattern.outputs]
    keys = {}

    def key(pn: PNode) -> int:
        if id(pn) not in keys:
            orders = tuple(tuple(value(v) for v in order) for order in pn.orders)
            keys[id(pn)] = _SKELETON_KEYS.setdefault((pn.op_type, pn.domain, orders), len(_SKELETON_KEYS))
        return keys[id(pn)]

    def value(v: Value | None) -> int | None:
        if not isinstance(v, NodeOutput):
            return None
        if id(v) not in keys:
            pn = v.node
            virtual = pn.op_type == "Cast" and not pn.domain and len(pn.inputs) == 1 and pn not in outputs
            to = pn.attrs.get("to")
            shape = ("value", key(pn), virtual, "capture" if isinstance(to, Capture) else repr(to))
            keys[id(v)] = _SKELETON_KEYS.setdefault(shape, len(_SKELETON_KEYS))
        return keys[id(v)]

    for pn in pattern.nodes:
        key(pn)
    _PATTERN_KEYS[pattern] = keys
    return keys


class _NodeCheck:
    """What the op-type pre-check reads of one pattern node: its op and, per input order, the inputs a node
    needs and the node outputs among them to check (by input position); ``answers``: those of its skeleton
    key, by ``id`` of the graph node."""

    __slots__ = ("op_type", "domain", "answers", "orders")

    def __init__(self, pn: PNode, answers: dict[int, bool]) -> None:
        self.op_type, self.domain, self.answers = pn.op_type, pn.domain, answers
        self.orders: tuple[tuple[int, tuple[tuple[int, _ValueCheck], ...]], ...] = ()


class _ValueCheck:
    """What the pre-check reads of one node output a pattern node takes: its node's check, whether that node
    is looked up directly (a Cast) or past no-op Casts, and whether it is a Cast the model may leave out
    (the part of that question that does not depend on the graph; ``first``: the check of that Cast's input
    where it is a node output); ``answers``: those of its skeleton key, by ``id`` of the tensor."""

    __slots__ = ("answers", "node", "pnode", "direct", "castlike", "first")

    def __init__(self, answers: dict[int, bool], node: _NodeCheck, pnode: PNode, castlike: bool) -> None:
        self.answers, self.node, self.pnode, self.castlike = answers, node, pnode, castlike
        self.direct = pnode.op_type == "Cast"
        self.first: _ValueCheck | None = None


def _checks_of(pattern: PatternGraph, answers: dict[int, dict[int, bool]]) -> _NodeCheck:
    """The pre-check's plan of ``pattern`` with the answer tables of a graph (``GraphIndex.skeletons``): one
    check per pattern node and node output, linked as the pattern is; returns the anchor's."""
    keys = skeleton_keys(pattern)
    outputs = [o.node for o in pattern.outputs]
    nodes = {id(pn): _NodeCheck(pn, answers.setdefault(keys[id(pn)], {})) for pn in pattern.nodes}
    values: dict[int, _ValueCheck] = {}
    for pn in pattern.nodes:
        for order in pn.orders:
            for v in order:
                if isinstance(v, NodeOutput) and id(v) not in values:
                    node = v.node
                    castlike = node.op_type == "Cast" and not node.domain and len(node.inputs) == 1
                    values[id(v)] = _ValueCheck(
                        answers.setdefault(keys[id(v)], {}),
                        nodes[id(node)],
                        node,
                        castlike and node not in outputs,
                    )
    for pn in pattern.nodes:
        nodes[id(pn)].orders = tuple(
            (len(order), tuple((i, values[id(v)]) for i, v in enumerate(order) if isinstance(v, NodeOutput)))
            for order in pn.orders
        )
    for value in values.values():
        first = value.pnode.inputs[0] if value.castlike else None
        if isinstance(first, NodeOutput):
            value.first = values[id(first)]
    return nodes[id(pattern.anchor)]


#: What checking a node's attributes against a pattern node gives: in order, each constant input read
#: ``(tensor, None, None)`` and each capture ``(None, name, value)``; the first failure's reason (None: none);
#: the node's inputs as the pattern's inputs see them (None: absent).
_Checked = tuple[list[tuple[Any, Any, Any]], str | None, list[gs.Tensor | None]]


def _check_attributes(pn: PNode, node: gs.Node) -> _Checked:
    """``pn``'s attributes (or the constant inputs that stand for them) and inputs on ``node``, whose op is
    ``pn``'s. Depends on nothing else, so it is computed once per alike pattern node and graph node."""
    steps: list[tuple[Any, Any, Any]] = []
    table = pn.attribute_inputs
    domain, op = pn.domain, pn.op_type
    for name, want in pn.attrs.items():
        idx = table.get(name)
        if idx is not None and name not in node.attrs and idx >= len(pn.inputs):
            if not present(node, idx):
                return steps, f"node '{label(node)}' has no '{name}' (attribute or input {idx})", []
            tensor = node.inputs[idx]
            have = constant_value(tensor)
            if have is None:
                return (
                    steps,
                    f"'{name}' of node '{label(node)}' (input '{tensor.name}') is not a constant",
                    [],
                )
            steps.append((tensor, None, None))
        else:
            have = node.attrs.get(name, schema_default(domain, op, name))
            if have is None:
                return steps, f"node '{label(node)}' has no attribute '{name}'", []
        if isinstance(want, Capture):
            steps.append((None, want.name, have))
        elif not _same_value(name, want, have, _rank(node.inputs[0]) if node.inputs else None):
            return (
                steps,
                f"'{name}' of node '{label(node)}' is {_plain(have)!r}, pattern wants {_plain(want)!r}",
                [],
            )
    for name, idx in table.items():
        if name not in pn.attrs and idx >= len(pn.inputs) and (name in node.attrs or present(node, idx)):
            return steps, f"node '{label(node)}' sets '{name}', which the pattern leaves unset", []
    for i in range(pn.input_limit, len(node.inputs)):
        if present(node, i):
            return steps, f"node '{label(node)}' has an extra input {i} ('{node.inputs[i].name}')", []
    return steps, None, [node.inputs[i] if present(node, i) else None for i in range(len(pn.inputs))]


def _wrong_op(node: gs.Node, want: str) -> str:
    if op_key(node) == ("", "Cast"):
        was = elem_type_name(node.inputs[0].dtype if node.inputs else None)
        to_name = elem_type_name(node.attrs.get("to"))
        return (
            f"Cast node '{label(node)}' (to {to_name}, from {was}) sits where the pattern wants {want}; "
            f"only a Cast to the dtype its input already has is looked through"
        )
    return f"node '{label(node)}' is {node.op}, pattern wants {want}"


#: Relative tolerance of a float literal against a float32 (or wider) constant.
LITERAL_RTOL = 1e-6
#: Machine epsilon of the narrow float types, whose constants hold a literal only to that precision.
_NARROW_EPS = {"float16": float(np.finfo(np.float16).eps), "bfloat16": 2.0**-7}


def literal_tolerance(*dtypes: Any) -> float:
    """Relative tolerance between a literal and a constant: :data:`LITERAL_RTOL`, or the machine epsilon
    of the narrowest float dtype among ``dtypes`` (numpy dtypes, their names, onnx enums; None skipped)."""
    rtol = LITERAL_RTOL
    for dtype in dtypes:
        if dtype is None:
            continue
        name = elem_type_name(dtype).lower() if isinstance(dtype, (int, np.integer)) else str(dtype)
        rtol = max(rtol, _NARROW_EPS.get(name, LITERAL_RTOL))
    return rtol


def literal_matches(value: np.ndarray, want: Any, want_dtype: str | None = None) -> bool:
    """Whether constant ``value`` is the literal ``want``: a number (every element equal to it) or an array
    (the same values, leading 1-dims aside). Floats compare within :func:`literal_tolerance` of the two
    dtypes, integers exactly."""
    if value.size == 0 or value.size > MAX_LITERAL_ELEMENTS:
        return False
    target = np.asarray(want)
    if target.ndim:
        if _squeezed(value.shape) != _squeezed(target.shape):
            return False
        value, target = value.reshape(target.shape), target
    if value.dtype.kind in "fc" or target.dtype.kind in "fc":
        rtol = literal_tolerance(value.dtype, want_dtype)
        try:
            return bool(np.allclose(value.astype(np.float64), target.astype(np.float64), rtol=rtol, atol=0))
        except (TypeError, ValueError):
            return False
    return bool(np.all(value == target))


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    dims = list(shape)
    while dims and dims[0] == 1:
        dims.pop(0)
    return tuple(dims)
