"""``gskit compare ORIGINAL PREPARED``: run both on the same inputs and compare outputs by name, or every
shared tensor (``--layerwise``), or each plugin node against the region it replaced (``--per-plugin``)."""

from __future__ import annotations

import argparse

import numpy as np

from gskit.cli import add_plugins_option
from gskit.compare.layers import DEFAULT_CHUNK, LayerwiseReport, compare_layerwise
from gskit.compare.outputs import (
    COMPARE_BACKENDS,
    CompareReport,
    DtypeChange,
    check_tolerances,
    compare,
)
from gskit.compare.plugins import PluginCompareReport, compare_plugins
from gskit.errors import GskitError
from gskit.io import report
from gskit.io.feeds import check_seed, load_feeds
from gskit.io.shape_args import format_shape, parse_fixed_shape
from gskit.plugin.discovery import implementation_paths, load_plugins


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "compare",
        help="compare two models' outputs on the same inputs (onnxruntime or TensorRT)",
        description="Run ORIGINAL on onnxruntime and PREPARED on onnxruntime (plugin nodes through their "
        "numpy references) or TensorRT (--backend trt / --engine) with the same inputs, and compare every "
        "output of ORIGINAL by name; --layerwise finds the first tensor that differs, --per-plugin checks "
        "each plugin node against the original region it replaced. Exit 0 if all match, 1 if not.",
    )
    parser.add_argument("original", help="reference .onnx")
    parser.add_argument("prepared", nargs="?", help=".onnx under test (optional with --engine)")
    parser.add_argument(
        "--backend",
        choices=COMPARE_BACKENDS,
        default="onnxruntime",
        help="what runs PREPARED (default onnxruntime; trt needs full TensorRT and a GPU)",
    )
    parser.add_argument(
        "--engine", metavar="ENGINE", help="TensorRT engine to run instead of PREPARED (implies trt)"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--layerwise",
        action="store_true",
        help="compare every tensor both models compute, in PREPARED's order; report the first that differs",
    )
    mode.add_argument(
        "--per-plugin",
        action="store_true",
        help="compare each plugin node of PREPARED (and each native op written in a plugin's place) with the "
        "region of ORIGINAL between its tensors",
    )
    parser.add_argument(
        "--chunk",
        type=int,
        default=DEFAULT_CHUNK,
        metavar="N",
        help=f"--layerwise: tensors marked per run (default {DEFAULT_CHUNK})",
    )
    parser.add_argument("--atol", type=float, default=1e-5, help="absolute tolerance (default 1e-5)")
    parser.add_argument("--rtol", type=float, default=1e-5, help="relative tolerance (default 1e-5)")
    parser.add_argument(
        "--inputs", metavar="FILE.npz", help="inputs saved with numpy.savez (default: random)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    parser.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME:DIMS",
        help="input shape for random inputs: x:1x3x224x224, x:1,3,224,224 or x:[1,3,224,224] (repeatable)",
    )
    parser.add_argument(
        "--allow-dtype-change",
        action="append",
        default=[],
        metavar="FROM:TO",
        help="an output dtype change that is intended, e.g. float32:float16 after `gskit convert --fp16 "
        "--no-keep-io-fp32` (repeatable); any other dtype change fails its output",
    )
    add_plugins_option(parser)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_tolerances(args.atol, args.rtol)
    check_seed(args.seed)
    if args.prepared is None and args.engine is None:
        raise GskitError("give PREPARED (an .onnx) or --engine ENGINE")
    if args.engine and (args.layerwise or args.per_plugin):
        raise GskitError(
            "--layerwise and --per-plugin build their own TensorRT engines from PREPARED: "
            "give PREPARED with --backend trt instead of --engine"
        )
    common = dict(
        feeds=load_feeds(args.inputs) if args.inputs else None,
        shapes=dict(parse_fixed_shape(text) for text in args.shape),
        seed=args.seed,
        atol=args.atol,
        rtol=args.rtol,
        plugins=load_plugins(args.plugins),
        trt_plugins=_trt_plugins(args),
    )
    if args.layerwise:
        layers = compare_layerwise(
            args.original, args.prepared, chunk=args.chunk, backend=args.backend, **common
        )
        print_layerwise(layers, as_json=args.json)
        return 0 if layers.passed else 1
    if args.per_plugin:
        per_plugin = compare_plugins(args.original, args.prepared, backend=args.backend, **common)
        print_plugins(per_plugin, as_json=args.json)
        return 0 if per_plugin.passed else 1
    result = compare(
        args.original,
        args.prepared,
        backend=args.backend,
        engine=args.engine,
        dtype_changes=[_dtype_change(text) for text in args.allow_dtype_change],
        **common,
    )
    print_report(result, as_json=args.json)
    return 0 if result.passed else 1


def _dtype_change(text: str) -> DtypeChange:
    """``float32:float16`` -> the change it allows, for any output."""
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


