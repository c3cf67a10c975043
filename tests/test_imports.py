"""Every gskit module imports without the optional heavy dependencies (they are imported lazily)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import gskit
import gskit.cli

#: The bundled example (a PyTorch export with two plugin patterns).
EXAMPLE = Path(gskit.__file__).parent / "data" / "example.onnx"

#: Optional dependencies that no gskit module may import at module level.
BLOCKED = ("tensorrt", "tensorrt_rtx", "torch")

# Runs first in a fresh interpreter: a meta path finder placed first refuses the blocked packages (and
# their submodules) as if they were not installed.
BLOCKER = """
import importlib, json, pkgutil, sys

BLOCKED = set(sys.argv[1].split(","))

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by test_imports)", name=name)
        return None

sys.meta_path.insert(0, Blocker())
for name in list(sys.modules):
    if name.split(".")[0] in BLOCKED:
        del sys.modules[name]
"""

# Then every module of the package is imported (``__main__`` modules would run the CLI, so not those).
IMPORT_ALL = """
import gskit
import gskit.cli

imported, failed = [], {}
def walk_error(name):
    failed[name] = "could not walk this package"

for info in pkgutil.walk_packages(gskit.__path__, "gskit.", onerror=walk_error):
    if info.name.rsplit(".", 1)[-1] == "__main__":
        continue
    try:
        importlib.import_module(info.name)
        imported.append(info.name)
    except Exception as err:
        failed[info.name] = f"{type(err).__name__}: {err}"
leaked = sorted(n for n in sys.modules if n.split(".")[0] in BLOCKED)
print(json.dumps({"imported": imported, "failed": failed, "leaked": leaked}))
"""


def _modules_on_disk() -> set[str]:
    root = Path(gskit.__file__).parent
    names = set()
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names - {"gskit"}


def test_every_module_imports_without_optional_dependencies() -> None:
    result = subprocess.run(
        [sys.executable, "-c", BLOCKER + IMPORT_ALL, ",".join(BLOCKED)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["failed"] == {}
    assert report["leaked"] == []
    unreached = _modules_on_disk() - set(report["imported"])
    assert not unreached, (
        f"modules not reached by pkgutil (a folder without __init__.py?): {sorted(unreached)}"
    )
    assert "gskit.passes.inspect" in report["imported"] and "gskit.cli.inspect" in report["imported"]


def test_blocker_really_blocks() -> None:
    result = subprocess.run(
        [sys.executable, "-c", BLOCKER + "import torch\n", ",".join(BLOCKED)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode != 0
    assert "ModuleNotFoundError" in result.stderr and "blocked by test_imports" in result.stderr


def test_import_paths_the_readmes_document_name_the_owners() -> None:
    """Names the README and plugins/README.md show under a module that no longer owns them still import
    from there, and are the owner's objects (not copies)."""
    from gskit.backends import aot_ptx, trt_plugin
    from gskit.passes import fold
    from gskit.passes.fold import fold_pass, options
    from gskit.plugin import discovery, registry, spec

    assert spec.load_plugins is discovery.load_plugins and spec.PluginRegistry is registry.PluginRegistry
    assert trt_plugin.triton_ptx is aot_ptx.triton_ptx
    assert fold.fold is fold_pass.fold and fold.FOLD is fold_pass.FOLD
    assert fold.FoldOptions is options.FoldOptions and fold.FoldReport is options.FoldReport
    try:
        spec.load_everything  # noqa: B018  # a name nobody moved is still an AttributeError
    except AttributeError as err:
        assert "load_everything" in str(err)
    else:
        raise AssertionError("gskit.plugin.spec answered a name it never had")


# A real run with torch installed: the commands that need no torch leave it unimported.
RUN_WITHOUT_TORCH = """
import sys
from gskit.cli import main
code = main(sys.argv[1:])
print("TORCH" if "torch" in sys.modules else "NO-TORCH", code)
"""


