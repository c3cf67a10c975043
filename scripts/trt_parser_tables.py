"""Regenerate gskit/data/tensorrt_parser.json: what TensorRT's ONNX parser imports, per TensorRT release.

    python scripts/trt_parser_tables.py --onnx-tensorrt CLONE [--operators VERSION=FILE ...] [--probe-rtx]
                                        [-o gskit/data/tensorrt_parser.json]

Source: ``docs/operators.md`` of https://github.com/onnx/onnx-tensorrt at the commit each TensorRT release
pins (:data:`RELEASES`: NVIDIA/TensorRT's ``parsers/onnx`` submodule at tag ``vX.Y``; 8.5 and 8.6 from
onnx-tensorrt's ``release/8.x-GA`` tags). Each table read gives the release's opset range, the ops it imports
(with the restriction the table states) and the ops it lists as unsupported. A release whose commit the clone
lacks is left out, unless ``--operators VERSION=FILE`` gives its operators.md. ``CHANGES`` holds what
onnx-tensorrt's ``docs/Changelog.md`` and NVIDIA/TensorRT's ``CHANGELOG.md`` say changed between releases,
each with its source: gskit applies them on top of the newest table read at or below a target, so a target
between two tables (10.3, 10.9) is answered too. ``--probe-rtx`` asks the installed TensorRT-RTX's parser
(``supports_operator``) which ops of its matching TensorRT table it has no importer for, and records them
under ``tensorrt_rtx``.

The JSON records, for every table, the commit and how it was read, so a check's answer names its source.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from datetime import date
from pathlib import Path

OUTPUT = Path(__file__).resolve().parents[1] / "gskit" / "data" / "tensorrt_parser.json"
REPOSITORY = "https://github.com/onnx/onnx-tensorrt"

#: TensorRT release -> the onnx-tensorrt commit it pins.
RELEASES = {
    "8.5": "3b008c466bcb7375aaf5cabf51b289fd34d40c44",  # tag release/8.5-GA
    "8.6": "6ba67d3428e05f690145373ca87fb8d32f98df45",  # tag release/8.6-GA
    "10.0": "eb43908b02a296ea0594432f06e9d3fac288d672",
    "10.1": "96e781103cfc4adf4a6bb557e94bac8e693f6f4c",
    "10.2": "706f02e74366b2cbaacf87be61de95df051a2788",
    "10.3": "62bdde2a04fcd53c2409cb895ee18db445b7e755",
    "10.4": "3775e499322eee17c837e27bff6d07af4261767a",
    "10.5": "886aff917b63f10a81c5f31e89752a3b46169623",
    "10.6": "4442153a4483c29e109241eb11752f3e59be62f8",
    "10.7": "9c69a24bc2e20c8a511a4e6b06fd49639ec5300a",
    "10.8": "118ed0aea197fa9a7d3ea66180a1d5ddb9deecc3",
    "10.9": "d5dce67db7c2e64b07e055571f5ec06f7f254de2",
    "10.10": "3b9c961a4318cea6fa1fa5f064562064eb27a9bd",
    "10.11": "745bde22c2fe883968cf18cc9ebdfb2e2985166d",
    "10.12": "ff761afc76f4a352e88200199e86a375bfbf9928",
    "10.13": "9a9f7883dd7b8cb0a718395bac2075fab6f97da8",
    "10.14": "c72727708d4ed8a379c04c4ea235c157ce9c3870",
    "10.15": "fa5aa9f61e7781d2ca8f5351d42c1f19525a6124",
    "10.16": "6bde6596eca84abf9afe9b4d21c18c32800fd3ad",
    "11.0": "5ab48c5c436a5686b8574c4a372cbca224273b5a",
    "11.1": "7c51a63a719180eb5160c874c111746f3fb46a6b",
}

_CHANGELOG = f"{REPOSITORY}/blob/main/docs/Changelog.md"
_TRT_CHANGELOG = "https://github.com/NVIDIA/TensorRT/blob/main/CHANGELOG.md"

#: Changes between releases, from the changelogs. ``supported``: the op is imported from ``version`` on;
#: ``restriction``: the table's restriction from ``version`` on ("" lifts it); ``from_opset``: the change
#: concerns the op at that opset and later only (GroupNormalization-21's per-channel scale); ``opsets``: the
#: parser's opset range from ``version`` on.
CHANGES: list[dict] = [
    {"version": "10.3", "op": "Slice", "restriction": "", "source": f"{_CHANGELOG} (10.3: tensor axes)"},
    {"version": "10.4", "op": "Pad", "restriction": "", "source": f"{_CHANGELOG} (10.4: tensor axes)"},
    *(
        {"version": "10.4", "op": op, "supported": True, "source": f"{_CHANGELOG} (10.4)"}
        for op in ("BlackmanWindow", "HammingWindow", "HannWindow")
    ),
    {
        "version": "10.5",
        "op": "STFT",
        "supported": True,
        "restriction": "`frame_step` and `window` must be an initializer. Input must be real-valued.",
        "source": f"{_CHANGELOG} (10.5)",
    },
    *(
        {
            "version": "10.7",
            "op": op,
            "restriction": "`axes` must be resolvable to a constant.",
            "source": f"{_CHANGELOG} (10.7: dynamic axes)",
        }
        for op in ("Squeeze", "Unsqueeze")
    ),
    {
        "version": "10.8",
        "op": "CumSum",
        "restriction": "`axis` must be a build-time constant",
        "source": f"{_CHANGELOG} (10.8: dynamic axes)",
    },
    {
        "version": "10.9",
        "op": "GroupNormalization",
        "from_opset": 21,
        "supported": True,
        "source": f"{_CHANGELOG} (10.9: opset 21 GroupNorm)",
    },
    {
        "version": "10.14",
        "op": "Attention",
        "supported": True,
        "restriction": "`Q`, `K`, `V` and `attn_mask` must be 4D; no past/present key-value inputs or "
        "outputs, no `softcap`",
        "source": f"{_CHANGELOG} (10.14)",
    },
    *(
        {"version": "10.15", "op": op, "supported": True, "source": f"{_CHANGELOG} (10.15)"}
        for op in ("RMSNormalization", "RotaryEmbedding", "TensorScatter")
    ),
    *(
        {"version": "11.0", "op": op, "supported": True, "source": f"{_TRT_CHANGELOG} (11.0 GA, Parsers)"}
        for op in ("Swish", "TRT_Attention", "TRT_MoE", "TRT_KVCacheUpdate")
    ),
    {"version": "11.2", "op": "DFT", "supported": True, "source": f"{_TRT_CHANGELOG} (11.2: via FFTPlugin)"},
    {"version": "11.2", "op": "GridSample", "restriction": "", "source": f"{_TRT_CHANGELOG} (11.2: 5D)"},
    {"version": "11.5", "opsets": [9, 25], "source": "TensorRT 11.5 release notes (opset 25)"},
]

#: TensorRT-RTX release -> the full TensorRT release whose parser it matches (its importers: Swish and the
#: TRT_* custom ops present, so 11.0 or later; DFT absent, so before 11.2).
RTX_LIKE = {"1.7": "11.1"}

_HEADER = re.compile(
    r"TensorRT\s+([\d.]+)\s+supports operators (?:up to Opset (\d+)|in the inclusive range of opset (\d+) to "
    r"opset (\d+))",
    re.IGNORECASE,
)


def parse_operators(text: str) -> dict:
    """A table: ``{"header": "10.1", "opsets": [lo, hi], "ops": {op: restriction}, "unsupported": [ops]}``."""
    header = _HEADER.search(text)
    if header is None:
        raise ValueError("no 'TensorRT X supports operators ...' header")
    low, high = (1, int(header.group(2))) if header.group(2) else (int(header.group(3)), int(header.group(4)))
    ops: dict[str, str] = {}
    unsupported: list[str] = []
    for line in text.splitlines():
        if not line.startswith("|") or line.startswith("|--") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or cells[0] in ("Operator", "ONNX Operator") or not cells[0]:
            continue
        name, supported = cells[0], cells[1].upper()
        restriction = cells[3] if len(cells) > 3 else ""
        restriction = re.sub(r"\s+", " ", restriction.replace("<br />", " ")).strip()
        if supported.startswith("Y"):
            ops[name] = restriction
        elif supported.startswith("N"):
            unsupported.append(name)
    return {"header": header.group(1), "opsets": [low, high], "ops": ops, "unsupported": sorted(unsupported)}


def read_release(clone: Path, commit: str) -> str | None:
    """``docs/operators.md`` at ``commit`` in the clone, or None when the clone lacks that commit."""
    done = subprocess.run(
        ["git", "-C", str(clone), "show", f"{commit}:docs/operators.md"], capture_output=True, text=True
    )
    return done.stdout if done.returncode == 0 else None


def probe_rtx(table: dict) -> dict:
    """How the installed TensorRT-RTX's parser differs from ``table`` (``supports_operator``): the ops the
    table imports and RTX has no importer for, and the ONNX ops RTX imports that the table does not list."""
    import onnx
    import tensorrt_rtx as trt

    logger = trt.Logger(trt.Logger.ERROR)
    parser = trt.OnnxParser(trt.Builder(logger).create_network(0), logger)
    onnx_ops = {s.name for s in onnx.defs.get_all_schemas_with_history()}
    return {
        "version": trt.__version__,
        "no_importer": sorted(op for op in table["ops"] if not parser.supports_operator(op)),
        "extra": sorted(op for op in onnx_ops - set(table["ops"]) if parser.supports_operator(op)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--onnx-tensorrt", required=True, type=Path, help="a git clone of onnx/onnx-tensorrt")
    parser.add_argument(
        "--operators",
        action="append",
        default=[],
        metavar="VERSION=FILE",
        help="operators.md of a release the clone lacks (read at the commit RELEASES names)",
    )
    parser.add_argument("--probe-rtx", action="store_true", help="record what TensorRT-RTX's parser lacks")
    parser.add_argument("-o", "--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    files = dict(item.split("=", 1) for item in args.operators)
    tables, missing = {}, []
    for version, commit in RELEASES.items():
        if version in files:
            text, how = Path(files[version]).read_text(), f"copy of docs/operators.md at {commit[:12]}"
        else:
            text, how = read_release(args.onnx_tensorrt, commit), "git show"
        if text is None:
            missing.append(version)
            continue
        table = parse_operators(text)
        table.update(commit=commit, read=how)
        tables[version] = table
    previous = json.loads(args.output.read_text()) if args.output.is_file() else {}
    rtx = previous.get("tensorrt_rtx", {})
    if args.probe_rtx:
        for rtx_version, like in RTX_LIKE.items():
            if like in tables:
                probed = probe_rtx(tables[like])
                if ".".join(probed["version"].split(".")[:2]) == rtx_version:
                    rtx[rtx_version] = {"like": like, **probed, "probed": date.today().isoformat()}
    data = {
        "source": f"{REPOSITORY} docs/operators.md at the commit each TensorRT release pins; "
        "regenerate with scripts/trt_parser_tables.py",
        "tables": tables,
        "changes": CHANGES,
        "tensorrt_rtx": rtx,
    }
    args.output.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    print(f"{args.output}: tables {', '.join(tables)}; not in the clone: {', '.join(missing) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
