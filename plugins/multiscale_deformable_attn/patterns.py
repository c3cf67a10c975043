"""What MultiscaleDeformableAttnPlugin_TRT replaces: multi-scale deformable attention in its grid-sample form.

transformers' ``MultiScaleDeformableAttention`` (Deformable DETR, RT-DETR; the PyTorch path, which is what the
exporters see) computes, for ``value [B, S, M, D]``, ``sampling_locations [B, Lq, M, L, P, 2]`` and
``attention_weights [B, Lq, M, L, P]``::

    grids = 2 * sampling_locations - 1
    per level l:  v_l = value.split(sizes)[l].flatten(2).transpose(1, 2).reshape(B * M, D, H_l, W_l)
                  g_l = grids[:, :, :, l].transpose(1, 2).flatten(0, 1)              # [B * M, Lq, P, 2]
                  s_l = grid_sample(v_l, g_l, bilinear, zeros, align_corners=False)  # [B * M, D, Lq, P]
    w = attention_weights.transpose(1, 2).reshape(B * M, 1, Lq, L * P)
    out = (stack(s_l, -2).flatten(-2) * w).sum(-1).view(B, M * D, Lq).transpose(1, 2)  # [B, Lq, M * D]

Both exporters write that as ``Split``, ``Mul``/``Sub``, per level ``Reshape``/``Transpose``/``Reshape``,
``Gather(axis=3)``/``Transpose``/``Reshape`` and ``GridSample``, then ``Unsqueeze``/``Concat``/``Reshape``,
the weights' ``Transpose``/``Reshape``, ``Mul``, ``ReduceSum`` and ``Reshape``/``Transpose``; TorchScript adds
``Shape``/``Slice``/``Concat`` computations of the reshape targets, which join the match. :class:`MsdaPattern`
walks that graph back from the last ``Transpose`` for any number of levels, and the plugin node takes the
function's own inputs (no reshape needed: they already have the plugin's layout), the level sizes and starts
as int32 constants, and gives ``[B, Lq, M, D]``, reshaped to ``[B, Lq, M * D]``. The level sizes must be
constants in the graph (a fixed input size, as DETR exports are).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs

from gskit.passes.patterns import GraphIndex, Match, Rewrite, Rule, Tracer, constant_value
from gskit.passes.patterns.match import (
    NULL_TRACER,
    elem_type,
    elem_type_name,
    label,
    op_key,
    through_noop_casts,
)

#: Ops that compute reshape targets from shapes (TorchScript's dynamic-shape arithmetic).
SHAPE_OPS = frozenset(
    {"Shape", "Slice", "Concat", "Gather", "Unsqueeze", "Squeeze", "Cast", "Constant", "Mul"}
)


class _NoMatch(Exception):
    """One step of the walk failed: the node and the reason (for ``--explain``)."""

    def __init__(self, node: gs.Node | None, reason: str) -> None:
        super().__init__(reason)
        self.node, self.reason = node, reason


@dataclass
class _Walk:
    """The nodes met so far and what they say."""

    nodes: list[gs.Node]
    reshapes: list[gs.Node]
    #: the first row of each level's Slice, where the values are sliced rather than split
    slices: list[int] = field(default_factory=list)

    def take(self, tensor: gs.Tensor, op: str, **attrs: Any) -> gs.Node:
        """The producer of ``tensor``, which must be ``op`` with these attribute values."""
        node = tensor.inputs[0] if tensor.inputs else None
        if node is None or op_key(node) != ("", op):
            found = f"{node.op}" if node is not None else "a graph input or constant"
            raise _NoMatch(node, f"tensor '{tensor.name}' comes from {found}, the pattern wants {op}")
        for name, want in attrs.items():
            have = node.attrs.get(name)
            if isinstance(want, (list, tuple)):
                ok = have is not None and list(have) == list(want)
            elif isinstance(want, set):
                ok = _text(have) in want
            else:
                ok = have == want
            if not ok:
                raise _NoMatch(
                    node, f"'{name}' of node '{label(node)}' is {have!r}, the pattern wants {want!r}"
                )
        if node not in self.nodes:
            self.nodes.append(node)
        if op == "Reshape":
            self.reshapes.append(node)
        return node


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def _int_constant(tensor: gs.Tensor) -> list[int] | None:
    value = constant_value(tensor)
    return None if value is None else [int(v) for v in np.asarray(value).reshape(-1)]


class MsdaPattern(Rule):
    """Multi-scale deformable attention as transformers writes it in PyTorch (see the module docstring)."""

    name = "multi_scale_deformable_attention (grid_sample form)"
    anchor = ("", "Transpose")
    check = None
    watches = (("", "GridSample"),)
    needs_shapes_of = (("", "GridSample"),)

    def __repr__(self) -> str:
        return f"MsdaPattern({self.name!r})"

    def ops(self) -> set[tuple[str, str]]:
        """The ONNX ops the walk reads (checked when the plugin loads)."""
        names = ("Transpose", "Reshape", "ReduceSum", "Mul", "Concat", "Unsqueeze", "GridSample", "Gather")
        return {("", op) for op in (*names, "Split", "Slice", "Sub")}

    @property
    def size(self) -> int:
        """Nodes of one level's branch and the shared tail, the smallest instance (one level)."""
        return 16

    def find(self, node: gs.Node, index: GraphIndex, tracer: Tracer = NULL_TRACER) -> Match | None:
        walk = _Walk([node], [])
        try:
            found = self._walk(node, walk)
        except _NoMatch as miss:
            tracer.fail(len(walk.nodes), miss.node, miss.reason)
            return None
        nodes = _exclusive([*walk.nodes, *_shape_cones(walk)], node, index)
        return Match(self, index.graph, node, tuple(nodes), found.pop("inputs"), (node.outputs[0],), found)

    def _walk(self, last: gs.Node, walk: _Walk) -> dict[str, Any]:
        if list(last.attrs.get("perm", [])) != [0, 2, 1]:
            raise _NoMatch(last, f"node '{label(last)}' is not Transpose(perm=[0, 2, 1])")
        heads_out = walk.take(last.inputs[0], "Reshape")
        total = walk.take(heads_out.inputs[0], "ReduceSum", keepdims=0)
        axes = total.attrs.get("axes") or (_int_constant(total.inputs[1]) if len(total.inputs) > 1 else None)
        if axes not in ([-1], [3]):
            raise _NoMatch(total, f"node '{label(total)}' sums over axes {axes}, the pattern wants the last")
        product = walk.take(total.inputs[0], "Mul")
        samples = weights = None
        for first, second in ((0, 1), (1, 0)):
            source = product.inputs[first].inputs[0] if product.inputs[first].inputs else None
            if source is not None and op_key(source) == ("", "Reshape"):
                inner = source.inputs[0].inputs[0] if source.inputs[0].inputs else None
                if inner is not None and op_key(inner) == ("", "Concat"):
                    samples, weights = product.inputs[first], product.inputs[second]
                    break
        if samples is None:
            raise _NoMatch(product, f"node '{label(product)}' does not multiply stacked samples by weights")
        stacked = walk.take(walk.take(samples, "Reshape").inputs[0], "Concat")
        weight_moved = walk.take(walk.take(weights, "Reshape").inputs[0], "Transpose", perm=[0, 2, 1, 3, 4])
        levels: list[tuple[int, int]] = []
        sizes: list[int | None] = []
        grid = value = None
        for level, tensor in enumerate(stacked.inputs):
            unsqueeze = walk.take(tensor, "Unsqueeze")
            sampler = walk.take(
                unsqueeze.inputs[0],
                "GridSample",
                mode={"bilinear", "linear"},
                padding_mode={"zeros"},
                align_corners=0,
            )
            height, width, split_out = self._level_value(sampler.inputs[0], walk)
            level_grid = self._level_grid(sampler.inputs[1], level, walk)
            grid = level_grid if grid is None else grid
            if level_grid is not grid:
                raise _NoMatch(sampler, f"level {level} samples another grid than level 0")
            part, rows = self._level_rows(split_out, level, walk)
            value = part if value is None else value
            if part is not value:
                raise _NoMatch(split_out.inputs[0], f"level {level}'s values are not part of the same values")
            levels.append((height, width))
            sizes.append(rows)
        if any(rows is not None for rows in sizes) and sizes != [h * w for h, w in levels]:
            raise _NoMatch(stacked, f"the values' parts {sizes} are not the levels' sizes {levels}")
        starts = [sum(h * w for h, w in levels[:i]) for i in range(len(levels))]
        if walk.slices and walk.slices != starts:
            raise _NoMatch(stacked, f"the levels' values start at rows {walk.slices}, not {starts}")
        centered = walk.take(grid, "Sub")
        if _int_constant(centered.inputs[1]) != [1]:
            raise _NoMatch(
                centered, f"node '{label(centered)}' does not subtract 1 (grid = 2 * location - 1)"
            )
        doubled = walk.take(centered.inputs[0], "Mul")
        factors = [_int_constant(t) for t in doubled.inputs]
        if [2] not in factors:
            raise _NoMatch(doubled, f"node '{label(doubled)}' does not double the sampling locations")
        locations = doubled.inputs[1 - factors.index([2])]
        kinds = elem_type(value.dtype), elem_type(locations.dtype)
        if None not in kinds and kinds[0] != kinds[1]:
            raise _NoMatch(
                doubled,
                f"the sampling locations are {elem_type_name(locations.dtype)} and the values "
                f"{elem_type_name(value.dtype)}; the plugin takes one float type for both",
            )
        inputs = {
            "value": through_noop_casts(value),
            "sampling_locations": locations,
            "attention_weights": weight_moved.inputs[0],
        }
        return {"inputs": inputs, "levels": levels}

    @staticmethod
    def _level_value(tensor: gs.Tensor, walk: _Walk) -> tuple[int, int, gs.Tensor]:
        """``split_l.flatten(2).transpose(1, 2).reshape(B * M, D, H, W)``: (H, W) and ``split_l``."""
        maps = walk.take(tensor, "Reshape")
        target = _int_constant(maps.inputs[1])
        shape = maps.outputs[0].shape
        if target is not None and len(target) == 4 and target[2] > 0 and target[3] > 0:
            height, width = target[2], target[3]
        elif shape is not None and len(shape) == 4 and all(isinstance(d, int) for d in shape[2:]):
            height, width = shape[2], shape[3]
        else:
            raise _NoMatch(
                maps, f"the level size of node '{label(maps)}' is not a constant (a dynamic input size)"
            )
        moved = walk.take(maps.inputs[0], "Transpose", perm=[0, 2, 1])
        flat = walk.take(moved.inputs[0], "Reshape")
        return height, width, flat.inputs[0]

    @staticmethod
    def _level_rows(part: gs.Tensor, level: int, walk: _Walk) -> tuple[gs.Tensor, int | None]:
        """The values and the rows of level ``level``: output ``level`` of a ``Split(axis=1)`` (the dynamo
        exporter, TorchScript on a constant size list) or a ``Slice`` of axis 1 (TorchScript on sizes it
        computed), checked to follow the previous level's rows."""
        node = part.inputs[0] if part.inputs else None
        if node is not None and op_key(node) == ("", "Slice"):
            walk.take(part, "Slice")
            starts, ends = (_int_constant(t) for t in node.inputs[1:3])
            axes = _int_constant(node.inputs[3]) if len(node.inputs) > 3 else [0]
            if starts is None or ends is None or axes != [1] or len(starts) != 1:
                raise _NoMatch(node, f"node '{label(node)}' is not a Slice of constant rows of axis 1")
            walk.slices.append(starts[0])
            return node.inputs[0], ends[0] - starts[0]
        split = walk.take(part, "Split", axis=1)
        if list(split.outputs).index(part) != level:
            raise _NoMatch(split, f"level {level}'s values are not part {level} of the Split of the values")
        sizes = _int_constant(split.inputs[1]) if len(split.inputs) > 1 else split.attrs.get("split")
        return split.inputs[0], None if sizes is None else int(sizes[level])

    @staticmethod
    def _level_grid(tensor: gs.Tensor, level: int, walk: _Walk) -> gs.Tensor:
        """``grids[:, :, :, level].transpose(1, 2).flatten(0, 1)``: the grids tensor."""
        moved = walk.take(walk.take(tensor, "Reshape").inputs[0], "Transpose", perm=[0, 2, 1, 3, 4])
        pick = walk.take(moved.inputs[0], "Gather", axis=3)
        if _int_constant(pick.inputs[1]) != [level]:
            raise _NoMatch(pick, f"level {level} samples level {_int_constant(pick.inputs[1])} of the grid")
        return pick.inputs[0]

    def rewrite(self, match: Match) -> Rewrite:
        levels = np.asarray(match.captures["levels"], dtype=np.int32)
        starts = np.concatenate([[0], np.cumsum(levels.prod(axis=1))[:-1]]).astype(np.int32)
        anchor = match.anchor.outputs[0].name
        inputs = (
            match.inputs["value"],
            gs.Constant(f"{anchor}__spatial_shapes", levels),
            gs.Constant(f"{anchor}__level_start_index", starts),
            match.inputs["sampling_locations"],
            match.inputs["attention_weights"],
        )
        return Rewrite(inputs, {}, output_shapes=(np.array([0, 0, -1], dtype=np.int64),))


