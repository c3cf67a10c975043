"""``gskit build MODEL -o ENGINE [--plugins ...] [--shape NAME:MIN,OPT,MAX ...] [--timing-cache F]
[--compute-capability 8.9]``: build a TensorRT engine and its JSON sidecar."""

from __future__ import annotations

import argparse

from gskit.backends.trt_build import WEAK_TYPING_REFUSED, EngineInfo, build_engine
from gskit.cli.command import add_json, add_output, subcommand
from gskit.errors import GskitError
from gskit.io.report import console, print_json, table
from gskit.io.shape_args import parse_profile

#: ``--help``: the command's line in ``gskit --help`` and its description.
DESCRIPTION = "Build a strongly typed TensorRT engine via Polygraphy; writes ENGINE and ENGINE.json."


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subcommand(subparsers, "build", description=DESCRIPTION)
    add_output(parser, "engine file to write", metavar="ENGINE")
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
        help="profile shapes of one input, e.g. x:1x3x224x224,4x3x224x224,8x3x224x224 or "
        "x:[1,3,224,224],[4,3,224,224],[8,3,224,224]; one shape (x:1x3x224x224) fixes it (repeatable)",
    )
    parser.add_argument("--timing-cache", metavar="FILE", help="timing cache, read if present and updated")
    parser.add_argument(
        "--compute-capability", metavar="MAJOR.MINOR", help="TensorRT-RTX AOT target, e.g. 8.9"
    )
    parser.add_argument("--backend", choices=("auto", "tensorrt", "tensorrt_rtx"), default="auto")
    for flag in WEAK_TYPING_REFUSED:  # offered to say what to do instead: builds are strongly typed
        parser.add_argument(f"--{flag}", action="store_true", help=f"refused: {flag} comes from the model")
    add_json(parser, "print the sidecar as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    for flag, why in WEAK_TYPING_REFUSED.items():
        if getattr(args, flag):
            raise GskitError(f"--{flag}: {why}")
    info = build_engine(
        args.model,
        args.output,
        plugins=args.plugins,
        shapes=dict(parse_profile(text) for text in args.shape),
        timing_cache=args.timing_cache,
        compute_capability=args.compute_capability,
        backend=args.backend,
    )
    if args.json:
        print_json(info)
    else:
        print_table(info)
    return 0


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
