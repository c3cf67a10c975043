"""What the TensorRT ONNX parser does not take: a static table used when neither TensorRT nor
TensorRT-RTX is installed, so that ``gskit check-trt`` still answers (marked "static table").

Sources: onnx-tensorrt's operators.md for TensorRT 10.15 and ``supports_operator`` of TensorRT-RTX 1.7
(see TENSORRT_NOTES.md). The table describes full TensorRT; ``tests/test_check_trt.py`` compares it op by
op with the installed parser and lists the few documented differences.

The parser chooses a node's importer by ``op_type`` alone and ignores the domain (a ``Relu`` in domain
``my.ns`` becomes a TensorRT activation), so, unlike the rest of gskit, this table is keyed by op type:
that is how TensorRT itself decides. Nodes with a ``plugin_namespace`` attribute are plugin nodes and
never reach this table.

Checked against TensorRT-RTX 1.7 here: the parser rejects ScatterND with a reduction, Reduce* with axes
computed at run time, Q/DQ with a non-zero zero point and LSTM with input_forget=1 (so does this table);
it takes Resize in cubic mode, 1D pooling and TopK with sorted=0, whatever older tables say.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import onnx

#: Op types with no importer in the parser, with the reason shown to users.
UNSUPPORTED_OPS: Mapping[str, str] = {
    **dict.fromkeys(
        (
            "AffineGrid",
            "Bernoulli",
            "BitShift",
            "BitwiseAnd",
            "BitwiseNot",
            "BitwiseOr",
            "BitwiseXor",
            "CenterCropPad",
            "Col2Im",
            "Compress",
            "ConvInteger",
            "Det",
            "DynamicQuantizeLinear",
            "ImageDecoder",
            "MatMulInteger",
            "MaxRoiPool",
            "MaxUnpool",
            "MelWeightMatrix",
            "Multinomial",
            "NegativeLogLikelihoodLoss",
            "QLinearConv",
            "QLinearMatMul",
            "RegexFullMatch",
            "SoftmaxCrossEntropyLoss",
            "TfIdfVectorizer",
            "Unique",
        ),
        "no TensorRT importer for this op (onnx-tensorrt operators.md)",
    ),
    "DFT": "no TensorRT importer before 11.2 (11.2 adds it through a plugin)",
    **dict.fromkeys(
        ("Optional", "OptionalGetElement", "OptionalHasElement"), "TensorRT has no optional types"
    ),
    **dict.fromkeys(
        (
            "ConcatFromSequence",
            "SequenceAt",
            "SequenceConstruct",
            "SequenceEmpty",
            "SequenceErase",
            "SequenceInsert",
            "SequenceLength",
            "SequenceMap",
            "SplitToSequence",
        ),
        "TensorRT has no sequence types",
    ),
    **dict.fromkeys(("StringConcat", "StringNormalizer", "StringSplit"), "TensorRT has no string tensors"),
    **dict.fromkeys(
        ("BitCast", "CumProd", "SwiGLU", "FlexAttention"),
        "op newer than the parser's operator table (no importer in TensorRT 10.15 / TensorRT-RTX 1.7)",
    ),
    # ai.onnx.ml and training ops: no importer, so the parser would look for a plugin of that name.
    **dict.fromkeys(
        (
            "ArrayFeatureExtractor",
            "Binarizer",
            "CastMap",
            "CategoryMapper",
            "DictVectorizer",
            "FeatureVectorizer",
            "Imputer",
            "LabelEncoder",
            "LinearClassifier",
            "LinearRegressor",
            "Normalizer",
            "OneHotEncoder",
            "SVMClassifier",
            "SVMRegressor",
            "Scaler",
            "TreeEnsemble",
            "TreeEnsembleClassifier",
            "TreeEnsembleRegressor",
            "ZipMap",
        ),
        "ai.onnx.ml op: no TensorRT importer",
    ),
    **dict.fromkeys(("Adagrad", "Adam", "Gradient", "Momentum"), "training op: no TensorRT importer"),
}

#: Largest K that TopK takes (exclusive).
TOPK_MAX_K = 3840

#: Ops the parser takes only under conditions; the condition is shown as a warning by the static check.
RESTRICTED_OPS: Mapping[str, str] = {
    "DeformConv": "1D/2D with symmetric pads only (TensorRT-RTX 1.7 does not take it at all)",
    "GridSample": "4D input only before TensorRT 11.2 (5D from 11.2)",
    **dict.fromkeys(("QuantizeLinear", "DequantizeLinear"), "zero point must be 0"),
    **dict.fromkeys(
        (
            "ReduceL1",
            "ReduceL2",
            "ReduceLogSum",
            "ReduceLogSumExp",
            "ReduceMax",
            "ReduceMean",
            "ReduceMin",
            "ReduceProd",
            "ReduceSum",
            "ReduceSumSquare",
        ),
        "axes must be an initializer",
    ),
    "TopK": f"K < {TOPK_MAX_K} (checked when the engine is built, not by the parser)",
    "ScatterND": "reduction 'none' only",
    "LSTM": "input_forget = 0 only",
    "RoiAlign": "the parser imports it through a plugin (ROIAlign_TRT)",
}

#: Status of a node in a support report.
UNSUPPORTED = "unsupported"
RESTRICTED = "restricted"


@dataclass(frozen=True)
class StaticVerdict:
    """What the static table says about one node.

    Attributes:
        status: ``unsupported`` (the parser will reject it) or ``restricted`` (it may, see reason).
        reason: one line for people.
    """

    status: str
    reason: str


def supports_operator(op_type: str) -> bool:
    """True when the parser has an importer for ``op_type`` (like ``OnnxParser.supports_operator``)."""
    return op_type not in UNSUPPORTED_OPS


def check_node(node: onnx.NodeProto, constants: Mapping[str, onnx.TensorProto]) -> StaticVerdict | None:
    """Check one standard node against the table; None when the table has nothing to say.

    Args:
        node: a node that is not a plugin node.
        constants: initializers (and Constant outputs) of the node's graph by name, to read the values of
            inputs such as TopK's K or a zero point.
    """
    reason = UNSUPPORTED_OPS.get(node.op_type)
    if reason is not None:
        return StaticVerdict(UNSUPPORTED, reason)
    restriction = RESTRICTED_OPS.get(node.op_type)
    if restriction is None:
        return None
    checker = _CHECKERS.get(node.op_type) or _CHECKERS.get(_family(node.op_type))
    violation = checker(node, constants) if checker else None
    if violation:
        return StaticVerdict(UNSUPPORTED, violation)
    return StaticVerdict(RESTRICTED, restriction)


def _family(op_type: str) -> str:
    if op_type.startswith("Reduce"):
        return "Reduce"
    if op_type in ("QuantizeLinear", "DequantizeLinear"):
        return "QDQ"
    return op_type


def _attr(node: onnx.NodeProto, name: str, default: object = None) -> object:
    for attribute in node.attribute:
        if attribute.name == name:
            value = onnx.helper.get_attribute_value(attribute)
            return value.decode() if isinstance(value, bytes) else value
    return default


def _input_value(
    node: onnx.NodeProto, index: int, constants: Mapping[str, onnx.TensorProto]
) -> np.ndarray | None:
    if len(node.input) <= index or not node.input[index]:
        return None
    tensor = constants.get(node.input[index])
    return None if tensor is None else onnx.numpy_helper.to_array(tensor)


def _check_scatter_nd(node: onnx.NodeProto, constants: Mapping[str, onnx.TensorProto]) -> str | None:
    reduction = _attr(node, "reduction", "none")
    return None if reduction == "none" else f"ScatterND reduction '{reduction}' (TensorRT takes 'none')"


def _check_lstm(node: onnx.NodeProto, constants: Mapping[str, onnx.TensorProto]) -> str | None:
    return "LSTM with input_forget=1" if _attr(node, "input_forget", 0) else None


def _check_reduce(node: onnx.NodeProto, constants: Mapping[str, onnx.TensorProto]) -> str | None:
    if len(node.input) > 1 and node.input[1] and node.input[1] not in constants:
        return f"{node.op_type} axes '{node.input[1]}' computed at run time (TensorRT needs an initializer)"
    return None


def _check_qdq(node: onnx.NodeProto, constants: Mapping[str, onnx.TensorProto]) -> str | None:
    zero_point = _input_value(node, 2, constants)
    if zero_point is not None and np.any(zero_point != 0):
        return f"{node.op_type} with a non-zero zero point (TensorRT takes symmetric quantization only)"
    return None


_CHECKERS: Mapping[str, Callable[[onnx.NodeProto, Mapping[str, onnx.TensorProto]], str | None]] = {
    "ScatterND": _check_scatter_nd,
    "LSTM": _check_lstm,
    "Reduce": _check_reduce,
    "QDQ": _check_qdq,
}
