"""``gskit edit``: rename tensors, change inputs, insert/remove nodes, set attributes, expose tensors."""

from __future__ import annotations

import argparse

import numpy as np

from gskit.errors import GskitError
from gskit.io import model as gsmodel
from gskit.io import report
from gskit.io.limits import number_array
from gskit.io.shape_args import parse_symbolic_shape
from gskit.passes import edit

_ORDER = (
    "Edits run in this order, whatever the order on the command line: drop initializer inputs, constants to "
    "initializers, rename, input dtype, input shape, remove node, insert after, set/remove attributes, "
    "expose. Later edits use the names left by earlier ones (after --rename use the new name)."
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "edit",
        help="edit a model: rename, input shape/dtype, insert/remove nodes, attributes, expose",
        description="Edit an ONNX model and save it (checked, atomic). " + _ORDER,
    )
    p.add_argument("model", help="input .onnx file")
    p.add_argument("-o", "--output", help="output .onnx file")
    p.add_argument("--in-place", action="store_true", help="overwrite the input model")
    p.add_argument(
        "--rename", action="extend", nargs="+", default=[], metavar="OLD=NEW", help="rename a tensor"
    )
    p.add_argument(
        "--input-shape",
        action="extend",
        nargs="+",
        default=[],
        metavar="NAME:DIMS",
        help="set an input's shape: x:1x3x224x224, x:1,3,224,224 or x:[1,3,224,224]; with commas a dim may "
        "be -1 or ? (dynamic) or a word (symbolic), e.g. x:batch,3,-1,-1; x: is a scalar",
    )
    p.add_argument(
        "--input-dtype",
        action="extend",
        nargs="+",
        default=[],
        metavar="NAME:DTYPE",
        help="change an input's dtype (e.g. ids:int32); a Cast back to the old dtype follows the input",
    )
    p.add_argument(
        "--insert-after",
        action="append",
        default=[],
        metavar="TENSOR:OP[:k=v,...]",
        help="insert a node after TENSOR keeping its name; list values as k=1,2,3; keys starting "
        "with @ are extra inputs in order: numbers become an int64/float32 constant, else a "
        "tensor name (e.g. y:Pad:mode=reflect,@pads=0,0,0,0,0,0,1,0)",
    )
    p.add_argument(
        "--remove-node",
        action="extend",
        nargs="+",
        default=[],
        metavar="NAME",
        help="remove a single-input single-output node",
    )
    p.add_argument(
        "--set-attr",
        action="extend",
        nargs="+",
        default=[],
        metavar="NODE:KEY=VALUE",
        help="set an attribute (custom ones start with __); lists as 1,2,3",
    )
    p.add_argument(
        "--remove-attr",
        action="extend",
        nargs="+",
        default=[],
        metavar="NODE:KEY",
        help="remove an attribute",
    )
    p.add_argument(
        "--expose",
        action="extend",
        nargs="+",
        default=[],
        metavar="TENSOR",
        help="add an intermediate tensor as a graph output",
    )
    p.add_argument(
        "--constants-to-initializers", action="store_true", help="turn Constant nodes into initializers"
    )
    p.add_argument(
        "--drop-initializer-inputs", action="store_true", help="remove initializers from the graph inputs"
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="accept attributes unknown to the op's schema, and --insert-after ops unknown to onnx",
    )
    p.add_argument("--json", action="store_true", help="print the changes as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.output and not args.in_place:
        raise GskitError("edit: give -o OUTPUT or --in-place")
    if args.output and args.in_place:
        raise GskitError("edit: give -o OUTPUT or --in-place, not both")
    output = gsmodel.resolve_output(
        args.model, args.output or args.model, in_place=args.in_place, has_in_place=True
    )
    plan = _plan(args)
    # In place, weights must be in memory: the data file they would be read from is being replaced.
    model = gsmodel.load(args.model, load_weights=args.in_place)
    graph, changes = edit.apply_edits(model, plan)
    path = gsmodel.save(graph, output, in_place=args.in_place)
    if args.json:
        report.print_json({"output": path, "changes": changes})
    else:
        out = report.console()
        out.print(
            report.table(
                f"gskit edit -> {path}",
                ("step", "target", "change"),
                [(c.step, c.target, c.detail) for c in changes],
            )
        )
        if not changes:
            out.print("no edits requested; model re-saved")
    return 0


def _plan(args: argparse.Namespace) -> edit.EditPlan:
    plan = edit.EditPlan(
        drop_initializer_inputs=args.drop_initializer_inputs,
        constants_to_initializers=args.constants_to_initializers,
        remove_nodes=list(args.remove_node),
        expose=list(args.expose),
        force=args.force,
    )
    for item in args.rename:
        old, sep, new = item.partition("=")
        if not sep or not old or not new:
            raise GskitError(f"--rename {item!r}: expected OLD=NEW")
        plan.renames[old] = new
    for item in args.input_shape:
        name, dims = parse_symbolic_shape(item)
        plan.input_shapes[name] = dims
    for item in args.input_dtype:
        name, sep, dtype = item.rpartition(":")
        if not sep or not name or not dtype:
            raise GskitError(f"--input-dtype {item!r}: expected NAME:DTYPE such as ids:int32")
        plan.input_dtypes[name] = dtype
    for item in args.insert_after:
        plan.insertions.append(_insertion(item))
    for item in args.set_attr:
        left, sep, value = item.partition("=")
        node, colon, key = left.rpartition(":")
        if not sep or not colon or not node or not key:
            raise GskitError(f"--set-attr {item!r}: expected NODE:KEY=VALUE")
        plan.set_attrs.setdefault(node, {})[key] = _value(value)
    for item in args.remove_attr:
        node, colon, key = item.rpartition(":")
        if not colon or not node or not key:
            raise GskitError(f"--remove-attr {item!r}: expected NODE:KEY")
        plan.remove_attrs.setdefault(node, []).append(key)
    return plan


def _insertion(item: str) -> edit.Insertion:
    """``TENSOR:OP`` or ``TENSOR:OP:k=v,...``; the tensor name itself may contain ':'."""
    parts = item.split(":")
    spec = ""
    if len(parts) >= 3 and "=" in parts[-1]:
        spec = parts.pop()
    if len(parts) < 2 or not parts[-1] or not all(parts[:-1]):
        raise GskitError(f"--insert-after {item!r}: expected TENSOR:OP[:k=v,...]")
    op = parts.pop()
    insertion = edit.Insertion(tensor=":".join(parts), op=op)
    for key, value in _pairs(spec, item):
        if key.startswith("@"):
            insertion.extra_inputs.append(_extra_input(value))
        else:
            insertion.attrs[key] = _value(value)
    return insertion


def _pairs(spec: str, item: str) -> list[tuple[str, str]]:
    """Split ``a=1,b=2,3`` into [(a, "1"), (b, "2,3")]: a piece without '=' continues the previous value."""
    pairs: list[tuple[str, str]] = []
    for piece in spec.split(",") if spec else []:
        key, sep, value = piece.partition("=")
        if sep:
            pairs.append((key.strip(), value))
        elif pairs:
            pairs[-1] = (pairs[-1][0], f"{pairs[-1][1]},{piece}")
        else:
            raise GskitError(f"--insert-after {item!r}: expected k=v after the op")
    return pairs


def _value(text: str) -> int | float | str | list[int] | list[float]:
    """An attribute value from text: int, float, a comma list of them, or a string."""
    items = text.split(",")
    parsed = [_number(t.strip()) for t in items]
    if all(p is not None for p in parsed):
        return parsed if len(items) > 1 else parsed[0]
    return text


def _extra_input(text: str) -> np.ndarray | str:
    numbers = [_number(t.strip()) for t in text.split(",")]
    if text and all(n is not None for n in numbers):
        return number_array(numbers, f"--insert-after input @{text[:40]}")  # type: ignore[arg-type]
    return text


def _number(text: str) -> int | float | None:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return None
