"""The steps a recipe can name: their options (validated by ``gskit.recipe``) and what each one does.

A transform step takes the graph and returns it changed; a check step reads the model as saved so far and
adds to the report. Every step checks what it needs before it runs and what it promises after: a failed
check raises ``StepError`` naming the step, and ``gskit prepare`` stops there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

#: Sizes used for plugin-free parts of the default recipe.
DEFAULT_ATOL = 1e-5
DEFAULT_RTOL = 1e-5


@dataclass(frozen=True)
class SanitizeOptions:
    """Tidy a model: constants to initializers, dedupe, drop no-ops and unused things."""

    skip: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()


@dataclass(frozen=True)
class EditOptions:
    """Graph edits, applied in the order of the fields below."""

    rename: dict[str, str] = field(default_factory=dict)
    input_shapes: dict[str, tuple[int | str | None, ...]] = field(default_factory=dict)
    input_dtypes: dict[str, str] = field(default_factory=dict)
    remove_nodes: tuple[str, ...] = ()
    set_attrs: dict[str, dict[str, Any]] = field(default_factory=dict)
    expose: tuple[str, ...] = ()
    constants_to_initializers: bool = False
    drop_initializer_inputs: bool = False


@dataclass(frozen=True)
class IsolateOptions:
    """Keep only the subgraph between these tensors."""

    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()


@dataclass(frozen=True)
class ReplaceOptions:
    """Replace plugin patterns by plugin nodes (all known plugins unless ``only`` names some)."""

    only: tuple[str, ...] | None = None
    keep_function: bool = False


@dataclass(frozen=True)
class InferShapesOptions:
    """Custom-domain aware shape inference; strict: every plugin output must get a shape."""

    strict: bool = True


@dataclass(frozen=True)
class FoldOptions:
    """Constant folding to a fixed point, safe around plugin nodes."""

    max_passes: int = 10
    fold_shapes: bool = True
    size_threshold: int = 16 * 2**20
    allow_partial: bool = False


@dataclass(frozen=True)
class ConvertOptions:
    """Opset conversion, fp16 conversion and int64 -> int32."""

    opset: int | None = None
    fp16: bool = False
    keep_io_fp32: bool = True
    block_ops: tuple[str, ...] = ()
    clamp_min: float = 1e-7
    clamp_max: float = 1e4
    int32: bool = False


@dataclass(frozen=True)
class CheckTrtOptions:
    """Ask the TensorRT parser (or the static table) which nodes it will not take."""

    fail_on_unsupported: bool = False
    backend: Literal["auto", "tensorrt", "tensorrt_rtx", "static"] = "auto"


@dataclass(frozen=True)
class ValidateOptions:
    """Run original and prepared on onnxruntime with the same inputs and compare every output."""

    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL
    seed: int = 0
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    inputs: str | None = None


@dataclass(frozen=True)
class BuildOptions:
    """Build a TensorRT engine (full TensorRT; TensorRT-RTX AOT when a compute capability is given)."""

    compute_capability: str | None = None
    shapes: dict[str, tuple[tuple[int, ...], ...]] = field(default_factory=dict)
    timing_cache: str | None = None
    required: bool = False


STEP_OPTIONS: dict[str, type] = {
    "sanitize": SanitizeOptions,
    "edit": EditOptions,
    "isolate": IsolateOptions,
    "replace": ReplaceOptions,
    "infer_shapes": InferShapesOptions,
    "fold": FoldOptions,
    "convert": ConvertOptions,
    "check_trt": CheckTrtOptions,
    "validate": ValidateOptions,
    "build": BuildOptions,
}

#: Steps that read the saved model instead of changing the graph.
CHECK_STEPS = frozenset({"check_trt", "validate", "build"})

DEFAULT_STEPS: tuple[str, ...] = (
    "sanitize",
    "replace",
    "infer_shapes",
    "fold",
    "infer_shapes",
    "check_trt",
    "validate",
    "build",
)
