"""Models past protobuf's 2 GB limit: save picks external data, load -> edit -> isolate -> save keeps every
weight bit for bit, and a lazy load reads shapes without reading weights.

The model (three 754 MB float32 weights, 2.26 GB in all) is built once per module and deleted at the end.
The gskit steps run in a subprocess so their peak RSS can be measured apart from the test's own memory.
"""

from __future__ import annotations

import gc
import hashlib
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from gskit.io.model import load, save

pytestmark = pytest.mark.slow

ROWS, COLS = 4096, 46_000  # 4 * 4096 * 46000 = 753,664,000 bytes per weight
WEIGHTS = {"W1": (ROWS, COLS), "W2": (COLS, ROWS), "W3": (ROWS, COLS)}
TOTAL_BYTES = 3 * 4 * ROWS * COLS
#: RSS growth allowed for gskit's steps: far below the 2.26 GB of weights they must not read into memory.
MAX_RSS_GROWTH = 300 * 2**20
_HASH_CHUNK = 64 * 2**20


def _weight(index: int, shape: tuple[int, int]) -> np.ndarray:
    # Every element differs from its neighbours, so a wrong offset or a swapped tensor changes the hash.
    values = np.arange(shape[0] * shape[1], dtype=np.float32).reshape(shape)
    values *= np.float32(1.0 + index / 8)
    return values


@pytest.fixture(scope="module")
def big_model(tmp_path_factory):
    """(path of the saved model, sha256 of each weight's bytes)."""
    folder = tmp_path_factory.mktemp("large")
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("MatMul", ["r", "W1"], ["a"]),
        helper.make_node("MatMul", ["a", "W2"], ["b"]),
        helper.make_node("MatMul", ["b", "W3"], ["c"]),
        helper.make_node("Add", ["c", "bias"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, ROWS])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, COLS])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    hashes: dict[str, str] = {}
    for index, name in enumerate((*WEIGHTS, "bias")):
        values = (
            _weight(index, WEIGHTS[name]) if name in WEIGHTS else np.linspace(-1, 1, COLS, dtype=np.float32)
        )
        hashes[name] = hashlib.sha256(values.data).hexdigest()
        # Filled in place: helper.make_graph would copy 2.26 GB of bytes twice more.
        tensor = model.graph.initializer.add(name=name, data_type=TensorProto.FLOAT, dims=values.shape)
        tensor.raw_data = values.tobytes()
        del values
    path = save(model, folder / "big.onnx")  # no external_data argument: save must choose it
    del model
    gc.collect()
    yield path, hashes
    shutil.rmtree(folder, ignore_errors=True)


def _run_measured(script: str, *args: str) -> dict:
    """Run a Python snippet in a fresh interpreter; it prints a JSON dict as its last line."""
    prelude = textwrap.dedent("""
        import json, sys
        def vm(key):
            with open("/proc/self/status") as f:
                return next(int(l.split()[1]) * 1024 for l in f if l.startswith(key + ":"))
    """)
    proc = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _external_hashes(model_path: Path) -> dict[str, str]:
    """sha256 of each external tensor's bytes, read in chunks from the data file at its offset."""
    model = onnx.load(str(model_path), load_external_data=False)
    result = {}
    for tensor in model.graph.initializer:
        if tensor.data_location != TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in tensor.external_data}
        digest = hashlib.sha256()
        remaining = int(info["length"])
        with open(model_path.parent / info["location"], "rb") as f:
            f.seek(int(info.get("offset", 0)))
            while remaining:
                chunk = f.read(min(_HASH_CHUNK, remaining))
                assert chunk, f"{info['location']} ends early for {tensor.name}"
                digest.update(chunk)
                remaining -= len(chunk)
        result[tensor.name] = digest.hexdigest()
    return result


def test_save_chose_external_data(big_model):
    path, hashes = big_model
    assert TOTAL_BYTES > 2**31
    assert path.stat().st_size < 1_000_000  # graph only; the weights are in the data file
    assert (path.parent / "big.onnx.data").stat().st_size >= TOTAL_BYTES
    assert _external_hashes(path) == hashes


def test_lazy_load_reads_shapes_without_weights(big_model):
    path, _ = big_model
    result = _run_measured(
        """
        import onnx_graphsurgeon as gs
        from gskit.io.model import load, to_graph
        before = vm("VmRSS")
        graph = to_graph(load(sys.argv[1], load_weights=False))
        shapes = {t.name: list(t.shape) for t in graph.tensors().values() if isinstance(t, gs.Constant)}
        print(json.dumps({"growth": vm("VmHWM") - before, "shapes": shapes}))
        """,
        str(path),
    )
    assert result["shapes"] == {**{k: list(v) for k, v in WEIGHTS.items()}, "bias": [COLS]}
    assert result["growth"] < MAX_RSS_GROWTH, f"lazy load grew RSS by {result['growth'] / 2**20:.0f} MiB"


def test_edit_isolate_save_keeps_weights_bit_identical(big_model):
    path, hashes = big_model
    out = path.parent / "sub" / "sub.onnx"
    result = _run_measured(
        """
        from gskit.passes.edit import rename_tensors
        from gskit.passes.isolate import isolate
        from gskit.io.model import load, save, to_graph
        before = vm("VmRSS")
        graph = to_graph(load(sys.argv[1], load_weights=False))
        rename_tensors(graph, {"W2": "W2_renamed", "b": "b_renamed"})
        sub = isolate(graph, ["r"], ["y"])
        save(sub, sys.argv[2])
        print(json.dumps({
            "growth": vm("VmHWM") - before,
            "nodes": [n.op for n in sub.nodes],
            "inputs": [(t.name, list(t.shape)) for t in sub.inputs],
        }))
        """,
        str(path),
        str(out),
    )
    assert result["nodes"] == ["MatMul", "MatMul", "MatMul", "Add"]
    assert result["inputs"] == [["r", [1, ROWS]]]
    assert result["growth"] < MAX_RSS_GROWTH, (
        f"edit+isolate+save grew RSS by {result['growth'] / 2**20:.0f} MiB"
    )

    assert out.stat().st_size < 1_000_000 and (out.parent / "sub.onnx.data").stat().st_size >= TOTAL_BYTES
    got = _external_hashes(out)
    assert got == {"W1": hashes["W1"], "W2_renamed": hashes["W2"], "W3": hashes["W3"], "bias": hashes["bias"]}

    reloaded = load(out, load_weights=False)
    assert [n.output[0] for n in reloaded.graph.node] == ["a", "b_renamed", "c", "y"]
    assert reloaded.graph.node[2].input[0] == "b_renamed"
    onnx.checker.check_model(str(out))
