"""gskit's folding adds no failures to onnx's backend node tests on onnxruntime.

Each case of ``onnx.backend.test.loader.load_model_tests(kind="node")`` runs on onnxruntime as given and after
``gskit.passes.fold``; a case that onnxruntime passes alone must pass after folding. The cases onnxruntime
fails alone are data (``tests/data/ort_node_failures.txt``), regenerated with::

    python tests/test_fold_conformance.py --write-ort-failures

Normal CI runs a fixed sample (every 5th case by name plus every tricky family); the full set runs with
``GSKIT_FULL_CONFORMANCE=1``. ``python tests/test_fold_conformance.py --compare-graphsurgeon`` prints the
failures of gskit's fold and of graphsurgeon's default fold (Polygraphy's ``fold_constants`` + cleanup) side
by side.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from gskit.io.model import MAX_ORT_IR_VERSION
from gskit.passes.fold import fold

FAILURES_FILE = Path(__file__).parent / "data" / "ort_node_failures.txt"
#: Families where folding has gone wrong before (in graphsurgeon or gskit): always in the sample.
TRICKY_PREFIXES = (
    "test_shape",
    "test_if",
    "test_loop",
    "test_scan",
    "test_identity",
    "test_attention",
    "test_group_norm",
    "test_optional",
    "test_sequence",
    "test_split_to_sequence",
    "test_constant",
    "test_range",
    "test_size",
    "test_layer_normalization",
    "test_cast",
    "test_reshape",
    "test_expand",
    "test_flatten",
    "test_slice",
    "test_rotary_embedding",  # Split sizes computed from Shape: onnxruntime's inference split them evenly
)
SAMPLE_EVERY = 5

Transform = Callable[[onnx.ModelProto], onnx.ModelProto]


@functools.cache
def node_cases() -> dict[str, object]:
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {case.name: case for case in sorted(load_model_tests(kind="node"), key=lambda c: c.name)}


def sample_names(names: list[str]) -> list[str]:
    """Every SAMPLE_EVERY-th case by name, plus all cases of the tricky families."""
    return [n for i, n in enumerate(names) if i % SAMPLE_EVERY == 0 or n.startswith(TRICKY_PREFIXES)]


def known_ort_failures() -> set[str]:
    lines = FAILURES_FILE.read_text().splitlines() if FAILURES_FILE.exists() else []
    return {line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()}


def run_case(case, transform: Transform | None = None) -> str | None:
    """Run one node test on onnxruntime (after ``transform``); None when it passes, else why it failed."""
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    # What gskit.io.model.save writes: the IR version onnxruntime loads.
    model.ir_version = min(model.ir_version, MAX_ORT_IR_VERSION)
    if transform is not None:
        try:
            model = transform(model)
        except Exception as err:
            return f"transform raised {type(err).__name__}: {_first_line(err)}"
    inputs, expected = case.data_sets[0]
    try:
        options = ort.SessionOptions()
        options.log_severity_level = 4
        sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        names = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
        feeds = dict(zip(names, (_value(v) for v in inputs), strict=False))
        wanted = {i.name for i in sess.get_inputs()}
        outputs = sess.run(None, {k: v for k, v in feeds.items() if k in wanted})
    except Exception as err:
        return f"onnxruntime: {_first_line(err)}"
    if len(outputs) != len(expected):
        return f"{len(outputs)} outputs, expected {len(expected)}"
    for index, (got, want) in enumerate(zip(outputs, expected, strict=True)):
        problem = _compare(got, want, case.rtol, case.atol)
        if problem:
            return f"output {index}: {problem}"
    return None


def _value(value):
    """A test input as onnxruntime takes it: numpy arrays, lists for sequences, None for empty optionals."""
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    if isinstance(value, onnx.SequenceProto):
        return [_value(v) for v in onnx.numpy_helper.to_list(value)]
    if isinstance(value, onnx.OptionalProto):
        return _value(onnx.numpy_helper.to_optional(value))
    if isinstance(value, list):
        return [_value(v) for v in value]
    if isinstance(value, np.generic):
        return np.asarray(value)
    return value


def _compare(got, want, rtol: float, atol: float) -> str | None:
    if want is None or got is None:
        return None if want is None and got is None else f"got {type(got).__name__}, expected {want!r}"
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return f"sequence mismatch ({type(got).__name__})"
        for g, w in zip(got, want, strict=True):
            problem = _compare(g, w, rtol, atol)
            if problem:
                return problem
        return None
    want, got = np.asarray(_value(want)), np.asarray(got)
    if want.shape != got.shape:
        return f"shape {got.shape}, expected {want.shape}"
    if want.dtype == object or want.dtype.kind in "USb" or got.dtype.kind in "USb":
        return None if np.array_equal(got.astype(want.dtype), want) else "values differ"
    if got.dtype != want.dtype and not (got.dtype.kind == want.dtype.kind == "f"):
        try:
            if got.dtype.itemsize != want.dtype.itemsize:
                return f"dtype {got.dtype}, expected {want.dtype}"
        except TypeError:
            pass
    try:
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol)
    except AssertionError:
        return "values differ"
    except (TypeError, ValueError):
        return None if np.array_equal(got, want) else "values differ"
    return None


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [repr(err)])[0][:200]


def gskit_fold(model: onnx.ModelProto) -> onnx.ModelProto:
    return fold(model)[0]


def graphsurgeon_fold(model: onnx.ModelProto) -> onnx.ModelProto:
    """What ``polygraphy surgeon sanitize --fold-constants`` does: Polygraphy's fold_constants (gs inside)."""
    from polygraphy.backend.onnx import fold_constants
    from polygraphy.logger import G_LOGGER

    G_LOGGER.module_severity = G_LOGGER.ERROR
    folded = fold_constants(model, error_ok=True)
    return folded