def _exclusive(nodes: list[gs.Node], anchor: gs.Node, index: GraphIndex) -> list[gs.Node]:
    """The nodes the plugin node replaces: those whose results only the instance itself reads.

    A node another part of the model also reads stays in the graph and computes what it did (TorchScript
    shares the grid of two attention calls on the same sampling locations); it goes once nothing reads it.
    """
    keep = {id(n) for n in nodes}
    changed = True
    while changed:
        changed = False
        for node in nodes:
            if node is anchor or id(node) not in keep:
                continue
            used_outside = any(index.external_use(out, keep) is not None for out in node.outputs)
            if used_outside:
                keep.discard(id(node))
                changed = True
    return [n for n in nodes if id(n) in keep]


def _shape_cones(walk: _Walk) -> list[gs.Node]:
    """The nodes computing the matched Reshapes' targets from matched tensors or constants (TorchScript's
    ``Shape``/``Slice``/``Concat`` arithmetic): they go with the match."""
    inside = {id(n) for n in walk.nodes}
    cone: list[gs.Node] = []
    for reshape in walk.reshapes:
        stack = [reshape.inputs[1]] if len(reshape.inputs) > 1 else []
        while stack:
            tensor = stack.pop()
            node = tensor.inputs[0] if tensor.inputs else None
            if node is None or id(node) in inside:
                continue
            if op_key(node)[0] != "" or node.op not in SHAPE_OPS:
                break
            inside.add(id(node))
            cone.append(node)
            stack.extend(t for t in node.inputs if not isinstance(t, gs.Constant))
    return cone


PATTERNS: tuple = (MsdaPattern(),)
