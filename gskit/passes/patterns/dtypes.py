"""Element types the matcher needs, learnt where they are needed rather than inferred for the whole graph.

Exports without value_info (TorchScript's) leave intermediate dtypes unknown, and matching needs a few: a
Cast's input (is the Cast a no-op?), a tensor where a pattern's Cast may be missing (``Matcher``'s virtual
Casts), and the tensors around a match (the plugin's output dtype check, a native form's checks, plugins'
own checks). Running onnx's inference over the whole graph for them took half of ``replace``'s time on a
10k-node graph. :class:`DtypeLearner` walks back the producer chain of each tensor it is asked about, with
onnx's type rule for the common ops (the type of input k, a fixed type, a Cast's ``to``), and remembers each
answer, so every tensor is walked at most once. Where a type depends on an op it has no rule for (custom
domains, control flow, ops the model's opset lacks) or on a graph input of unknown type, it runs onnx's
inference once, as before, and answers from that from then on.

The learnt types are those onnx's inference gives, written into the tensors as it wrote them (the model
replace writes keeps them), but only into the tensors asked about and those they depend on. It learns only
when onnx's inference would have run: some Cast reads a tensor of unknown dtype (see
:meth:`DtypeLearner.for_graph`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Sequence

import onnx
import onnx_graphsurgeon as gs
from onnx import TensorProto

from gskit.passes.tensor_types import constant_elem_type, elem_type, infer_tensor_types
from gskit.plugin.ops import canonical_domain

log = logging.getLogger(__name__)

#: ONNX ops each of whose outputs has the element type of input 0 (onnx's rule for them, every opset).
_LIKE_FIRST_INPUT = frozenset(
    """Abs Acos Acosh Add Asin Asinh Atan Atanh AveragePool BitShift Ceil Celu Clip Concat Conv ConvTranspose
    Cos Cosh CumSum DepthToSpace Div Einsum Elu Erf Exp Expand Flatten Floor Gather GatherElements GatherND
    Gelu Gemm GlobalAveragePool GlobalLpPool GlobalMaxPool GroupNormalization HardSigmoid HardSwish Hardmax
    Identity InstanceNormalization LRN LeakyRelu Log LogSoftmax LpNormalization MatMul Max Mean Min Mish Mod
    Mul Neg PRelu Pad Pow Range Reciprocal ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax
    ReduceMean ReduceMin ReduceProd ReduceSum ReduceSumSquare Relu Reshape Resize Round ScatterElements
    ScatterND Selu Shrink Sigmoid Sign Sin Sinh Slice Softmax Softplus Softsign SpaceToDepth Split Sqrt
    Squeeze Sub Sum Tan Tanh ThresholdedRelu Tile Transpose Trilu Unsqueeze""".split()
)
#: ONNX ops whose outputs have the element type of another input.
_LIKE_INPUT = {"Where": 1, "CastLike": 1}
#: ONNX ops whose outputs have one element type whatever their inputs.
_FIXED = {
    **dict.fromkeys(("Shape", "Size", "NonZero", "ArgMax", "ArgMin"), TensorProto.INT64),
    **dict.fromkeys(
        (
            "Equal",
            "Greater",
            "GreaterOrEqual",
            "Less",
            "LessOrEqual",
            "Not",
            "And",
            "Or",
            "Xor",
            "IsNaN",
            "IsInf",
        ),
        TensorProto.BOOL,
    ),
}
_CONSTANT_ATTRS = {
    "value_float": TensorProto.FLOAT,
    "value_floats": TensorProto.FLOAT,
    "value_int": TensorProto.INT64,
    "value_ints": TensorProto.INT64,
    "value_string": TensorProto.STRING,
    "value_strings": TensorProto.STRING,
}


class _Unknown(Exception):
    """A type the rules here cannot give: onnx's inference decides."""


