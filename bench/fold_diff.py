"""Whether two versions of gskit's fold give the same models: record one version's folded models, then the
other's, and compare them.

    python bench/fold_diff.py save OUTDIR MODEL ...        # fold each model (defaults), keep the results
    FOLD_DIFF_DIR=OUTDIR PYTHONPATH=bench python -m pytest -p fold_diff TESTS  # keep the tests' folds
    python bench/fold_diff.py diff BEFORE AFTER            # compare the two folders, exit 1 on a difference

A kept fold is ``KEY.onnx`` (the folded model) and ``KEY.json`` (the report and where it came from); KEY
hashes the input model and the options, so the same fold run by two versions of the code has the same key.
Two folds of a key are the same when they have the same nodes (op histogram, graph and subgraphs, in order),
the same graph inputs, outputs and ``value_info`` (element types and dims, subgraphs too), the same constants
(names aside: dtypes, shapes and bytes), the same report (nodes before and after, passes, folded ops,
excluded nodes, failures, restored outputs, mode) and, where onnxruntime runs both, equal outputs on the same
random inputs.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.external_data_helper import uses_external_data

#: Folds of larger inputs are not kept (test models written for the > 2 GB paths).
MAX_KEPT_BYTES = 256 * 2**20


def key_of(data: bytes, options: Any, plugins: Any) -> str:
    digest = hashlib.sha1(data)
    digest.update(repr(options).encode())
    digest.update(repr(sorted(_plugin_names(plugins))).encode())
    return digest.hexdigest()[:16]


def _plugin_names(plugins: Any) -> list[str]:
    if plugins is None:
        return []
    try:
        return [str(getattr(spec, "name", spec)) for spec in plugins]
    except TypeError:
        return [type(plugins).__name__]


def keep(out_dir: Path, key: str, folded: onnx.ModelProto, report: Any, origin: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    if any(uses_external_data(t) for t in folded.graph.initializer):
        # batched mode's large results are read from a temporary data file, removed when the process ends:
        # written beside the kept model (gskit's save streams them), so the comparison can read them
        from gskit.io import model as gsmodel

        gsmodel.save(folded, out_dir / f"{key}.onnx", external_data=True, check=False)
    else:
        onnx.save_model(folded, out_dir / f"{key}.onnx")
    fields = dataclasses.asdict(report) if dataclasses.is_dataclass(report) else {}
    (out_dir / f"{key}.json").write_text(
        json.dumps({"origin": origin, "report": fields}, indent=1, default=str)
    )


def _save(out_dir: Path, models: list[Path]) -> None:
    from gskit.io import model as gsmodel
    from gskit.passes.fold import FoldOptions, fold

    for path in models:
        model = gsmodel.load(path)
        key = key_of(model.SerializeToString(), FoldOptions(), None)
        folded, report = fold(model)
        keep(out_dir, key, folded, report, str(path))
        print(f"{path.name}: {report.nodes_before} -> {report.nodes_after}", file=sys.stderr, flush=True)


# -- the pytest plugin: every fold the tests run ---------------------------------------------------------


def pytest_configure(config: Any) -> None:
    """Wraps ``FOLD.call`` to keep each fold's input key and result in ``$FOLD_DIFF_DIR``."""
    out_dir = Path(os.environ["FOLD_DIFF_DIR"])
    import onnx_graphsurgeon as gs

    from gskit.passes.fold import fold_pass

    fold_class = type(fold_pass.FOLD)
    original = fold_class.call

    def call(self: Any, model: Any, options: Any, context: Any) -> Any:
        try:
            proto = gs.export_onnx(model.copy()) if isinstance(model, gs.Graph) else model
            data = proto.SerializeToString()
        except Exception:  # noqa: BLE001  # a graph the exporter refuses: the fold meets it, not the harness
            data = None
        result = original(self, model, options, context)
        if data is not None and len(data) <= MAX_KEPT_BYTES:
            try:
                folded = gs.export_onnx(result.model) if isinstance(result.model, gs.Graph) else result.model
                origin = os.environ.get("PYTEST_CURRENT_TEST", "?")
                keep(out_dir, key_of(data, options, context.plugins), folded, result.report, origin)
            except Exception:  # noqa: BLE001,S110  # e.g. > 2 GB or weights on disk: not compared
                pass
        return result

    fold_class.call = call


# -- comparing -----------------------------------------------------------------------------------------


