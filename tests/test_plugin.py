"""Plugin discovery and validation: spec folders, entry points, broken files, lookups, `plugin list`."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from conftest import run_subcommand

from gskit.cli import plugin as plugin_cli
from gskit.errors import PluginError
from gskit.io import model as gsmodel
from gskit.plugin.discovery import default_plugin_dirs, implementation_paths, load_plugins
from gskit.plugin.registry import PluginRegistry
from gskit.plugin.spec import Attribute, AttrType, PluginSpec

REPO_PLUGINS = Path(__file__).resolve().parent.parent / "plugins"

SPEC_PY = """
from gskit.passes.patterns import GraphPattern
from gskit.plugin import Attribute, AttrType, PluginSpec, same_as_input
from .reference import scaled_tanh


def p1(op, x):
    return op.Mul(op.Tanh(x), op.capture("alpha"))


def p2(op, x):
    return op.Mul(op.capture("alpha"), op.Tanh(x))


SPEC = PluginSpec(
    name="ScaledTanh", namespace="test.gskit", version="{version}",
    attributes=(Attribute("alpha", AttrType.FLOAT, 1.0, "scale"),),
    infer=same_as_input(0), reference=scaled_tanh,
    patterns=(GraphPattern(p1, attrs={"alpha": "alpha"}), GraphPattern(p2, attrs={"alpha": "alpha"})),
)
"""

REFERENCE_PY = """
import numpy as np


def scaled_tanh(x, *, alpha):
    return np.tanh(x) * alpha
