"""``gskit plugin new``: the generated plugin loads, its test fails until the reference is written and
passes once it is (run with pytest in a subprocess), and ``--from-node`` copies a custom node's signature."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import parse_model

from gskit.cli import main
from gskit.errors import GskitError
from gskit.io import model as gmodel
from gskit.plugin import AttrType, load_spec_file
from gskit.plugin.scaffold import new_plugin, read_node

REPO = Path(__file__).resolve().parents[1]

CUSTOM_NODE_MODEL = """
<ir_version: 10, opset_import: ["" : 17, "custom" : 1]>
g (float[N, 4] x, int64[4] idx) => (float[N, 4] y) {
    t = Relu (x)
    y, aux = custom.GatherTwo <axis = 1, scale = 0.5, mode = "wrap", sizes = [2, 3], weights = [0.25, 0.75],
                               table = float[2] {1.0, 2.0}, plugin_version = "1"> (t, idx)
}
"""


def _fill_reference(folder: Path, body: str) -> None:
    path = folder / "reference.py"
    text, count = re.subn(r"    raise NotImplementedError\(.*\)\n", body, path.read_text())
    assert count == 1
    path.write_text(text)


def _run_generated_tests(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", str(folder), "-q", "-p", "no:cacheprovider"],
        cwd=folder.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_generated_plugin_passes_its_test_once_the_reference_is_written(tmp_path: Path) -> None:
    files = new_plugin("soft_sign", tmp_path)
    folder = tmp_path / "soft_sign"
    assert sorted(f.name for f in files) == sorted(
        [
            "__init__.py",
            "spec.py",
            "reference.py",
            "patterns.py",
            "kernel.py",
            "trt_plugin.py",
            "README.md",
            "test_reference.py",
            "conftest.py",
        ]
    )
    (spec,) = load_spec_file(folder / "spec.py", "gskit_plugins.scaffold_soft_sign")
    assert (spec.name, spec.namespace, spec.inputs, spec.outputs) == ("SoftSign", "gskit", ("x",), ("y",))
    with pytest.raises(NotImplementedError):
        spec.run_reference([np.zeros(3, np.float32)], {})

    before = _run_generated_tests(folder)
    assert before.returncode == 1, before.stdout[-2000:]
    assert "NotImplementedError" in before.stdout

    _fill_reference(folder, "    return (x / (1 + np.abs(x))).astype(x.dtype)\n")
    after = _run_generated_tests(folder)
    assert after.returncode == 0, after.stdout[-3000:] + after.stderr[-2000:]
    assert "4 passed" in after.stdout


def test_wrong_reference_dtype_fails_the_generated_test(tmp_path: Path) -> None:
    new_plugin("soft_sign", tmp_path)
    _fill_reference(tmp_path / "soft_sign", "    return (x / (1 + np.abs(x))).astype(np.float64)\n")
    done = _run_generated_tests(tmp_path / "soft_sign")
    assert done.returncode == 1 and "test_reference_follows_the_output_rule" in done.stdout


def _custom_model(tmp_path: Path) -> Path:
    path = tmp_path / "custom.onnx"
    gmodel.save(parse_model(CUSTOM_NODE_MODEL), path)
    return path


def test_read_node_takes_attributes_and_dtypes(tmp_path: Path) -> None:
    sig = read_node(_custom_model(tmp_path), "GatherTwo")  # unnamed node: found by its unique op type
    assert (sig.op_type, sig.domain) == ("GatherTwo", "custom")
    assert sig.inputs == (("float32", (3, 4)), ("int64", (4,)))
    assert sig.outputs == ("float32", "float32")  # aux is unknown: the first input's dtype
    attrs = {a.name: (a.type, a.value) for a in sig.attributes}
    assert "plugin_version" not in attrs
    assert attrs["axis"] == (AttrType.INT, 1)
    assert attrs["scale"] == (AttrType.FLOAT, 0.5)
    assert attrs["mode"] == (AttrType.STRING, "wrap")
    assert attrs["sizes"] == (AttrType.INTS, [2, 3])
    assert attrs["weights"] == (AttrType.FLOATS, [0.25, 0.75])
    assert attrs["table"][0] is AttrType.TENSOR
    np.testing.assert_array_equal(attrs["table"][1], np.array([1.0, 2.0], np.float32))


def test_from_node_cli_writes_a_spec_with_the_node_signature(tmp_path: Path) -> None:
    model = _custom_model(tmp_path)
    plugins = tmp_path / "plugins"
    assert (
        main(["plugin", "new", "gather_two", "--from-node", f"{model}:GatherTwo", "--dir", str(plugins)]) == 0
    )
    folder = plugins / "gather_two"
    (spec,) = load_spec_file(folder / "spec.py", "gskit_plugins.scaffold_gather_two")
    assert (spec.name, spec.namespace) == ("GatherTwo", "custom")
    assert spec.inputs == ("x0", "x1") and spec.outputs == ("y0", "y1")
    kinds = {a.name: (a.type, a.default) for a in spec.attributes if a.type is not AttrType.TENSOR}
    assert kinds == {
        "axis": (AttrType.INT, 1),
        "scale": (AttrType.FLOAT, 0.5),
        "mode": (AttrType.STRING, "wrap"),
        "sizes": (AttrType.INTS, [2, 3]),
        "weights": (AttrType.FLOATS, [0.25, 0.75]),
    }
    table = spec.attribute("table")
    assert table.type is AttrType.TENSOR and np.dtype(table.tensor_dtype) == np.float32
    np.testing.assert_array_equal(table.default, [1.0, 2.0])
    module = sys.modules["gskit_plugins.scaffold_gather_two"]
    assert module.INPUT_DTYPES == ("float32", "int64") and module.OUTPUT_DTYPES == ("float32", "float32")

    _fill_reference(folder, "    return (x0 * scale).astype(x0.dtype), (x0 + table[0]).astype(x0.dtype)\n")
    done = _run_generated_tests(folder)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def test_refuses_to_overwrite_and_bad_arguments(tmp_path: Path) -> None:
    new_plugin("soft_sign", tmp_path)
    with pytest.raises(GskitError, match="already exists"):
        new_plugin("soft_sign", tmp_path)
    assert main(["plugin", "new", "soft_sign", "--dir", str(tmp_path)]) == 2
    with pytest.raises(GskitError, match="Python identifier"):
        new_plugin("3-bad", tmp_path)
    model = _custom_model(tmp_path)
    with pytest.raises(GskitError, match="no node named"):
        new_plugin("other", tmp_path, from_node=f"{model}:Missing")
    with pytest.raises(GskitError, match="MODEL:NODE"):
        new_plugin("other", tmp_path, from_node="no_colon")
    assert not (tmp_path / "other").exists()


# ---- the plugin author's first run (issue 22) --------------------------------------------------------------

#: A node whose attribute names are Python keywords or no identifiers at all.
ODD_NAMES_MODEL = """
<ir_version: 10, opset_import: ["" : 17, "odd" : 1]>
g (float[2, 4] x) => (float[2, 4] y) {
    y = odd.OddOp <ok = 1, scale = 2.0> (x)
}
"""
ODD_NAMES = {"class": 3, "a-b": 2.0, "lambda": 1, "def": "d", "1x": 4, "with space": 5, 'q"uote': 6}


def _odd_model(tmp_path: Path) -> Path:

    proto = parse_model(ODD_NAMES_MODEL)
    node = proto.graph.node[0]
    node.name = "odd_node"
    node.attribute.extend(onnx.helper.make_attribute(name, value) for name, value in ODD_NAMES.items())
    return gmodel.save(proto, tmp_path / "odd.onnx", check=False)


def test_from_node_with_keyword_and_non_identifier_attribute_names_writes_valid_python(
    tmp_path: Path,
) -> None:
    import ast

    from gskit.plugin import load_plugins

    plugins = tmp_path / "plugins"
    new_plugin("odd_op", plugins, from_node=f"{_odd_model(tmp_path)}:odd_node")
    folder = plugins / "odd_op"
    for path in folder.glob("*.py"):
        ast.parse(path.read_text(), filename=str(path))  # no SyntaxError anywhere
    assert "from typing import Any" in (folder / "reference.py").read_text()  # **attrs: Any is defined
    _fill_reference(folder, '    return (x * attrs["class"] + scale + attrs["a-b"]).astype(x.dtype)\n')
    (spec,) = list(load_plugins([plugins], entry_points=False))
    defaults = {a.name: a.default for a in spec.attributes}
    assert {name: defaults[name] for name in ODD_NAMES} == ODD_NAMES
    (y,) = spec.run_reference([np.ones((2, 4), np.float32)], defaults)
    np.testing.assert_array_equal(y, np.full((2, 4), 3 + 2.0 + 2.0, np.float32))


def test_a_broken_plugin_file_is_one_line_naming_it(tmp_path: Path, monkeypatch, capsys) -> None:
    """One bad folder in ./plugins: every command that loads plugins says which file, in one line."""
    monkeypatch.chdir(tmp_path)
    new_plugin("soft_sign", "plugins")
    (tmp_path / "plugins" / "soft_sign" / "reference.py").write_text(
        "def soft_sign(x, *, class):\n    pass\n"
    )
    assert main(["plugin", "list"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0]
    assert "plugins/soft_sign/spec.py: cannot import plugin: SyntaxError" in err[0]


def test_first_run_outside_the_repository_with_the_real_cli(tmp_path: Path) -> None:
    """From a folder outside gskit's repository: `gskit plugin new`, then the `pytest PATH` its spec names
    works from that same folder, with no warning about an unknown mark."""
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    made = subprocess.run(
        [sys.executable, "-m", "gskit.cli", "plugin", "new", "neg_relu"],
        cwd=work,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    folder = work / "plugins" / "neg_relu"
    hint = re.search(r"``pytest ([^`]+)``", (folder / "spec.py").read_text()).group(1)
    assert hint == "plugins/neg_relu" and f"`pytest {hint}`" in (folder / "README.md").read_text()
    assert "write it in plugins/neg_relu/reference.py" in (folder / "reference.py").read_text()
    _fill_reference(folder, "    return np.maximum(-x, 0).astype(x.dtype)\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", hint, "-q", "-p", "no:cacheprovider", "-W", "error"],
        cwd=work,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "4 passed, 1 skipped" in done.stdout and "warning" not in done.stdout.lower()


def test_scaffolded_stubs_are_named_stubs_until_written(tmp_path: Path, monkeypatch, capsys) -> None:
    """plugin list and check-trt call the scaffold's stubs stubs; writing the code ends it."""
    import json

    monkeypatch.chdir(tmp_path)
    model = _custom_model(tmp_path)
    assert main(["plugin", "new", "gather_two", "--from-node", f"{model}:GatherTwo"]) == 0
    capsys.readouterr()

    def listed() -> dict:
        assert main(["plugin", "list", "--json"]) == 0
        rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
        assert all(not r["stubs"] for name, r in rows.items() if name != "GatherTwo")  # shipped ones
        return rows["GatherTwo"]

    def checked() -> tuple[int, dict]:
        code = main(["check-trt", str(model), "--backend", "static", "--json"])
        (issue,) = json.loads(capsys.readouterr().out)["issues"]
        return code, issue

    assert listed()["stubs"] == ["reference", "trt_plugin", "kernel"]
    assert main(["plugin", "list"]) == 0
    table = capsys.readouterr().out  # one implementation per line of its cell
    assert "reference (stub)" in table and "trt_plugin (stub)" in table and "kernel (stub)" in table
    code, issue = checked()
    assert code == 1 and issue["status"] == "plugin problem"
    assert "reference, trt_plugin and kernel are stubs" in issue["reason"]
    assert "TensorRT would run its stub kernel" in issue["reason"]
    # prepare reaches the stub reference: one line naming plugin and node (exit 2), the page names the stubs
    assert main(["prepare", str(model), "-o", "out", "--skip", "check_trt", "--skip", "build"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
    assert "plugin custom::GatherTwo v1, node '" in line and "raised NotImplementedError" in line
    page = (tmp_path / "out" / "report.html").read_text()
    assert "plugin stubs</td><td>custom::GatherTwo v1: reference, trt_plugin and kernel are stubs" in page

    folder = tmp_path / "plugins" / "gather_two"
    _fill_reference(folder, "    return x0, x0\n")
    assert listed()["stubs"] == ["trt_plugin", "kernel"]
    kernel = folder / "kernel.py"
    kernel.write_text(
        re.sub(r"    raise NotImplementedError\(.*\)\n", "    outputs[0].copy_(x0)\n", kernel.read_text())
    )
    assert listed()["stubs"] == []
    code, issue = checked()
    assert code == 0 and issue["status"] == "needs plugin" and "stub kernel" not in issue["reason"]
    assert "is a stub" not in issue["reason"] and "are stubs" not in issue["reason"]


def test_what_counts_as_a_stub() -> None:
    from gskit.plugin.stubs import is_stub_function

    def documented(x):
        """Write me."""
        raise NotImplementedError("write it")

    def bare(x):
        raise NotImplementedError

    def partial(x):
        if x is None:
            raise NotImplementedError("None")
        return x

    def other(x):
        raise ValueError("not a stub: it says what is wrong")

    assert is_stub_function(documented) and is_stub_function(bare)
    assert not is_stub_function(partial) and not is_stub_function(other) and not is_stub_function(len)


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("_helper", "starts with '_', and gskit skips such folders"),
        ("__init__", "starts with '_', and gskit skips such folders"),
        ("class", "is a Python keyword"),
        ("a-b", "must be a Python identifier"),
    ],
)
def test_a_plugin_name_gskit_would_not_find_is_refused(tmp_path: Path, name: str, words: str) -> None:
    with pytest.raises(GskitError, match=re.escape(words)):
        new_plugin(name, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_from_node_takes_a_node_name_with_colons(tmp_path: Path) -> None:
    proto = parse_model(CUSTOM_NODE_MODEL)
    proto.graph.node[1].name = "gather:two::0"
    model = gmodel.save(proto, tmp_path / "m.onnx", check=False)
    new_plugin("gather_two", tmp_path / "plugins", from_node=f"{model}:gather:two::0")
    spec = (tmp_path / "plugins" / "gather_two" / "spec.py").read_text()
    assert 'name="GatherTwo"' in spec and f"node 'gather:two::0' of {model}" in spec


@pytest.mark.parametrize(
    ("domain", "op_type"),
    [
        ('evil"; import os #', "Op"),
        ("my dom", "Op"),
        ("ok.dom", "a::b"),
        ("a\x1b[2Jb", "Op"),
        ("d", "Op\u202e"),
    ],
)
def test_from_node_refuses_what_cannot_name_a_plugin_and_writes_nothing(
    tmp_path: Path, monkeypatch, capsys, domain: str, op_type: str
) -> None:
    """A node whose domain or op type cannot be a plugin's namespace or name: one line, nothing written, so
    every later command that loads ./plugins still works."""
    proto = parse_model(CUSTOM_NODE_MODEL)
    node = proto.graph.node[1]
    node.domain, node.op_type, node.name = domain, op_type, "n"
    del proto.opset_import[1:]
    proto.opset_import.append(onnx.helper.make_opsetid(domain, 1))
    model = gmodel.save(proto, tmp_path / "m.onnx", check=False)
    monkeypatch.chdir(tmp_path)
    assert main(["plugin", "new", "odd", "--from-node", f"{model}:n"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--from-node" in err and "node 'n': plugin" in err, err
    assert not (tmp_path / "plugins").exists()
    assert main(["plugin", "list", "--json"]) == 0
