"""Which parts of a plugin are stubs, asked again and again (check-trt asks for every plugin node): each
distinct text is parsed once and no file is tokenized again, and an edit is seen at once, even one of the
same size within the same second."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import os
import sys
from pathlib import Path

import pytest

from gskit.plugin import derive, stubs
from gskit.plugin.discovery import load_plugins

STUB = '''def kernel(x):
    """Write me."""
    raise NotImplementedError("write the kernel")
'''
WRITTEN = '''def kernel(x):
    """Write me."""
    return x + 0  # the kernel, written out here.
'''


@pytest.fixture(autouse=True)
def user_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "user-cache"
    monkeypatch.setenv("GSKIT_CACHE_DIR", str(cache))
    return cache


def _same_size_and_time(path: Path, text: str) -> None:
    before = path.stat()
    assert len(text.encode()) == before.st_size
    path.write_text(text)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def _counting_parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    parsed: list[str] = []
    real = ast.parse

    def counting(source, *args, **kwargs):
        parsed.append(source if isinstance(source, str) else "")
        return real(source, *args, **kwargs)

    monkeypatch.setattr(ast, "parse", counting)
    return parsed


def test_the_shipped_plugins_have_no_stubs_and_a_second_ask_parses_and_tokenizes_nothing(monkeypatch) -> None:
    registry = load_plugins()
    first = {spec.name: stubs.stub_parts(spec) for spec in registry}
    assert first == {spec.name: () for spec in registry}
    parsed = _counting_parses(monkeypatch)
    monkeypatch.setattr(derive, "_SOURCES", {})  # the sources come from the cache file on disk

    def refused(lines):
        raise AssertionError("a plugin file was tokenized again")

    monkeypatch.setattr(inspect, "getblock", refused)
    assert {spec.name: stubs.stub_parts(spec) for spec in registry} == first
    assert parsed == []


def test_a_kernel_edited_to_the_same_size_within_the_second_is_seen(tmp_path: Path) -> None:
    kernel = tmp_path / "kernel.py"
    kernel.write_text(STUB)
    assert len(STUB) == len(WRITTEN)
    assert stubs._is_stub_module(kernel)
    _same_size_and_time(kernel, WRITTEN)
    assert not stubs._is_stub_module(kernel)
    _same_size_and_time(kernel, STUB)
    assert stubs._is_stub_module(kernel)


def test_a_reference_edited_to_the_same_size_within_the_second_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "reference.py"
    path.write_text(STUB)
    spec = importlib.util.spec_from_file_location("gskit_test_stub_reference", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    assert stubs.is_stub_function(module.kernel)
    _same_size_and_time(path, WRITTEN)  # the function object stays; its file is what inspect reads
    assert not stubs.is_stub_function(module.kernel)


def test_an_unreadable_or_broken_file_is_no_stub_module(tmp_path: Path, caplog) -> None:
    import logging

    broken = tmp_path / "kernel.py"
    broken.write_text("def kernel(:\n")
    with caplog.at_level(logging.DEBUG, logger="gskit.plugin.stubs"):
        assert not stubs._is_stub_module(broken)
        assert not stubs._is_stub_module(broken)  # asked twice: said twice
        assert not stubs._is_stub_module(tmp_path / "missing.py")
    assert caplog.text.count("cannot read it to look for stubs") == 3
