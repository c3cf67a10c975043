"""Fuzzing what validation may let pass: hostile recipes, dtypes, integers, models that do not load, inputs
that differ and plugin references that raise (issue 22).

Families, each drawn from a seed:

* recipe orders: random step lists; a step that changes the model after the last ``validate`` must be refused
  when the recipe is read (one line naming both lines), every other order accepted; some of them run through
  ``gskit prepare`` on a small model, and whenever the run says "validation passed" (``passed: true``) the
  written model must agree with the original when run on plain onnxruntime with other inputs (floats within
  twice the tolerance, integers and bools exactly, dtypes equal but for the fp16 outputs the recipe's own
  convert step made); a run without validation must never say passed;
* dtype changes: an output cast to another dtype fails unless the change is declared expected;
* integers and bools with large values: compared exactly (a difference of 1 at 2**62 fails);
* originals that onnxruntime cannot load: ``gskit compare`` exits 2 in one line, with no ``--shape`` advice;
* inputs that differ: refused in one line exactly when a name, a kind of dtype, a rank or a fixed dim differs;
* plugin references that raise (any exception type), return too few outputs or junk: never an abort, a
  traceback or a pass; exceptions are one ``PluginError`` line naming the plugin and the node, Ctrl-C stays
  Ctrl-C.

In CI (pytest) a fixed, seeded set runs in about half a minute. For a long run::

    python tests/test_fuzz_validation.py --cases 500 [--seed 1]

prints ``N hostile cases tried, 0 tracebacks, 0 false "validation passed"`` or the failing cases (exit 1).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]

#: What a finding looks like: (kind, description). Kinds: "traceback" (a crash, a traceback or a gskit-bug
#: line), "false pass" (a pass that the model does not deserve), "wrong" (any other broken promise).
Finding = tuple[str, str]


def _cli(argv: list[str]) -> tuple[int, str, str]:
    """``gskit ARGV`` in this process: exit code, stdout, stderr."""
    from gskit.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as stop:
            code = int(stop.code or 0)
    return code, out.getvalue(), err.getvalue()


def _clean_exit(code: int, err: str) -> list[Finding]:
    """Exit 0, 1 or 2; on 2 exactly one error line; never a traceback or the safety net's 'a gskit bug'."""
    found: list[Finding] = []
    if "Traceback" in err or "a gskit bug" in err:
        found.append(("traceback", err.strip().splitlines()[-1] if err.strip() else "?"))
    if code not in (0, 1, 2):
        found.append(("traceback", f"exit code {code}"))
    if code == 2 and sum("error:" in line for line in err.splitlines()) != 1:
        found.append(("wrong", f"exit 2 without exactly one error line: {err.strip()[-300:]}"))
    return found


# ---- recipe orders -----------------------------------------------------------------------------------------

#: Steps of the small model's recipes, with options that run on it. ``edit`` changes the numbers.
STEP_TEXT: dict[str, list[str]] = {
    "sanitize": ["sanitize"],
    "replace": ["replace"],
    "infer_shapes": ["infer_shapes"],
    "fold": ["fold", "fold: {max_passes: 2}"],
    "edit": ["edit: {set_attrs: {gemm: {alpha: 5.0}}}", "edit: {set_attrs: {gemm: {alpha: 1.0}}}"],
    "convert": [
        "convert: {fp16: true}",
        "convert: {fp16: true, keep_io_fp32: false}",
        "convert: {int32: true}",
    ],
    "isolate": ["isolate: {inputs: [x], outputs: [y, s, b]}"],
    "check_trt": ["check_trt: {backend: static}"],
    "validate": ["validate: {atol: 1.0e-2, rtol: 1.0e-2}"],
    "build": ["build"],
}
CHECKS = {"check_trt", "validate", "build"}


def random_recipe(rng: random.Random) -> list[str]:
    """A list of recipe lines (YAML list items), 1 to 6 steps."""
    names = rng.choices(sorted(STEP_TEXT), k=rng.randint(1, 6))
    return [rng.choice(STEP_TEXT[name]) for name in names]


def _step_name(line: str) -> str:
    return line.split(":")[0]


def refused_position(steps: list[str]) -> int | None:
    """Index of the first step that changes the model after the last validate (the one to refuse), or None."""
    names = [_step_name(s) for s in steps]
    if "validate" not in names:
        return None
    last = len(names) - 1 - names[::-1].index("validate")
    return next((i for i in range(last + 1, len(names)) if names[i] not in CHECKS), None)


