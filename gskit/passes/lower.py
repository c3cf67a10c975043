"""The ``lower`` pass: ONNX ops TensorRT's parser rejects, rewritten into ops it takes.

``Col2Im`` (opset 18; PyTorch's ``nn.Fold``, exported by both exporters: MobileViTv2 uses it) has no TensorRT
importer (onnx-tensorrt's operator table, and TensorRT-RTX 1.7's parser here). Its 2-D form becomes:

* **Reshape, Transpose, Reshape** when the blocks tile the image (stride = block, dilation 1, no padding, the
  image a whole number of blocks): ``[N, C*kh*kw, oh*ow] -> [N, C, kh, kw, oh, ow] -> [N, C, oh, kh, ow, kw]
  -> [N, C, H, W]``. Every output value is one input value: exact.
* **ConvTranspose** otherwise: ``[N, C*kh*kw, L]`` reshaped to ``[N, C*kh*kw, oh, ow]``, then a grouped
  (``group = C``) transposed convolution with a one-hot kernel (input channel ``c*kh*kw + i*kw + j`` has a 1
  at tap ``(i, j)``), the Col2Im strides, dilations and pads, and ``output_padding`` for the rows and columns
  no block reaches. Each output value is the sum of the values of the blocks covering it, the same sum Col2Im
  takes: exact where blocks do not overlap, rounded like any sum of several terms (in another order than
  onnxruntime's Col2Im) where they do.

Both need ``image_shape`` and ``block_shape`` as constants (ConvTranspose also a known channel count); a node
without them, or not 2-D, is left as it is with the reason in the report.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs

from gskit.errors import GskitError
from gskit.passes.edit import unique_name
from gskit.passes.patterns.match import constant_value, label, op_key
from gskit.passes.transform import GraphPass, PassContext, PassResult, option, run_pass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Lowered:
    """One node rewritten: its name, op, and the form it took (``reshape``, ``conv_transpose``)."""

    node: str
    op: str
    form: str
    nodes: tuple[str, ...]


@dataclass
class LowerReport:
    """What :func:`lower` did: nodes rewritten, and nodes left with the reason."""

    lowered: list[Lowered] = field(default_factory=list)
    left: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class LowerOptions:
    """Rewrite ops TensorRT's parser rejects (Col2Im) into ops it takes."""

    only: tuple[str, ...] | None = option(
        None, help="lower only these op types (all it knows by default: Col2Im)", metavar="OP", nargs="+"
    )


#: A lowering: (graph, node, new names) -> the nodes replacing it, and the form's name; or a reason (str).
Lowering = Callable[[gs.Graph, gs.Node, "_Names"], "tuple[list[gs.Node], str] | str"]


class _Names:
    """Unique node and tensor names derived from the node being lowered."""

    def __init__(self, graph: gs.Graph) -> None:
        self.tensors = set(graph.tensors())
        self.nodes = {n.name for n in graph.nodes}

    def tensor(self, base: str) -> str:
        return unique_name(base, self.tensors)

    def node(self, base: str) -> str:
        return unique_name(base, self.nodes)


def lower(graph: gs.Graph, *, only: Sequence[str] | None = None) -> LowerReport:
    """Rewrite the ops of :data:`LOWERINGS` in ``graph`` and its subgraphs, in place
    (``run_pass(LOWER, graph, LowerOptions(only)).report``)."""
    return run_pass(LOWER, graph, LowerOptions(only=None if only is None else tuple(only))).report


class _Lower(GraphPass[LowerOptions]):
    name, options, effect, takes_model = "lower", LowerOptions, "in_place", False

    def requires(self, model: Any, options: LowerOptions) -> None:
        unknown = sorted(set(options.only or ()) - set(LOWERINGS))
        if unknown:
            raise GskitError(f"lower: no lowering for {unknown}; known: {', '.join(sorted(LOWERINGS))}")

    def call(self, model: Any, options: LowerOptions, context: PassContext) -> PassResult:
        report = LowerReport()
        for graph in (model, *model.subgraphs(recursive=True)):
            _lower_graph(graph, options, report)
        forms = ", ".join(f"{item.node} ({item.op} -> {item.form})" for item in report.lowered[:4])
        summary = f"{len(report.lowered)} node(s) lowered" + (f": {forms}" if forms else "")
        if len(report.lowered) > 4:
            summary += " ..."
        if report.left:
            summary += f"; {len(report.left)} left: " + "; ".join(f"{n}: {why}" for n, why in report.left[:3])
        return PassResult(model, modified=bool(report.lowered), report=report, summary=summary)


#: The lower pass: ``run_pass(LOWER, graph, LowerOptions(...))``.
LOWER = _Lower()