"""


def write_plugin(
    root: Path, folder: str = "scaled_tanh", spec: str | None = None, version: str = "1"
) -> Path:
    path = root / folder
    path.mkdir(parents=True, exist_ok=True)
    (path / "spec.py").write_text(
        textwrap.dedent(spec if spec is not None else SPEC_PY.replace("{version}", version))
    )
    (path / "reference.py").write_text(textwrap.dedent(REFERENCE_PY))
    return path


def test_loads_spec_with_relative_imports(tmp_path):
    write_plugin(tmp_path)
    (tmp_path / "not_a_plugin").mkdir()  # folders without spec.py are skipped
    registry = load_plugins([tmp_path], entry_points=False)
    assert registry.names() == ["test.gskit::ScaledTanh v1"]
    spec = registry.get("test.gskit", "ScaledTanh")
    assert spec.source == (tmp_path / "scaled_tanh" / "spec.py").resolve()
    x = np.linspace(-1, 1, 5, dtype=np.float32)
    np.testing.assert_allclose(spec.run_reference([x], {"alpha": 2.0})[0], np.tanh(x) * 2.0)
    # a single plugin folder can be given directly
    assert load_plugins([tmp_path / "scaled_tanh"], entry_points=False).names() == registry.names()


@pytest.mark.parametrize(
    ("spec_text", "message"),
    [
        ("SPEC = PluginSpec(\n", "SyntaxError"),
        ("import does_not_exist_anywhere\n", "ModuleNotFoundError"),
        ("X = 1\n", "defines neither SPEC"),
        ("SPEC = 42\n", "must be a gskit.plugin.spec.PluginSpec"),
        (
            "from gskit.plugin import PluginSpec\nSPEC = PluginSpec(name='A', namespace='')\n",
            "namespace must be a non-empty string",
        ),
        (
            "from gskit.plugin import PluginSpec\nSPEC = PluginSpec(name='A', namespace='n', version=1)\n",
            "version must be a non-empty string",
        ),
        (
            "from gskit.plugin import Attribute, AttrType, PluginSpec\n"
            "SPEC = PluginSpec(name='A', namespace='n', attributes=(Attribute('k', AttrType.INT, 2**40),))\n",
            "does not fit in int32",
        ),
        (
            "import numpy as np\nfrom gskit.plugin.spec import Attribute, AttrType, PluginSpec\n"
            "SPEC = PluginSpec(name='A', namespace='n',\n"
            "                  attributes=(Attribute('t', AttrType.TENSOR, np.zeros(2, np.int64)),))\n",
            "cannot reach a TensorRT plugin",
        ),
        (
            "from gskit.plugin import Attribute, AttrType, PluginSpec\n"
            "SPEC = PluginSpec(name='A', namespace='n',\n"
            "                  attributes=(Attribute('plugin_version', AttrType.STRING, ''),))\n",
            "reserved",
        ),
    ],
)
def test_broken_plugin_file_names_file_and_problem(tmp_path, spec_text, message):
    write_plugin(tmp_path, "broken", spec=spec_text)
    with pytest.raises(PluginError, match=message) as info:
        load_plugins([tmp_path], entry_points=False)
    assert str(tmp_path / "broken" / "spec.py") in str(info.value)


def test_duplicate_key_is_an_error_but_versions_coexist(tmp_path):
    write_plugin(tmp_path / "a", "one")
    write_plugin(tmp_path / "b", "one")
    with pytest.raises(PluginError, match="defined twice"):
        load_plugins([tmp_path / "a", tmp_path / "b"], entry_points=False)
    write_plugin(tmp_path / "c", "two", version="2")
    registry = load_plugins([tmp_path / "a", tmp_path / "c"], entry_points=False)
    assert registry.get("test.gskit", "ScaledTanh").version == "2"  # highest when no version is given
    assert registry.get("test.gskit", "ScaledTanh", "1").source.parent.name == "one"


def test_missing_explicit_folder_is_an_error(tmp_path):
    with pytest.raises(PluginError, match="no such plugin folder"):
        load_plugins([tmp_path / "nope"], entry_points=False)


SHIPPED_NAMES = [
    "TRT::EfficientNMS_TRT v1",
    "TRT::ModulatedDeformConv2d v2",
    "TRT::MultiscaleDeformableAttnPlugin_TRT v2",
    "gskit::ClampSwish v1",
    "gskit::DeformConv2d v1",
    "gskit::GroupNorm v1",
    "gskit::LayerNorm v1",
    "gskit::RMSNorm v1",
]


def _origins(registry) -> dict[str, str]:
    return {spec.qualified_name: registry.origin(spec) for spec in registry}


def test_environment_folders_add_to_the_shipped_plugins(tmp_path, monkeypatch):
    write_plugin(tmp_path / "one")
    write_plugin(tmp_path / "two", "other", spec=SPEC_PY.replace("{version}", "3"))
    monkeypatch.chdir(tmp_path)  # no ./plugins here
    monkeypatch.setenv("GSKIT_PLUGINS", f"{tmp_path / 'one'}{os.pathsep}{tmp_path / 'two'}")
    dirs = default_plugin_dirs()
    assert dirs[-2:] == [tmp_path / "one", tmp_path / "two"] and REPO_PLUGINS in dirs
    origins = _origins(load_plugins())
    assert sorted(origins) == sorted(
        [*SHIPPED_NAMES, "test.gskit::ScaledTanh v1", "test.gskit::ScaledTanh v3"]
    )
    assert origins["test.gskit::ScaledTanh v1"] == f"folder {tmp_path / 'one'} ($GSKIT_PLUGINS)"
    assert origins["gskit::LayerNorm v1"].startswith("shipped with gskit")
    assert load_plugins(entry_points=False).names() == []  # only the folders given


def test_plugins_folder_of_the_working_directory_is_searched(tmp_path, monkeypatch, capsys):
    # `gskit plugin new` writes ./plugins/NAME: gskit run from the same folder finds it, beside the shipped.
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GSKIT_PLUGINS", raising=False)
    assert load_plugins().names() == SHIPPED_NAMES
    assert run_subcommand(plugin_cli, "plugin", "new", "my_op") == 0
    assert "gskit finds it when run from this folder (./plugins)" in capsys.readouterr().out
    assert run_subcommand(plugin_cli, "plugin", "new", "other_op", "--dir", "elsewhere") == 0
    assert "--plugins elsewhere" in capsys.readouterr().out
    origins = _origins(load_plugins())
    assert origins["gskit::MyOp v1"] == f"folder {tmp_path / 'plugins'} (./plugins)"
    assert set(SHIPPED_NAMES) < set(origins)


def test_given_folders_add_and_override_the_default_sources(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GSKIT_PLUGINS", raising=False)
    # --plugins naming the shipped folder itself: the same files, loaded once, shipped four kept.
    assert _origins(load_plugins([REPO_PLUGINS])).keys() == set(SHIPPED_NAMES)
    # A local copy of a shipped plugin wins over the shipped one (the closer source is the one meant).
    copy = tmp_path / "mine"
    shutil.copytree(REPO_PLUGINS / "clamp_swish", copy / "clamp_swish")
    registry = load_plugins([copy])
    assert registry.origin(registry.get("gskit", "ClampSwish")) == f"folder {copy}"
    assert registry.get("gskit", "ClampSwish").source == copy / "clamp_swish" / "spec.py"
    assert registry.names() == SHIPPED_NAMES


def test_tensorrt_implementations_come_from_the_plugin_that_wins(tmp_path, monkeypatch):
    from gskit.backends.trt import find_plugin_files

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GSKIT_PLUGINS", raising=False)
    mine = tmp_path / "mine"
    shutil.copytree(REPO_PLUGINS / "clamp_swish", mine / "clamp_swish")
    (mine / "clamp_swish" / "cpp" / "build").mkdir(parents=True)
    (mine / "clamp_swish" / "cpp" / "build" / "libclamp_swish.so").write_bytes(b"")
    (tmp_path / "libs").mkdir()
    (tmp_path / "libs" / "libother.so").write_bytes(b"")
    given = [mine, tmp_path / "libs"]
    files = find_plugin_files(implementation_paths(load_plugins(given), given))
    # The local ClampSwish brings its library and not the shipped trt_plugin.py (both would register it).
    assert set(files.libraries) == {
        mine / "clamp_swish/cpp/build/libclamp_swish.so",
        tmp_path / "libs/libother.so",
    }
    assert {m.parent.name for m in files.modules} == {"deform_conv2d", "layer_norm", "rms_norm"}
    assert all(m.parent.parent == REPO_PLUGINS for m in files.modules)


def test_entry_points_group(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "gskit_ep_demo").mkdir(parents=True)
    (site / "gskit_ep_demo" / "__init__.py").write_text(
        "from gskit.plugin import PluginSpec\n"
        "SPECS = [PluginSpec(name='EpOne', namespace='ep.ns'), PluginSpec(name='EpTwo', namespace='ep.ns')]\n"
    )
    # A package of plugin folders: each subfolder with a spec.py is a plugin.
    write_plugin(site / "gskit_ep_folders")
    (site / "gskit_ep_folders" / "__init__.py").write_text("")
    dist = site / "gskit_ep_demo-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: gskit-ep-demo\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[gskit.plugins]\ndemo = gskit_ep_demo:SPECS\nfolders = gskit_ep_folders\n"
    )
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.chdir(tmp_path)
    origins = _origins(load_plugins([], entry_points=True))
    assert origins["ep.ns::EpOne v1"] == origins["ep.ns::EpTwo v1"] == "entry point demo from gskit-ep-demo"
    assert origins["test.gskit::ScaledTanh v1"] == "entry point folders from gskit-ep-demo"
    assert load_plugins([], entry_points=False).names() == []


def _dist(site: Path, stem: str, name: str, entry_points: str | None) -> None:
    dist = site / f"{stem}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    if entry_points is not None:
        (dist / "entry_points.txt").write_text(entry_points)


def test_plugin_entry_points_are_the_standard_calls(tmp_path, monkeypatch):
    """group_entry_points parses only the distributions whose entry_points.txt names the group; it gives
    what importlib.metadata.entry_points(group=...) gives: the same entries in the same order, a name
    shadowed by an earlier distribution of that name (spelled otherwise) skipped, a file that names the
    group elsewhere than as a section giving none."""
    import importlib.metadata

    from gskit.plugin.discovery import ENTRY_POINT_GROUP, group_entry_points

    first, second = tmp_path / "first", tmp_path / "second"
    _dist(first, "zeta_plugins-1.0", "zeta-plugins", "[gskit.plugins]\nz = zeta_one\nz2 = zeta_two\n")
    _dist(first, "Alpha.Plugins-2.0", "Alpha.Plugins", "[console_scripts]\na = alpha:main\n")
    _dist(first, "noentry-1.0", "noentry", None)
    _dist(first, "mention-1.0", "mention", "[console_scripts]\nm = gskit.plugins_tool:main\n")
    _dist(second, "alpha_plugins-1.0", "alpha_plugins", "[gskit.plugins]\nshadowed = alpha_old\n")
    _dist(second, "beta-1.0", "beta", "[pytest11]\nb = beta\n\n[gskit.plugins]\nb = beta_plugins\n")
    monkeypatch.syspath_prepend(str(second))
    monkeypatch.syspath_prepend(str(first))
    found = group_entry_points(ENTRY_POINT_GROUP)
    assert found == list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
    assert [(ep.name, ep.value, ep.dist.name) for ep in found[:3]] == [
        ("z", "zeta_one", "zeta-plugins"),
        ("z2", "zeta_two", "zeta-plugins"),
        ("b", "beta_plugins", "beta"),
    ]
    assert "shadowed" not in {ep.name for ep in found}
    assert group_entry_points("pytest11") == list(importlib.metadata.entry_points(group="pytest11"))


def test_distribution_names_come_from_the_metadata_headers(tmp_path, monkeypatch):
    """metadata_field (asked for entry points' distribution Names by plugin discovery, for torch's Version by
    torch_version) parses the metadata's headers only; it says what ``dist.name`` and ``dist.version`` say,
    whatever the line ends, with a long description that names another package, and for every installed
    distribution."""
    import importlib.metadata
    import importlib.util

    from gskit.io.dist_metadata import metadata_field
    from gskit.plugin import derive

    body = "\n".join(["A long description.", "", "Name: impostor", "Version: 9.9", *["text"] * 2000])
    metadata = {
        "lf-1.0": "Metadata-Version: 2.1\nName: lf.Package\nVersion: 1.0\n\n" + body,
        "crlf-1.0": "Metadata-Version: 2.1\r\nName: CRLF_pkg\r\nVersion: 1.0\r\n\r\n" + body,
        "cr-1.0": "Metadata-Version: 2.1\rName: cr-pkg\rVersion: 1.0\r\r" + body,
        "folded-1.0": "Metadata-Version: 2.1\nName: folded\n  name\nVersion: 1.0\n",
    }
    for stem, text in metadata.items():
        dist = tmp_path / f"{stem}.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_bytes(text.encode())
    pkg_info = tmp_path / "egg-1.0.egg-info"
    pkg_info.mkdir()
    (pkg_info / "PKG-INFO").write_text("Metadata-Version: 1.1\nName: egg\nVersion: 1.0\n\n" + body)
    dists = [importlib.metadata.PathDistribution(tmp_path / f"{stem}.dist-info") for stem in metadata]
    dists.append(importlib.metadata.PathDistribution(pkg_info))
    assert [metadata_field(d, "Name") for d in dists] == [d.name for d in dists]
    assert [metadata_field(d, "Name") for d in dists][:3] == ["lf.Package", "CRLF_pkg", "cr-pkg"]
    installed = list(importlib.metadata.distributions())
    assert [metadata_field(d, "Name") for d in installed] == [d.name for d in installed]
    assert [metadata_field(d, "Version") for d in [*dists, *installed]] == [
        d.version for d in [*dists, *installed]
    ]
    derive.torch_version.cache_clear()
    torch_installed = importlib.util.find_spec("torch") is not None
    expected = importlib.metadata.version("torch").split("+")[0] if torch_installed else None
    assert derive.torch_version() == expected


def test_entry_point_to_a_plain_module_is_an_error(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    (site / "gskit_ep_flat.py").write_text("")
    dist = site / "gskit_ep_flat-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: gskit-ep-flat\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[gskit.plugins]\nflat = gskit_ep_flat\n")
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(PluginError, match="entry point 'flat = gskit_ep_flat'.*not a package"):
        load_plugins()


def test_onnx_op_name_collision_warns(tmp_path, caplog):
    write_plugin(
        tmp_path,
        "relu",
        spec="from gskit.plugin import PluginSpec\nSPEC = PluginSpec(name='Relu', namespace='n')\n",
    )
    with caplog.at_level(logging.WARNING, logger="gskit.plugin.spec"):
        load_plugins([tmp_path], entry_points=False)
    assert "ignores domains" in caplog.text and "10.15" in caplog.text


def test_for_node_matches_domain_op_and_version():
    v1 = PluginSpec(name="Op", namespace="a.ns")
    v2 = PluginSpec(name="Op", namespace="a.ns", version="2")
    registry = PluginRegistry([v1, v2])
    x, y = gs.Variable("x"), gs.Variable("y")
    assert registry.for_node(gs.Node("Op", domain="a.ns", inputs=[x], outputs=[y])) is v1  # default "1"
    assert registry.for_node(gs.Node("Op", domain="a.ns", attrs={"plugin_version": "2"})) is v2
    assert registry.for_node(gs.Node("Op", domain="b.ns")) is None
    assert registry.for_node(gs.Node("Op", attrs={"plugin_version": "3"}, domain="a.ns")) is None
    proto = onnx.helper.make_node("Op", ["x"], ["y"], domain="a.ns", plugin_version="2")
    assert registry.for_node(proto) is v2
    assert registry.for_node(onnx.helper.make_node("Op", ["x"], ["y"])) is None
    assert len(registry) == 2 and set(registry) == {v1, v2} and registry.domains() == {"a.ns"}


def test_tensor_attribute_exports_as_tensor():
    spec = PluginSpec(
        name="WithTensor",
        namespace="t.ns",
        attributes=(
            Attribute("table", AttrType.TENSOR, tensor_dtype="float32"),
            Attribute("k", AttrType.INTS, [1]),
        ),
    )
    table = np.arange(6, dtype=np.float32).reshape(2, 3)
    x, y = gs.Variable("x", np.float32, (2, 3)), gs.Variable("y", np.float32, (2, 3))
    graph = gs.Graph(nodes=[spec.make_node([x], [y], {"table": table})], inputs=[x], outputs=[y], opset=17)
    node = gsmodel.to_model(graph).graph.node[0]
    attrs = {a.name: a for a in node.attribute}
    assert attrs["table"].type == onnx.AttributeProto.TENSOR
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(attrs["table"].t), table)
    assert attrs["k"].type == onnx.AttributeProto.INTS and list(attrs["k"].ints) == [1]
    assert attrs["plugin_namespace"].s == b"t.ns" and attrs["plugin_version"].s == b"1"
    # the imported node's Constant attribute reaches a reference as an array
    imported = gs.import_onnx(gsmodel.to_model(graph)).nodes[0]
    seen = {}
    spec_ref = PluginSpec(
        name="WithTensor",
        namespace="t.ns",
        attributes=spec.attributes,
        reference=lambda x, table, k: seen.setdefault("table", table) + x,
    )
    spec_ref.run_reference([np.zeros((2, 3), np.float32)], imported.attrs)
    np.testing.assert_array_equal(seen["table"], table)
    with pytest.raises(PluginError, match="float32"):
        spec.node_attrs({"table": np.zeros(3, np.float64)})


def _cli(*argv: str) -> int:
    from gskit.cli import plugin as command

    return run_subcommand(command, *argv)


def test_plugin_list_shows_implementations(tmp_path, capsys):
    folder = write_plugin(tmp_path)
    (folder / "trt_plugin.py").write_text("# TensorRT python plugin\n")
    (folder / "cpp").mkdir()
    assert _cli("plugin", "list", "--plugins", str(tmp_path), "--json") == 0
    rows = json.loads(capsys.readouterr().out)
    (row,) = [r for r in rows if r["namespace"] == "test.gskit"]
    assert {r["origin"] for r in rows if r is not row} == {f"shipped with gskit ({REPO_PLUGINS})"}
    assert row["origin"] == f"folder {tmp_path}"
    assert row["namespace"] == "test.gskit" and row["name"] == "ScaledTanh" and row["version"] == "1"
    assert row["attributes"] == ["alpha: float = 1.0"] and row["patterns"] == 2
    assert row["implementations"] == ["reference", "trt_plugin", "cpp"]
    assert _cli("plugin", "list", "--plugins", str(tmp_path)) == 0
    assert "ScaledTanh" in capsys.readouterr().out
    write_plugin(tmp_path, "broken", spec="SPEC = (\n")
    assert _cli("plugin", "list", "--plugins", str(tmp_path)) == 2


def test_plugin_files_are_compiled_once_and_an_edit_of_the_same_size_and_time_is_seen(tmp_path, monkeypatch):
    """A plugin's files get hash-checked bytecode: a second load compiles none of them, and a file edited
    without changing its size or modification time (a stale timestamp-checked .pyc) loads as edited."""
    import builtins

    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path / "pycache"))
    folder = write_plugin(tmp_path / "plugins")
    compiled: list[str] = []
    real_compile = builtins.compile

    def counting(source, filename, *args, **kwargs):
        compiled.append(str(filename))
        return real_compile(source, filename, *args, **kwargs)

    monkeypatch.setattr(builtins, "compile", counting)
    load_plugins([tmp_path / "plugins"], entry_points=False)
    ours = [f for f in compiled if f.startswith(str(folder.resolve()))]
    assert sorted(Path(f).name for f in set(ours)) == ["reference.py", "spec.py"]
    compiled.clear()
    registry = load_plugins([tmp_path / "plugins"], entry_points=False)
    assert not [f for f in compiled if f.startswith(str(folder.resolve()))]  # read from the cache
    assert registry.get("test.gskit", "ScaledTanh").attributes[0].default == 1.0
    spec_file = folder / "spec.py"
    before = spec_file.stat()
    spec_file.write_text(spec_file.read_text().replace("1.0, ", "2.0, "))  # same size
    os.utime(spec_file, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert spec_file.stat().st_size == before.st_size
    assert (
        load_plugins([tmp_path / "plugins"], entry_points=False)
        .get("test.gskit", "ScaledTanh")
        .attributes[0]
        .default
        == 2.0
    )


def test_the_suite_keeps_its_caches_out_of_the_users_cache() -> None:
    """tests/conftest.py gives the run its own cache folder, which the commands the tests start inherit."""
    from gskit.io.user_cache import user_cache_dir

    folder = user_cache_dir()
    assert not folder.is_relative_to(Path.home() / ".cache") and folder.name.startswith("gskit-test-cache-")
