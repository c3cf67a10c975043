"""``gskit compare ORIGINAL PREPARED``: run both on the same inputs and compare outputs by name, or every
shared tensor (``--layerwise``), or each plugin node against the region it replaced (``--per-plugin``)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

from gskit.cli import COMMANDS, add_plugins_option
from gskit.cli.options import add_options, options_from_args
from gskit.compare.options import CompareOptions, ComparisonHeader
from gskit.errors import GskitError
from gskit.io.shape_args import format_shape
from gskit.io.text import Line, plain_output, writes_plain
from gskit.plugin.discovery import implementation_paths, load_plugins

if TYPE_CHECKING:  # each mode imports its own comparison when it runs
    from gskit.compare.layers import LayerwiseReport
    from gskit.compare.outputs import CompareReport, OutputComparison
    from gskit.compare.plugins import PluginCheck, PluginCompareReport


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "compare",
        help=COMMANDS["compare"],
        description="Run ORIGINAL on onnxruntime and PREPARED on onnxruntime (plugin nodes through their "
        "numpy references) or TensorRT (--backend trt / --engine) with the same inputs, and compare every "
        "output of ORIGINAL by name; --layerwise finds the first tensor that differs, --per-plugin checks "
        "each plugin node against the original region it replaced. Exit 0 if all match, 1 if not.",
    )
    parser.add_argument("original", help="reference .onnx")
    parser.add_argument("prepared", nargs="?", help=".onnx under test (optional with --engine)")
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
    add_options(parser, CompareOptions)
    add_plugins_option(parser)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    options = options_from_args(args, CompareOptions)
    if args.prepared is None and options.engine is None:
        raise GskitError("give PREPARED (an .onnx) or --engine ENGINE")
    if options.engine and (args.layerwise or args.per_plugin):
        raise GskitError(
            "--layerwise and --per-plugin build their own TensorRT engines from PREPARED: "
            "give PREPARED with --backend trt instead of --engine"
        )
    if args.plugins or args.per_plugin or options.under_test_backend == "trt":
        registry = load_plugins(args.plugins)
        # TensorRT's plugin files come from the same folders as the specs (only read with --backend trt)
        trt_plugins = tuple(str(p) for p in implementation_paths(registry, args.plugins or ()))
        options = dataclasses.replace(options, plugins=registry, trt_plugins=trt_plugins)
    else:  # the default plugin sources are read only if a model has nodes of a custom domain
        options = dataclasses.replace(options, plugins=partial(load_plugins, None))
    if args.layerwise:
        from gskit.compare.layers import compare_layerwise

        layers = compare_layerwise(args.original, args.prepared, options)
        print_layerwise(layers, as_json=args.json)
        return 0 if layers.passed else 1
    if args.per_plugin:
        from gskit.compare.plugins import compare_plugins

        per_plugin = compare_plugins(args.original, args.prepared, options)
        print_plugins(per_plugin, as_json=args.json)
        return 0 if per_plugin.passed else 1
    from gskit.compare.outputs import compare

    result = compare(args.original, args.prepared, options)
    print_report(result, as_json=args.json)
    return 0 if result.passed else 1


def print_report(result: CompareReport, *, as_json: bool) -> None:
    """The report as a table per output (or JSON); shared by compare variants."""
    if as_json:
        _print_json(result)
        return
    rows = [
        (
            o.name,
            format_shape(o.shape),
            o.dtypes,
            *_errors(o),
        )
        for o in result.outputs
    ]
    raised = {
        o.dtype: (o.atol, o.rtol) for o in result.outputs if (o.atol, o.rtol) != (result.atol, result.rtol)
    }
    floors = "".join(f"; {dtype} outputs: atol={a:g}, rtol={r:g}" for dtype, (a, r) in raised.items())
    title = _title("", result.reference, result, floors)
    below: list[Line] = [
        ((f"output '{o.name}': {o.note}", "" if o.passed else "red"),) for o in result.outputs if o.note
    ]
    verdict = (
        "all outputs match"
        if result.passed
        else f"{len(result.failed)} of {len(result.outputs)} outputs differ"
    )
    below.append(((verdict, "green" if result.passed else "red"),))
    _show(title, ("output", "shape", "dtype", "max abs err", "max rel err", "result"), rows, below)


class Verdict(NamedTuple):
    """A table cell: a green "pass" or a red "FAIL" (``gskit.io.report.verdict``)."""

    passed: bool


def _show(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], below: Sequence[Line]) -> None:
    """A table and the lines under it on stdout, as ``gskit.io.report`` prints them with rich.

    Where rich would write no escapes (stdout a pipe or a file) the same text is written directly
    (``gskit.io.text.plain_output``), so that a plain run does not import rich for it.
    """
    plain = _plain(title, columns, rows, below)
    if plain is not None:
        sys.stdout.write(plain)
        return
    from gskit.io import report

    out = report.console()
    cells = [[report.verdict(c.passed) if isinstance(c, Verdict) else c for c in row] for row in rows]
    out.print(report.table(title, columns, cells))
    for line in below:
        out.print(report.styled(*line))


def _plain(
    title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], below: Sequence[Line]
) -> str | None:
    """The text rich would print for :func:`_show`, where it prints no escapes and this text can say it;
    else None."""
    if not writes_plain(sys.stdout):
        return None  # rich writes escapes (colours, bold) or may, or draws the box otherwise
    cells = [[("pass" if c.passed else "FAIL") if isinstance(c, Verdict) else c for c in row] for row in rows]
    return plain_output([(title, columns, cells)], below)


def _print_json(result: object) -> None:
    from gskit.io.strict_json import print_json

    print_json(result)


def _errors(compared: OutputComparison | PluginCheck) -> tuple[str, str, Verdict]:
    """The columns ``max abs err``, ``max rel err`` and ``result`` of a row."""
    return f"{compared.max_abs_err:.3g}", f"{compared.max_rel_err:.3g}", Verdict(compared.passed)


def _title(kind: str, reference: str, header: ComparisonHeader, floors: str = "") -> str:
    """``Layerwise: original vs prepared (atol=1e-05, rtol=1e-05; inputs x: 2x4)``: a report's header.

    ``floors``: the tolerances lower-precision outputs got (``; float16 outputs: atol=...``).
    """
    inputs = ", ".join(f"{n}: {format_shape(s)}" for n, s in header.input_shapes.items())
    tolerances = f"atol={header.atol:g}, rtol={header.rtol:g}{floors}"
    return f"{kind + ': ' if kind else ''}{reference} vs {header.under_test} ({tolerances}; inputs {inputs})"


def print_layerwise(result: LayerwiseReport, *, as_json: bool) -> None:
    """The tensors checked up to the first failure, and the verdict (or JSON)."""
    if as_json:
        _print_json(result)
        return
    rows = [
        (
            index,
            c.tensor.name,
            format_shape(c.tensor.shape),
            *_errors(c.tensor),
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
    title = _title("Layerwise", result.reference, result)
    first = result.first_failure
    if first is None:
        below: Line = (
            (f"all {result.candidates} shared tensors match", "green"),
            f" ({result.runs} run(s) of up to {result.chunk})",
        )
    else:
        below = (
            (f"first mismatch: tensor '{first.tensor.name}'", "red"),
            f", made by '{first.prepared_node.name}' ({first.prepared_node.op}) in the prepared model and "
            f"'{first.original_node.name}' ({first.original_node.op}) in the original; "
            f"{len(result.checked)} of {result.candidates} tensors checked",
        )
    _show(title, columns, rows, [below])


def print_plugins(result: PluginCompareReport, *, as_json: bool) -> None:
    """One row per plugin node and the verdict (or JSON)."""
    if as_json:
        _print_json(result)
        return
    rows = [
        (
            p.node,
            p.op,
            ", ".join(f"{n}: {format_shape(s)}" for n, s in p.inputs.items()),
            *_errors(p),
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
    title = _title("Per plugin", "original region", result)
    if result.passed:
        below: Line = ((f"all {len(result.plugins)} replaced nodes match their original regions", "green"),)
    else:
        names = ", ".join(f"'{p.node}' ({p.op})" for p in result.failed)
        below = ((f"{len(result.failed)} of {len(result.plugins)} replaced nodes differ: {names}", "red"),)
    _show(title, columns, rows, [below])