def new_failures(names: list[str], transform: Transform) -> dict[str, str]:
    known = known_ort_failures()
    cases = node_cases()
    failures = {}
    for name in names:
        if name in known:
            continue
        problem = run_case(cases[name], transform)
        if problem:
            failures[name] = problem
    return failures


def _assert_none(failures: dict[str, str]) -> None:
    listing = "\n".join(f"{name}: {why}" for name, why in sorted(failures.items()))
    assert not failures, (
        f"gskit.passes.fold broke {len(failures)} node tests that onnxruntime passes:\n{listing}"
    )


def test_sample_adds_no_failures():
    names = sample_names(list(node_cases()))
    assert len(names) > 400
    _assert_none(new_failures(names, gskit_fold))


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("GSKIT_FULL_CONFORMANCE") != "1", reason="set GSKIT_FULL_CONFORMANCE=1")
def test_full_set_adds_no_failures():
    _assert_none(new_failures(list(node_cases()), gskit_fold))


def test_known_failures_are_real_cases():
    names = set(node_cases())
    unknown = known_ort_failures() - names
    assert not unknown, f"{FAILURES_FILE.name} names cases that do not exist: {sorted(unknown)[:5]}"


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write-ort-failures", action="store_true", help=f"rewrite {FAILURES_FILE.name}")
    parser.add_argument("--compare-graphsurgeon", action="store_true", help="also run graphsurgeon's fold")
    parser.add_argument("--only", help="run the cases whose name starts with this")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    cases = node_cases()
    names = [n for n in cases if not args.only or n.startswith(args.only)]
    if args.write_ort_failures:
        failing = {n: run_case(cases[n]) for n in names}
        lines = [f"{n}  # {why}" for n, why in failing.items() if why]
        FAILURES_FILE.parent.mkdir(parents=True, exist_ok=True)
        FAILURES_FILE.write_text(
            "# onnx backend node tests that onnxruntime fails by itself (no folding); one name per line.\n"
            f"# onnx {onnx.__version__}, onnxruntime {ort.__version__}; "
            "regenerate: python tests/test_fold_conformance.py --write-ort-failures\n"
            + "\n".join(lines)
            + "\n"
        )
        print(f"{len(lines)} of {len(names)} cases fail on onnxruntime alone -> {FAILURES_FILE}")
        return 0
    transforms = {"gskit": gskit_fold}
    if args.compare_graphsurgeon:
        transforms["graphsurgeon"] = graphsurgeon_fold
    known = known_ort_failures()
    print(f"{len(names)} cases, {len(known & set(names))} fail on onnxruntime alone")
    for label, transform in transforms.items():
        failures = new_failures(names, transform)
        print(f"{label}: {len(failures)} new failures")
        for name, why in sorted(failures.items()):
            print(f"  {label} {name}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
