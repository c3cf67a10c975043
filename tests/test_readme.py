"""The README's Python example runs as written (from the repository root) and does what it says."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

REPO = Path(__file__).resolve().parents[1]


def test_python_api_example_runs(tmp_path: Path, monkeypatch) -> None:
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), flags=re.S)
    assert blocks, "the README has no Python example"
    code = blocks[0].replace('"gskit/data/example.onnx"', repr(str(REPO / "gskit" / "data" / "example.onnx")))
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"})  # its own asserts check the results
    assert (tmp_path / "prepared.onnx").is_file()
    assert os.listdir(tmp_path) == ["prepared.onnx"]  # nothing else left behind


def test_quick_start_commands_are_what_ci_runs() -> None:
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    commands = re.findall(r"```bash\n(pip install[^\n]*)\n```", readme)
    assert len(commands) == 2, commands
    main_job, tests = commands
    assert "gskit prepare gskit/data/example.onnx" in main_job
    install, _, run = tests.partition(" && ")
    assert install.replace("pip install", "python3 -m pip install -q") in ci
    assert run.replace("python -m pytest", "python3 -m pytest") in ci


def test_recipe_example_is_a_valid_recipe() -> None:
    from gskit.pipeline.recipe import parse_recipe

    blocks = re.findall(r"```yaml\n(.*?)```", (REPO / "README.md").read_text(), flags=re.S)
    assert blocks, "the README has no recipe example"
    recipe = parse_recipe(blocks[0], source="README.md")
    assert [s.name for s in recipe.steps] == [
        "edit",
        "replace",
        "infer_shapes",
        "fold",
        "convert",
        "validate",
        "build",
    ]


# -- "Use in CI": the JSON tables match the real output, the CI step runs as written ------------------------

EXAMPLE = REPO / "gskit" / "data" / "example.onnx"
#: The README's words for JSON types.
JSON_TYPES = {
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "list": list,
    "object": dict,
}


def ci_section() -> str:
    text = (REPO / "README.md").read_text()
    match = re.search(r"^## Use in CI\n(.*?)(?=^## )", text, flags=re.S | re.M)
    assert match, "README.md has no 'Use in CI' section"
    return match.group(1)


def documented_keys(command: str) -> dict[str, str]:
    """Key -> type of the table under "`gskit COMMAND --json`:" in the CI section, in order."""
    section = ci_section()
    heading = rf"^`gskit {re.escape(command)} --json`[^\n]*:\n\n"
    match = re.search(heading + r"((?:\|[^\n]*\n)+)", section, flags=re.M)
    assert match, f"no JSON table for gskit {command}"
    rows = [line.split("|")[1:-1] for line in match.group(1).splitlines()[2:]]
    return {key.strip().strip("`"): kind.strip() for key, kind, _ in rows}


def _json_of(*argv: str) -> tuple[int, dict]:
    import contextlib
    import io

    from gskit.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([*argv, "--json"])
    return code, json.loads(out.getvalue())


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("ci") / "out"
    code, data = _json_of("prepare", str(EXAMPLE), "-o", str(out))
    assert code == 0
    return out, data


@pytest.mark.parametrize(
    "command", ["prepare", "compare", "compare --layerwise", "compare --per-plugin", "check-trt"]
)
def test_documented_json_keys_are_the_keys_produced(command: str, prepared) -> None:
    out, report = prepared
    model = str(out / "model.onnx")
    if command == "prepare":
        data = report
        assert json.loads((out / "report.json").read_text()) == data  # what --json prints is report.json
    elif command == "check-trt":
        data = _json_of("check-trt", model)[1]
    else:
        data = _json_of("compare", str(EXAMPLE), model, *command.split()[1:])[1]
    documented = documented_keys(command)
    assert list(documented) == list(data)
    for key, kind in documented.items():
        base, _, null = kind.partition(" or ")
        assert null in ("", "null") and base in JSON_TYPES, (key, kind)
        value = data[key]
        assert (value is None and null) or isinstance(value, JSON_TYPES[base]), (key, kind, value)


def test_nested_tables_are_described_where_they_are_documented(prepared) -> None:
    """prepare's comparison and tensorrt carry the keys of compare's and check-trt's tables."""
    _, report = prepared
    assert list(report["comparison"]) == list(documented_keys("compare"))
    assert list(report["tensorrt"]) == list(documented_keys("check-trt"))


def _model(path: Path, body: str) -> Path:
    """A float[2, 3] -> float[2, 3] model made of ``body``."""
    from gskit.io import model as gsmodel

    text = f'<ir_version: 8, opset_import: ["" : 17]>\ng (float[2, 3] x) => (float[2, 3] y) {{\n {body}\n}}'
    return gsmodel.save(onnx.parser.parse_model(text), path)


WRONG_PLUGIN = """
import numpy as np
from gskit.passes.patterns import GraphPattern
from gskit.plugin import PluginSpec, same_as_input


def off_by_one(x):
    return (np.maximum(-x, 0) + 1).astype(x.dtype)


SPEC = PluginSpec(
    name="NegRelu", namespace="readme.ci", inputs=("x",), infer=same_as_input(0), reference=off_by_one,
    patterns=(GraphPattern(lambda op, x: op.Relu(op.Neg(x)), name="Relu(Neg(x))"),),
)
"""


def _wrong_plugin(tmp_path: Path) -> Path:
    """A plugin whose reference is off by one: a model it replaces fails validation (exit 1)."""
    folder = tmp_path / "plugins" / "neg_relu"
    folder.mkdir(parents=True)
    (folder / "spec.py").write_text(WRONG_PLUGIN)
    return folder.parent


@pytest.mark.parametrize(
    ("case", "code", "says"),
    [
        ("fits", 0, "validated: prepared/model.onnx"),
        ("differs", 1, "outputs differ: ['y']"),
        ("missing", 2, "gskit prepare could not run (exit 2): the reason is on stderr"),
    ],
)
def test_ci_step_runs_as_written(case: str, code: int, says: str, tmp_path: Path) -> None:
    (block,) = re.findall(r"```bash\n(.*?)```", ci_section(), flags=re.S)
    model = {
        "fits": str(_model(tmp_path / "relu.onnx", "y = Relu(x)")),
        "differs": str(_model(tmp_path / "neg_relu.onnx", "n = Neg(x)\n y = Relu(n)")),
        "missing": str(tmp_path / "no-such.onnx"),
    }[case]
    # `gskit` and `python` are this interpreter with this tree's gskit, installed or not
    python = f'"{sys.executable}"'
    prelude = f'gskit() {{ {python} -m gskit.cli "$@"; }}\npython() {{ {python} "$@"; }}\n'
    plugins = str(_wrong_plugin(tmp_path))
    env = {**os.environ, "MODEL": model, "PYTHONPATH": str(REPO), "GSKIT_PLUGINS": plugins}
    run = subprocess.run(
        ["bash", "-c", prelude + block],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == code, run.stderr
    assert run.stdout.strip().splitlines()[-1] == says
    if code == 2:
        assert run.stderr.strip().splitlines()[-1].startswith("gskit prepare: error: ")
