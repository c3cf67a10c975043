"""gskit as its users install it, following the README: a wheel built from a copy of this tree, installed in
a fresh virtualenv and run from a temporary folder; then a third-party plugin package, found after
``pip install`` through the ``gskit.plugins`` entry point, whose pattern replaces nodes of a model.

The README's "Install from a wheel" and "Write your own plugin package" commands run in bash as written, with
these changes so that nothing is downloaded: the virtualenv borrows this environment's packages (for gskit's
dependencies, like ``--system-site-packages``), ``pip install`` gets ``--no-deps --no-index
--no-build-isolation``, and ``python -m build`` builds without isolation (``pip wheel`` where the ``build``
package, a dev extra, is missing: then no sdist is checked). Everything is written under the tests'
temporary folders: the build runs in a copy of the tree, ``mktemp -d`` goes to a temporary ``TMPDIR``. The
README's quick start (``pip install -e .`` and prepare) runs the same way in a copy. About 55 s in all.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import site
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import onnx
import pytest
from packaging.requirements import Requirement
from test_plugin import SHIPPED_NAMES

REPO = Path(__file__).resolve().parents[1]
SHIPPED = set(SHIPPED_NAMES)  # the plugins the repository ships, listed once in test_plugin
EXTRAS = {"trt", "rtx", "torch", "gpu", "bench"}
#: What a build needs from the tree (MANIFEST.in and setup.py say what goes into the sdist and the wheel).
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "gskit", "plugins")
BUILD_LEFTOVERS = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info")

pytestmark = pytest.mark.slow


def readme_blocks(section: str, language: str) -> list[str]:
    """The ``language`` code blocks of one README section, in order."""
    text = (REPO / "README.md").read_text()
    match = re.search(rf"^## {re.escape(section)}\n(.*?)(?=^## )", text, flags=re.S | re.M)
    assert match, f"README.md has no section '{section}'"
    return re.findall(rf"```{language}\n(.*?)```", match.group(1), flags=re.S)


#: Run by the new virtualenv's python: drop the old setuptools that Python < 3.12 puts into a virtualenv (no
#: bdist_wheel; builds without isolation would use it), then let it see this environment's packages (gskit's
#: dependencies; the virtualenv's own come first). Like --system-site-packages, also when the tests run in
#: a virtualenv themselves.
BORROW_PACKAGES = """
import subprocess, sys, sysconfig
from pathlib import Path
subprocess.run([sys.executable, "-m", "pip", "uninstall", "-q", "-y", "setuptools"], capture_output=True)
lines = "".join(f"import site; site.addsitedir({p!r})\\n" for p in sys.argv[1:])
(Path(sysconfig.get_paths()["purelib"]) / "_borrowed_site_packages.pth").write_text(lines)
"""


def offline(script: str, env_dir: Path) -> str:
    """A README bash block with the changes the module docstring lists."""
    if importlib.util.find_spec("build") is not None:
        build = f"{sys.executable} -m build --no-isolation"
    else:
        build = f"{sys.executable} -m pip wheel --no-deps --no-build-isolation -w dist ."
    helper = env_dir.parent / "borrow_packages.py"
    helper.write_text(BORROW_PACKAGES)
    borrow = shlex.join([f"{env_dir}/bin/python", str(helper), *site.getsitepackages()])
    return (
        script.replace("python -m build", build)
        .replace("python -m venv /tmp/gskit-env", f"{sys.executable} -m venv {env_dir} && {borrow}")
        .replace("pip install ", "pip install --no-deps --no-index --no-build-isolation ")
        .replace("/tmp/gskit-env", str(env_dir))
    )


@dataclass(frozen=True)
class Installed:
    tree: Path  # the copy the wheel was built in (dist/ under it)
    env: Path  # the virtualenv
    scratch: Path  # TMPDIR of the commands
    output: str  # what the README's commands printed

    def environ(self) -> dict[str, str]:
        """This process's environment without what points at the source tree, the venv's bin first."""
        drop = {"PYTHONPATH", "GSKIT_PLUGINS", "VIRTUAL_ENV", "PYTHONHOME"}
        env = {k: v for k, v in os.environ.items() if k not in drop}
        env["PATH"] = f"{self.env / 'bin'}{os.pathsep}{env['PATH']}"
        env["TMPDIR"] = str(self.scratch)
        return env

    def bash(self, script: str, cwd: Path) -> str:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", _every_line_checked(script)],
            cwd=cwd,
            env=self.environ(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"{script}\nexit {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done.stdout + done.stderr

    def plugin_rows(self, cwd: Path) -> dict[str, dict]:
        """``gskit plugin list --json`` of the virtualenv run in ``cwd``, by qualified name (node domain)."""
        done = subprocess.run(
            [str(self.env / "bin" / "gskit"), "plugin", "list", "--json"],
            cwd=cwd,
            env=self.environ(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return {f"{r['domain']}::{r['name']} v{r['version']}": r for r in json.loads(done.stdout)}


def _every_line_checked(script: str) -> str:
    """``bash -e`` ignores a failure on the left of ``&&``: stop after each line whose status is not 0."""
    return "\n".join(
        f"{line}\n" + 'status=$?; [ "$status" = 0 ] || exit "$status"' for line in script.splitlines()
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The README's "Install from a wheel" commands, run once."""
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("building offline needs setuptools in this environment (pip install 'setuptools>=77')")
    root = tmp_path_factory.mktemp("wheel")
    (block,) = readme_blocks("Install from a wheel", "bash")
    install = Installed(copy_tree(root / "gskit"), root / "gskit-env", root / "tmp", "")
    output = install.bash(offline(block, install.env), cwd=install.tree)
    return Installed(install.tree, install.env, install.scratch, output)


