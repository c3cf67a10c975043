"""The floors a gskit command is measured against: what a plain script does with onnxruntime alone.

Usage::

    python bench/floors.py session MODEL [--runs N]  # onnx.load, one onnxruntime session, N runs (default 1)
    python bench/floors.py compare A B               # two sessions, the same random inputs, outputs compared
    python bench/floors.py plugins A B --reference DOMAIN:OP=MODULE:FUNCTION ...
                                                     # compare, B's plugin nodes run as Python ops

Each command only does the work (and prints the seconds its function took), so a whole-process timer
(``/usr/bin/time -v``, a benchmark harness) times it like the gskit command beside it. The same work is a
plain function for an in-process caller (``bench/run.py``): :func:`session_floor` and :func:`compare_floor`,
each returning the seconds it took, its imports included when they are its first.

The inputs are drawn as gskit draws them by default (``gskit.io.feeds.random_feeds``: floats uniform in
[-1, 1), ints in [0, 8), symbolic dims 2), here with numpy alone: a floor must not pay for gskit's imports.

Plain onnxruntime cannot run a model with plugin nodes. :func:`plugin_compare_floor` is what a script that
runs them anyway must do: read the model with onnx, make each plugin node a Python op of
onnxruntime-extensions that calls the plugin's numpy reference (named by the caller, ``--reference``), and
register the extensions' library with the session. It imports only the extensions' module that registers
Python ops (its package ``__init__`` imports model converters, and torch where installed, which would make a
slow floor); it handles float32 tensors and passes no attribute to the reference (enough for the bundled
example's ClampSwish nodes, whose only attributes are TensorRT's plugin fields).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

#: What gskit gives a symbolic or unknown dim (``gskit.io.feeds.DEFAULT_DYNAMIC_DIM``).
DYNAMIC_DIM = 2


def session_floor(model: Path, runs: int = 1) -> float:
    """Load ``model`` with onnx, create one onnxruntime CPU session from it and run it ``runs`` times.

    Returns:
        The seconds it took (imports of onnx, onnxruntime and numpy included when not yet imported).
    """
    start = time.perf_counter()
    import onnx
    import onnxruntime as ort

    proto = onnx.load(str(model))
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = random_inputs(session)
    for _ in range(runs):
        session.run(None, feeds)
    return time.perf_counter() - start


def compare_floor(a: Path, b: Path) -> float:
    """Create an onnxruntime CPU session on each file, run both on the same random inputs, compare outputs.

    Returns:
        The seconds it took (imports of onnxruntime and numpy included when not yet imported).

    Raises:
        SystemExit: the outputs differ (``|a - b| <= 1e-5 + 1e-5 * |a|``, gskit's default tolerances).
    """
    start = time.perf_counter()
    import onnxruntime as ort

    first = ort.InferenceSession(str(a), providers=["CPUExecutionProvider"])
    second = ort.InferenceSession(str(b), providers=["CPUExecutionProvider"])
    _same_outputs(first, second, f"between {a} and {b}")
    return time.perf_counter() - start


def plugin_compare_floor(a: Path, b: Path, references: dict[tuple[str, str], str]) -> float:
    """:func:`compare_floor` where ``b`` has plugin nodes: each node whose ``(domain, op_type)`` is in
    ``references`` runs ``references[...]`` (``"module:function"``, imported) as an onnxruntime-extensions
    Python op on float32 tensors.

    Returns:
        The seconds it took (imports of onnx, onnxruntime, numpy and the extensions' module included when
        not yet imported).

    Raises:
        SystemExit: the outputs differ (as :func:`compare_floor`).
    """
    start = time.perf_counter()
    import importlib

    import onnx
    import onnxruntime as ort

    pyops = _pyop_module()
    prepared = onnx.load(str(b))
    for index, node in enumerate(prepared.graph.node):
        target = references.get((node.domain, node.op_type))
        if target is None:
            continue
        module, _, name = target.partition(":")
        function = getattr(importlib.import_module(module), name)
        op_type = f"{node.op_type}_{index}"
        pyops.Opdef.declare(
            op_type=op_type,
            inputs=[pyops.PyCustomOpDef.dt_float] * len(node.input),
            outputs=[pyops.PyCustomOpDef.dt_float] * len(node.output),
        )(lambda *arrays, run=function: run(*arrays))
        node.domain, node.op_type = "ai.onnx.contrib", op_type
        del node.attribute[:]
    prepared.opset_import.append(onnx.helper.make_opsetid("ai.onnx.contrib", 1))
    options = ort.SessionOptions()
    options.register_custom_ops_library(pyops.get_library_path())
    first = ort.InferenceSession(str(a), providers=["CPUExecutionProvider"])
    second = ort.InferenceSession(prepared.SerializeToString(), options, providers=["CPUExecutionProvider"])
    _same_outputs(first, second, f"between {a} and {b}")
    return time.perf_counter() - start


def _same_outputs(first: Any, second: Any, where: str) -> None:
    """Run both sessions on the same random inputs; SystemExit when an output differs (gskit's default
    tolerances: ``|a - b| <= 1e-5 + 1e-5 * |a|``)."""
    import numpy as np

    feeds = random_inputs(first)
    names = [o.name for o in first.get_outputs()]
    expected = first.run(names, feeds)
    actual = second.run(names, feeds)
    for name, x, y in zip(names, expected, actual, strict=True):
        if not np.allclose(y, x, atol=1e-5, rtol=1e-5):
            raise SystemExit(f"output {name} differs {where}")


def _pyop_module() -> Any:
    """onnxruntime-extensions' ``_ocos`` (Python op registration, the library's path), its package's
    ``__init__`` not run (see the module docstring)."""
    import importlib
    import importlib.util

    package = "onnxruntime_extensions"
    spec = importlib.util.find_spec(package)
    if spec is None:
        raise SystemExit("the plugins floor needs onnxruntime-extensions: pip install onnxruntime-extensions")
    sys.modules[package] = importlib.util.module_from_spec(spec)
    try:
        return importlib.import_module(f"{package}._ocos")
    finally:
        del sys.modules[package]


def parse_references(given: list[str]) -> dict[tuple[str, str], str]:
    """``["gskit:ClampSwish=gskit_plugins.clamp_swish.reference:clamp_swish"]`` ->
    ``{("gskit", "ClampSwish"): "gskit_plugins.clamp_swish.reference:clamp_swish"}``."""
    references = {}
    for item in given:
        op, _, target = item.partition("=")
        domain, _, op_type = op.rpartition(":")
        if not op_type or ":" not in target:
            raise SystemExit(f"--reference {item!r}: give DOMAIN:OP=MODULE:FUNCTION")
        references[(domain, op_type)] = target
    return references


def random_inputs(session: Any) -> dict[str, Any]:
    """Random inputs for every input of an onnxruntime session, seed 0."""
    import numpy as np

    rng = np.random.default_rng(0)
    feeds = {}
    for value in session.get_inputs():
        shape = tuple(d if isinstance(d, int) and d >= 0 else DYNAMIC_DIM for d in value.shape)
        dtype = _numpy_dtype(value.type)
        if dtype.kind == "f":
            feeds[value.name] = rng.uniform(-1, 1, shape).astype(dtype)
        elif dtype.kind in "iu":
            feeds[value.name] = rng.integers(0, 8, shape).astype(dtype)
        else:
            feeds[value.name] = rng.integers(0, 2, shape).astype(dtype)
    return feeds


def _numpy_dtype(ort_type: str) -> Any:
    """``tensor(float)`` -> ``float32``."""
    import numpy as np

    name = ort_type.removeprefix("tensor(").removesuffix(")")
    return np.dtype({"float": "float32", "double": "float64", "bool": "bool"}.get(name, name))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="floor", required=True)
    session = sub.add_parser("session", help="load, create one session, run it")
    session.add_argument("model", type=Path)
    session.add_argument("--runs", type=int, default=1)
    compare = sub.add_parser("compare", help="two sessions on the same inputs, outputs compared")
    compare.add_argument("a", type=Path)
    compare.add_argument("b", type=Path)
    plugins = sub.add_parser("plugins", help="compare; B's plugin nodes run as Python ops (their references)")
    plugins.add_argument("a", type=Path)
    plugins.add_argument("b", type=Path)
    plugins.add_argument("--reference", action="append", default=[], metavar="DOMAIN:OP=MODULE:FUNCTION")
    args = parser.parse_args(argv)
    if args.floor == "session":
        seconds = session_floor(args.model, args.runs)
    elif args.floor == "plugins":
        seconds = plugin_compare_floor(args.a, args.b, parse_references(args.reference))
    else:
        seconds = compare_floor(args.a, args.b)
    print(f"{seconds:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
