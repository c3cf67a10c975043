"""Node counts and times of gskit.passes.fold against Polygraphy's fold (and onnxsim / onnxslim when
importable).

Usage: ``python bench/fold_vs_peers.py [MODEL ...] [--json]`` (default: the nine light_*.onnx models
shipped in the onnx wheel). Each tool folds a fresh copy of the model; ``peak_rss_mib`` is the process's
peak RSS after the tool ran (monotonic, so read it for the first tool or run one model per process to
compare memory).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import onnx

from gskit.io import model as gsmodel
from gskit.passes.fold import FoldOptions, fold

LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _gskit(model):
    return fold(model)[0]


def _polygraphy(model):
    from polygraphy.backend.onnx import fold_constants
    from polygraphy.logger import G_LOGGER

    G_LOGGER.module_severity = G_LOGGER.ERROR
    return fold_constants(model, size_threshold=FoldOptions().size_threshold)  # the same limit as gskit's


def _onnxsim(model):
    import onnxsim

    return onnxsim.simplify(model)[0]


def _onnxslim(model):
    import onnxslim

    return onnxslim.slim(model)


def tools() -> dict:
    found = {"gskit": _gskit, "polygraphy": _polygraphy}
    for name, fn in (("onnxsim", _onnxsim), ("onnxslim", _onnxslim)):
        try:
            __import__(name)
            found[name] = fn
        except ImportError:
            pass
    return found


def bench(path: Path) -> dict:
    model = gsmodel.load(path)
    row = {"model": path.stem, "nodes": len(model.graph.node), "size_mib": round(model.ByteSize() / 2**20, 1)}
    for name, fn in tools().items():
        start = time.perf_counter()
        try:
            out = fn(_copy(model))
            row[name] = {"nodes": len(out.graph.node), "seconds": round(time.perf_counter() - start, 3)}
        except Exception as err:  # a peer failing is a result, not a crash of the bench
            row[name] = {"error": str(err).splitlines()[0][:120]}
        row[name]["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = [bench(p) for p in (args.models or sorted(LIGHT_DIR.glob("light_*.onnx")))]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    names = list(tools())
    print(f"{'model':<28}{'nodes':>7}" + "".join(f"{n:>22}" for n in names))
    for row in rows:
        cells = []
        for n in names:
            r = row[n]
            cells.append(
                f"{'error':>22}" if "error" in r else f"{r['nodes']:>8} in {r['seconds']:>7.2f}s    "
            )
        print(f"{row['model']:<28}{row['nodes']:>7}" + "".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