class DtypeLearner:
    """Answers "what element type has this tensor?" for the matcher, learning it from producers when unknown.

    Build it with :meth:`for_graph`; ask :meth:`elem_type`, or :meth:`learn` for tensors whose dtype code
    reads directly (a match's tensors, before its checks run).
    """

    def __init__(self, root: gs.Graph, *, learning: bool) -> None:
        self._root = root
        self._learning = learning
        self._opset = root.opset
        self._known: dict[int, int] = {}  # id(tensor) -> element type learnt
        self._nodes_learnt: set[int] = set()  # id(node) whose inputs and outputs were learnt (learn_nodes)
        #: whether onnx's inference ran (a type no rule gave), for tests and logs
        self.inferred = False

    @classmethod
    def for_graph(
        cls, root: gs.Graph, graphs: Sequence[gs.Graph], shaped: Iterable[tuple[str, str]] = ()
    ) -> DtypeLearner:
        """The learner for one matching of ``graphs`` (``root`` and its If/Loop/Scan bodies).

        Types are learnt only when some Cast reads a tensor of unknown dtype, and then each such input is
        learnt at once. Shapes are not learnt: when a ``GlobalAveragePool`` (a mean over the last axis only
        for a 3-D input) reads a tensor of unknown rank, or a node of an op some rule reads shapes around
        (``Rule.needs_shapes_of``) has an input of unknown shape, onnx's inference of types and shapes runs
        over the whole graph first, as it always did.
        """
        shaped = set(shaped)
        # the op's name first, the domain (canonical_domain, a call) only for nodes of an op asked about
        shaped_ops = {op for _, op in shaped} | {"Cast", "GlobalAveragePool"}
        nodes = [n for g in graphs for n in g.nodes if n.op in shaped_ops]
        casts = [
            n.inputs[0] for n in nodes if _key(n) == ("", "Cast") and n.inputs and n.inputs[0].dtype is None
        ]
        pools = any(
            _key(n) == ("", "GlobalAveragePool") and n.inputs and n.inputs[0].shape is None for n in nodes
        ) or any(_key(n) in shaped and any(t.shape is None for t in n.inputs) for n in nodes)
        if pools:
            infer_tensor_types(root, symbolic=False)
            return cls(root, learning=False)
        learner = cls(root, learning=bool(casts))
        for tensor in casts:
            learner.elem_type(tensor)
        return learner

    def elem_type(self, tensor: gs.Tensor) -> int | None:
        """``tensor``'s element type: its own, else the one learnt for it (None where onnx's inference
        leaves it unknown)."""
        have = elem_type(tensor.dtype)
        if have is not None or not self._learning:
            return have
        try:
            self._walk(tensor)
        except _Unknown:
            self._infer()
        return elem_type(tensor.dtype)

    def learn(self, tensors: Iterable[gs.Tensor | None]) -> None:
        """Learn the dtypes of ``tensors`` (None skipped), so code reading ``tensor.dtype`` sees them."""
        if self._learning:
            for tensor in tensors:
                if tensor is not None and tensor.dtype is None:
                    self.elem_type(tensor)

    def learn_nodes(self, nodes: Iterable[gs.Node]) -> None:
        """Learn the dtypes of the nodes' inputs and outputs, in order. A node asked about before is skipped:
        learning again changes nothing (the rules that match one instance ask about the same nodes)."""
        if not self._learning:
            return
        done = self._nodes_learnt
        for node in nodes:
            if id(node) not in done:
                done.add(id(node))
                self.learn(node.inputs)
                self.learn(node.outputs)

    def _infer(self) -> None:
        log.debug("dtypes: a type no local rule gives; onnx's inference over the whole graph")
        self._learning = False
        self.inferred = True
        infer_tensor_types(self._root, dtypes_only=True, symbolic=False)

    def _walk(self, tensor: gs.Tensor) -> None:
        """Learn ``tensor``'s type and those it depends on, producers first (a loop: chains are long)."""
        stack = [tensor]
        while stack:
            current = stack[-1]
            if id(current) in self._known:
                stack.pop()
                continue
            own = _own_type(current)
            if own is not None:
                self._known[id(current)] = own
                stack.pop()
                continue
            node = current.inputs[0] if current.inputs else None
            if node is None:
                raise _Unknown  # a graph input (or a dangling tensor) of unknown type
            fixed, source_index = self._rule(node)
            if fixed is not None:
                self._set(current, fixed)
                stack.pop()
                continue
            source = node.inputs[source_index] if source_index < len(node.inputs) else None
            if source is None or not source.name:
                raise _Unknown
            if id(source) in self._known:
                self._set(current, self._known[id(source)])
                stack.pop()
            else:
                stack.append(source)

    def _rule(self, node: gs.Node) -> tuple[int | None, int]:
        """``(type, 0)``: outputs of one fixed element type; ``(None, k)``: outputs typed like input k."""
        domain, op = _key(node)
        if domain or not _exists(op, self._opset):
            raise _Unknown
        if op in _FIXED:
            return _FIXED[op], 0
        if op == "Cast":
            to = node.attrs.get("to")
            if not isinstance(to, int) or elem_type(to) is None:
                raise _Unknown
            return to, 0
        if op == "Constant":
            return _constant_type(node), 0
        if op == "ConstantOfShape":
            value = node.attrs.get("value")
            return (constant_elem_type(value) if isinstance(value, gs.Constant) else TensorProto.FLOAT), 0
        if op in _LIKE_INPUT:
            return None, _LIKE_INPUT[op]
        if op in _LIKE_FIRST_INPUT:
            return None, 0
        raise _Unknown

    def _set(self, tensor: gs.Tensor, elem: int) -> None:
        self._known[id(tensor)] = elem
        # where onnx's inference wrote a type: every named variable a node computes
        if isinstance(tensor, gs.Variable) and tensor.dtype is None and tensor.name:
            tensor.dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)


def _key(node: gs.Node) -> tuple[str, str]:
    return canonical_domain(node.domain), node.op


def _own_type(tensor: gs.Tensor) -> int | None:
    if isinstance(tensor, gs.Constant):
        return constant_elem_type(tensor)
    return elem_type(tensor.dtype)


def _constant_type(node: gs.Node) -> int:
    for name, value in node.attrs.items():
        if name == "value" and isinstance(value, gs.Constant):
            elem = constant_elem_type(value)
            if elem is not None:
                return elem
        if name in _CONSTANT_ATTRS:
            return _CONSTANT_ATTRS[name]
    raise _Unknown  # sparse_value, or no value


@functools.lru_cache(maxsize=1024)
def _exists(op: str, opset: int) -> bool:
    """Whether ONNX has ``op`` at ``opset`` (onnx's inference types no node of an op the opset lacks)."""
    try:
        onnx.defs.get_schema(op, opset, "")
    except onnx.defs.SchemaError:
        return False
    return True