def check_recipe_order(steps: list[str]) -> tuple[list[Finding], bool]:
    """Parse the recipe; returns the findings and whether it was accepted."""
    from gskit.errors import GskitError
    from gskit.pipeline.recipe import parse_recipe

    text = "steps:\n" + "".join(f"  - {s}\n" for s in steps)
    refused_at = refused_position(steps)
    try:
        parse_recipe(text, source="r.yaml")
    except GskitError as err:
        message = str(err)
        if refused_at is None:
            return [("wrong", f"{steps}: refused although validate is last: {message}")], False
        names = [_step_name(s) for s in steps]
        last = len(names) - 1 - names[::-1].index("validate")
        expected = f"r.yaml:{refused_at + 2}: step '{names[refused_at]}' changes the model after step "
        expected += f"'validate' (line {last + 2})"
        if not message.startswith(expected) or "\n" in message:
            return [("wrong", f"{steps}: refusal does not name both lines: {message}")], False
        return [], False
    except Exception as err:  # noqa: BLE001  # anything else escaping is the finding
        return [("traceback", f"{steps}: {type(err).__name__}: {err}")], False
    if refused_at is not None:
        return [("false pass", f"{steps}: a change after validate was accepted")], True
    return [], True


def small_model(path: Path) -> Path:
    """x float[2, 8] -> y = Relu(Gemm(x)) (float), s = Shape(x) (int64), b = x > 0 (bool)."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["x", "w", "c"], ["g"], name="gemm", transB=1),
            helper.make_node("Relu", ["g"], ["y"], name="relu"),
            helper.make_node("Shape", ["x"], ["s"], name="shape"),
            helper.make_node("Greater", ["x", "zero"], ["b"], name="greater"),
        ],
        "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4]),
            helper.make_tensor_value_info("s", TensorProto.INT64, [2]),
            helper.make_tensor_value_info("b", TensorProto.BOOL, [2, 8]),
        ],
        [
            numpy_helper.from_array(rng.uniform(-1, 1, (4, 8)).astype(np.float32), "w"),
            numpy_helper.from_array(rng.uniform(-1, 1, 4).astype(np.float32), "c"),
            numpy_helper.from_array(np.zeros(1, np.float32), "zero"),
        ],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _plain_run(path: Path, x: np.ndarray) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {i.name: x.astype(np.float16 if "float16" in i.type else np.float32) for i in session.get_inputs()}
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feed), strict=True))


def agrees(original: Path, written: Path, fp16_outputs_allowed: bool, atol: float, rtol: float) -> str:
    """Why the written model does not compute what the original does on plain onnxruntime (other inputs
    than validation's); "" when it does."""
    x = np.random.default_rng(123).uniform(-1, 1, (2, 8)).astype(np.float32)
    want, got = _plain_run(original, x), _plain_run(written, x)
    for name, expected in want.items():
        if name not in got:
            return f"output {name} missing"
        actual = got[name]
        if actual.dtype != expected.dtype and not (
            fp16_outputs_allowed and (expected.dtype, actual.dtype) == (np.float32, np.float16)
        ):
            return f"output {name}: dtype {expected.dtype} -> {actual.dtype}"
        if actual.shape != expected.shape:
            return f"output {name}: shape {expected.shape} -> {actual.shape}"
        if expected.dtype.kind in "biu":
            if not np.array_equal(expected, actual):
                return f"output {name}: integers differ"
        elif not np.allclose(actual.astype(np.float64), expected, atol=2 * atol, rtol=2 * rtol):
            return f"output {name}: max abs err {np.abs(actual.astype(np.float64) - expected).max():.3g}"
    return ""


def run_prepare_case(root: Path, steps: list[str]) -> list[Finding]:
    """Run an accepted recipe through ``gskit prepare``; what it claims must hold for the written model."""
    root.mkdir(parents=True, exist_ok=True)
    model, out, recipe = small_model(root / "m.onnx"), root / "out", root / "r.yaml"
    recipe.write_text("steps:\n" + "".join(f"  - {s}\n" for s in steps))
    code, stdout, err = _cli(["prepare", str(model), "-o", str(out), "--recipe", str(recipe)])
    found = [(kind, f"{steps}: {what}") for kind, what in _clean_exit(code, err)]
    report_path = out / "report.json"
    if not report_path.is_file():
        if code != 2:
            found.append(("wrong", f"{steps}: exit {code} without report.json"))
        return found
    report = json.loads(report_path.read_text())
    names = [_step_name(s) for s in steps]
    passed, validated = report.get("passed"), report.get("validated")
    says_passed = "validation passed" in stdout
    if passed is True or says_passed:
        if "validate" not in names or not validated:
            found.append(("false pass", f"{steps}: passed without a validate step"))
        else:
            fp16 = any("keep_io_fp32: false" in s for s in steps)
            why = agrees(model, out / "model.onnx", fp16, 1e-2, 1e-2)
            if why:
                found.append(("false pass", f"{steps}: 'validation passed' but {why}"))
    expected_code = {True: 0, None: 0, False: (1, 2)}.get(passed, ())
    if code not in (expected_code if isinstance(expected_code, tuple) else (expected_code,)):
        found.append(("wrong", f"{steps}: exit {code} with passed={passed}"))
    if "validate" not in names and code != 2 and ("not validated" not in stdout or passed is not None):
        found.append(("wrong", f"{steps}: a run without validation does not say 'not validated'"))
    return found


# ---- dtypes, integers and bools ----------------------------------------------------------------------------

DTYPES = {
    "float32": TensorProto.FLOAT,
    "float64": TensorProto.DOUBLE,
    "float16": TensorProto.FLOAT16,
    "int64": TensorProto.INT64,
    "int32": TensorProto.INT32,
    "uint8": TensorProto.UINT8,
    "bool": TensorProto.BOOL,
}


def _cast_model(src: str, dst: str | None) -> onnx.ModelProto:
    """x float[6] -> y = Cast(Abs(x) * 3, src) [then Cast(.., dst)]."""
    nodes = [
        helper.make_node("Abs", ["x"], ["a"]),
        helper.make_node("Mul", ["a", "three"], ["m"]),
        helper.make_node("Cast", ["m"], ["y" if dst is None else "c"], to=DTYPES[src]),
    ]
    if dst is not None:
        nodes.append(helper.make_node("Cast", ["c"], ["y"], to=DTYPES[dst]))
    graph = helper.make_graph(
        nodes,
        "cast",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
        [helper.make_tensor_value_info("y", DTYPES[dst or src], [6])],
        [numpy_helper.from_array(np.array([3.0], np.float32), "three")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def dtype_case(rng: random.Random) -> list[Finding]:
    from gskit.compare.outputs import DtypeChange, compare

    src, dst = rng.sample(sorted(DTYPES), 2)
    allowed = rng.random() < 0.3
    changes = [DtypeChange(src, dst, by="the fuzz")] if allowed else []
    label = f"dtype {src} -> {dst} (allowed: {allowed})"
    try:
        report = compare(
            _cast_model(src, None), _cast_model(src, dst), atol=10, rtol=10, dtype_changes=changes
        )
    except Exception as err:  # noqa: BLE001
        return [("traceback", f"{label}: {type(err).__name__}: {err}")]
    (y,) = report.outputs
    if not allowed and (report.passed or "an output must keep its dtype" not in y.note):
        return [("false pass", f"{label}: passed={report.passed}, note={y.note!r}")]
    if allowed and "made by the fuzz" not in y.note:
        return [("wrong", f"{label}: the expected change is not named: {y.note!r}")]
    return []


def _offset_model(dtype: str, offset: int) -> onnx.ModelProto:
    """x int[4] -> y = x + offset (integers), or x XOR mask (bool)."""
    if dtype == "bool":
        mask = np.array([(offset >> i) & 1 for i in range(4)], bool)
        node = helper.make_node("Xor", ["x", "k"], ["y"])
        const = numpy_helper.from_array(mask, "k")
    else:
        node = helper.make_node("Add", ["x", "k"], ["y"])
        const = numpy_helper.from_array(np.array([offset], dtype), "k")
    graph = helper.make_graph(
        [node],
        "offset",
        [helper.make_tensor_value_info("x", DTYPES[dtype], [4])],
        [helper.make_tensor_value_info("y", DTYPES[dtype], [4])],
        [const],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def integer_case(rng: random.Random) -> list[Finding]:
    from gskit.compare.outputs import compare

    dtype = rng.choice(["int64", "int64", "int32", "uint8", "bool"])
    if dtype == "bool":
        base, delta = 0, rng.choice([0, 0, 1, 5, 15])
    else:
        info = np.iinfo(dtype)
        delta = rng.choice([0, 0, 1, 100, 2**20])
        base = rng.randint(0, max(0, int(info.max) - 2**21 - 8))  # x + base + delta stays in range
        delta = min(delta, int(info.max) - base - 8)
    feeds = {"x": np.arange(4).astype(dtype) if dtype != "bool" else np.array([0, 1, 0, 1], bool)}
    label = f"{dtype}: {base} vs {base} + {delta}"
    try:
        report = compare(
            _offset_model(dtype, base), _offset_model(dtype, base + delta), feeds=feeds, atol=1e6, rtol=1
        )
    except Exception as err:  # noqa: BLE001
        return [("traceback", f"{label}: {type(err).__name__}: {err}")]
    if report.passed != (delta == 0):
        kind = "false pass" if report.passed else "wrong"
        return [(kind, f"{label}: passed={report.passed}, max abs err {report.outputs[0].max_abs_err}")]
    return []


# ---- models that do not load, inputs that differ -----------------------------------------------------------


def _not_loading(kind: str) -> onnx.ModelProto:
    """A model onnx can read and onnxruntime cannot load."""
    vi = helper.make_tensor_value_info
    if kind == "deformconv-18":
        graph = helper.make_graph(
            [helper.make_node("DeformConv", ["x", "w", "off"], ["y"], name="dc")],
            "g",
            [vi("x", TensorProto.FLOAT, [1, 1, 4, 4]), vi("off", TensorProto.FLOAT, [1, 18, 2, 2])],
            [vi("y", TensorProto.FLOAT, [1, 1, 2, 2])],
            [numpy_helper.from_array(np.ones((1, 1, 3, 3), np.float32), "w")],
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    if kind == "layernorm-mixed":
        graph = helper.make_graph(
            [helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], name="ln", axis=-1)],
            "g",
            [vi("x", TensorProto.FLOAT16, [2, 4])],
            [vi("y", TensorProto.FLOAT16, [2, 4])],
            [
                numpy_helper.from_array(np.ones(4, np.float32), "s"),
                numpy_helper.from_array(np.zeros(4, np.float32), "b"),
            ],
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    if kind == "unknown-op":
        graph = helper.make_graph(
            [helper.make_node("NoSuchOp", ["x"], ["y"], name="nope")],
            "g",
            [vi("x", TensorProto.FLOAT, [2])],
            [vi("y", TensorProto.FLOAT, [2])],
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    graph = helper.make_graph(  # a custom-domain node without a plugin spec or a local function
        [helper.make_node("Mystery", ["x"], ["y"], name="mystery", domain="fuzz.unknown")],
        "g",
        [vi("x", TensorProto.FLOAT, [2])],
        [vi("y", TensorProto.FLOAT, [2])],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("fuzz.unknown", 1)]
    )


LOAD_FAILURES = ("deformconv-18", "layernorm-mixed", "unknown-op", "custom-domain")


def load_failure_case(root: Path, kind: str) -> list[Finding]:
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{kind}.onnx"
    path.write_bytes(_not_loading(kind).SerializeToString())
    code, _, err = _cli(["compare", str(path), str(path)])
    found = [(k, f"{kind}: {what}") for k, what in _clean_exit(code, err)]
    if code != 2 or "does not load on onnxruntime" not in err or "--shape" in err:
        found.append(
            ("wrong", f"{kind}: exit {code}, not said once that it does not load: {err.strip()[-300:]}")
        )
    return found


def _input_model(name: str, dtype: str, dims: list) -> onnx.ModelProto:
    """One input ``name`` of ``dtype``/``dims`` -> y = ReduceSum(Cast(x, float)) (a float scalar)."""
    graph = helper.make_graph(
        [
            helper.make_node("Cast", [name], ["f"], to=TensorProto.FLOAT),
            helper.make_node("ReduceSum", ["f"], ["y"], keepdims=0),
        ],
        "inputs",
        [helper.make_tensor_value_info(name, DTYPES[dtype], dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


KINDS = {
    "float32": "f",
    "float16": "f",
    "float64": "f",
    "int64": "i",
    "int32": "i",
    "uint8": "i",
    "bool": "b",
}


def input_mismatch_case(rng: random.Random) -> list[Finding]:
    from gskit.compare.outputs import compare
    from gskit.errors import GskitError

    def signature() -> tuple[str, str, list]:
        rank = rng.randint(1, 3)
        dims = [rng.choice([2, 3, "batch", None]) for _ in range(rank)]
        return rng.choice(["x", "x", "x", "x2"]), rng.choice(sorted(DTYPES)), dims

    (n1, t1, d1), (n2, t2, d2) = signature(), signature()
    fixed_conflict = len(d1) != len(d2) or any(
        isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(d1, d2, strict=False)
    )
    expect_refusal = n1 != n2 or KINDS[t1] != KINDS[t2] or fixed_conflict
    label = f"{n1} {t1}{d1} vs {n2} {t2}{d2}"
    try:
        report = compare(_input_model(n1, t1, d1), _input_model(n2, t2, d2))
    except GskitError as err:
        message = str(err)
        refused = message.startswith("the models' inputs differ")
        if refused != expect_refusal or "\n" in message:
            return [("wrong", f"{label}: expected refusal {expect_refusal}, got: {message}")]
        return []
    except Exception as err:  # noqa: BLE001
        return [("traceback", f"{label}: {type(err).__name__}: {err}")]
    if expect_refusal:
        return [("false pass" if report.passed else "wrong", f"{label}: compared instead of refused")]
    if any(np.isinf(o.max_abs_err) for o in report.outputs):
        return [("wrong", f"{label}: compared to inf")]
    return []


# ---- plugin references that raise --------------------------------------------------------------------------

#: Bodies of a plugin reference ``boom(x)``; the first word says what must come out.
REFERENCE_BODIES = {
    "raise NotImplementedError": 'raise NotImplementedError("Boom reference: write it")',
    "raise ValueError": 'raise ValueError("bad value")',
    "raise ZeroDivisionError": "return 1 // 0",
    "raise KeyError": 'return {}["missing"]',
    "raise custom": "class Mine(Exception):\n        pass\n    raise Mine('mine')",
    "raise RecursionError": "return boom(x)",
    "raise TypeError": "return np.asarray(x, dtype=object) + 'text'",
    "raise SystemExit": "raise SystemExit(0)",
    "raise sys.exit": "import sys\n    sys.exit()",
    "raise GeneratorExit": "raise GeneratorExit",
    "raise own BaseException": "class Halt(BaseException):\n        pass\n    raise Halt('halt')",
    "junk string": 'return "not an array"',
    "junk none": "return None",
    "junk objects": "return np.array([object()] * 6).reshape(2, 3)",
    "too few outputs": "return ()",
    "too many outputs": "return (x, x)",
    "ctrl-c": "raise KeyboardInterrupt",
}

SPEC_PY = """
import numpy as np
from gskit.plugin import PluginSpec, same_as_input


def boom(x):
    {body}


SPEC = PluginSpec(
    name="Boom", namespace="fuzz.plugins", inputs=("x",), infer=same_as_input(0), reference=boom
)
"""


def _plugin_model(after: str | None) -> onnx.ModelProto:
    """x float[2, 3] -> Boom -> [an op after it] -> y."""
    nodes = [
        helper.make_node(
            "Boom", ["x"], ["p" if after else "y"], name="boom_node", domain="fuzz.plugins",
            plugin_namespace="fuzz.plugins", plugin_version="1",
        )
    ]  # fmt: skip
    if after == "Reshape":
        nodes.append(helper.make_node("Reshape", ["p", "shape"], ["y"]))
    elif after:
        nodes.append(helper.make_node(after, ["p"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "plugin",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(np.array([2, 3], np.int64), "shape")] if after == "Reshape" else [],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("fuzz.plugins", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def raising_reference_case(root: Path, rng: random.Random) -> list[Finding]:
    from gskit.compare.outputs import compare
    from gskit.errors import GskitError, PluginError
    from gskit.plugin import load_plugins

    what = rng.choice(sorted(REFERENCE_BODIES))
    after = rng.choice([None, "Relu", "Reshape", "Neg"])
    label = f"reference {what}, then {after}"
    folder = root / "plugins" / "boom"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "spec.py").write_text(SPEC_PY.format(body=REFERENCE_BODIES[what]))
    plugins = load_plugins([folder.parent], entry_points=False)
    original = _plugin_model(after)
    original.graph.node[0].op_type, original.graph.node[0].domain = "Relu", ""  # what Boom stands for
    del original.graph.node[0].attribute[:]
    try:
        report = compare(original, _plugin_model(after), plugins=plugins)
    except KeyboardInterrupt:
        return [] if what == "ctrl-c" else [("wrong", f"{label}: KeyboardInterrupt out of nowhere")]
    except PluginError as err:
        message = str(err)
        if what.startswith("raise") and not (
            message.startswith("plugin fuzz.plugins::Boom v1, node 'boom_node': the reference raised")
            and "\n" not in message
        ):
            return [("wrong", f"{label}: {message}")]
        return []
    except GskitError as err:
        if what.startswith(("raise", "ctrl")):
            return [("wrong", f"{label}: not a PluginError: {err}")]
        return []
    except BaseException as err:  # noqa: BLE001  # sys.exit() in plugin code escaping would end gskit with 0
        return [("traceback", f"{label}: {type(err).__name__}: {err}")]
    if what.startswith(("raise", "ctrl")) or report.passed:
        return [("false pass" if report.passed else "wrong", f"{label}: compared (passed={report.passed})")]
    return []


# ---- in CI -------------------------------------------------------------------------------------------------

#: Cases per family in CI (seeded): parsing is fast, running prepare is not.
CI_CASES = {"recipes": 300, "prepare": 8, "dtypes": 40, "integers": 40, "inputs": 60, "references": 16}


def run_family(family: str, seed: int, count: int, root: Path) -> tuple[int, list[Finding]]:
    """``count`` cases of one family from ``seed``: (cases tried, findings)."""
    rng = random.Random(f"{family}-{seed}")
    found: list[Finding] = []
    tried = 0
    if family == "recipes":
        for _ in range(count):
            found += check_recipe_order(random_recipe(rng))[0]
            tried += 1
    elif family == "prepare":
        while tried < count:
            steps = random_recipe(rng)
            if rng.random() < 0.7:  # most runs validate, after every change: what they claim is checked
                steps += [STEP_TEXT["validate"][0], *rng.choice([[], [STEP_TEXT["check_trt"][0]]])]
            if refused_position(steps) is not None:
                continue
            found += run_prepare_case(root / f"prepare{tried}", steps)
            tried += 1
    elif family == "loads":
        for index, kind in enumerate(LOAD_FAILURES[:count]):
            found += load_failure_case(root / f"load{index}", kind)
            tried += 1
    else:
        case: Callable[..., list[Finding]] = {
            "dtypes": dtype_case,
            "integers": integer_case,
            "inputs": input_mismatch_case,
        }.get(family) or (lambda r: raising_reference_case(root / f"ref{tried}", r))
        for _ in range(count):
            found += case(rng)
            tried += 1
    return tried, found


def test_recipe_orders(tmp_path: Path) -> None:
    tried, found = run_family("recipes", 22, CI_CASES["recipes"], tmp_path)
    assert tried == CI_CASES["recipes"] and not found, found


def test_prepare_never_says_passed_for_a_model_that_differs(tmp_path: Path) -> None:
    tried, found = run_family("prepare", 22, CI_CASES["prepare"], tmp_path)
    assert not found, found


def test_dtype_changes_and_exact_integers(tmp_path: Path) -> None:
    found = run_family("dtypes", 22, CI_CASES["dtypes"], tmp_path)[1]
    found += run_family("integers", 22, CI_CASES["integers"], tmp_path)[1]
    assert not found, found


def test_models_that_do_not_load_and_inputs_that_differ(tmp_path: Path) -> None:
    found = run_family("loads", 22, len(LOAD_FAILURES), tmp_path)[1]
    found += run_family("inputs", 22, CI_CASES["inputs"], tmp_path)[1]
    assert not found, found


def test_plugin_references_that_raise(tmp_path: Path) -> None:
    tried, found = run_family("references", 22, CI_CASES["references"], tmp_path)
    assert not found, found


# ---- long runs ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=200, help="cases per fast family (default 200)")
    parser.add_argument("--seed", type=int, default=1, help="seed (default 1)")
    parser.add_argument("--prepare", type=int, default=None, help="prepare runs (default cases / 10)")
    args = parser.parse_args(argv)
    import logging

    logging.disable(logging.CRITICAL)
    counts = {family: args.cases for family in ("recipes", "dtypes", "integers", "inputs", "references")}
    counts["prepare"] = args.prepare if args.prepare is not None else max(1, args.cases // 10)
    counts["loads"] = len(LOAD_FAILURES)
    total, findings = 0, []
    with tempfile.TemporaryDirectory(prefix="gskit-fuzz-validation-") as tmp:
        for family, count in counts.items():
            tried, found = run_family(family, args.seed, count, Path(tmp) / family)
            total += tried
            findings += found
            print(f"{family}: {tried} cases, {len(found)} findings", flush=True)
    tracebacks = sum(kind == "traceback" for kind, _ in findings)
    false_passes = sum(kind == "false pass" for kind, _ in findings)
    print(f'{total} hostile cases tried, {tracebacks} tracebacks, {false_passes} false "validation passed"')
    for kind, what in findings[:50]:
        print(f"{kind}: {what}")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
