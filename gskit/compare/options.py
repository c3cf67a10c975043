"""The comparison contract: the options every comparison takes and the header every report starts with.

:class:`CompareOptions` holds what ``compare``, ``compare_layerwise``, ``compare_plugins`` and
``compare_detections`` are told (tolerances, inputs, what runs the model under test, plugins); each function
takes one (``options``) and keyword changes to it (``atol=1e-3``), as :func:`dataclasses.replace` does. Its
fields made with ``option`` are the flags of ``gskit compare`` (``gskit.cli.options.add_options``), and the
validate step takes its tolerances from it (:func:`compare_default`), so the default tolerance is written once
(:data:`DEFAULT_TOLERANCE`). :class:`ComparisonHeader` is what every report says first: the verdict, the input
shapes, the tolerances and what ran the model under test.

This module imports no runtime: the pipeline reads it when a recipe is validated.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from gskit.errors import GskitError
from gskit.io import model as gsmodel
from gskit.io.feeds import check_seed, feed_shapes, load_feeds, resolve_feeds
from gskit.io.shape_args import parse_fixed_shape
from gskit.passes.transform import StepFlag, option, prepare_flag
from gskit.plugin.ops import ORT_DOMAINS
from gskit.plugin.registry import PluginRegistry

#: The absolute and relative tolerance of every comparison unless told otherwise (float32 outputs: a prepared
#: model that sums in another order differs by a few units in the last place, far below it).
DEFAULT_TOLERANCE = 1e-5

#: A compared model: in memory, or the path of a file (loaded with its weights left on disk).
ModelSource = onnx.ModelProto | str | os.PathLike

#: What runs the model under test: ``gskit.backends.ort`` (CPU) or ``gskit.backends.trt`` (TensorRT, a GPU).
COMPARE_BACKENDS = ("onnxruntime", "trt")

#: Tensors marked per run by a layerwise comparison: few runs, bounded memory.
DEFAULT_CHUNK = 256


def check_tolerances(atol: float, rtol: float) -> None:
    """The one check of tolerances the CLI, the recipe and the library share.

    A NaN tolerance makes every comparison pass (``err <= nan`` is never false in Polygraphy's rule),
    an infinite one accepts anything and a negative one rejects everything: all are mistakes.

    Raises:
        GskitError: ``atol`` or ``rtol`` is NaN, infinite or negative.
    """
    for name, value in (("atol", atol), ("rtol", rtol)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise GskitError(f"{name} must be a number, got {value!r}")
        if not math.isfinite(value) or value < 0:
            raise GskitError(f"{name} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class DtypeChange:
    """An output dtype change that is expected, so not a failure (the report still names it).

    Attributes:
        before: the original's dtype (numpy name, e.g. ``float32``).
        after: the prepared model's dtype (``float16``).
        by: what made it, for the report ("the recipe's convert step").
        output: the output it applies to; None: any output.
    """

    before: str
    after: str
    by: str
    output: str | None = None

    def allows(self, name: str, before: str, after: str) -> bool:
        return (self.before, self.after) == (before, after) and self.output in (None, name)


def parse_dtype_change(text: str) -> DtypeChange:
    """``float32:float16`` -> the change it allows, for any output (``--allow-dtype-change``).

    Raises:
        GskitError: not ``FROM:TO`` with numpy dtype names.
    """
    before, sep, after = text.partition(":")
    try:
        if not sep:
            raise TypeError
        before, after = np.dtype(before.strip()).name, np.dtype(after.strip()).name
    except TypeError as err:
        raise GskitError(
            f"--allow-dtype-change {text}: give FROM:TO as numpy dtype names, e.g. float32:float16"
        ) from err
    return DtypeChange(before, after, by="--allow-dtype-change")


@dataclass(frozen=True)
class CompareOptions:
    """How two runs are compared: the inputs, the tolerances, what runs the model under test, the plugins.

    An element matches when its absolute error is at most ``atol`` or its relative error at most ``rtol``
    (lower-precision outputs get at least their dtype's floor, ``gskit.compare.outputs.tolerance_for``).

    Attributes:
        backend: what runs the model under test (``"trt"``: full TensorRT and a GPU).
        engine: a serialized TensorRT engine run instead of building the prepared model (implies ``"trt"``;
            output comparison only).
        chunk: tensors marked per run of a layerwise comparison (at least 1).
        atol: absolute tolerance.
        rtol: relative tolerance.
        inputs: an ``.npz`` file of inputs (``numpy.savez``); None with no ``feeds``: random inputs.
        seed: seed of the random inputs.
        shapes: input shapes for random inputs, overriding symbolic dims (or ``NAME:DIMS`` texts, as
            ``--shape`` takes them).
        dtype_changes: output dtype changes that are expected; any other change fails its output (or
            ``FROM:TO`` texts, as ``--allow-dtype-change`` takes them).
        feeds: inputs by name, given in memory (they win over ``inputs``); or a function that makes them from
            the original model as the comparison loaded it (the validate step draws its inputs so, without
            loading the original a second time).
        plugins: specs of plugin nodes; on onnxruntime they run through their numpy references. Or a function
            that loads them, called only when one of the compared models has nodes of a custom domain
            (:meth:`plugins_for`): the command line reads the plugin folders only for such models.
        trt_plugins: plugin libraries / folders loaded into TensorRT (``"trt"`` only).
    """

    backend: str = option(
        "onnxruntime",
        help="what runs PREPARED (trt needs full TensorRT and a GPU)",
        choices=COMPARE_BACKENDS,
    )
    engine: str | None = option(
        None, metavar="ENGINE", help="TensorRT engine to run instead of PREPARED (implies trt)"
    )
    chunk: int = option(DEFAULT_CHUNK, metavar="N", help="--layerwise: tensors marked per run")
    atol: float = option(DEFAULT_TOLERANCE, help="absolute tolerance")
    rtol: float = option(DEFAULT_TOLERANCE, help="relative tolerance")
    inputs: str | None = option(
        None, metavar="FILE.npz", help="inputs saved with numpy.savez (default: random)"
    )
    seed: int = option(0, help="seed of the random inputs")
    shapes: dict[str, tuple[int, ...]] = option(
        {},
        flag="--shape",
        metavar="NAME:DIMS",
        parse=str,  # parsed by the options, so that a wrong one is a GskitError of the command
        action="append",
        help="input shape for random inputs: x:1x3x224x224, x:1,3,224,224 or x:[1,3,224,224] (repeatable)",
    )
    dtype_changes: tuple[DtypeChange, ...] = option(
        (),
        flag="--allow-dtype-change",
        metavar="FROM:TO",
        parse=str,
        action="append",
        help="an output dtype change that is intended, e.g. float32:float16 after `gskit convert --fp16 "
        "--no-keep-io-fp32` (repeatable); any other dtype change fails its output",
    )
    feeds: Mapping[str, np.ndarray] | Callable[[onnx.ModelProto], Mapping[str, np.ndarray]] | None = field(
        default=None, compare=False
    )
    plugins: PluginRegistry | Callable[[], PluginRegistry] | None = field(default=None, compare=False)
    trt_plugins: Sequence[str | os.PathLike] = ()

    def __post_init__(self) -> None:
        check_tolerances(self.atol, self.rtol)
        check_seed(self.seed)
        if self.backend not in COMPARE_BACKENDS:
            raise GskitError(
                f"unknown compare backend {self.backend!r}; choose one of {', '.join(COMPARE_BACKENDS)}"
            )
        # the command line gives the flags' texts (or None: no flag)
        shapes = self.shapes.items() if isinstance(self.shapes, Mapping) else self.shapes or ()
        object.__setattr__(
            self, "shapes", dict(parse_fixed_shape(s) if isinstance(s, str) else s for s in shapes)
        )
        changes = tuple(parse_dtype_change(c) if isinstance(c, str) else c for c in self.dtype_changes or ())
        object.__setattr__(self, "dtype_changes", changes)

    @classmethod
    def given(cls, options: CompareOptions | None, changes: Mapping[str, Any]) -> CompareOptions:
        """``options`` (the defaults when None) with ``changes``, checked as a new instance.

        Raises:
            GskitError: a change names no option, or gives a value the options refuse.
        """
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise GskitError(f"unknown comparison option(s) {unknown}; see gskit.compare.CompareOptions")
        return dataclasses.replace(options or cls(), **changes)

    @property
    def under_test_backend(self) -> str:
        """The backend that runs the model under test: ``backend``, or ``"trt"`` for an engine."""
        return "trt" if self.engine is not None else self.backend

    @property
    def random_inputs(self) -> bool:
        """The inputs are drawn from ``seed`` (no ``feeds``, no ``inputs`` file)."""
        return self.feeds is None and self.inputs is None

    def plugins_for(self, *models: onnx.ModelProto | None, always: bool = False) -> CompareOptions:
        """These options with ``plugins`` loaded when it is a loader: called if one of ``models`` imports a
        custom domain (only plugin specs or model-local functions run such nodes) or ``always`` (a comparison
        that looks for plugins' native forms too), else None.

        Raises:
            PluginError: the loader fails (a plugin file that cannot be imported).
        """
        if not callable(self.plugins):
            return self
        custom = any(
            o.domain not in ORT_DOMAINS for model in models if model is not None for o in model.opset_import
        )
        return dataclasses.replace(self, plugins=self.plugins() if custom or always else None)

    def feeds_for(self, model: onnx.ModelProto) -> dict[str, np.ndarray]:
        """The inputs of one comparison: ``feeds``, else the ``inputs`` file, else random ones for ``model``.

        Raises:
            GskitError: the inputs do not fit ``model``, or ``shapes`` are given with them.
        """
        if callable(self.feeds):
            return resolve_feeds(model, self.feeds(model), self.shapes, seed=self.seed)
        given = self.feeds if self.feeds is not None else load_feeds(self.inputs) if self.inputs else None
        return resolve_feeds(model, given, self.shapes, seed=self.seed)


def compare_default(name: str, step_flag: StepFlag | None = None) -> Any:
    """A field of another options dataclass (the validate step's) that takes :class:`CompareOptions`' field
    ``name``'s default and help, so the two cannot drift; ``step_flag`` is its ``gskit prepare`` flag."""
    source = next(f for f in dataclasses.fields(CompareOptions) if f.name == name)
    return dataclasses.field(
        default=source.default, metadata={"help": source.metadata["help"], **prepare_flag(step_flag)}
    )


@dataclass(frozen=True, kw_only=True)
class ComparisonHeader:
    """What every comparison report says first (JSON keys of ``gskit compare --json`` and ``report.json``).

    Attributes:
        passed: every compared tensor within tolerance (and everything that had to run, ran).
        input_shapes: the shape of each input fed to both runs.
        atol: absolute tolerance given (float32 values; lower-precision ones get at least their dtype's
            floor).
        rtol: relative tolerance given (likewise).
        under_test: what ran the model (or the plugin nodes) under test.
    """

    passed: bool
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    atol: float = DEFAULT_TOLERANCE
    rtol: float = DEFAULT_TOLERANCE
    under_test: str = "prepared"


def header_fields(options: CompareOptions, feeds: Mapping[str, np.ndarray], passed: bool) -> dict[str, Any]:
    """The :class:`ComparisonHeader` fields of a comparison run with ``options`` on ``feeds``."""
    return dict(passed=passed, input_shapes=feed_shapes(feeds), atol=options.atol, rtol=options.rtol)


def source_model(model: ModelSource) -> onnx.ModelProto:
    """``model`` itself if it is a ModelProto, else the model at that path with its weights left on disk.

    Raises:
        GskitError: the file cannot be loaded (as ``gskit.io.model.load``).
    """
    return model if isinstance(model, onnx.ModelProto) else gsmodel.load(model, load_weights=False)


def source_label(model: ModelSource) -> str:
    """How messages name a compared model: its path, or "prepared model" for an in-memory ModelProto."""
    return "prepared model" if isinstance(model, onnx.ModelProto) else str(model)
