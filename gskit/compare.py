"""Compare two models (or two runs) output by output on the same inputs.

Built on Polygraphy's ``Comparator``: each side is a Polygraphy runner, so any backend Polygraphy can
run plugs in (``onnxrt_runner`` here gives an ``OnnxrtRunner`` whose session runs plugin nodes through
their numpy references; a TensorRT runner can take either side). Polygraphy's ``SimpleCompareFunc``
decides pass/fail per output: an element matches when its absolute error is at most ``atol`` **or** its
relative error (to the reference side) is at most ``rtol``; shapes must be equal.

gskit adds what Polygraphy leaves to the caller: inputs from gskit's feeds, outputs matched by name with
an error when the prepared model lacks one, and a typed report.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from gskit import model as gsmodel
from gskit.backends import ort as ort_backend
from gskit.errors import GskitError
from gskit.feeds import random_feeds
from gskit.plugin import PluginRegistry

log = logging.getLogger(__name__)

ModelSource = onnx.ModelProto | str | os.PathLike


@dataclass(frozen=True)
class OutputComparison:
    """One output compared between the reference run and the run under test.

    Attributes:
        name: output name (the same in both models).
        shape: shape in the reference run.
        dtype: numpy dtype name in the reference run.
        max_abs_err: largest absolute difference (``inf`` when the shapes differ).
        max_rel_err: largest difference relative to the reference value (``inf`` when the shapes differ).
        passed: every element within ``atol`` or ``rtol``, and the shapes are equal.
        shape_under_test: shape in the run under test.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    max_abs_err: float
    max_rel_err: float
    passed: bool
    shape_under_test: tuple[int, ...] = ()


@dataclass(frozen=True)
class CompareReport:
    """Result of :func:`compare`.

    Attributes:
        outputs: one entry per output of the reference model, in its order.
        passed: all outputs passed.
        input_shapes: the shape of each input fed to both runs.
        atol: absolute tolerance used.
        rtol: relative tolerance used.
        reference: name of the reference runner.
        under_test: name of the runner under test.
    """

    outputs: list[OutputComparison]
    passed: bool
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    atol: float = 1e-5
    rtol: float = 1e-5
    reference: str = "original"
    under_test: str = "prepared"

    @property
    def failed(self) -> list[OutputComparison]:
        return [o for o in self.outputs if not o.passed]


def compare(
    original: ModelSource,
    prepared: ModelSource,
    *,
    feeds: Mapping[str, np.ndarray] | None = None,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    seed: int = 0,
    atol: float = 1e-5,
    rtol: float = 1e-5,
    plugins: PluginRegistry | None = None,
) -> CompareReport:
    """Run both models on onnxruntime with the same inputs and compare their outputs by name.

    Args:
        original: the reference model (a ModelProto or a path).
        prepared: the model under test; it must have every output of ``original`` (by name).
        feeds: inputs by name; ``None`` draws random inputs (``gskit.feeds.random_feeds``) from ``seed``.
        shapes: input shapes for random inputs, overriding symbolic dims.
        seed: seed of the random inputs.
        atol: absolute tolerance.
        rtol: relative tolerance.
        plugins: specs of plugin nodes in either model; they run through their numpy references.

    Raises:
        GskitError: a model cannot be loaded or run, or ``prepared`` lacks an output of ``original``.
    """
    original_proto, prepared_proto = _proto(original), _proto(prepared)
    expected = [o.name for o in original_proto.graph.output]
    have = {o.name for o in prepared_proto.graph.output}
    missing = [name for name in expected if name not in have]
    if missing:
        raise GskitError(
            f"{_label(prepared)} lacks output(s) {missing} of {_label(original)}; outputs are matched by name"
        )
    if feeds is None:
        feeds = random_feeds(original_proto, shapes, seed=seed)
    runners = (
        onnxrt_runner(
            original if not isinstance(original, onnx.ModelProto) else original_proto, plugins, "original"
        ),
        onnxrt_runner(
            prepared if not isinstance(prepared, onnx.ModelProto) else prepared_proto, plugins, "prepared"
        ),
    )
    return compare_runners(runners[0], runners[1], feeds, outputs=expected, atol=atol, rtol=rtol)


def onnxrt_runner(model: ModelSource, plugins: PluginRegistry | None, name: str) -> Any:
    """A Polygraphy ``OnnxrtRunner`` whose session knows plugin references (made on activation)."""
    from polygraphy.backend.onnxrt import OnnxrtRunner

    return OnnxrtRunner(lambda: ort_backend.session(model, plugins=plugins), name=name)


