"""The README's Python example runs as written (from the repository root) and does what it says."""

from __future__ import annotations

import os
import re
from pathlib import Path

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
