"""Which rules to try at which node: rules indexed by anchor op and by what feeds the anchor.

Trying every rule at every node of its anchor op costs rules x nodes: a plugin set has 50-90 rules, most
anchored at ``Add`` or ``Mul``, and a transformer has thousands of those. Most attempts fail at once, on the
op types of the anchor's producers. So each node of an anchor op is looked at once: its *signature* (the op
of each input's producer, directly and past no-op Casts, and the same of those producers: :data:`DEPTH`
levels) picks the rules whose pattern fits it that far, a list computed once per distinct signature. Each of
those rules then runs the matcher's op-type pre-check (``Matcher.could_match``), whose answers are shared by
alike parts of all rules (the variance of 30 LayerNorm variants is checked once per node); only where it
passes does ``replace`` try the rule.

Both filters only remove attempts that would fail (the signature is the first levels of the pre-check, and
``Matcher.match`` runs the pre-check first itself), so the matches, their order and the report are those of
trying every rule at every node. Rules other than plain :class:`GraphPattern` (an ``OpPattern``, a custom
``Rule``, a subclass with its own ``find``) are tried at every node of their anchor op, as before; so is every
rule when failures are explained (``explain`` reports each attempt).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import onnx_graphsurgeon as gs

from gskit.passes.patterns.dsl import NodeOutput, PNode, Value
from gskit.passes.patterns.match import GraphIndex, Matcher, op_key, producer, through_noop_casts
from gskit.passes.patterns.rules import GraphPattern, Rule

#: How many levels of producers a node's signature describes.
DEPTH = 1

#: Per input of a node: the op of its producer, that of the producer past no-op Casts (None: no producer), and
#: the signatures of those two producers one level less deep (None at the last level).
Signature = tuple[tuple[Any, ...], ...]


@dataclass(frozen=True)
class _Wants:
    """What a pattern node wants of one input's producer: ``op``, looked up directly (a pattern Cast) or past
    no-op Casts (any other op), and what that producer's pattern node wants of its own producers (None: not
    looked at, at the last level)."""

    op: tuple[str, str]
    direct: bool
    then: _Orders | None


#: Per input order of a pattern node, per input: what it wants of the producer (None: anything).
_Orders = tuple[tuple[_Wants | None, ...], ...]


class RuleIndex:
    """The rules of one ``replace`` call, by anchor op, with what each wants of its anchor's producers.

    Args:
        rules: every rule, in the order they are tried (their positions are the ids :meth:`anchors` uses).
    """

    def __init__(self, rules: Sequence[Rule]) -> None:
        self._rules = list(rules)
        self._wants: dict[int, _Orders | None] = {
            i: _anchor_wants(rule) for i, rule in enumerate(self._rules)
        }
        self._by_anchor: dict[tuple[str, str], list[int]] = {}
        for i, rule in enumerate(self._rules):
            self._by_anchor.setdefault(tuple(rule.anchor), []).append(i)
        self._fits: dict[tuple[tuple[str, str], Signature], list[int]] = {}

    def anchors(self, index: GraphIndex, *, every: bool = False) -> list[list[gs.Node]]:
        """Per rule (in the given order), the nodes of ``index``'s graph to try it at, in graph order.

        ``every``: every node of the rule's anchor op (to explain each failed attempt).
        """
        result: list[list[gs.Node]] = [[] for _ in self._rules]
        signatures: dict[tuple[int, int], Signature] = {}
        for key, ids in self._by_anchor.items():
            nodes = index.by_op.get(key, [])
            if not nodes:
                continue
            if every:
                for i in ids:
                    result[i] = list(nodes)
                continue
            # per rule, the matcher's own op-type pre-check, whose answers every rule shares (index.skeletons)
            checks = {
                i: Matcher.on(self._rules[i].graph, index)  # type: ignore[attr-defined]
                for i in ids
                if self._wants[i] is not None
            }
            for node in nodes:
                signature = _signature(node, DEPTH, signatures)
                fits = self._fits.get((key, signature))
                if fits is None:
                    fits = [i for i in ids if _fits(self._wants[i], signature)]
                    self._fits[(key, signature)] = fits
                for i in fits:
                    if i not in checks or checks[i].could_match(node):
                        result[i].append(node)
        return result


def _signature(node: gs.Node, depth: int, memo: dict[tuple[int, int], Signature]) -> Signature:
    key = (id(node), depth)
    known = memo.get(key)
    if known is not None:
        return known
    parts = []
    for tensor in node.inputs:
        direct = producer(tensor)
        source = producer(through_noop_casts(tensor))
        parts.append(
            (
                op_key(direct) if direct is not None else None,
                op_key(source) if source is not None else None,
                _signature(direct, depth - 1, memo) if direct is not None and depth > 1 else None,
                _signature(source, depth - 1, memo) if source is not None and depth > 1 else None,
            )
        )
    memo[key] = signature = tuple(parts)
    return signature


def _fits(orders: _Orders | None, signature: Signature) -> bool:
    """Whether a node of ``signature`` passes the first levels of the matcher's op-type pre-check."""
    if orders is None:
        return True
    for order in orders:
        if len(order) > len(signature):
            continue
        for i, w in enumerate(order):
            if w is None:
                continue
            where = 0 if w.direct else 1
            if signature[i][where] != w.op or (
                w.then is not None and not _fits(w.then, signature[i][where + 2])
            ):
                break
        else:
            return True
    return False


def _anchor_wants(rule: Rule) -> _Orders | None:
    """What ``rule``'s anchor pattern node wants of its producers; None: try the rule at every anchor."""
    if not isinstance(rule, GraphPattern) or type(rule).find is not GraphPattern.find:
        return None
    pattern = rule.graph
    outputs = [o.node for o in pattern.outputs]
    return _orders(pattern.anchor, outputs, DEPTH)


def _orders(pn: PNode, outputs: list[PNode], depth: int) -> _Orders:
    return tuple(tuple(_wants(v, outputs, depth) for v in order) for order in pn.orders)


def _wants(value: Value | None, outputs: list[PNode], depth: int) -> _Wants | None:
    if not isinstance(value, NodeOutput):
        return None
    pn = value.node
    if pn.op_type == "Cast" and not pn.domain and len(pn.inputs) == 1 and pn not in outputs:
        return None  # a Cast the model may not need (the matcher's virtual Cast): decided by the matcher
    then = _orders(pn, outputs, depth - 1) if depth > 1 else None
    return _Wants((pn.domain, pn.op_type), pn.op_type == "Cast", then)