def compare_runners(
    reference: Any,
    under_test: Any,
    feeds: Mapping[str, np.ndarray],
    *,
    outputs: Sequence[str] | None = None,
    atol: float = 1e-5,
    rtol: float = 1e-5,
) -> CompareReport:
    """Run two Polygraphy runners on ``feeds`` and compare the named outputs (all of the reference's if None).

    Raises:
        GskitError: a runner fails, or the runner under test lacks one of the outputs.
    """
    from polygraphy.comparator import Comparator, SimpleCompareFunc
    from polygraphy.exception import PolygraphyException

    feeds = {name: np.asarray(value) for name, value in feeds.items()}
    try:
        with _quiet_polygraphy():
            results = Comparator.run([reference, under_test], data_loader=[feeds])
            accuracy = Comparator.compare_accuracy(
                results, compare_func=SimpleCompareFunc(atol=atol, rtol=rtol, check_shapes=True)
            )
    except PolygraphyException as err:
        raise GskitError(f"comparison failed to run: {_first_line(err)}") from err
    except GskitError:
        raise
    ref_out = results[0][1][0]
    test_out = results[1][1][0]
    names = list(outputs) if outputs is not None else list(ref_out.keys())
    missing = [n for n in names if n not in test_out]
    if missing:
        raise GskitError(
            f"{under_test.name} did not produce output(s) {missing}; outputs are matched by name"
        )
    verdicts = _verdicts(accuracy)
    rows = [_row(name, ref_out[name], test_out[name], verdicts.get(name)) for name in names]
    return CompareReport(
        outputs=rows,
        passed=all(r.passed for r in rows),
        input_shapes={name: tuple(int(d) for d in value.shape) for name, value in feeds.items()},
        atol=atol,
        rtol=rtol,
        reference=reference.name,
        under_test=under_test.name,
    )


def _verdicts(accuracy: Any) -> dict[str, Any]:
    """Per-output results of the one comparison and iteration (Polygraphy wraps them in a list of dicts)."""
    for result in getattr(accuracy, "lst", [accuracy]):
        for iterations in result.values():
            return dict(iterations[0]) if iterations else {}
    return {}


def _row(name: str, expected: Any, actual: Any, verdict: Any) -> OutputComparison:
    expected, actual = np.asarray(expected), np.asarray(actual)
    if expected.shape != actual.shape:
        abs_err = rel_err = math.inf
        passed = False
    else:
        abs_err, rel_err = _errors(expected, actual)
        passed = bool(verdict) if verdict is not None else False
    return OutputComparison(
        name=name,
        shape=tuple(int(d) for d in expected.shape),
        dtype=str(expected.dtype),
        max_abs_err=abs_err,
        max_rel_err=rel_err,
        passed=passed,
        shape_under_test=tuple(int(d) for d in actual.shape),
    )


def _errors(expected: np.ndarray, actual: np.ndarray) -> tuple[float, float]:
    if expected.size == 0:
        return 0.0, 0.0
    if expected.dtype == np.bool_ or not np.issubdtype(expected.dtype, np.number):
        diff = (expected != actual).astype(np.float64)
        return float(diff.max()), float(diff.max())
    a = expected.astype(np.float64)
    b = actual.astype(np.float64)
    absdiff = np.abs(a - b)
    both_nan = np.isnan(a) & np.isnan(b)
    same_inf = np.isinf(a) & (a == b)
    absdiff = np.where(both_nan | same_inf, 0.0, absdiff)
    with np.errstate(divide="ignore", invalid="ignore"):
        reldiff = np.where(absdiff == 0, 0.0, absdiff / np.abs(a))
    return float(np.nan_to_num(absdiff, nan=math.inf).max()), float(
        np.nan_to_num(reldiff, nan=math.inf).max()
    )


def _proto(model: ModelSource) -> onnx.ModelProto:
    return model if isinstance(model, onnx.ModelProto) else gsmodel.load(model, load_weights=False)


def _label(model: ModelSource) -> str:
    return "prepared model" if isinstance(model, onnx.ModelProto) else str(model)


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else repr(err)


@contextmanager
def _quiet_polygraphy() -> Iterator[None]:
    """Polygraphy logs to stdout; keep it to errors (or gskit's debug level) while comparing."""
    from polygraphy.logger import G_LOGGER

    severity = G_LOGGER.VERBOSE if log.isEnabledFor(logging.DEBUG) else G_LOGGER.CRITICAL
    with G_LOGGER.verbosity(severity):
        yield