def _graphs(graph: onnx.GraphProto) -> list[onnx.GraphProto]:
    found = [graph]
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                found += _graphs(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    found += _graphs(sub)
    return found


def _type(info: onnx.ValueInfoProto) -> str:
    return str(info.type).replace("\n", " ")


def _constants(model: onnx.ModelProto) -> Counter:
    """Every constant (initializer or ``Constant`` node value) as (dtype, dims, digest of its bytes)."""
    found: Counter = Counter()
    for graph in _graphs(model.graph):
        tensors = list(graph.initializer)
        tensors += [
            a.t for n in graph.node if n.op_type == "Constant" for a in n.attribute if a.name == "value"
        ]
        for tensor in tensors:
            try:
                raw = numpy_helper.to_array(tensor).tobytes()
            except Exception:  # noqa: BLE001  # external data not beside it
                raw = tensor.SerializeToString()
            found[(tensor.data_type, tuple(tensor.dims), hashlib.sha1(raw).hexdigest()[:12])] += 1
    return found


def fingerprint(model: onnx.ModelProto) -> dict[str, Any]:
    graphs = _graphs(model.graph)
    return {
        "nodes": [[n.domain + "::" + n.op_type for n in g.node] for g in graphs],
        "histogram": Counter(n.op_type for g in graphs for n in g.node),
        "inputs": [[(i.name, _type(i)) for i in g.input] for g in graphs],
        "outputs": [[(o.name, _type(o)) for o in g.output] for g in graphs],
        "value_info": [sorted((v.name, _type(v)) for v in g.value_info) for g in graphs],
        "constants": _constants(model),
    }


_REPORT_FIELDS = (
    "nodes_before",
    "nodes_after",
    "passes",
    "folded_ops",
    "excluded",
    "failures",
    "restored_outputs",
    "mode",
)


#: Seconds one onnxruntime run of a kept model may take (the tests' hostile models loop for ever).
RUN_SECONDS = 20


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import threading

    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    run_options = ort.RunOptions()
    timer = threading.Timer(RUN_SECONDS, lambda: setattr(run_options, "terminate", True))
    timer.start()
    try:
        return session.run(None, feeds, run_options)
    finally:
        timer.cancel()


def _feed_choices(model: onnx.ModelProto) -> Iterator[dict[str, np.ndarray]]:
    """Random inputs to try in turn: images of 64x64, then audio (unknown dims 512, an integer scalar a
    sample rate of 16000, as silero-vad wants)."""
    from gskit.io.feeds import random_feeds

    yield random_feeds(model, image_dim=64)
    audio = random_feeds(model, default_dim=512)
    for name, value in audio.items():
        if value.ndim == 0 and value.dtype.kind == "i":
            audio[name] = np.array(16000, dtype=value.dtype)
    yield audio


def outputs_differ(before: onnx.ModelProto, after: onnx.ModelProto) -> str | None:
    """A difference between the two models' outputs on the same random inputs, "not run" where onnxruntime
    cannot run the earlier one, None when equal."""
    expected = None
    choices = _feed_choices(before)
    while expected is None:
        try:
            feeds = next(choices)
            expected = _run(before, feeds)
        except StopIteration:
            break
        except Exception as err:  # noqa: BLE001
            error = err
    if expected is None:
        return f"not run ({str(error).splitlines()[0][:80] if str(error) else type(error).__name__})"
    try:
        got = _run(after, feeds)
    except Exception as err:  # noqa: BLE001
        return f"after fails: {str(err).splitlines()[0][:120]}"
    for index, (a, b) in enumerate(zip(expected, got, strict=True)):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"output {index}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        if not np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"):
            return (
                f"output {index}: values differ (max abs {np.max(np.abs(a.astype(float) - b.astype(float)))})"
            )
    return None


def diff(before_dir: Path, after_dir: Path) -> int:
    keys = sorted(p.stem for p in before_dir.glob("*.onnx"))
    missing = [k for k in keys if not (after_dir / f"{k}.onnx").exists()]
    differences = 0
    not_run = 0
    for key in keys:
        if key in missing:
            continue
        meta = json.loads((before_dir / f"{key}.json").read_text())
        report_b = meta["report"]
        report_a = json.loads((after_dir / f"{key}.json").read_text())["report"]
        model_b = onnx.load(before_dir / f"{key}.onnx")
        model_a = onnx.load(after_dir / f"{key}.onnx")
        found = []
        fp_b, fp_a = fingerprint(model_b), fingerprint(model_a)
        for field, value in fp_b.items():
            if fp_a[field] != value:
                found.append(field)
        for field in _REPORT_FIELDS:
            if report_b.get(field) != report_a.get(field):
                found.append(f"report.{field}")
        costly = [r for r in report_b.get("excluded", {}).values() if "bytes" in r or "run" in r]
        # a model fold left unevaluated for its cost (the tests' hostile models) is not run either
        numeric = "not run (costly)" if costly else outputs_differ(model_b, model_a)
        if numeric and numeric.startswith("not run"):
            not_run += 1
        elif numeric:
            found.append(numeric)
        if found:
            differences += 1
            print(f"{key} ({meta['origin']}): {'; '.join(found)}")
    print(
        f"{len(keys) - len(missing)} folds compared, {differences} with differences, {not_run} not run on "
        f"onnxruntime; {len(missing)} only in {before_dir}"
        + (f" ({', '.join(missing[:5])}...)" if missing else "")
    )
    return 1 if differences else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    save = sub.add_parser("save", help="fold each model with the defaults and keep the results")
    save.add_argument("out_dir", type=Path)
    save.add_argument("models", nargs="+", type=Path)
    compare = sub.add_parser("diff", help="compare two folders of kept folds")
    compare.add_argument("before", type=Path)
    compare.add_argument("after", type=Path)
    args = parser.parse_args(argv)
    if args.command == "save":
        _save(args.out_dir, args.models)
        return 0
    return diff(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
