"""Run models on onnxruntime (CPU): the reference that every prepared model is checked against."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort

from gskit import model as gsmodel
from gskit.errors import GskitError


def session(
    model: onnx.ModelProto | gs.Graph | str | os.PathLike,
    *,
    optimize: bool = False,
) -> ort.InferenceSession:
    """Create a CPU InferenceSession for a model, a graph or a file.

    Args:
        model: what to run. In-memory models whose weights are still on disk are written to a temporary
            file first, since onnxruntime resolves external data relative to a file.
        optimize: enable onnxruntime's graph optimizations. Off by default so a comparison checks the
            model as written, not onnxruntime's rewrite of it.

    Raises:
        GskitError: onnxruntime rejects the model (the message names the first problem it reports).
    """
    options = ort.SessionOptions()
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    options.log_severity_level = 3
    providers = ["CPUExecutionProvider"]
    try:
        if isinstance(model, (str, os.PathLike)):
            return ort.InferenceSession(str(model), options, providers=providers)
        proto = gsmodel.to_model(model) if isinstance(model, gs.Graph) else model
        if _has_disk_weights(proto) or proto.ByteSize() > gsmodel.EXTERNAL_DATA_THRESHOLD:
            with tempfile.TemporaryDirectory(prefix="gskit-ort-") as tmp:
                path = gsmodel.save(proto, Path(tmp) / "model.onnx", external_data=True, check=False)
                return ort.InferenceSession(str(path), options, providers=providers)
        with gsmodel._ir_version_for_onnxruntime(proto):
            payload = proto.SerializeToString()
        return ort.InferenceSession(payload, options, providers=providers)
    except (ort.capi.onnxruntime_pybind11_state.Fail, ort.capi.onnxruntime_pybind11_state.InvalidGraph,
            ort.capi.onnxruntime_pybind11_state.NotImplemented, ort.capi.onnxruntime_pybind11_state.InvalidArgument) as err:
        first = str(err).strip().splitlines()[0]
        raise GskitError(f"onnxruntime cannot load the model: {first}") from err


def run(
    model: onnx.ModelProto | gs.Graph | str | os.PathLike | ort.InferenceSession,
    feeds: Mapping[str, np.ndarray],
    outputs: list[str] | None = None,
) -> dict[str, np.ndarray]:
    """Run a model once and return its outputs by name."""
    sess = model if isinstance(model, ort.InferenceSession) else session(model)
    names = outputs or [o.name for o in sess.get_outputs()]
    try:
        values = sess.run(names, dict(feeds))
    except Exception as err:  # onnxruntime raises its own pybind types; keep one line of it
        first = str(err).strip().splitlines()[0]
        raise GskitError(f"onnxruntime failed to run the model: {first}") from err
    return dict(zip(names, values))


def _has_disk_weights(model: onnx.ModelProto) -> bool:
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    return any(uses_external_data(t) for t in _get_all_tensors(model))
