"""MultiscaleDeformableAttnPlugin_TRT v2: TensorRT's own multi-scale deformable attention.

TensorRT's ``libnvinfer_plugin`` implements it (IPluginV3 from 10.11; version 1, IPluginV2DynamicExt, from
8.4): this folder has no kernel and no ``trt_plugin.py``. Inputs and output as NVIDIA/TensorRT's
``plugin/multiscaleDeformableAttnPlugin`` defines them; the plugin has no fields (README.md names the files
and the commit).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gskit.errors import PluginError
from gskit.plugin import PluginSpec, TensorInfo, libnvinfer, patterns_in

from .reference import multiscale_deformable_attn

LEVELS = ((6, 5), (3, 3), (2, 1))


def example_inputs(rng: np.random.Generator) -> list[np.ndarray]:
    """Three levels, batch 2, 7 queries, 2 heads of 4 channels, 3 points, for a one-node test model."""
    shapes = np.asarray(LEVELS, dtype=np.int32)
    starts = np.concatenate([[0], np.cumsum(shapes.prod(axis=1))[:-1]]).astype(np.int32)
    total = int(shapes.prod(axis=1).sum())
    return [
        rng.standard_normal((2, total, 2, 4)).astype(np.float32),
        shapes,
        starts,
        rng.uniform(-0.05, 1.05, size=(2, 7, 2, 3, 3, 2)).astype(np.float32),
        rng.random((2, 7, 2, 3, 3)).astype(np.float32),
    ]


def infer(inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any]) -> list[TensorInfo]:
    """``[N, Lq, M, D]`` in the value's dtype: N, M, D from ``value``, Lq from ``sampling_locations`` (the
    plugin's ``getOutputShapes``).

    Raises:
        PluginError: an input is absent or of a known rank the plugin does not take.
    """
    if len(inputs) != 5 or any(i is None for i in inputs):
        raise PluginError("MultiscaleDeformableAttnPlugin_TRT needs its five inputs")
    value, locations = inputs[0], inputs[3]
    for label, info, rank in zip(
        ("value", "spatial_shapes", "level_start_index", "sampling_locations", "attention_weights"),
        inputs,
        (4, 2, 1, 6, 5),
        strict=True,
    ):
        if info is not None and info.shape is not None and len(info.shape) != rank:
            raise PluginError(
                f"MultiscaleDeformableAttnPlugin_TRT {label} has rank {len(info.shape)}, not {rank}"
            )
    v = value.shape or (None,) * 4
    queries = locations.shape[1] if locations is not None and locations.shape else None
    return [TensorInfo(value.dtype, (v[0], queries, v[2], v[3]))]


SPEC = PluginSpec(
    name="MultiscaleDeformableAttnPlugin_TRT",
    **libnvinfer.SPEC_FIELDS,
    version="2",
    inputs=("value", "spatial_shapes", "level_start_index", "sampling_locations", "attention_weights"),
    outputs=("output",),
    attributes=(),
    infer=infer,
    reference=multiscale_deformable_attn,
    patterns=patterns_in(".patterns", __package__),  # built when replacing reads them
    supports_fp16=True,
    doc=(
        "TensorRT's multi-scale deformable attention (Deformable DETR): per query and head, attention-"
        "weighted bilinear samples of each level's value map; value [N,S,M,D], spatial_shapes [L,2] int32, "
        "level_start_index [L] int32, sampling_locations [N,Lq,M,L,P,2], attention_weights [N,Lq,M,L,P] -> "
        "[N,Lq,M,D]."
    ),
)
