"""Rewrite rules: a pattern, a check and a rewrite into one plugin node.

Three kinds, all with the same interface (``anchor``, ``find``, ``rewrite``):

* :class:`GraphPattern` - a multi-node pattern written as a Python function (see
  ``gskit.passes.patterns.dsl``).
* :class:`OpPattern` - one node identified by ``(domain, op_type)``, e.g. ``DeformConv`` or
  ``com.microsoft::GridSample``.
* :class:`FunctionPattern` - calls of a model-local function (``torch.onnx.export(...,
  export_modules_as_functions=...)``); the function is removed once no call is left.

A ``check`` is ``check(match) -> MatchResult``; a rewrite gives the plugin's inputs (in the spec's
order, None for an absent optional input) and attribute values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs

from gskit.errors import PluginError
from gskit.passes.patterns.dsl import PatternGraph, trace
from gskit.passes.patterns.match import (
    NULL_TRACER,
    GraphIndex,
    Matcher,
    MatchResult,
    Tracer,
    label,
    op_key,
    present,
    schema_default,
)


@dataclass(frozen=True, eq=False)
class Match:
    """One instance of a pattern in a graph.

    Attributes:
        rule: the rule that matched.
        graph: the graph (main graph or an If/Loop body) holding the nodes.
        anchor: the node the match started from (the pattern's last node).
        nodes: the matched nodes, which the plugin node replaces.
        inputs: pattern argument name -> bound tensor (for single-node rules: ``"0"``, ``"1"``, ...).
        outputs: the boundary outputs, which keep their names.
        captures: constants and attribute values recorded by ``op.capture(name)``.
        constants: constant tensors read by the match (initializers or Constant-node outputs).
        function: for a FunctionPattern, the called local function (its body can be checked).
    """

    rule: Rule
    graph: gs.Graph
    anchor: gs.Node
    nodes: tuple[gs.Node, ...]
    inputs: Mapping[str, gs.Tensor]
    outputs: tuple[gs.Tensor, ...]
    captures: Mapping[str, Any] = field(default_factory=dict)
    constants: tuple[gs.Tensor, ...] = ()
    function: gs.Function | None = None

    def scalar(self, name: str) -> float | int:
        """A captured constant or attribute with exactly one element, as a Python number.

        Raises:
            PluginError: nothing was captured under ``name``, or it has more than one element.
        """
        if name not in self.captures:
            raise PluginError(f"pattern '{self.rule.name}' captured no '{name}'")
        value = np.asarray(self.captures[name])
        if value.size != 1:
            raise PluginError(
                f"pattern '{self.rule.name}': capture '{name}' has {value.size} elements, not 1"
            )
        return value.reshape(()).item()


@dataclass(frozen=True)
class Rewrite:
    """What the plugin node gets: inputs in the spec's order (None = absent) and attribute values.

    ``output_shapes``: for each plugin output, None, or the constant shape (a ``Reshape`` target, ``0`` copies
    a dim) that turns the plugin's output into the match's, when the two layouts differ (multi-scale
    deformable attention gives ``[N, Lq, M, D]`` where the model has ``[N, Lq, M * D]``).
    """

    inputs: tuple[gs.Tensor | None, ...]
    attrs: dict[str, Any]
    output_shapes: tuple[np.ndarray | None, ...] = ()


CheckFn = Callable[[Match], "MatchResult | bool"]
AttrsFn = Callable[[Match], Mapping[str, Any]]
#: Where a plugin input comes from in an OpPattern: a node input index, None (absent), or a new constant.
InputSource = int | None | np.ndarray


class Rule:
    """Base of the three rule kinds."""

    name: str
    anchor: tuple[str, str]
    check: CheckFn | None
    #: ``(domain, op_type)`` of ops the rule's instances are made of, whose nodes left after replacement the
    #: report lists (an instance the rule did not recognise), e.g. GridSample for deformable attention
    watches: tuple[tuple[str, str], ...] = ()
    #: ``(domain, op_type)`` of ops around which the rule reads tensor shapes: replace infers shapes first
    #: when a node of one of them has an input of unknown shape (TorchScript exports record none)
    needs_shapes_of: tuple[tuple[str, str], ...] = ()

    def find(self, node: gs.Node, index: GraphIndex, tracer: Tracer = NULL_TRACER) -> Match | None:
        raise NotImplementedError

    def rewrite(self, match: Match) -> Rewrite:
        raise NotImplementedError

    def ops(self) -> set[tuple[str, str]]:
        """``(domain, op_type)`` of every op the rule names (checked when the plugin loads)."""
        return {self.anchor}

    @property
    def size(self) -> int:
        """Nodes of the pattern (1 for a single op or a function call)."""
        return 1

    def validate(self, match: Match, index: GraphIndex) -> MatchResult:
        """Boundary rules, then the rule's own check.

        An interior tensor (output of a matched node that is not a pattern output) must not be a
        graph output, be read by a node outside the match, or be read inside a subgraph.
        """
        inside = {id(n) for n in match.nodes}
        boundary = {id(t) for t in match.outputs}
        for node in match.nodes:
            for tensor in node.outputs:
                if id(tensor) in boundary:
                    continue
                why = index.external_use(tensor, inside)
                if why:
                    return MatchResult.fail(f"interior {why}", node)
        for name, tensor in match.inputs.items():
            if tensor.inputs and id(tensor.inputs[0]) in inside:
                return MatchResult.fail(f"input '{name}' is computed inside the match", tensor.inputs[0])
        return run_check(self.check, match)


def run_check(check: CheckFn | None, match: Match) -> MatchResult:
    """A rule's ``check`` on a match, as a MatchResult (a check may return a bool)."""
    if check is None:
        return MatchResult.success()
    result = check(match)
    if isinstance(result, MatchResult):
        return result
    return (
        MatchResult.success()
        if result
        else MatchResult.fail(f"check of '{match.rule.name}' failed", match.anchor)
    )


class GraphPattern(Rule):
    """A multi-node pattern written as a function ``fn(op, *arguments)``.

    Args:
        fn: the pattern function (see ``gskit.passes.patterns.dsl``).
        inputs: the plugin's inputs as argument names in the spec's order (None for an absent optional
            input); defaults to the function's arguments in order.
        attrs: plugin attribute -> capture name (the captured value, scalars unwrapped), or a function
            of the match returning the attribute dict.
        check: extra conditions on the match, ``check(match) -> MatchResult``.
        name: shown in reports; defaults to the function's name.

    Raises:
        PluginError: the pattern function is malformed (see ``dsl.trace``).
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        inputs: Sequence[str | None] | None = None,
        attrs: Mapping[str, str] | AttrsFn | None = None,
        check: CheckFn | None = None,
        name: str | None = None,
    ) -> None:
        self.graph: PatternGraph = trace(fn)
        self.name = name or self.graph.name
        self.inputs = tuple(inputs) if inputs is not None else tuple(v.name for v in self.graph.inputs)
        known = {v.name for v in self.graph.inputs}
        unknown = [n for n in self.inputs if n is not None and n not in known]
        if unknown:
            raise PluginError(
                f"pattern '{self.name}': inputs {unknown} are not arguments of the pattern function"
            )
        self.attrs = attrs
        self.check = check
        self.anchor = (self.graph.anchor.domain, self.graph.anchor.op_type)

    def __repr__(self) -> str:
        return f"GraphPattern({self.name!r}, {len(self.graph.nodes)} nodes)"

    def ops(self) -> set[tuple[str, str]]:
        return {(n.domain, n.op_type) for n in self.graph.nodes}

    @property
    def size(self) -> int:
        return len(self.graph.nodes)

    def find(self, node: gs.Node, index: GraphIndex, tracer: Tracer = NULL_TRACER) -> Match | None:
        if tracer is NULL_TRACER:
            binding = Matcher.on(self.graph, index).match(node)
        else:
            binding = Matcher(self.graph, tracer, index).match(node)
        if binding is None:
            return None
        # pattern Casts the model does not need (binding.virtual) have no node to replace
        nodes = (*(binding.nodes[id(p)] for p in self.graph.nodes if id(p) in binding.nodes), *binding.casts)
        outputs = tuple(binding.nodes[id(o.node)].outputs[o.index] for o in self.graph.outputs)
        return Match(
            self,
            index.graph,
            node,
            nodes,
            dict(binding.vars),
            outputs,
            dict(binding.captures),
            tuple(binding.constants),
        )

    def rewrite(self, match: Match) -> Rewrite:
        inputs = tuple(match.inputs[n] if n is not None else None for n in self.inputs)
        if callable(self.attrs):
            attrs = dict(self.attrs(match))
        else:
            attrs = {key: _attribute_value(match, capture) for key, capture in (self.attrs or {}).items()}
        return Rewrite(inputs, attrs)


def _attribute_value(match: Match, capture: str) -> Any:
    if capture not in match.captures:
        raise PluginError(f"pattern '{match.rule.name}' captured no '{capture}'")
    value = match.captures[capture]
    array = np.asarray(value)
    if array.dtype.kind in "biuf" and array.size == 1:
        return array.reshape(()).item()
    return array.tolist() if isinstance(value, np.ndarray) else value


class OpPattern(Rule):
    """One node of ``(domain, op_type)`` (domain explicit; ``""`` is ONNX).

    Args:
        op_type: the node's op type.
        domain: the node's domain.
        inputs: node input indices in the plugin's order (None or an index past the node's inputs:
            absent; a numpy array: a new constant input, e.g. a neutral value for an absent optional
            input that a later input follows), or a function of the match returning them; defaults to
            all the node's inputs in order.
        attrs: plugin attribute -> node attribute name (missing ones take the ONNX schema default, else
            the plugin's default), or a function of the match returning the attribute dict.
        check: extra conditions, ``check(match) -> MatchResult``; ``match.anchor`` is the node.
        name: shown in reports.
    """

    def __init__(
        self,
        op_type: str,
        domain: str = "",
        *,
        inputs: Sequence[InputSource] | Callable[[Match], Sequence[InputSource]] | None = None,
        attrs: Mapping[str, str] | AttrsFn | None = None,
        check: CheckFn | None = None,
        name: str | None = None,
    ) -> None:
        self.anchor = (domain, op_type)
        self.name = name or (f"{domain}::{op_type}" if domain else op_type)
        self.inputs = inputs if inputs is None or callable(inputs) else tuple(inputs)
        self.attrs = attrs
        self.check = check

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def find(self, node: gs.Node, index: GraphIndex, tracer: Tracer = NULL_TRACER) -> Match | None:
        if op_key(node) != self.anchor:
            tracer.fail(0, node, f"node '{label(node)}' is not {self.name}")
            return None
        inputs = {str(i): t for i, t in enumerate(node.inputs) if t.name}
        return Match(self, index.graph, node, (node,), inputs, tuple(node.outputs), dict(node.attrs))

    def rewrite(self, match: Match) -> Rewrite:
        node = match.anchor
        if callable(self.inputs):
            order: Sequence[int | None] = self.inputs(match)
        else:
            order = self.inputs if self.inputs is not None else range(len(node.inputs))
        inputs = tuple(_rewrite_input(node, position, i) for position, i in enumerate(order))
        if callable(self.attrs):
            attrs = dict(self.attrs(match))
        else:
            attrs = {}
            for key, source in (self.attrs or {}).items():
                value = node.attrs.get(source, schema_default(self.anchor[0], self.anchor[1], source))
                if value is not None:
                    attrs[key] = value
        return Rewrite(inputs, attrs)


def _rewrite_input(node: gs.Node, position: int, source: int | None | np.ndarray) -> gs.Tensor | None:
    if isinstance(source, np.ndarray):
        # Named after the node's first output, which is unique in its graph.
        return gs.Constant(f"{node.outputs[0].name}__input{position}", source)
    return node.inputs[source] if source is not None and present(node, source) else None


class FunctionPattern(OpPattern):
    """Calls of the model-local function ``domain::function``; attrs map plugin attribute -> call attr."""

    def __init__(
        self,
        function: str,
        domain: str,
        *,
        inputs: Sequence[InputSource] | Callable[[Match], Sequence[InputSource]] | None = None,
        attrs: Mapping[str, str] | AttrsFn | None = None,
        check: CheckFn | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(
            function,
            domain,
            inputs=inputs,
            attrs=attrs,
            check=check,
            name=name or f"function {domain}::{function}",
        )

    def ops(self) -> set[tuple[str, str]]:
        return set()  # a model-local function, not an op

    def find(self, node: gs.Node, index: GraphIndex, tracer: Tracer = NULL_TRACER) -> Match | None:
        function = index.functions.get(self.anchor)
        if function is None:
            tracer.fail(0, node, f"the model has no local function {self.anchor[0]}::{self.anchor[1]}")
            return None
        match = super().find(node, index, tracer)
        return None if match is None else dataclasses.replace(match, function=function)