def copy_tree(dest: Path) -> Path:
    """What a build needs from this tree, copied to ``dest`` (a build writes build/ and *.egg-info)."""
    dest.mkdir(parents=True)
    (dest.parent / "tmp").mkdir(exist_ok=True)  # TMPDIR of the commands
    for name in SOURCES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=BUILD_LEFTOVERS)
        else:
            shutil.copy2(source, dest / name)
    return dest


def test_wheel_in_a_fresh_virtualenv_finds_the_shipped_plugins_and_prepares_the_example(
    installed: Installed, tmp_path: Path
) -> None:
    assert f"{len(SHIPPED)} plugin(s)" in installed.output
    rows = installed.plugin_rows(tmp_path)
    shipped = {name: row for name, row in rows.items() if row["origin"] == "shipped with gskit"}
    assert set(shipped) == SHIPPED
    site = installed.env / "lib"
    for row in shipped.values():  # from the installed package, not from this source tree
        assert Path(row["source"]).is_relative_to(site) and "/gskit_plugins/" in row["source"]
    assert "cpp" in shipped["gskit::DeformConv2d v1"]["implementations"]
    (prepared,) = installed.scratch.glob("*/out/model.onnx")
    report = json.loads((prepared.parent / "report.json").read_text())
    assert report["comparison"]["passed"] is True
    domains = {node.domain for node in onnx.load(prepared, load_external_data=False).graph.node}
    assert "gskit" in domains  # the shipped patterns replaced nodes


def test_plugin_made_with_plugin_new_is_found_beside_the_shipped_ones(
    installed: Installed, tmp_path: Path
) -> None:
    installed.bash("gskit plugin new my_op", cwd=tmp_path)  # writes ./plugins/my_op
    rows = installed.plugin_rows(tmp_path)
    assert rows["gskit::MyOp v1"]["origin"] == f"folder {tmp_path / 'plugins'} (./plugins)"
    assert SHIPPED < set(rows)


