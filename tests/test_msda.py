"""MultiscaleDeformableAttnPlugin_TRT replaces multi-scale deformable attention as the exporters write it.

Models: the grid-sample form written here in torch as transformers' PyTorch code computes it (so the tests
need torch only), transformers' own ``MultiScaleDeformableAttention`` and a whole Deformable DETR attention
layer when transformers is installed; each exported with both exporters. Each instance becomes one plugin
node (plus the Reshape to ``[N, Lq, M * D]``), and the prepared model matches the original on onnxruntime
within 1e-5.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import onnx
import pytest

from gskit.backends import ort
from gskit.io import model as gsmodel
from gskit.passes.patterns import replace
from gskit.plugin import load_plugins

pytestmark = [
    pytest.mark.torch,
    pytest.mark.filterwarnings(
        "ignore::DeprecationWarning",
        "ignore::FutureWarning",
        "ignore::UserWarning",
        "ignore:torch.tensor results:Warning",
        "ignore:Converting a tensor:Warning",
    ),
]

REGISTRY = load_plugins()
LEVELS = [(8, 8), (4, 5), (2, 3)]
B, M, D, LQ, P = 2, 4, 8, 10, 4
PLUGIN = "TRT::MultiscaleDeformableAttnPlugin_TRT v2"


def _msda(value, locations, weights, levels, *, sliced: bool = False):
    """The grid-sample form (transformers' PyTorch MultiScaleDeformableAttention, written again); ``sliced``
    takes each level's rows with a slice, as TorchScript writes a split whose sizes it computed."""
    import torch

    batch, _, heads, dim = value.shape
    queries, points = locations.shape[1], locations.shape[4]
    starts = [sum(h * w for h, w in levels[:i]) for i in range(len(levels) + 1)]
    if sliced:
        parts = [value[:, starts[i] : starts[i + 1]] for i in range(len(levels))]
    else:
        parts = value.split([h * w for h, w in levels], dim=1)
    grids = 2 * locations - 1
    samples = []
    for level, (h, w) in enumerate(levels):
        maps = parts[level].flatten(2).transpose(1, 2).reshape(batch * heads, dim, h, w)
        grid = grids[:, :, :, level].transpose(1, 2).flatten(0, 1)
        samples.append(torch.nn.functional.grid_sample(maps, grid, "bilinear", "zeros", align_corners=False))
    share = weights.transpose(1, 2).reshape(batch * heads, 1, queries, len(levels) * points)
    out = (torch.stack(samples, dim=-2).flatten(-2) * share).sum(-1).view(batch, heads * dim, queries)
    return out.transpose(1, 2).contiguous()


def _module(kind: str):
    import torch

    class Twice(torch.nn.Module):
        """Two attention calls on projected inputs: two instances."""

        def __init__(self) -> None:
            super().__init__()
            self.mix = torch.nn.Linear(D, D)

        def forward(self, value, locations, weights):
            first = _msda(value, locations, weights, LEVELS).view(B, LQ, M, D)
            return _msda(self.mix(value), locations, weights.softmax(-1), LEVELS) + first.flatten(2)

    class Transformers(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            from transformers.models.deformable_detr.modeling_deformable_detr import (
                MultiScaleDeformableAttention,
            )

            self.attn = MultiScaleDeformableAttention()

        def forward(self, value, locations, weights):
            shapes = torch.tensor(LEVELS)
            starts = torch.cat((shapes.new_zeros((1,)), shapes.prod(1).cumsum(0)[:-1]))
            return self.attn(value, shapes, LEVELS, starts, locations, weights, 64)

    class Sliced(torch.nn.Module):
        def forward(self, value, locations, weights):
            return _msda(value, locations, weights, LEVELS, sliced=True)

    return {"twice": Twice, "transformers": Transformers, "sliced": Sliced}[kind]().eval()


def _export(module, path: Path, dynamo: bool) -> Path:
    import torch

    torch.manual_seed(0)
    total = sum(h * w for h, w in LEVELS)
    args = (
        torch.randn(B, total, M, D),
        torch.rand(B, LQ, M, len(LEVELS), P, 2),
        torch.rand(B, LQ, M, len(LEVELS), P),
    )
    options = {"dynamo": True} if dynamo else {"dynamo": False, "opset_version": 17}
    with contextlib.redirect_stdout(io.StringIO()):
        torch.onnx.export(
            module, args, str(path), input_names=["value", "loc", "attw"], output_names=["out"], **options
        )
    return path


def _feeds(rng) -> dict[str, np.ndarray]:
    total = sum(h * w for h, w in LEVELS)
    return {
        "value": rng.standard_normal((B, total, M, D)).astype(np.float32),
        "loc": rng.uniform(-0.1, 1.1, (B, LQ, M, len(LEVELS), P, 2)).astype(np.float32),
        "attw": rng.random((B, LQ, M, len(LEVELS), P)).astype(np.float32),
    }


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.parametrize("kind", ["twice", "sliced", "transformers"])
def test_every_instance_becomes_the_plugin(tmp_path: Path, rng, kind: str, dynamo: bool) -> None:
    if kind == "transformers":
        pytest.importorskip("transformers")
    path = _export(_module(kind), tmp_path / "msda.onnx", dynamo)
    original = onnx.load(path)
    graph = gsmodel.to_graph(original)
    report = replace(graph, list(REGISTRY))
    instances = 2 if kind == "twice" else 1
    assert [r.plugin for r in report.regions] == [PLUGIN] * instances
    prepared = gsmodel.to_model(graph)
    ops = [n.op_type for n in prepared.graph.node]
    assert "GridSample" not in ops and ops.count("MultiscaleDeformableAttnPlugin_TRT") == instances
    assert not report.watched_left
    read = {name for n in prepared.graph.node for name in n.input} | {o.name for o in prepared.graph.output}
    dead = [n.name for n in prepared.graph.node if not any(o in read for o in n.output)]
    assert not dead, f"nodes only the replaced instances read are left: {dead}"
    (node, *_) = [n for n in prepared.graph.node if n.op_type == "MultiscaleDeformableAttnPlugin_TRT"]
    assert [a.name for a in node.attribute] == ["plugin_namespace", "plugin_version"]
    constants = {t.name: onnx.numpy_helper.to_array(t) for t in prepared.graph.initializer}
    shapes, starts = constants[node.input[1]], constants[node.input[2]]
    assert shapes.dtype == starts.dtype == np.int32
    assert shapes.tolist() == [list(s) for s in LEVELS] and starts.tolist() == [0, 64, 84]
    feeds = _feeds(rng)
    want = ort.run(original, feeds)["out"]
    got = ort.run(prepared, feeds, plugins=REGISTRY)["out"]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_split_that_disagrees_with_the_levels_is_skipped_with_the_reason(tmp_path: Path) -> None:
    graph = gsmodel.to_graph(onnx.load(_export(_module("twice"), tmp_path / "msda.onnx", True)))
    (split, *_) = [n for n in graph.nodes if n.op == "Split"]
    import onnx_graphsurgeon as gs

    split.inputs[1] = gs.Constant("other_sizes", np.array([60, 24, 6], dtype=np.int64))
    report = replace(graph, [REGISTRY.get("TRT", "MultiscaleDeformableAttnPlugin_TRT", "2")], explain=True)
    (plugin,) = report.plugins
    assert plugin.replaced == 1  # the second call splits the projected values, untouched
    assert any("values' parts [60, 24, 6] are not the levels' sizes" in e.reason for e in report.explanations)
    assert len(report.watched_left["multi_scale_deformable_attention (grid_sample form)"]) == 3


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_deformable_detr_attention_layer_prepares_and_validates(tmp_path: Path, dynamo: bool) -> None:
    """A whole transformers attention layer (projections, softmax, offsets) through gskit prepare."""
    torch = pytest.importorskip("torch")
    modeling = pytest.importorskip("transformers.models.deformable_detr.modeling_deformable_detr")
    from transformers import DeformableDetrConfig

    from gskit.pipeline.prepare import prepare

    config = DeformableDetrConfig(
        d_model=32, encoder_attention_heads=4, num_feature_levels=3, encoder_n_points=4
    )
    layer = modeling.DeformableDetrMultiscaleDeformableAttention(config, num_heads=4, n_points=4).eval()

    class Layer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = layer

        def forward(self, hidden, encoder_hidden, reference_points):
            shapes = torch.tensor(LEVELS)
            starts = torch.cat((shapes.new_zeros((1,)), shapes.prod(1).cumsum(0)[:-1]))
            return self.layer(
                hidden,
                encoder_hidden_states=encoder_hidden,
                reference_points=reference_points,
                spatial_shapes=shapes,
                spatial_shapes_list=LEVELS,
                level_start_index=starts,
            )[0]

    torch.manual_seed(0)
    total = sum(h * w for h, w in LEVELS)
    args = (torch.randn(1, LQ, 32), torch.randn(1, total, 32), torch.rand(1, LQ, 3, 2))
    path = tmp_path / "layer.onnx"
    options = {"dynamo": True} if dynamo else {"dynamo": False, "opset_version": 17}
    with contextlib.redirect_stdout(io.StringIO()):
        torch.onnx.export(Layer().eval(), args, str(path), input_names=["h", "e", "r"], **options)
    report = prepare(path, tmp_path / "out", plugin_dirs=None)
    assert report.passed, report.comparison
    assert report.plugins_inserted == {PLUGIN: 1}


def test_sampling_locations_of_another_float_type_are_refused(tmp_path: Path) -> None:
    """The plugin takes one float type (TorchScript exports of whole DETR models have float64 locations)."""
    graph = gsmodel.to_graph(onnx.load(_export(_module("sliced"), tmp_path / "msda.onnx", True)))
    (locations,) = [t for t in graph.inputs if t.name == "loc"]
    locations.dtype = np.float64
    report = replace(graph, [REGISTRY.get("TRT", "MultiscaleDeformableAttnPlugin_TRT", "2")], explain=True)
    assert not report.regions
    assert any("sampling locations are DOUBLE and the values FLOAT" in e.reason for e in report.explanations)


def test_per_plugin_comparison_ends_after_the_layout_reshape(tmp_path: Path, rng) -> None:
    """``gskit compare --per-plugin``: the plugin's [N, Lq, M, D] is not in the original; the unit compared is
    the plugin node and the Reshape to the model's [N, Lq, M * D]."""
    from gskit.compare.plugins import compare_plugins

    original = onnx.load(_export(_module("twice"), tmp_path / "msda.onnx", True))
    graph = gsmodel.to_graph(original)
    replace(graph, list(REGISTRY))
    report = compare_plugins(original, gsmodel.to_model(graph), feeds=_feeds(rng), plugins=REGISTRY)
    assert report.passed and len(report.plugins) == 2
    assert all(len(check.original_nodes) > 10 for check in report.plugins)


def test_a_target_older_than_the_plugin_version_leaves_the_region_with_the_reason(tmp_path: Path) -> None:
    """MultiscaleDeformableAttnPlugin_TRT v2 ships from TensorRT 10.11: for 8.6 no node it cannot load is
    written; for 10.11 the plugin is."""
    path = _export(_module("twice"), tmp_path / "msda.onnx", True)
    spec = REGISTRY.get("TRT", "MultiscaleDeformableAttnPlugin_TRT", "2")
    graph = gsmodel.to_graph(onnx.load(path))
    report = replace(graph, [spec], tensorrt="8.6")
    (plugin,) = report.plugins
    assert plugin.replaced == 0 and len(plugin.skipped) == 2
    assert all(
        "TensorRT 8.6 predates MultiscaleDeformableAttnPlugin_TRT v2" in s.reason for s in plugin.skipped
    )
    assert "MultiscaleDeformableAttnPlugin_TRT" not in {n.op for n in graph.nodes}
    graph = gsmodel.to_graph(onnx.load(path))
    assert replace(graph, [spec], tensorrt="10.11").replaced == 2
