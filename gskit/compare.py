"""Compare two models (or two runs) output by output on the same inputs.

Built on Polygraphy's ``Comparator``: each side is a Polygraphy runner, so any backend Polygraphy can
run plugs in (``gskit.backends.ort.runner`` gives an ``OnnxrtRunner`` whose session runs plugin nodes
through their numpy references; ``gskit.backends.trt.trt_runner`` a TensorRT runner). Runners come from
``gskit.backends``; this module only compares. Polygraphy's ``SimpleCompareFunc``
decides pass/fail per output: an element matches when its absolute error is at most ``atol`` **or** its
relative error (to the reference side) is at most ``rtol``; shapes must be equal.

gskit adds what Polygraphy leaves to the caller: inputs from gskit's feeds, outputs matched by name with
an error when the prepared model lacks one, and a typed report.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from gskit import model as gsmodel
from gskit.backends import ort as ort_backend
from gskit.backends import trt as trt_backend
from gskit.errors import GskitError
from gskit.feeds import feed_shapes, resolve_feeds
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
    prepared: ModelSource | None,
    *,
    feeds: Mapping[str, np.ndarray] | None = None,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    seed: int = 0,
    atol: float = 1e-5,
    rtol: float = 1e-5,
    plugins: PluginRegistry | None = None,
    backend: str = "onnxruntime",
    engine: str | os.PathLike | None = None,
    trt_plugins: Sequence[str | os.PathLike] = (),
) -> CompareReport:
    """Run the original on onnxruntime and the prepared model on ``backend``; compare outputs by name.

    Args:
        original: the reference model (a ModelProto or a path).
        prepared: the model under test; it must have every output of ``original`` (by name). May be
            ``None`` when ``engine`` is given.
        feeds: inputs by name; ``None`` draws random inputs (``gskit.feeds.random_feeds``) from ``seed``.
        shapes: input shapes for random inputs, overriding symbolic dims.
        seed: seed of the random inputs.
        atol: absolute tolerance.
        rtol: relative tolerance.
        plugins: specs of plugin nodes in either model; on onnxruntime they run through their numpy
            references.
        backend: what runs ``prepared``: ``"onnxruntime"`` (CPU) or ``"trt"`` (full TensorRT on a GPU,
            through Polygraphy's ``TrtRunner``; the original still runs on onnxruntime).
        engine: a serialized TensorRT engine to run instead of building ``prepared`` (implies ``"trt"``).
        trt_plugins: plugin libraries / folders loaded into TensorRT (``"trt"`` only).

    Raises:
        GskitError: a model cannot be loaded or run, ``prepared`` lacks an output of ``original``, or
            ``"trt"`` is asked for without full TensorRT and a GPU.
    """
    backend = check_backend(backend, engine)
    if prepared is None and engine is None:
        raise GskitError("compare needs a prepared model or an engine")
    original_proto = source_model(original)
    prepared_proto = source_model(prepared) if prepared is not None else None
    expected = [o.name for o in original_proto.graph.output]
    if not expected:
        raise GskitError(f"{source_label(original)} has no graph outputs: nothing to compare")
    have = {o.name for o in prepared_proto.graph.output} if prepared_proto is not None else set(expected)
    missing = [name for name in expected if name not in have]
    if missing and engine is None:
        raise GskitError(
            f"{source_label(prepared)} lacks output(s) {missing} of {source_label(original)}; "
            "outputs are matched by name"
        )
    feeds = resolve_feeds(original_proto, feeds, shapes, seed=seed)
    reference = ort_backend.runner(
        original if not isinstance(original, onnx.ModelProto) else original_proto, plugins, "original"
    )
    if backend == "onnxruntime":
        under_test = ort_backend.runner(
            prepared if not isinstance(prepared, onnx.ModelProto) else prepared_proto, plugins, "prepared"
        )
        return compare_runners(reference, under_test, feeds, outputs=expected, atol=atol, rtol=rtol)
    with model_file(engine if engine is not None else prepared) as path:  # type: ignore[arg-type]
        under_test = trt_backend.trt_runner(path, feeds, trt_plugins, name="tensorrt")
        return compare_runners(reference, under_test, feeds, outputs=expected, atol=atol, rtol=rtol)


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
        with quiet_polygraphy():
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
        input_shapes=feed_shapes(feeds),
        atol=atol,
        rtol=rtol,
        reference=reference.name,
        under_test=under_test.name,
    )


def compare_arrays(
    reference: Mapping[str, np.ndarray],
    under_test: Mapping[str, np.ndarray],
    names: Sequence[str],
    *,
    atol: float = 1e-5,
    rtol: float = 1e-5,
) -> list[OutputComparison]:
    """Compare arrays already computed, with the same rule as :func:`compare_runners` (Polygraphy's).

    Raises:
        GskitError: a name is missing from one side.
    """
    from polygraphy.comparator import SimpleCompareFunc
    from polygraphy.comparator.struct import IterationResult

    for side, values in (("reference", reference), ("run under test", under_test)):
        missing = [n for n in names if n not in values]
        if missing:
            raise GskitError(f"the {side} lacks tensor(s) {missing}; tensors are matched by name")
    ref = {n: np.asarray(reference[n]) for n in names}
    test = {n: np.asarray(under_test[n]) for n in names}
    with quiet_polygraphy():
        verdicts = SimpleCompareFunc(atol=atol, rtol=rtol, check_shapes=True)(
            IterationResult(ref, runner_name="reference"), IterationResult(test, runner_name="under test")
        )
    return [_row(n, ref[n], test[n], verdicts.get(n)) for n in names]


# -- TensorRT (full TensorRT and a GPU) ------------------------------------------------------------------

#: Backends of the run under test.
COMPARE_BACKENDS = ("onnxruntime", "trt")


def check_backend(backend: str, engine: str | os.PathLike | None = None) -> str:
    """The backend of the run under test (``engine`` implies ``"trt"``); checks TensorRT and a GPU for it.

    Raises:
        GskitError: an unknown backend, or ``"trt"`` without full TensorRT or without a GPU.
    """
    if backend not in COMPARE_BACKENDS:
        raise GskitError(f"unknown compare backend {backend!r}; choose one of {', '.join(COMPARE_BACKENDS)}")
    if engine is not None:
        backend = "trt"
    if backend == "trt":
        trt_backend.require_gpu_tensorrt("--backend trt")
    return backend


@contextmanager
def model_file(model: ModelSource) -> Iterator[Path]:
    """A path for ``model``: the file itself, or an in-memory model saved to a temporary folder."""
    if not isinstance(model, onnx.ModelProto):
        path = Path(model)
        if not path.is_file():
            raise GskitError(f"{path}: no such model or engine file")
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="gskit-compare-") as tmp:
        yield gsmodel.save(model, Path(tmp) / "model.onnx", check=False)


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


def source_model(model: ModelSource) -> onnx.ModelProto:
    """``model`` itself if it is a ModelProto, else the model at that path with its weights left on disk.

    Raises:
        GskitError: the file cannot be loaded (as ``gskit.model.load``).
    """
    return model if isinstance(model, onnx.ModelProto) else gsmodel.load(model, load_weights=False)


def source_label(model: ModelSource) -> str:
    """How messages name a compared model: its path, or "prepared model" for an in-memory ModelProto."""
    return "prepared model" if isinstance(model, onnx.ModelProto) else str(model)


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else repr(err)


@contextmanager
def quiet_polygraphy() -> Iterator[None]:
    """Polygraphy logs to stdout; silence it (gskit's debug level: verbose) while comparing.

    Its critical messages still arrive, as the ``PolygraphyException`` that gskit turns into one line.
    """
    from polygraphy.logger import G_LOGGER

    severity = G_LOGGER.VERBOSE if log.isEnabledFor(logging.DEBUG) else G_LOGGER.CRITICAL + 1
    with G_LOGGER.verbosity(severity):
        yield