def test_compare_and_validate_do_not_import_torch(tmp_path: Path) -> None:
    """Polygraphy's torch-tensor check imported torch on every onnxruntime run (1 s, 170 MB per command)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        import pytest

        pytest.skip("torch is not installed: nothing could import it")
    example = str(Path(gskit.__file__).parent / "data" / "example.onnx")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("steps: [sanitize, fold, validate]\n")  # no plugin node: nothing asks for torch
    for argv in (
        ["compare", example, example],
        ["compare", example, example, "--layerwise"],
        ["prepare", example, "-o", str(tmp_path / "out"), "--recipe", str(recipe)],
    ):
        done = subprocess.run(
            [sys.executable, "-c", RUN_WITHOUT_TORCH, *argv], capture_output=True, text=True, timeout=300
        )
        assert done.stdout.strip().splitlines()[-1] == "NO-TORCH 0", (
            argv,
            done.stdout[-500:],
            done.stderr[-500:],
        )


def test_reading_a_model_does_not_import_asyncio() -> None:
    """onnx's helper module decorates a function with ``typing_extensions.deprecated``, which imported asyncio
    (and with it ssl and sockets: 16 ms) before typing_extensions 4.16; gskit requires that version."""
    example = str(Path(gskit.__file__).parent / "data" / "example.onnx")
    for argv in (["inspect", example], ["compare", example, example]):
        code = "import sys\nfrom gskit.cli import main\nmain(sys.argv[1:])\nprint('asyncio' in sys.modules)"
        done = subprocess.run(
            [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300, check=False
        )
        assert done.returncode == 0 and done.stdout.strip().splitlines()[-1] == "False", (argv, done.stderr)


LOADED_BY = """
import sys
from gskit.cli import main
code = main(sys.argv[1:])
print(" ".join(sorted(m for m in sys.modules if m.startswith("gskit.cli.") or m in ("onnx", "numpy"))), code)
"""


def _loaded(*argv: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", LOADED_BY, *argv], capture_output=True, text=True, timeout=120
    )
    return done.stdout.strip().splitlines()[-1].split()


def test_version_imports_no_command_and_a_command_imports_only_its_own() -> None:
    """Building every subcommand's parser imported all 13 modules (and onnx, numpy ...) for `--version`."""
    assert _loaded("--version") == ["0"]
    example = str(Path(gskit.__file__).parent / "data" / "example.onnx")
    loaded = _loaded("inspect", example)
    assert loaded[-1] == "0"
    # the shared helpers (gskit.cli.command, gskit.cli.options) load with any command; no other command does
    commands = [m for m in loaded if m.startswith("gskit.cli.") and m.split(".")[2] in gskit.cli.COMMANDS]
    assert commands == ["gskit.cli.inspect"]
    listed = subprocess.run(
        [sys.executable, "-m", "gskit.cli", "--help"], capture_output=True, text=True, timeout=120
    )
    assert all(name.replace("_", "-") in listed.stdout for name in gskit.cli.COMMANDS)


# What a command left in sys.modules: the gskit modules, and which of the libraries a command may not need.
MODULES_OF = """
import json, sys
from gskit.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as done:  # argparse's --help and usage errors
    code = done.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def _modules_after(*argv: str, cwd: Path | None = None) -> tuple[int, set[str], str]:
    """The exit code of ``gskit ARGV`` run in a fresh interpreter, the modules it imported, its stderr."""
    done = subprocess.run(
        [sys.executable, "-c", MODULES_OF, *argv], capture_output=True, text=True, timeout=300, cwd=cwd
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return report["code"], set(report["modules"]), done.stderr


def _command_modules(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.startswith("gskit.cli.") and m.split(".")[2] in gskit.cli.COMMANDS)


def test_help_and_a_mistyped_command_import_no_command_module() -> None:
    """The listing and "did you mean" came from the 13 commands' parsers: every module (onnx, numpy ...)
    was imported to print them."""
    code, modules, _ = _modules_after("--help")
    assert code == 0 and _command_modules(modules) == []
    assert not {"onnx", "numpy", "rich"} & modules
    code, modules, err = _modules_after("inspekt", "model.onnx")
    assert code == 2 and _command_modules(modules) == []
    assert "unknown 'inspekt'; did you mean inspect?" in err
    assert not {"onnx", "numpy", "rich"} & modules


def test_the_command_table_says_what_the_parsers_say() -> None:
    """``gskit --help`` lists :data:`gskit.cli.COMMANDS` without importing the commands: each line there is
    the help of the parser the command's module builds, in the same order."""
    parser = gskit.cli.build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    built = {action.dest: action.help for action in subparsers._choices_actions}
    listed = {gskit.cli.command_name(name): line for name, line in gskit.cli.COMMANDS.items()}
    assert list(built.items()) == list(listed.items())
    listing = gskit.cli.build_parser(["--help"]).format_help()
    assert listing == parser.format_help()


