"""The comparison contract: one options dataclass, one report header, runners chosen by the backends."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
from pathlib import Path

import numpy as np
import pytest

from gskit.backends import ort as ort_backend
from gskit.backends import trt as trt_backend
from gskit.cli import build_parser
from gskit.cli.options import cli_fields, flag_of, options_from_args
from gskit.compare.detections import compare_detections
from gskit.compare.layers import LayerwiseReport, compare_layerwise
from gskit.compare.options import DEFAULT_TOLERANCE, CompareOptions, ComparisonHeader, DtypeChange
from gskit.compare.outputs import BACKENDS, CompareReport, compare
from gskit.compare.plugins import PluginCompareReport, compare_plugins
from gskit.errors import GskitError
from gskit.io import report
from gskit.pipeline.steps import ValidateOptions

GSKIT = Path(__file__).resolve().parents[1] / "gskit"
EXAMPLE = GSKIT / "data" / "example.onnx"
EXAMPLE_SHAPES = {"x": (2, 4, 8, 8)}


def test_compare_flags_are_the_options_fields_with_their_defaults() -> None:
    args = build_parser().parse_args(["compare", "a.onnx", "b.onnx"])
    assert options_from_args(args, CompareOptions) == CompareOptions()
    compare_parser = build_parser()._subparsers._group_actions[0].choices["compare"]
    flags = {s for action in compare_parser._actions for s in action.option_strings}
    assert {flag_of(f) for f in cli_fields(CompareOptions)} <= flags
    assert {"--atol", "--rtol", "--seed", "--shape", "--inputs", "--backend", "--engine", "--chunk"} <= flags


def test_flags_reach_the_options_as_the_library_takes_them() -> None:
    argv = ["compare", "a", "b", "--atol", "1e-3", "--shape", "x:2x4", "--shape", "y:[3]", "--seed", "7"]
    argv += ["--allow-dtype-change", "float32:float16"]
    options = options_from_args(build_parser().parse_args(argv), CompareOptions)
    assert options.atol == 1e-3 and options.rtol == DEFAULT_TOLERANCE and options.seed == 7
    assert options.shapes == {"x": (2, 4), "y": (3,)}
    assert options.dtype_changes == (DtypeChange("float32", "float16", by="--allow-dtype-change"),)


def test_the_validate_step_takes_its_tolerances_from_compare() -> None:
    assert (ValidateOptions().atol, ValidateOptions().rtol) == (CompareOptions().atol, CompareOptions().rtol)
    assert (CompareOptions().atol, CompareOptions().rtol) == (DEFAULT_TOLERANCE, DEFAULT_TOLERANCE)


def test_the_default_tolerance_is_written_once() -> None:
    """No float literal 1e-5 in the comparison modules, the compare command or the pipeline's steps but the
    one of ``DEFAULT_TOLERANCE``."""
    files = [*sorted((GSKIT / "compare").glob("*.py")), GSKIT / "cli/compare.py", GSKIT / "pipeline/steps.py"]
    found = [
        str(path.relative_to(GSKIT))
        for path in files
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value == 1e-5 and isinstance(node.value, float)
    ]
    assert found == ["compare/options.py"]


@pytest.mark.parametrize(
    "bad",
    [{"atol": float("nan")}, {"rtol": -1.0}, {"seed": -1}, {"backend": "cuda"}, {"shapes": ["x:0x4"]}],
)
def test_every_comparison_refuses_bad_options_in_one_line(bad: dict) -> None:
    for function in (compare, compare_layerwise, compare_plugins):
        with pytest.raises(GskitError) as caught:
            function(EXAMPLE, EXAMPLE, **bad)
        assert "\n" not in str(caught.value)
    with pytest.raises(GskitError, match="unknown comparison option"):
        compare(EXAMPLE, EXAMPLE, atl=1e-3)


def test_the_options_are_one_value_for_every_comparison(tmp_path) -> None:
    """One CompareOptions runs all three comparisons; a keyword changes one field of it."""
    feeds = {"x": np.random.default_rng(1).standard_normal(EXAMPLE_SHAPES["x"]).astype(np.float32)}
    options = CompareOptions(atol=1e-4, feeds=feeds)
    outputs = compare(EXAMPLE, EXAMPLE, options)
    layers = compare_layerwise(EXAMPLE, EXAMPLE, options, chunk=8)
    assert outputs.passed and layers.passed and layers.chunk == 8
    for result in (outputs, layers):
        assert (result.atol, result.rtol, result.input_shapes) == (1e-4, DEFAULT_TOLERANCE, EXAMPLE_SHAPES)
    np.savez(tmp_path / "in.npz", **feeds)
    from_file = compare(EXAMPLE, EXAMPLE, options, feeds=None, inputs=str(tmp_path / "in.npz"))
    assert [o.max_abs_err for o in from_file.outputs] == [o.max_abs_err for o in outputs.outputs]


def test_every_report_starts_with_the_same_header() -> None:
    header = [f.name for f in dataclasses.fields(ComparisonHeader)]
    assert header == ["passed", "input_shapes", "atol", "rtol", "under_test"]
    for cls in (CompareReport, LayerwiseReport, PluginCompareReport):
        assert issubclass(cls, ComparisonHeader)
        assert [f.name for f in dataclasses.fields(cls)][: len(header)] == header
    printed = json.loads(report.dumps(compare(EXAMPLE, EXAMPLE, shapes=EXAMPLE_SHAPES)))
    assert list(printed) == [*header, "outputs", "reference"]
    assert (printed["under_test"], printed["reference"]) == ("prepared", "original")


def test_the_backends_offer_the_same_runners() -> None:
    """compare asks a backend by name; each answers the same calls with the same parameters."""
    assert BACKENDS == {"onnxruntime": ort_backend, "trt": trt_backend}
    for call in ("require_runtime", "comparison_runner", "run_unit", "tensor_source"):
        ort_call, trt_call = getattr(ort_backend, call), getattr(trt_backend, call)
        assert list(inspect.signature(ort_call).parameters) == list(inspect.signature(trt_call).parameters)
    assert (ort_backend.NAME, trt_backend.NAME) == ("onnxruntime", "tensorrt")


def test_compare_names_no_backend_in_a_test() -> None:
    """No ``backend == "onnxruntime"`` in the comparisons: the backend module is looked up and asked."""
    tests = [
        f"{path.name}:{node.lineno}"
        for path in sorted((GSKIT / "compare").glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Compare)
        and any(isinstance(c, ast.Constant) and c.value in BACKENDS for c in (node.left, *node.comparators))
    ]
    assert tests == []


def test_detections_take_the_same_options() -> None:
    assert list(inspect.signature(compare_detections).parameters)[3:] == ["options", "changes"]
