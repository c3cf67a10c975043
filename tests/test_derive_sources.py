"""The source of a ``from_torch`` function (what its cache key hashes): inspect's, served from the user cache
for the same lines of the same file, never stale after an edit, and a cache that cannot be read or written
only means asking inspect. No torch needed: nothing is derived here.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gskit.plugin import derive
from gskit.plugin.discovery import load_plugins

REPO = Path(__file__).resolve().parents[1]

MODULE = '''\
"""Functions a plugin derives its rules from."""

from typing import Any


def swish(x: Any) -> Any:
    """x * sigmoid(x)."""
    import torch

    return x * torch.sigmoid(x)  # the 1.0 form
    # a trailing comment of the body, which inspect keeps


def shifted(x: Any, *, epsilon: float) -> Any:
    return x + epsilon
'''


@pytest.fixture(autouse=True)
def user_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "user-cache"
    monkeypatch.setenv("GSKIT_CACHE_DIR", str(cache))
    monkeypatch.setattr(derive, "_SOURCES", {})  # what this process read: each test starts from the disk
    return cache


def _import(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _refuse_tokenizing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(lines):
        raise AssertionError("inspect tokenized the file although the cache holds the block")

    monkeypatch.setattr(inspect, "getblock", refused)


def test_the_source_is_inspects_and_comes_from_the_cache_the_second_time(tmp_path, user_cache, monkeypatch):
    path = tmp_path / "fns.py"
    path.write_text(MODULE)
    module = _import(path, "gskit_test_sources_a")
    expected = {fn: inspect.getsource(fn) for fn in (module.swish, module.shifted)}
    assert "trailing comment" in expected[module.swish]
    assert {fn: derive.function_source(fn) for fn in expected} == expected
    assert len(list((user_cache / "function-sources").glob("*.json"))) == 1
    monkeypatch.setattr(derive, "_SOURCES", {})  # a new process: only the file on disk
    _refuse_tokenizing(monkeypatch)
    assert {fn: derive.function_source(fn) for fn in expected} == expected


def test_the_shipped_plugins_functions_have_inspects_source_cold_and_cached(user_cache, monkeypatch):
    registry = load_plugins()
    functions = [source.fn for spec in registry for source in derive.sources_of(spec.patterns)]
    assert len(functions) >= 10  # clamp_swish, layer_norm, rms_norm
    expected = [inspect.getsource(fn) for fn in functions]
    assert [derive.function_source(fn) for fn in functions] == expected  # written by the load above
    monkeypatch.setattr(derive, "_SOURCES", {})
    _refuse_tokenizing(monkeypatch)
    assert [derive.function_source(fn) for fn in functions] == expected


def _edit_in_place(path: Path, old: str, new: str) -> None:
    """Rewrite ``path`` with ``old`` replaced by ``new`` (same length), keeping its modification time."""
    assert len(old) == len(new)
    before = path.stat()
    path.write_text(path.read_text().replace(old, new))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def _key(fn) -> str:
    return derive._source(fn, [(2, 5)], {}, derive.DEFAULT_DTYPES, derive.EXPORTERS, None).key


def test_an_edit_of_the_same_size_and_time_is_seen_by_the_next_load_in_the_process(tmp_path):
    """Two loads in this process, the file edited between them within the same second to the same size:
    linecache would keep the old lines (it compares size and time), the cache file is another one."""
    path = tmp_path / "fns.py"
    path.write_text(MODULE)
    first = _import(path, "gskit_test_sources_b").swish
    old_key, old_source = _key(first), derive.function_source(first)
    _edit_in_place(path, "x * torch.sigmoid(x)  # the 1.0 form", "x * torch.sigmoid(x)  # the 2.0 form")
    second = _import(path, "gskit_test_sources_b").swish
    assert derive.function_source(second) == old_source.replace("1.0 form", "2.0 form")
    assert _key(second) != old_key
    assert len(list((Path(os.environ["GSKIT_CACHE_DIR"]) / "function-sources").glob("*.json"))) == 2


def test_an_edit_between_two_runs_is_never_served_stale(tmp_path, user_cache):
    """Two processes sharing the user cache, the file edited between them within the same second to the
    same size: the second prints the edited source."""
    path = tmp_path / "fns.py"
    path.write_text(MODULE)
    code = textwrap.dedent(
        f"""
        import importlib.util, sys
        from gskit.plugin.derive import function_source
        spec = importlib.util.spec_from_file_location("fns", {str(path)!r})
        module = importlib.util.module_from_spec(spec)
        sys.modules["fns"] = module
        spec.loader.exec_module(module)
        print(function_source(module.swish), end="")
        """
    )
    env = {
        **os.environ,
        "GSKIT_CACHE_DIR": str(user_cache),
        "PYTHONPATH": str(REPO),
        "PYTHONDONTWRITEBYTECODE": "1",
    }

    def run() -> str:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
        )
        assert done.returncode == 0, done.stderr[-800:]
        return done.stdout

    before = run()
    assert "1.0 form" in before and run() == before  # the second run from the cache
    _edit_in_place(path, "1.0 form", "3.0 form")
    assert run() == before.replace("1.0 form", "3.0 form")


def test_a_cache_that_cannot_be_written_or_read_only_means_asking_inspect(tmp_path, monkeypatch):
    path = tmp_path / "fns.py"
    path.write_text(MODULE)
    swish = _import(path, "gskit_test_sources_c").swish
    expected = inspect.getsource(swish)
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("GSKIT_CACHE_DIR", str(blocked / "cache"))  # a folder cannot be made there
    assert derive.function_source(swish) == expected
    cache = tmp_path / "damaged"
    monkeypatch.setenv("GSKIT_CACHE_DIR", str(cache))
    monkeypatch.setattr(derive, "_SOURCES", {})
    derive.function_source(swish)
    (written,) = (cache / "function-sources").glob("*.json")
    for damage in ("{not json", "[1, 2]", '{"swish:6": 7}'):
        written.write_text(damage)
        monkeypatch.setattr(derive, "_SOURCES", {})
        assert derive.function_source(swish) == expected


def test_objects_other_than_plain_functions_are_asked_of_inspect(user_cache):
    import functools

    @functools.wraps(test_objects_other_than_plain_functions_are_asked_of_inspect)
    def wrapper():
        return None

    assert derive.function_source(wrapper) == inspect.getsource(wrapper)
    assert derive.function_source(PathLike) == inspect.getsource(PathLike)
    assert not (user_cache / "function-sources").exists()


class PathLike:
    """A class: its source is found otherwise (by name), so it is not cached."""


def test_the_cache_keeps_the_newest_source_files_and_the_one_just_written(tmp_path, user_cache, monkeypatch):
    """Each edit of a plugin file adds a source file to the cache: beyond SOURCE_FILES_KEPT the oldest written
    go, the one just written stays, and an evicted file is only asked of inspect again."""
    monkeypatch.setattr(derive, "SOURCE_FILES_KEPT", 3)
    folder = user_cache / "function-sources"
    folder.mkdir(parents=True)
    for age in range(4):  # four files of earlier edits, the first the oldest
        old = folder / f"old{age}.json"
        old.write_text("{}")
        os.utime(old, ns=(10**18 + age, 10**18 + age))
    path = tmp_path / "fns.py"
    path.write_text(MODULE)
    module = _import(path, "gskit_test_sources_prune")
    assert derive.function_source(module.swish) == inspect.getsource(module.swish)
    left = sorted(p.name for p in folder.glob("*.json"))
    assert len(left) == 3 and "old0.json" not in left and "old1.json" not in left and "old3.json" in left
    written = [name for name in left if not name.startswith("old")]
    assert len(written) == 1