def test_inspect_imports_no_runtime() -> None:
    """inspect reads a model without running it: no onnxruntime, Polygraphy or torch (the command line set
    onnxruntime's log level for every command, which imported it)."""
    code, modules, _ = _modules_after("inspect", str(EXAMPLE))
    assert code == 0
    assert _command_modules(modules) == ["gskit.cli.inspect"]
    loaded = {m.split(".")[0] for m in modules}
    assert not {"onnxruntime", "polygraphy", "torch", "tensorrt_rtx"} & loaded


def test_comparing_models_without_plugin_nodes_reads_no_plugin_folder(tmp_path: Path) -> None:
    """The default plugin sources (shipped plugins, ./plugins ...) are imported only for a model with nodes of
    a custom domain: their files are compiled on every import (a quarter of a plain compare's time)."""
    code, modules, _ = _modules_after("compare", str(EXAMPLE), str(EXAMPLE), cwd=tmp_path)
    assert code == 0
    assert not [m for m in modules if m.startswith("gskit_plugins.")]


def test_plugin_references_run_without_torch(tmp_path: Path) -> None:
    """Plugin nodes run through onnxruntime-extensions, whose package __init__ imports its converters, and
    they transformers and torch where installed (2 s and 170 MB for every validate of a prepared model)."""
    import importlib.util

    import pytest

    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed: nothing could import it")
    out = tmp_path / "out"
    code, modules, err = _modules_after("prepare", str(EXAMPLE), "-o", str(out))
    assert code == 0, err[-500:]
    report = json.loads((out / "report.json").read_text())
    validate = next(step for step in report["steps"] if step["name"] == "validate")
    assert validate["status"] == "ok"
    # the prepared model has plugin nodes, run through their references: the PyOp path really ran
    assert "onnxruntime_extensions._ocos" in modules
    assert not {"torch", "transformers"} & {m.split(".")[0] for m in modules}
    code, modules, err = _modules_after("compare", str(EXAMPLE), str(out / "model.onnx"))
    assert code == 0, err[-500:]
    assert "onnxruntime_extensions._ocos" in modules
    assert not {"torch", "transformers"} & {m.split(".")[0] for m in modules}


LATER_IMPORT = """
import sys
from gskit.backends.ort_extensions import library_path, pyop_module

ocos = pyop_module()
assert "onnxruntime_extensions" not in sys.modules  # the bare parent package is not left behind
import onnxruntime_extensions  # a plugin's own code may import the package: its real __init__ runs

assert onnxruntime_extensions.Opdef is ocos.Opdef and pyop_module() is ocos
assert onnxruntime_extensions.get_library_path() == library_path()
print("OK")
"""