def _trt_plugins(args: argparse.Namespace) -> list[str]:
    """TensorRT plugin files come from the same folders as the specs (only read with --backend trt)."""
    if args.backend != "trt" and not args.engine:
        return []
    return [str(p) for p in implementation_paths(load_plugins(args.plugins), args.plugins or ())]


def print_report(result: CompareReport, *, as_json: bool) -> None:
    """The report as a table per output (or JSON); shared by compare variants."""
    if as_json:
        report.print_json(result)
        return
    rows = [
        (
            o.name,
            format_shape(o.shape),
            o.dtypes,
            f"{o.max_abs_err:.3g}",
            f"{o.max_rel_err:.3g}",
            report.verdict(o.passed),
        )
        for o in result.outputs
    ]
    inputs = ", ".join(f"{n}: {'x'.join(map(str, s))}" for n, s in result.input_shapes.items())
    tolerances = f"atol={result.atol:g}, rtol={result.rtol:g}"
    raised = {
        o.dtype: (o.atol, o.rtol) for o in result.outputs if (o.atol, o.rtol) != (result.atol, result.rtol)
    }
    tolerances += "".join(f"; {dtype} outputs: atol={a:g}, rtol={r:g}" for dtype, (a, r) in raised.items())
    title = f"{result.reference} vs {result.under_test} ({tolerances}; inputs {inputs})"
    out = report.console()
    out.print(report.table(title, ("output", "shape", "dtype", "max abs err", "max rel err", "result"), rows))
    for o in result.outputs:
        if o.note:
            out.print(report.styled((f"output '{o.name}': {o.note}", "" if o.passed else "red")))
    verdict = (
        "all outputs match"
        if result.passed
        else f"{len(result.failed)} of {len(result.outputs)} outputs differ"
    )
    out.print(report.styled((verdict, "green" if result.passed else "red")))


def _title(kind: str, reference: str, under_test: str, atol: float, rtol: float, shapes: dict) -> str:
    inputs = ", ".join(f"{n}: {format_shape(s)}" for n, s in shapes.items())
    return f"{kind}: {reference} vs {under_test} (atol={atol:g}, rtol={rtol:g}; inputs {inputs})"


def print_layerwise(result: LayerwiseReport, *, as_json: bool) -> None:
    """The tensors checked up to the first failure, and the verdict (or JSON)."""
    if as_json:
        report.print_json(result)
        return
    rows = [
        (
            index,
            c.tensor.name,
            format_shape(c.tensor.shape),
            f"{c.tensor.max_abs_err:.3g}",
            f"{c.tensor.max_rel_err:.3g}",
            report.verdict(c.tensor.passed),
            f"{c.original_node.name} ({c.original_node.op})",
            f"{c.prepared_node.name} ({c.prepared_node.op})",
        )
        for index, c in enumerate(result.checked, 1)
    ]
    columns = (
        "#",
        "tensor",
        "shape",
        "max abs err",
        "max rel err",
        "result",
        "original node",
        "prepared node",
    )
    title = _title(
        "Layerwise", result.reference, result.under_test, result.atol, result.rtol, result.input_shapes
    )
    out = report.console()
    out.print(report.table(title, columns, rows))
    first = result.first_failure
    if first is None:
        out.print(
            report.styled(
                (f"all {result.candidates} shared tensors match", "green"),
                f" ({result.runs} run(s) of up to {result.chunk})",
            )
        )
        return
    out.print(
        report.styled(
            (f"first mismatch: tensor '{first.tensor.name}'", "red"),
            f", made by '{first.prepared_node.name}' ({first.prepared_node.op}) in the prepared model and "
            f"'{first.original_node.name}' ({first.original_node.op}) in the original; "
            f"{len(result.checked)} of {result.candidates} tensors checked",
        )
    )


def print_plugins(result: PluginCompareReport, *, as_json: bool) -> None:
    """One row per plugin node and the verdict (or JSON)."""
    if as_json:
        report.print_json(result)
        return
    rows = [
        (
            p.node,
            p.op,
            ", ".join(f"{n}: {format_shape(s)}" for n, s in p.inputs.items()),
            f"{p.max_abs_err:.3g}",
            f"{p.max_rel_err:.3g}",
            report.verdict(p.passed),
            len(p.original_nodes) or "-",
            p.note,
        )
        for p in result.plugins
    ]
    columns = (
        "node",
        "op",
        "inputs",
        "max abs err",
        "max rel err",
        "result",
        "region nodes (no Constant)",
        "note",
    )
    title = _title(
        "Per plugin", "original region", result.under_test, result.atol, result.rtol, result.input_shapes
    )
    out = report.console()
    out.print(report.table(title, columns, rows))
    if result.passed:
        out.print(
            report.styled((f"all {len(result.plugins)} replaced nodes match their original regions", "green"))
        )
        return
    names = ", ".join(f"'{p.node}' ({p.op})" for p in result.failed)
    out.print(
        report.styled(
            (f"{len(result.failed)} of {len(result.plugins)} replaced nodes differ: {names}", "red")
        )
    )