def test_wheel_and_sdist_carry_the_plugin_folders_and_declare_the_extras(installed: Installed) -> None:
    (wheel,) = (installed.tree / "dist").glob("gskit-*.whl")
    plugin_files = sorted(
        p.relative_to(REPO / "plugins").as_posix()
        for p in (REPO / "plugins").rglob("*")
        if p.is_file() and not ({"__pycache__", "build"} & set(p.parts)) and p.suffix != ".pyc"
    )
    assert any(f.endswith("cpp/CMakeLists.txt") for f in plugin_files)
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = zf.read(info).decode()
        entry_points = zf.read(info.replace("METADATA", "entry_points.txt")).decode()
    missing = [f for f in plugin_files if f"gskit_plugins/{f}" not in names]
    assert not missing, f"the wheel lacks {missing}"
    assert "gskit/data/example.onnx" in names
    assert re.search(r"^\[gskit\.plugins\]\ngskit = gskit_plugins$", entry_points, flags=re.M)
    assert EXTRAS <= set(re.findall(r"^Provides-Extra: (\S+)$", metadata, flags=re.M))
    requirements = [Requirement(r) for r in re.findall(r"^Requires-Dist: (.+)$", metadata, flags=re.M)]
    for extra in EXTRAS:  # each extra brings packages of its own
        assert [r for r in requirements if r.marker and r.marker.evaluate({"extra": extra})], extra
    sdists = list((installed.tree / "dist").glob("gskit-*.tar.gz"))
    if not sdists:
        pytest.skip("no sdist: the build package (dev extra) is not installed, the wheel came from pip wheel")
    with tarfile.open(sdists[0]) as tf:
        members = {m.split("/", 1)[1] for m in tf.getnames() if "/" in m}
    assert {"setup.py", "MANIFEST.in", "pyproject.toml"} <= members
    assert not [f for f in plugin_files if f"plugins/{f}" not in members]


NEG_RELU_MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
agraph (float[2, 5] x) => (float[2, 5] z) {
    n = Neg(x)
    y = Relu(n)
    z = Mul(y, x)
}
"""


def test_third_party_plugin_package_is_found_and_replaces_its_pattern(
    installed: Installed, tmp_path: Path
) -> None:
    create, use = readme_blocks("Write your own plugin package", "bash")
    (pyproject,) = readme_blocks("Write your own plugin package", "toml")
    reference, patterns = readme_blocks("Write your own plugin package", "python")
    installed.bash(create, cwd=tmp_path)
    project = tmp_path / "my-plugins"
    (project / "pyproject.toml").write_text(pyproject)
    (project / "my_plugins" / "neg_relu" / "reference.py").write_text(reference)
    (project / "my_plugins" / "neg_relu" / "patterns.py").write_text(patterns)
    model = tmp_path / "model.onnx"
    onnx.save(onnx.parser.parse_model(NEG_RELU_MODEL), model)
    installed.bash(f"export MODEL={model}\n" + offline(use, installed.env), cwd=project)

    rows = installed.plugin_rows(tmp_path)
    assert rows["my.plugins::NegRelu v1"]["origin"] == "entry point my-plugins from my-plugins"
    assert SHIPPED < set(rows)
    (prepared,) = installed.scratch.glob("*/prepared.onnx")
    nodes = [(n.domain, n.op_type) for n in onnx.load(prepared).graph.node]
    assert nodes == [("my.plugins", "NegRelu"), ("", "Mul")]


def test_editable_install_runs_the_readme_quick_start_and_ships_the_trees_plugins(tmp_path: Path) -> None:
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("building offline needs setuptools in this environment (pip install 'setuptools>=77')")
    (main_job,) = [b for b in readme_blocks("Quick start", "bash") if "gskit prepare" in b]
    editable = Installed(copy_tree(tmp_path / "gskit"), tmp_path / "env", tmp_path / "tmp", "")
    script = "python -m venv /tmp/gskit-env && . /tmp/gskit-env/bin/activate\n" + main_job
    editable.bash(offline(script, editable.env), cwd=editable.tree)
    assert (editable.tree / "out" / "model.onnx").is_file()
    rows = editable.plugin_rows(tmp_path)  # from another folder
    plugins = editable.tree / "plugins"
    assert {
        name for name, row in rows.items() if row["origin"] == f"shipped with gskit ({plugins})"
    } == SHIPPED
    # The package mapping and the entry point work in editable mode too (the plugins a wheel would carry).
    probe = (
        "import gskit_plugins; from importlib.metadata import entry_points; "
        "print(gskit_plugins.__path__[0], [e.value for e in entry_points(group='gskit.plugins')])"
    )
    assert editable.bash(f'python -c "{probe}"', cwd=tmp_path).split() == [str(plugins), "['gskit_plugins']"]