def test_the_package_imported_later_shares_the_pyop_registration() -> None:
    """gskit's PyOps and the package's own ``onnx_op`` register in one table: importing the package after
    gskit runs its real ``__init__``, which reuses the module gskit imported."""
    done = subprocess.run([sys.executable, "-c", LATER_IMPORT], capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "OK", done.stderr[-500:]


def test_importing_the_op_facts_lists_no_schemas() -> None:
    """``gskit.plugin.ops`` listed every onnx schema on import (70 ms of every command, even --help ones
    that never ask whether an op is standard); the list is made on first use."""
    code = (
        "import onnx.defs\n"
        "def refused():\n"
        "    raise AssertionError('schemas listed on import')\n"
        "real, onnx.defs.get_all_schemas_with_history = onnx.defs.get_all_schemas_with_history, refused\n"
        "import gskit.plugin.ops as ops, gskit.cli.compare, gskit.compare.outputs\n"
        "onnx.defs.get_all_schemas_with_history = real\n"
        "assert 'Relu' in ops.ONNX_OP_TYPES and 'Relu' in ops.onnx_op_types()\n"
        "print('OK')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "OK", done.stderr[-500:]


def test_comparing_a_model_with_plugin_nodes_imports_no_rich(tmp_path: Path) -> None:
    """Loading the plugins imports their patterns, and through them the pattern passes and inspect, which
    wrote their JSON with gskit.io.report's helpers, so a compare to a pipe imported rich."""
    out = tmp_path / "out"
    assert gskit.cli.main(["replace", str(EXAMPLE), "-o", str(out / "model.onnx")]) == 0
    code, modules, _ = _modules_after("compare", str(EXAMPLE), str(out / "model.onnx"), cwd=tmp_path)
    assert code == 0
    assert [m for m in modules if m.startswith("gskit_plugins.")], "the plugins were not loaded"
    assert not [m for m in modules if m.split(".")[0] == "rich" or m == "gskit.io.report"]


def test_prepare_to_a_pipe_imports_no_rich(tmp_path: Path) -> None:
    """The step lines and the summary of a prepare to a pipe are written without rich (``gskit.io.text``):
    importing rich's console took 20 ms of a small model's prepare."""
    out = tmp_path / "out"
    code, modules, err = _modules_after("prepare", str(EXAMPLE), "-o", str(out), cwd=tmp_path)
    assert code == 0, err[-500:]
    assert "validate " in err and (out / "report.html").is_file()
    assert not [m for m in modules if m.split(".")[0] == "rich" or m == "gskit.io.report"]


#: ``gskit prepare`` in a fresh interpreter: the modules loaded when its parser's worker started.
WORKER_STARTED_AFTER = """
import json, subprocess, sys
from gskit.cli import main

seen = []
real = subprocess.Popen.__init__
def recording(self, args, *rest, **kwargs):
    if "gskit.backends.trt_worker" in args:
        seen.append(sorted(sys.modules))
    real(self, args, *rest, **kwargs)
subprocess.Popen.__init__ = recording
code = main(sys.argv[1:])
print(json.dumps({"code": code, "loaded": seen[0] if seen else None, "modules": sorted(sys.modules)}))
"""


def test_a_default_prepare_starts_its_parser_before_onnx_and_imports_no_yaml(tmp_path: Path) -> None:
    """The TensorRT-RTX parser's worker of check_trt started when ``prepare()`` began, after 0.3 s of imports;
    now the command line starts it first. The default recipe was written as YAML and read back (PyYAML's
    import and the round trip: 20-30 ms)."""
    import importlib.util

    import pytest

    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-c", WORKER_STARTED_AFTER, "prepare", str(EXAMPLE), "-o", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["code"] == 0, done.stderr[-500:]
    assert "yaml" not in report["modules"]
    if importlib.util.find_spec("tensorrt_rtx") is None or importlib.util.find_spec("tensorrt"):
        pytest.skip("the worker is started from the command line for TensorRT-RTX alone")
    loaded = set(report["loaded"])
    assert not {"onnx", "numpy", "onnx_graphsurgeon", "onnxruntime", "gskit.cli.prepare"} & loaded


def test_the_prepare_command_loads_the_report_page_when_it_writes_it() -> None:
    """report.html's modules (gskit.io.html_report, html) load when the page is written, not before."""
    code = "import sys, gskit.cli.prepare\nprint(sorted(m for m in sys.modules if 'html' in m))\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "[]", done.stderr[-500:]