def _lower_graph(graph: gs.Graph, options: LowerOptions, report: LowerReport) -> None:
    names = _Names(graph)
    changed = False
    for node in list(graph.nodes):
        domain, op = op_key(node)
        lowering = LOWERINGS.get(op) if domain == "" else None
        if lowering is None or (options.only is not None and op not in options.only):
            continue
        result = lowering(graph, node, names)
        if isinstance(result, str):
            report.left.append((label(node), result))
            continue
        nodes, form = result
        graph.nodes.extend(nodes)
        node.outputs.clear()  # the last new node took the output tensor over
        node.inputs.clear()
        report.lowered.append(Lowered(label(node), op, form, tuple(n.name for n in nodes)))
        changed = True
    if changed:
        graph.cleanup(remove_unused_graph_inputs=False).toposort(
            recurse_subgraphs=False, recurse_functions=False
        )


def _col2im(graph: gs.Graph, node: gs.Node, names: _Names) -> tuple[list[gs.Node], str] | str:
    if len(node.inputs) != 3:
        return "Col2Im needs input, image_shape and block_shape"
    x, image_input, block_input = node.inputs
    image, block = constant_value(image_input), constant_value(block_input)
    if image is None or block is None:
        return "image_shape and block_shape are not constants"
    if image.size != 2 or block.size != 2:
        return f"{image.size}-D; only 2-D Col2Im is rewritten"
    (height, width), (kh, kw) = (int(v) for v in image), (int(v) for v in block)
    strides = [int(s) for s in node.attrs.get("strides", [1, 1])]
    dilations = [int(d) for d in node.attrs.get("dilations", [1, 1])]
    pads = [int(p) for p in node.attrs.get("pads", [0, 0, 0, 0])]
    spans = [
        size + pads[axis] + pads[axis + 2] - dilations[axis] * (k - 1) - 1
        for axis, (size, k) in enumerate(((height, kh), (width, kw)))
    ]
    if any(s < 0 for s in spans):
        return f"block {kh}x{kw} does not fit the padded image {height}x{width}"
    grid = [s // stride + 1 for s, stride in zip(spans, strides, strict=True)]
    out = node.outputs[0]
    base = out.name

    def const(values: Sequence[int] | np.ndarray, what: str) -> gs.Constant:
        return gs.Constant(names.tensor(f"{base}_{what}"), np.asarray(values, dtype=np.int64))

    def make(
        op: str, inputs: list[gs.Tensor], what: str, result: gs.Tensor | None = None, **attrs: Any
    ) -> gs.Node:
        target = result if result is not None else gs.Variable(names.tensor(f"{base}_{what}"), dtype=x.dtype)
        return gs.Node(
            op, name=names.node(f"{label(node)}_{what}"), attrs=attrs, inputs=inputs, outputs=[target]
        )

    tiles = strides == [kh, kw] and dilations == [1, 1] and not any(pads) and height == grid[0] * kh
    if tiles and width == grid[1] * kw:
        blocks = make("Reshape", [x, const([0, -1, kh, kw, grid[0], grid[1]], "blocks_shape")], "blocks")
        moved = make("Transpose", [blocks.outputs[0]], "tiled", perm=[0, 1, 4, 2, 5, 3])
        image_node = make(
            "Reshape", [moved.outputs[0], const([0, -1, height, width], "image_shape")], "image", out
        )
        return [blocks, moved, image_node], "reshape"
    channels = x.shape[1] if x.shape is not None and len(x.shape) == 3 else None
    if not isinstance(channels, int) or channels % (kh * kw):
        return f"overlapping blocks need a known channel count divisible by {kh * kw}, got {channels}"
    groups = channels // (kh * kw)
    kernel = np.zeros((channels, 1, kh, kw), dtype=x.dtype if x.dtype is not None else np.float32)
    taps = np.arange(channels) % (kh * kw)
    kernel[np.arange(channels), 0, taps // kw, taps % kw] = 1
    rows = make("Reshape", [x, const([0, channels, grid[0], grid[1]], "grid_shape")], "grid")
    weights = gs.Constant(names.tensor(f"{base}_one_hot"), kernel)
    spread = make(
        "ConvTranspose",
        [rows.outputs[0], weights],
        "spread",
        out,
        group=groups,
        kernel_shape=[kh, kw],
        strides=strides,
        dilations=dilations,
        pads=pads,
        output_padding=[s % stride for s, stride in zip(spans, strides, strict=True)],
    )
    return [rows, spread], "conv_transpose"


#: Op type -> its lowering (default domain).
LOWERINGS: dict[str, Lowering] = {"Col2Im": _col2im}
