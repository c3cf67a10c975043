"""Compare two models (or two runs) output by output on the same inputs.

The original runs on onnxruntime (``gskit.backends.ort.session``: plugin nodes through their numpy
references). When the model under test runs there too, both sessions are run here directly; on another
backend (``gskit.backends.trt``: a TensorRT runner) the model under test runs as the Polygraphy runner the
backend gives, through Polygraphy's ``Comparator``. Inputs that do not fit a session as they are (another
shape, a loosely matching name) go through Polygraphy's ``OnnxrtRunner``, which reshapes or refuses them. At
gskit's debug level both sides run as Polygraphy runners, for their lines.

Pass/fail per output is Polygraphy's ``SimpleCompareFunc`` rule, computed by :func:`within_tolerance` (the
same verdicts, tested against it, without importing Polygraphy): an element matches when its absolute error
is at most ``atol`` **or** its relative error (to the run under test) is at most ``rtol``; shapes must be
equal.

Tolerances follow each output's dtype: the given ``atol``/``rtol`` (``DEFAULT_TOLERANCE``) are what float32
outputs get, and lower-precision outputs get at least the floor of :data:`DTYPE_TOLERANCE` (float16: 4e-3,
about four units in the last place; bfloat16: 3e-2, likewise). The original rounds to float16 after each op (a
float16 LayerNormalization differs from an exact one by up to three units on BERT), a plugin rounds once: that
is then not reported as a failure, while a real error (a wrong epsilon, a lost bias) still is.

Values that are not finite match only themselves, element by element: inf matches inf of the same sign and
NaN matches NaN (the original computes NaN there too), whatever the tolerances; inf against a finite value or
against inf of the other sign, and NaN against anything but NaN, fail whatever the tolerances. Their errors
are reported as ``inf``.

Integer, bool and string outputs are compared exactly (never through float64, which cannot tell
``2**60`` from ``2**60 + 100``), and an output of :func:`compare` whose dtype changed is a failure of its own
unless the caller names that change as expected (:class:`DtypeChange`, e.g. the fp16 outputs that a
recipe's ``convert`` step made).

gskit adds what Polygraphy leaves to the caller: inputs from gskit's feeds, outputs matched by name with
an error when the prepared model lacks one, and a typed report.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from types import ModuleType
from typing import Any

import numpy as np
import onnx

from gskit.backends import ort as ort_backend
from gskit.backends import trt as trt_backend
from gskit.backends.model_run import ModelRun
from gskit.compare.options import (
    DEFAULT_TOLERANCE,
    CompareOptions,
    ComparisonHeader,
    DtypeChange,
    ModelSource,
    check_tolerances,
    source_label,
    source_model,
)
from gskit.errors import GskitError, ModelLoadError, PluginError
from gskit.io.feeds import feed_shapes
from gskit.plugin.registry import PluginRegistry

log = logging.getLogger(__name__)


#: Lowest (atol, rtol) an output of this dtype is compared with: about four units in the last place.
DTYPE_TOLERANCE: dict[str, tuple[float, float]] = {"float16": (4e-3, 4e-3), "bfloat16": (3e-2, 3e-2)}


def tolerance_for(dtype: Any, atol: float, rtol: float) -> tuple[float, float]:
    """``(atol, rtol)`` for an output of ``dtype``: the given ones, raised to the dtype's floor; ``(0, 0)``
    for integers and bools, which are compared exactly."""
    if _exact(dtype):
        return 0.0, 0.0
    floor_atol, floor_rtol = DTYPE_TOLERANCE.get(
        str(np.dtype(dtype)) if dtype is not None else "", (0.0, 0.0)
    )
    return max(atol, floor_atol), max(rtol, floor_rtol)


def _exact(dtype: Any) -> bool:
    """Integers, bools and strings are compared for equality; a tolerance means nothing for them."""
    return dtype is not None and np.dtype(dtype).kind not in "fc"


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
        atol: absolute tolerance this output was compared with (follows its dtype, see
            :func:`tolerance_for`; 0 for integers and bools, compared exactly).
        rtol: relative tolerance this output was compared with.
        dtype_under_test: numpy dtype name in the run under test.
        note: what else to know: a dtype change (a failure, or expected and by what).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    max_abs_err: float
    max_rel_err: float
    passed: bool
    shape_under_test: tuple[int, ...] = ()
    atol: float = DEFAULT_TOLERANCE
    rtol: float = DEFAULT_TOLERANCE
    dtype_under_test: str = ""
    note: str = ""

    @property
    def dtypes(self) -> str:
        """``float32``, or ``int64 -> float32`` when the run under test gave another dtype."""
        changed = self.dtype_under_test and self.dtype_under_test != self.dtype
        return f"{self.dtype} -> {self.dtype_under_test}" if changed else self.dtype


@dataclass(frozen=True, kw_only=True)
class CompareReport(ComparisonHeader):
    """Result of :func:`compare`: the header (:class:`ComparisonHeader`: ``passed``: all outputs passed), then

    Attributes:
        outputs: one entry per output of the reference model, in its order.
        reference: name of the reference runner.
    """

    outputs: list[OutputComparison]
    reference: str = "original"

    @property
    def failed(self) -> list[OutputComparison]:
        return [o for o in self.outputs if not o.passed]


def compare(
    original: ModelSource,
    prepared: ModelSource | None,
    options: CompareOptions | None = None,
    **changes: Any,
) -> CompareReport:
    """Run the original on onnxruntime and the prepared model on ``options.backend``; compare outputs by name.

    Args:
        original: the reference model (a ModelProto or a path).
        prepared: the model under test; it must have every output of ``original`` (by name). May be
            ``None`` when ``options.engine`` is given.
        options: the inputs, tolerances, backend and plugins (:class:`CompareOptions`; its defaults if None).
            On ``"trt"`` (full TensorRT on a GPU, through Polygraphy's ``TrtRunner``) the original still runs
            on onnxruntime; ``dtype_changes`` lists the output dtype changes that are expected.
        changes: fields of ``options`` to change (``atol=1e-3``, ``feeds={...}``).

    Raises:
        GskitError: a model cannot be loaded or run (a model that onnxruntime cannot load at all is said
            once, never retried: ``ModelLoadError``), the models' inputs differ (names, dtype kinds, ranks
            or fixed dims), ``prepared`` lacks an output of ``original``, or ``"trt"`` is asked for without
            full TensorRT and a GPU.
    """
    options = CompareOptions.given(options, changes)
    backend = backend_for(options)
    engine = options.engine
    if prepared is None and engine is None:
        raise GskitError("compare needs a prepared model or an engine")
    original_proto = source_model(original)
    prepared_proto = source_model(prepared) if prepared is not None else None
    options = options.plugins_for(original_proto, prepared_proto)
    expected = [o.name for o in original_proto.graph.output]
    if not expected:
        raise GskitError(f"{source_label(original)} has no graph outputs: nothing to compare")
    check_tensor_outputs(original_proto, source_label(original))
    have = {o.name for o in prepared_proto.graph.output} if prepared_proto is not None else set(expected)
    missing = [name for name in expected if name not in have]
    if missing and engine is None:
        raise GskitError(
            f"{source_label(prepared)} lacks output(s) {missing} of {source_label(original)}; "
            "outputs are matched by name"
        )
    if prepared_proto is not None:
        check_same_inputs(original_proto, prepared_proto, source_label(original), source_label(prepared))
    feeds = options.feeds_for(original_proto)
    # Each file is read once: the sessions get the models loaded above (see ``ort_backend.session``).
    # At gskit's debug level both sides run as Polygraphy runners, whose lines say what ran and how.
    direct = not log.isEnabledFor(logging.DEBUG)
    reference = (
        partial(_session_outputs, "original", original, original_proto, options.plugins)
        if direct
        else partial(
            _runner_outputs, ort_backend.runner(original, options.plugins, "original", original_proto)
        )
    )

    def compared(name: str, under_test: Callable[[Mapping[str, np.ndarray]], Any]) -> CompareReport:
        try:
            return _compare_sides(
                ("original", reference),
                (name, under_test),
                feeds,
                outputs=expected,
                atol=options.atol,
                rtol=options.rtol,
                dtype_changes=options.dtype_changes,
            )
        except ReferenceRunError as err:
            if not options.random_inputs:
                raise
            raise ReferenceRunError(
                f"{err}; give shapes that fit with --shape NAME:DIMS or real inputs with --inputs F.npz",
                err.failure,
                err.input_shapes,
            ) from err

    if backend is ort_backend and direct:
        # The model under test runs where the reference runs: both are plain onnxruntime sessions, run
        # here; a Polygraphy runner (its import, its per-run bookkeeping) costs more than the two runs
        # of a small model.
        return compared(
            UNDER_TEST_NAMES[options.under_test_backend],
            partial(
                _session_outputs,
                UNDER_TEST_NAMES[options.under_test_backend],
                prepared,
                prepared_proto,
                options.plugins,
            ),
        )
    under_test = ModelRun(
        engine if engine is not None else prepared,
        feeds,
        UNDER_TEST_NAMES[options.under_test_backend],
        options.plugins,
        options.trt_plugins,
        loaded=prepared_proto if engine is None else None,
    )
    with backend.comparison_runner(under_test) as runner:
        return compared(runner.name, partial(_runner_outputs, runner))


#: The name of the run under test in :class:`CompareReport` (``under_test``), by backend.
UNDER_TEST_NAMES = {"onnxruntime": "prepared", "trt": "tensorrt"}


def check_tensor_outputs(model: onnx.ModelProto, label: str) -> None:
    """Outputs are compared as tensors: a sequence, map or optional output is refused by name (the runner
    cannot return one, and other input shapes would not help).

    Raises:
        GskitError: naming the outputs and their kinds.
    """
    others = [
        f"'{o.name}' ({o.type.WhichOneof('value') or 'no type'})"
        for o in model.graph.output
        if o.type.WhichOneof("value") not in ("tensor_type", None)
    ]
    if others:
        raise GskitError(
            f"{label}: output(s) {', '.join(others)} are not tensors, and gskit compares tensor outputs "
            "only; compare the tensors they are made of (gskit edit --expose NAME), or leave validate out"
        )


def check_same_inputs(
    original: onnx.ModelProto, prepared: onnx.ModelProto, original_label: str, prepared_label: str
) -> None:
    """Refuse two models that cannot take the same inputs, before running either.

    The prepared model may drop an input the original has (an unused one) and may narrow or widen an input
    within its kind (``convert --fp16``: float32 -> float16; ``--int32``: int64 -> int32): the same values are
    cast to it. Anything else would feed it values it does not take and report a meaningless ``inf``: an input
    only the prepared model has, an input of another kind (float, integer, bool, string), another rank, or
    a fixed dim of another size.

    Raises:
        GskitError: one line naming each input that differs, as each model declares it.
    """
    ours, theirs = _declared_inputs(original), _declared_inputs(prepared)
    differ = []
    for name, (dtype, dims) in theirs.items():
        if name not in ours:
            differ.append(f"'{name}' only in {prepared_label} ({_declared(dtype, dims)})")
            continue
        other_dtype, other_dims = ours[name]
        if _kind(dtype) != _kind(other_dtype) or not _dims_fit(dims, other_dims):
            differ.append(
                f"'{name}' is {_declared(other_dtype, other_dims)} in {original_label}, "
                f"{_declared(dtype, dims)} in {prepared_label}"
            )
    if differ:
        raise GskitError(
            f"the models' inputs differ, so the same inputs cannot feed both: {'; '.join(differ)}; compare "
            f"a model with its own prepared copy (inputs named and typed alike), or isolate the same part"
        )


def _declared_inputs(model: onnx.ModelProto) -> dict[str, tuple[int, tuple[int | str | None, ...] | None]]:
    """Each graph input that is no initializer: (element type, dims as int, symbol or None; None: no rank)."""
    initializers = {t.name for t in model.graph.initializer}
    found = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        dims = None
        if tensor.HasField("shape"):
            dims = tuple(
                d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim
            )
        found[value.name] = (tensor.elem_type, dims)
    return found


def _kind(elem_type: int) -> str:
    """float, int, bool, string, or "" when unknown (a non-tensor input, an undefined type)."""
    if not elem_type:
        return ""
    kind = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).kind
    return {"f": "float", "c": "float", "i": "int", "u": "int", "b": "bool"}.get(kind, "string")


def _dims_fit(a: tuple | None, b: tuple | None) -> bool:
    """The same rank, and no dim fixed to two different sizes (symbols and unknown dims fit anything)."""
    if a is None or b is None:
        return True
    if len(a) != len(b):
        return False
    return all(not (isinstance(x, int) and isinstance(y, int) and x != y) for x, y in zip(a, b, strict=True))


def _declared(elem_type: int, dims: tuple | None) -> str:
    """``float32[2x4x8x8]``, ``float32[batch,16]`` (as a model declares an input)."""
    dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type).name if elem_type else "?"
    if dims is None:
        return f"{dtype}[?]"
    sep = "x" if all(isinstance(d, int) for d in dims) else ","
    return f"{dtype}[{sep.join('?' if d is None else str(d) for d in dims)}]"


def compare_runners(
    reference: Any,
    under_test: Any,
    feeds: Mapping[str, np.ndarray],
    *,
    outputs: Sequence[str] | None = None,
    atol: float = DEFAULT_TOLERANCE,
    rtol: float = DEFAULT_TOLERANCE,
    dtype_changes: Sequence[DtypeChange] | None = None,
) -> CompareReport:
    """Run two Polygraphy runners on ``feeds`` and compare the named outputs (all of the reference's if None).

    ``dtype_changes``: None compares values whatever the dtypes; a sequence (:func:`compare` gives one) makes
    every dtype change a failure except those it lists.

    Raises:
        GskitError: a runner fails, or the runner under test lacks one of the outputs.
    """
    return _compare_sides(
        (reference.name, partial(_runner_outputs, reference)),
        (under_test.name, partial(_runner_outputs, under_test)),
        feeds,
        outputs=outputs,
        atol=atol,
        rtol=rtol,
        dtype_changes=dtype_changes,
    )


#: One side of a comparison: its name in reports, and what runs it on the inputs and gives its outputs.
Side = tuple[str, Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]]


def _compare_sides(
    reference: Side,
    under_test: Side,
    feeds: Mapping[str, np.ndarray],
    *,
    outputs: Sequence[str] | None,
    atol: float,
    rtol: float,
    dtype_changes: Sequence[DtypeChange] | None,
) -> CompareReport:
    """Run both sides on ``feeds`` (the reference first) and compare their outputs: :func:`compare_runners`.

    Raises:
        GskitError: a side fails to run, or the side under test lacks one of the outputs.
    """
    check_tolerances(atol, rtol)

    feeds = {name: np.asarray(value) for name, value in feeds.items()}
    (ref_name, run_ref), (test_name, run_test) = reference, under_test
    # One side at a time, so a failure names the side that failed: the reference failing means the inputs
    # do not fit the model, which is a different finding (and fix) from the model under test failing.
    ref_out = _run_side(ref_name, run_ref, feeds, ReferenceRunError)
    test_out = _run_side(test_name, run_test, feeds, GskitError)
    atols, rtols = _per_output(ref_out, atol, rtol, test_out, dtype_changes)
    verdicts = _verdicts(ref_out, test_out, atols, rtols)
    if log.isEnabledFor(logging.DEBUG):
        _log_polygraphy_comparison((ref_name, ref_out), (test_name, test_out), atols, rtols)
    names = list(outputs) if outputs is not None else list(ref_out.keys())
    missing = [n for n in names if n not in test_out]
    if missing:
        raise GskitError(f"{test_name} did not produce output(s) {missing}; outputs are matched by name")
    rows = [_row(name, ref_out[name], test_out[name], verdicts.get(name), atols, rtols) for name in names]
    if dtype_changes is not None:
        rows = [_judge_dtype(row, dtype_changes) for row in rows]
    return CompareReport(
        outputs=rows,
        passed=all(r.passed for r in rows),
        input_shapes=feed_shapes(feeds),
        atol=atol,
        rtol=rtol,
        reference=ref_name,
        under_test=test_name,
    )


class ReferenceRunError(GskitError):
    """The reference (original) model cannot run on the inputs: the inputs are wrong, not the preparation.

    Attributes:
        failure: onnxruntime's one-line reason (it names the failing node).
        input_shapes: the shape of each input that was fed.
    """

    def __init__(
        self, message: str, failure: str = "", input_shapes: Mapping[str, tuple] | None = None
    ) -> None:
        super().__init__(message)
        self.failure = failure
        self.input_shapes = dict(input_shapes or {})


def _run_side(
    name: str,
    run: Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]],
    feeds: Mapping[str, np.ndarray],
    error: type[GskitError],
) -> Mapping[str, np.ndarray]:
    """The outputs of one side on ``feeds``; any failure becomes ``error`` naming the side."""
    try:
        return run(feeds)
    except ModelLoadError as err:
        # Said once: other inputs or shapes cannot make a model load, so this is never a ReferenceRunError.
        detail = str(err).removeprefix("onnxruntime cannot load the model: ")
        raise ModelLoadError(
            f"the {name} model does not load on onnxruntime, so no input can run it: {detail}"
        ) from err
    except PluginError:
        raise  # plugin code failed (it names the plugin and the node); other inputs would not help
    except GskitError as err:
        if error is GskitError or isinstance(err, error):
            raise
        failure = str(err)
    except Exception as err:  # onnxruntime's pybind errors (and a plugin reference's) arrive unwrapped
        failure = _first_line(err) if _is_polygraphy_error(err) else ort_backend.short_error(err)
    shapes = feed_shapes(feeds)
    if error is ReferenceRunError:
        raise ReferenceRunError(
            f"the {name} model cannot run on the inputs {describe_feeds(feeds)}: {failure}",
            failure,
            shapes,
        )
    raise error(f"the {name} model failed to run on {describe_feeds(feeds)}: {failure}")


def _is_polygraphy_error(err: Exception) -> bool:
    """Whether ``err`` is Polygraphy's (a run that never imported Polygraphy cannot have raised one)."""
    module = sys.modules.get("polygraphy.exception")
    return module is not None and isinstance(err, module.PolygraphyException)


def _runner_outputs(runner: Any, feeds: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
    """The outputs of a Polygraphy runner run once on ``feeds`` (activated, run and deactivated)."""
    from polygraphy.comparator import Comparator

    with quiet_polygraphy():
        return Comparator.run([runner], data_loader=[feeds])[0][1][0]


def _session_outputs(
    name: str,
    model: ModelSource,
    loaded: onnx.ModelProto | None,
    plugins: PluginRegistry | None,
    feeds: Mapping[str, np.ndarray],
) -> dict[str, np.ndarray]:
    """The outputs of ``model`` run once on onnxruntime in the session its runner would use
    (``ort_backend.runner_session``: plugin nodes through their references, a model with weights over 1 GiB in
    segments), as Polygraphy's ``OnnxrtRunner`` gives them: every output, by name, in the session's order.

    Inputs that fit the session (its input names and dims) are fed as they are, cast to the input's dtype
    where it differs, as Polygraphy does; others go through Polygraphy's runner, which matches names loosely,
    reshapes or refuses them with its own message.
    """
    # a plugin reference's 0/0 stays quiet, as inside Polygraphy's runner (``quiet_polygraphy``)
    with np.errstate(divide="ignore", invalid="ignore"):
        session = ort_backend.runner_session(model, plugins, name, loaded)
        fitted = _fitted_feeds(session, feeds)
        if fitted is None:  # a session of its own for the runner: a rare case, not worth a second interface
            return dict(_runner_outputs(ort_backend.runner(model, plugins, name, loaded), feeds))
        values = session.run(None, fitted)
    return {o.name: value for o, value in zip(session.get_outputs(), values, strict=True)}


#: onnxruntime's tensor types that inputs are fed as without Polygraphy: numpy's own dtypes.
_ORT_NUMPY_TYPES = {
    f"tensor({name})": np.dtype(dtype)
    for name, dtype in {
        "double": "float64",
        "float": "float32",
        "float16": "float16",
        **{t: t for t in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool")},
    }.items()
}


def _fitted_feeds(session: Any, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """``feeds`` for ``session``'s inputs when Polygraphy's runner would feed them unchanged or only cast them
    to the input's dtype (``astype``, as it does); None when it would do more (match a name loosely, reshape,
    refuse): the caller then lets Polygraphy do it. An input the session does not take (an initializer fed
    to override it) is left out, as Polygraphy leaves it out."""
    fitted = {}
    for value in session.get_inputs():
        dtype = _ORT_NUMPY_TYPES.get(value.type)
        given = feeds.get(value.name)
        if dtype is None or given is None or given.dtype.kind not in "biuf":
            return None
        shape = value.shape
        dims_fit = len(shape) == given.ndim and all(
            d == n or not isinstance(d, int) or d < 0 for d, n in zip(shape, given.shape, strict=True)
        )
        if not dims_fit:
            return None
        fitted[value.name] = given if given.dtype == dtype else np.array(given.astype(dtype))
    return fitted


def unsteady_outputs(
    model: ModelSource, feeds: Mapping[str, np.ndarray], plugins: PluginRegistry | None = None
) -> list[str]:
    """Outputs of ``model`` that differ between two onnxruntime runs on the same ``feeds``.

    A model exported in training mode (Dropout with ``training_mode`` on) or with random ops gives new outputs
    on every run: no prepared model can match it, and saying so is the useful answer to a failed validation.
    """
    session = ort_backend.session(model, plugins=plugins)
    first = ort_backend.run(session, feeds)
    second = ort_backend.run(session, feeds)
    differ = []
    for name, value in first.items():
        a, b = np.asarray(value), np.asarray(second[name])
        same = a.shape == b.shape and (
            np.array_equal(a, b, equal_nan=True)
            if np.issubdtype(a.dtype, np.inexact)
            else np.array_equal(a, b)
        )
        if not same:
            differ.append(name)
    return differ


def failing_node(model: onnx.ModelProto, failure: str) -> tuple[str, list[str]] | None:
    """The main-graph node onnxruntime's message names (``Name:'...'``) and the graph inputs it depends on.

    Follows producers back from the node's inputs, and from the outer-scope names its subgraphs read (an
    ``If`` branch reading ``input``). None when the message names no node of the main graph.
    """
    import re

    names = re.findall(r"Name:'([^']*)'", failure)
    nodes = {node.name: node for node in model.graph.node if node.name}
    node = next((nodes[n] for n in names if n in nodes), None)
    if node is None:
        return None
    producers = {out: n for n in model.graph.node for out in n.output}
    graph_inputs = {i.name for i in model.graph.input} - {t.name for t in model.graph.initializer}
    found: list[str] = []
    seen: set[str] = set()
    stack = list(_read_names(node))
    while stack:
        name = stack.pop()
        if name in seen or not name:
            continue
        seen.add(name)
        if name in graph_inputs:
            found.append(name)
        elif name in producers:
            stack.extend(_read_names(producers[name]))
    order = [i.name for i in model.graph.input]
    return f"{node.name} ({node.op_type})", sorted(found, key=order.index)


def _read_names(node: onnx.NodeProto) -> list[str]:
    """What a node reads: its inputs and every name used in its subgraphs (outer-scope ones among them)."""
    names = list(node.input)
    for graph in (a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH):
        for inner in graph.node:
            names.extend(_read_names(inner))
    return names


def describe_feeds(feeds: Mapping[str, np.ndarray]) -> str:
    """``x float32[1x3x64x64], sr int64[] = 3``: names, dtypes and shapes (and the value of a scalar)."""
    parts = []
    for name, value in feeds.items():
        value = np.asarray(value)
        text = f"{name} {value.dtype}[{'x'.join(str(d) for d in value.shape)}]"
        if value.size == 1:
            text += f" = {value.reshape(-1)[0].item()!r}"
        parts.append(text)
    return "{" + ", ".join(parts) + "}"


def compare_arrays(
    reference: Mapping[str, np.ndarray],
    under_test: Mapping[str, np.ndarray],
    names: Sequence[str],
    *,
    atol: float = DEFAULT_TOLERANCE,
    rtol: float = DEFAULT_TOLERANCE,
) -> list[OutputComparison]:
    """Compare arrays already computed, with the same rule as :func:`compare_runners` (Polygraphy's).

    Raises:
        GskitError: a name is missing from one side.
    """
    check_tolerances(atol, rtol)

    for side, values in (("reference", reference), ("run under test", under_test)):
        missing = [n for n in names if n not in values]
        if missing:
            raise GskitError(f"the {side} lacks tensor(s) {missing}; tensors are matched by name")
    ref = {n: np.asarray(reference[n]) for n in names}
    test = {n: np.asarray(under_test[n]) for n in names}
    atols, rtols = _per_output(ref, atol, rtol)
    verdicts = {}
    for n in names:
        cleared = same_non_finite_cleared(ref[n], test[n])
        verdicts[n] = within_tolerance(*cleared, atols.get(n, atols[""]), rtols.get(n, rtols[""]))
    return [_row(n, ref[n], test[n], verdicts.get(n), atols, rtols) for n in names]


# -- what runs the model under test ---------------------------------------------------------------------

#: The backend module of each ``CompareOptions.backend``; each offers the same functions: ``require_runtime``,
#: ``comparison_runner`` (a Polygraphy runner), ``run_unit`` (one small model once) and ``tensor_source``
#: (intermediate tensors, for a layerwise comparison).
BACKENDS: dict[str, ModuleType] = {"onnxruntime": ort_backend, "trt": trt_backend}


def backend_for(options: CompareOptions) -> ModuleType:
    """The backend that runs the model under test (an engine: TensorRT), checked to run here.

    Raises:
        GskitError: ``"trt"`` without full TensorRT or without a GPU.
    """
    backend = BACKENDS[options.under_test_backend]
    backend.require_runtime("--backend trt")
    return backend


def _comparable(
    ref: Mapping[str, Any], test: Mapping[str, Any]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The two runs' outputs as the tolerance rule should judge them: without non-numeric outputs (strings),
    which cannot be subtracted (``_row`` compares those for equality), and with the elements where both runs
    hold the same non-finite value cleared (:func:`same_non_finite_cleared`)."""
    ref_out: dict[str, np.ndarray] = {}
    test_out: dict[str, np.ndarray] = {}
    for name, value in test.items():
        if np.asarray(value).dtype.kind in "biufc":
            test_out[name] = np.asarray(value)
    for name, value in ref.items():
        if np.asarray(value).dtype.kind not in "biufc":
            continue
        ref_out[name] = np.asarray(value)
        if name in test_out:
            ref_out[name], test_out[name] = same_non_finite_cleared(ref_out[name], test_out[name])
    return ref_out, test_out


def same_non_finite_cleared(expected: np.ndarray, actual: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Copies of two float arrays with 0 where both hold the same non-finite value (NaN and NaN, inf and inf
    of one sign), so that a tolerance rule sees those elements as equal and every other non-finite element as
    a mismatch; other arrays come back as they are."""
    if expected.shape != actual.shape or not {expected.dtype.kind, actual.dtype.kind} <= set("fc"):
        return expected, actual
    same = _same_non_finite(expected, actual)
    if not same.any():
        return expected, actual
    return np.where(same, 0, expected).astype(expected.dtype), np.where(same, 0, actual).astype(actual.dtype)


def _same_non_finite(expected: np.ndarray, actual: np.ndarray) -> np.ndarray:
    """Where both hold NaN, or both the same infinity."""
    with np.errstate(invalid="ignore"):
        return (np.isnan(expected) & np.isnan(actual)) | (np.isinf(expected) & (expected == actual))


def _verdicts(
    ref: Mapping[str, Any],
    test: Mapping[str, Any],
    atols: Mapping[str, float],
    rtols: Mapping[str, float],
) -> dict[str, bool]:
    """Per output (by name) whether the two runs match (:func:`within_tolerance`), for the outputs both
    runs have as numbers (:func:`_comparable`).

    Raises:
        GskitError: the reference has numeric outputs and none of them has a counterpart under test, or
            the other way round: Polygraphy's comparator refused that ("All outputs were skipped"), and the
            report said so.
    """
    ref_out, test_out = _comparable(ref, test)
    if (ref_out or test_out) and not any(
        _polygraphy_counterpart(name, index, ref_out, test_out) for index, name in enumerate(ref_out)
    ):
        raise GskitError("comparison failed to run: All outputs were skipped, no common outputs found! Note:")
    return {
        name: within_tolerance(
            ref_out[name], test_out[name], atols.get(name, atols[""]), rtols.get(name, rtols[""])
        )
        for name in ref_out
        if name in test_out
    }


def _log_polygraphy_comparison(
    reference: tuple[str, Mapping[str, Any]],
    under_test: tuple[str, Mapping[str, Any]],
    atols: Mapping[str, float],
    rtols: Mapping[str, float],
) -> None:
    """Polygraphy's comparator on the two runs' outputs, for its lines alone (gskit's debug level: each
    output's error statistics); :func:`within_tolerance` gave the verdicts."""
    from polygraphy.comparator import Comparator, SimpleCompareFunc
    from polygraphy.comparator.struct import IterationResult, RunResults

    compared = RunResults()
    for (name, _), outputs in zip(
        (reference, under_test), _comparable(reference[1], under_test[1]), strict=True
    ):
        compared.append((name, [IterationResult(outputs, runner_name=name)]))
    with quiet_polygraphy():
        Comparator.compare_accuracy(compared, compare_func=SimpleCompareFunc(atol=atols, rtol=rtols))


def _polygraphy_counterpart(name: str, index: int, ref: Mapping[str, Any], test: Mapping[str, Any]) -> bool:
    """Whether Polygraphy's comparator finds an output under test for the reference's output ``name``:
    the same name, else one containing it or contained in it (case-insensitive) that is not the exact
    match of another reference output, else the one at the same position."""
    if name in test:
        return True
    found = next((t for t in test if name.lower() in t.lower() or t.lower() in name.lower()), None)
    if found is None and index < len(test):
        found = list(test)[index]
    return found is not None and found not in ref


#: What Polygraphy adds to zeros of the run under test before dividing by them (float64's machine epsilon).
_ZERO_EPSILON = 2.220446049250313e-16


def within_tolerance(expected: np.ndarray, actual: np.ndarray, atol: float, rtol: float) -> bool:
    """Whether ``actual`` matches ``expected``: the shapes are equal and every element is within ``atol``
    **or** within ``rtol`` relative to ``actual`` (a NaN difference is out of both).

    The rule of Polygraphy's ``SimpleCompareFunc`` (elementwise, shapes checked), computed the same way so
    that the verdicts are the same (``tests/test_compare.py`` checks them against it): float16 is widened to
    float32 and small integers to int32/int64 before subtracting, the relative error divides by the value
    under test with its zeros raised to float64's epsilon, and bools differ by their XOR.
    """
    if expected.shape != actual.shape:
        return False
    # its division by zero (integers) and NaN arithmetic must not warn, as inside Polygraphy's comparator
    with np.errstate(divide="ignore", invalid="ignore"):
        if expected.dtype == np.bool_ and actual.dtype == np.bool_:
            absdiff = np.logical_xor(expected, actual)
        else:
            absdiff = np.abs(np.subtract(_cast_up(expected), _cast_up(actual)))
        divisor = _cast_up(actual).copy()
        if divisor.dtype.kind == "f":
            divisor[divisor == 0] += _ZERO_EPSILON
        reldiff = np.divide(absdiff, np.abs(divisor))
        mismatches = (np.greater(absdiff, atol) | np.isnan(absdiff)) & (
            np.greater(reldiff, rtol) | np.isnan(reldiff)
        )
    return not bool(np.any(mismatches))


def _cast_up(values: np.ndarray) -> np.ndarray:
    """float16 -> float32, 8/16-bit integers -> int32, uint32 -> int64 (Polygraphy's ``cast_up``)."""
    if values.dtype == np.float16:
        return values.astype(np.float32)
    if values.dtype in (np.int8, np.uint8, np.int16, np.uint16):
        return values.astype(np.int32)
    if values.dtype == np.uint32:
        return values.astype(np.int64)
    return values


def _per_output(
    reference: Mapping[str, Any],
    atol: float,
    rtol: float,
    under_test: Mapping[str, Any] | None = None,
    expected_changes: Sequence[DtypeChange] | None = None,
) -> tuple[dict, dict]:
    """Polygraphy's per-output tolerance dicts (``""`` is its default entry) from the reference dtypes.

    An output whose dtype change is expected (``expected_changes``: the float16 outputs a recipe's convert
    step made, a change allowed on the command line) gets the floor of the dtype it was changed to as well:
    its values cannot be closer than that. Any other change is a failure anyway; integer and bool references
    stay exact.
    """
    atols: dict[str, float] = {"": atol}
    rtols: dict[str, float] = {"": rtol}
    for name, value in reference.items():
        dtype = getattr(value, "dtype", None)
        atols[name], rtols[name] = tolerance_for(dtype, atol, rtol)
        other = (
            getattr(under_test[name], "dtype", None)
            if under_test is not None and name in under_test
            else None
        )
        if other is None or dtype is None or _exact(dtype) or _exact(other):
            continue
        if any(c.allows(name, str(dtype), str(other)) for c in expected_changes or ()):
            floor_atol, floor_rtol = tolerance_for(other, atol, rtol)
            atols[name], rtols[name] = max(atols[name], floor_atol), max(rtols[name], floor_rtol)
    return atols, rtols


def _row(
    name: str,
    expected: Any,
    actual: Any,
    verdict: Any,
    atols: Mapping[str, float],
    rtols: Mapping[str, float],
) -> OutputComparison:
    expected, actual = np.asarray(expected), np.asarray(actual)
    if expected.shape != actual.shape:
        abs_err = rel_err = math.inf
        passed = False
    else:
        abs_err, rel_err = _errors(expected, actual)
        if _exact(expected.dtype) or _exact(actual.dtype):  # integers, bools, strings: equal or not
            passed = bool(np.array_equal(expected, actual))
        else:
            passed = bool(verdict) and _same_nans(expected, actual) if verdict is not None else False
    return OutputComparison(
        name=name,
        shape=tuple(int(d) for d in expected.shape),
        dtype=str(expected.dtype),
        max_abs_err=abs_err,
        max_rel_err=rel_err,
        passed=passed,
        shape_under_test=tuple(int(d) for d in actual.shape),
        atol=atols.get(name, atols[""]),
        rtol=rtols.get(name, rtols[""]),
        dtype_under_test=str(actual.dtype),
    )


def _judge_dtype(row: OutputComparison, expected_changes: Sequence[DtypeChange]) -> OutputComparison:
    """A row whose dtype changed fails, unless the change is expected; either way its note says so."""
    if row.dtype == row.dtype_under_test:
        return row
    change = f"dtype changed {row.dtype} -> {row.dtype_under_test}"
    allowed = next((c for c in expected_changes if c.allows(row.name, row.dtype, row.dtype_under_test)), None)
    if allowed is not None:
        return dataclasses.replace(row, note=f"{change}, made by {allowed.by}")
    return dataclasses.replace(row, passed=False, note=f"{change}: an output must keep its dtype")


def _same_nans(expected: np.ndarray, actual: np.ndarray) -> bool:
    """NaN exactly where the reference has NaN: a NaN never passes as close to a number, whatever the
    tolerance."""
    if not (np.issubdtype(expected.dtype, np.inexact) or np.issubdtype(actual.dtype, np.inexact)):
        return True
    return bool(np.array_equal(np.isnan(expected), np.isnan(actual)))


def _errors(expected: np.ndarray, actual: np.ndarray) -> tuple[float, float]:
    if expected.size == 0:
        return 0.0, 0.0
    kinds = {expected.dtype.kind, actual.dtype.kind}
    if not kinds <= set("iufc"):  # bools, strings: 1 where they differ
        diff = (expected != actual).astype(np.float64)
        return float(diff.max()), float(diff.max())
    if kinds <= set("iu"):
        return _integer_errors(expected, actual)
    wide = np.complex128 if "c" in kinds else np.float64
    a, b = expected.astype(wide), actual.astype(wide)
    # inf - inf and NaN arithmetic must not warn: those elements are judged by _same_non_finite
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        absdiff = np.where(_same_non_finite(a, b), 0.0, np.abs(a - b))
        reldiff = np.where(absdiff == 0, 0.0, absdiff / np.abs(a))
    return _worst(absdiff), _worst(reldiff)


def _worst(diff: np.ndarray) -> float:
    """The largest difference; NaN (one side NaN) and overflow count as ``inf``."""
    return float(np.nan_to_num(diff, nan=math.inf, posinf=math.inf).max())


def _integer_errors(expected: np.ndarray, actual: np.ndarray) -> tuple[float, float]:
    """Largest absolute and relative difference of integer arrays, the difference taken exactly.

    float64 holds 53 bits: ``2**60`` and ``2**60 + 100`` would be equal there. The difference of two int64
    values always fits in uint64, and modular uint64 arithmetic gives it exactly.
    """
    wide = np.uint64 if expected.dtype.kind == actual.dtype.kind == "u" else np.int64
    a, b = expected.astype(wide), actual.astype(wide)
    high, low = np.maximum(a, b), np.minimum(a, b)
    absdiff = high.astype(np.uint64) - low.astype(np.uint64)
    worst = int(absdiff.max())
    if worst == 0:
        return 0.0, 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        reldiff = absdiff.astype(np.float64) / np.abs(a.astype(np.float64))
    return float(worst), _worst(reldiff)


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else repr(err)


@contextmanager
def quiet_polygraphy() -> Iterator[None]:
    """Polygraphy logs to stdout and numpy warns; silence both (gskit's debug level: verbose) while comparing,
    and keep Polygraphy from importing torch to ask whether an array is a torch tensor (``polygraphy_torch``).

    At gskit's debug level Polygraphy's lines go through Python's logging (stderr, names shown as data like
    every log line), never to stdout, where they would print tensor names raw and break ``--json``. Its
    critical messages still arrive, as the ``PolygraphyException`` that gskit turns into one line.
    """
    from polygraphy.logger import G_LOGGER

    from gskit.backends.polygraphy_torch import use_without_torch

    use_without_torch()  # every Polygraphy run of a comparison passes here
    severity = G_LOGGER.VERBOSE if log.isEnabledFor(logging.DEBUG) else G_LOGGER.CRITICAL + 1
    routed, colors = G_LOGGER.use_python_logging_system, G_LOGGER.colors
    # no colours: they would be escapes in gskit's log lines (and asking for them prints a warning to stdout)
    G_LOGGER.use_python_logging_system, G_LOGGER.colors = True, False
    try:
        # its relative error divides by the reference: 0/0 where both are 0 warns "invalid value" on stderr
        with G_LOGGER.verbosity(severity), np.errstate(divide="ignore", invalid="ignore"):
            yield
    finally:
        G_LOGGER.use_python_logging_system, G_LOGGER.colors = routed, colors
