"""``gskit build MODEL -o ENGINE [--plugins ...] [--shape NAME:MIN,OPT,MAX ...] [--timing-cache F]
[--compute-capability 8.9]``: build a TensorRT engine and its JSON sidecar."""

from __future__ import annotations

import argparse

from gskit.backends.trt_build import EngineInfo, Shape, build_engine
from gskit.errors import GskitError
from gskit.report import console, print_json, table


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "build",
        help="build a TensorRT engine (TensorRT-RTX: ahead of time for a compute capability) with a sidecar",
        description="Build a strongly typed TensorRT engine via Polygraphy; writes ENGINE and ENGINE.json.",
    )
    parser.add_argument("model", help="the .onnx file")
    parser.add_argument("-o", "--output", required=True, metavar="ENGINE", help="engine file to write")
    parser.add_argument(
        "--plugins",
        action="append",
        default=[],
        metavar="DIR_OR_SO",
        help="a plugin library (.so), trt_plugin.py module or plugin folder (repeatable; full TensorRT)",
    )
    parser.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME:MIN,OPT,MAX",
        help="profile shapes of one input, e.g. x:1x3x224x224,4x3x224x224,8x3x224x224 (repeatable)",
    )
    parser.add_argument("--timing-cache", metavar="FILE", help="timing cache, read if present and updated")
    parser.add_argument(
        "--compute-capability", metavar="MAJOR.MINOR", help="TensorRT-RTX AOT target, e.g. 8.9"
    )
    parser.add_argument("--backend", choices=("auto", "tensorrt", "tensorrt_rtx"), default="auto")
    parser.add_argument("--json", action="store_true", help="print the sidecar as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    info = build_engine(
        args.model,
        args.output,
        plugins=args.plugins,
        shapes=dict(parse_shape(text) for text in args.shape),
        timing_cache=args.timing_cache,
        compute_capability=args.compute_capability,
        backend=args.backend,
    )
    if args.json:
        print_json(info)
    else:
        print_table(info)
    return 0


def parse_shape(text: str) -> tuple[str, tuple[Shape, Shape, Shape]]:
    """``x:1x4,4x4,16x4`` -> ``("x", ((1, 4), (4, 4), (16, 4)))``; one shape means min = opt = max."""
    name, sep, rest = text.rpartition(":")
    shapes = rest.split(",")
    try:
        parsed = tuple(tuple(int(d) for d in s.lower().split("x")) if s else () for s in shapes)
    except ValueError as err:
        raise GskitError(
            f"--shape {text!r}: write NAME:MIN,OPT,MAX with dims joined by x, e.g. x:1x4,4x4,8x4"
        ) from err
    if not sep or not name or len(parsed) not in (1, 3) or any(not s for s in parsed):
        raise GskitError(
            f"--shape {text!r}: write NAME:MIN,OPT,MAX with dims joined by x, e.g. x:1x4,4x4,8x4"
        )
    if len(parsed) == 1:
        parsed = parsed * 3
    return name, parsed  # type: ignore[return-value]


def print_table(info: EngineInfo) -> None:
    rows = [
        ("engine", info.engine),
        ("sidecar", info.sidecar),
        ("TensorRT", f"{info.tensorrt['flavour']} {info.tensorrt['version']}"),
        ("compute capability", info.compute_capability),
        ("strongly typed", info.strongly_typed),
        ("plugins", ", ".join(info.plugins) or "-"),
        ("build time", f"{info.build_seconds:.2f} s"),
    ]
    for profile in info.profiles:
        for name, shapes in profile.items():
            rows.append(
                (f"profile {name}", " / ".join("x".join(map(str, shapes[k])) for k in ("min", "opt", "max")))
            )
    console().print(table("Engine", ("field", "value"), rows))
