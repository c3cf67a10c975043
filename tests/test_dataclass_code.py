"""gskit.io.dataclass_code: the methods dataclasses makes from kept code are the ones it compiles itself,
the file is read, written and ignored as it should be, and only the command line's process uses it."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gskit.io import dataclass_code
from gskit.io.dataclass_code import code_kept


def _make() -> type:
    @dataclasses.dataclass(frozen=True, order=True)
    class Point:
        x: int
        y: float = 0.5
        tags: tuple[str, ...] = dataclasses.field(default_factory=tuple)
        note: str = dataclasses.field(default="", compare=False)

    return Point


def _shape(cls: type) -> dict[str, Any]:
    """What the generated methods are: their code, constants, names and annotations."""
    methods = ("__init__", "__repr__", "__eq__", "__lt__", "__hash__", "__setattr__", "__delattr__")
    return {
        name: (
            fn.__code__.co_code,
            fn.__code__.co_consts,
            fn.__code__.co_names,
            fn.__code__.co_varnames,
            fn.__code__.co_flags,
            fn.__annotations__,
            fn.__defaults__,
            fn.__qualname__,
        )
        for name in methods
        if (fn := getattr(cls.__dict__.get(name), "__wrapped__", cls.__dict__.get(name))) is not None
    }


def _counting_compile(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []

    def counting(source: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(source)
        return compile(source, *args, **kwargs)

    monkeypatch.setattr(dataclass_code, "compile", counting, raising=False)
    return seen


def test_kept_code_makes_the_methods_compiling_makes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compiled = _counting_compile(monkeypatch)
    plain = _make()
    path = tmp_path / "code.marshal"
    with code_kept(path):
        first = _make()
    assert compiled and path.is_file()  # compiled once and written
    written = path.stat().st_mtime_ns
    compiled.clear()
    with code_kept(path):
        second = _make()
    assert not compiled and path.stat().st_mtime_ns == written  # every text from the file, nothing new
    assert _shape(first) == _shape(second) == _shape(plain)
    p = second(1, 2.0, ("a",), note="n")
    assert p == second(1, 2.0, ("a",)) and p != second(1, 2.0, ("b",))  # note does not count
    assert repr(p) == "_make.<locals>.Point(x=1, y=2.0, tags=('a',), note='n')" and second(0) < p
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x = 3  # type: ignore[misc]
    assert "exec" not in vars(dataclasses)  # the module is as it was outside the block


def test_a_file_that_cannot_be_read_is_ignored_and_replaced(tmp_path: Path) -> None:
    path = tmp_path / "code.marshal"
    path.write_bytes(b"not marshal data")
    with code_kept(path):
        made = _make()
    assert _shape(made) == _shape(_make())
    assert dataclass_code._read(path)  # rewritten with the run's code
    blocked = tmp_path / "file"
    blocked.write_text("")
    with code_kept(blocked / "code.marshal"):  # a folder that cannot be made: no cache, no error
        assert _shape(_make()) == _shape(made)


def test_a_damaged_file_is_not_loaded(tmp_path: Path) -> None:
    """marshal checks little of what it loads: a name in a code object's names damaged into a number raised
    SystemError from every command's start (and a damaged length asked for gigabytes). Such a file is
    ignored and written again."""

    def make() -> type:
        @dataclasses.dataclass
        class Named:
            qzx: int

        return Named

    path = tmp_path / "code.marshal"
    with code_kept(path):
        make()
    data = path.read_bytes()
    # The first string 'qzx' (in a code object's names) becomes the number 1, marked as referenced or not
    name = re.compile(rb"([\x5a\xda])\x03qzx")  # a short interned string, marked as referenced or not
    damaged = name.sub(lambda m: bytes([m[1][0] & 0x80 | ord("i"), 1, 0, 0, 0]), data, count=1)
    assert damaged != data and len(damaged) == len(data)
    path.write_bytes(damaged)
    assert dataclass_code._read(path) == {}
    with code_kept(path):
        assert make()(3).qzx == 3
    assert dataclass_code._read(path)  # written again


def test_only_the_command_lines_own_process_keeps_code(tmp_path: Path) -> None:
    from gskit.cli import main

    assert main(["--version"]) == 0 and "exec" not in vars(dataclasses)
    env = {**os.environ, "GSKIT_CACHE_DIR": str(tmp_path)}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from gskit.cli import main; sys.argv = ['gskit', 'inspect', sys.argv[1]];"
            " sys.exit(main())",
            str(Path(__file__).parents[1] / "gskit" / "data" / "example.onnx"),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert dataclass_code._read(tmp_path / dataclass_code.cache_file().name)


NO_HOME = """
import pathlib, sys

def no_home(cls):
    raise RuntimeError("Could not determine home directory.")  # no $HOME, a uid without a passwd entry

pathlib.Path.home = classmethod(no_home)
from gskit.io.user_cache import user_cache_dir
assert user_cache_dir() is None
sys.argv = ["gskit", "prepare", *sys.argv[1:]]
from gskit.cli import main
sys.exit(main())
"""


def test_without_any_cache_folder_the_command_runs_and_keeps_nothing(tmp_path: Path) -> None:
    """No $GSKIT_CACHE_DIR, $XDG_CACHE_HOME or home folder (``env -i`` under an arbitrary uid): the command
    line keeps neither compiled code nor plugin sources, and prepares as always (Path.home() raised)."""
    env = {k: v for k, v in os.environ.items() if k not in ("GSKIT_CACHE_DIR", "XDG_CACHE_HOME", "HOME")}
    example = Path(__file__).parents[1] / "gskit" / "data" / "example.onnx"
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-c", NO_HOME, str(example), "-o", str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-1500:]
    assert "Traceback" not in done.stderr and (out / "model.onnx").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # nothing written into the working folder


@pytest.mark.parametrize("kind", ["pipe", "link to /dev/zero", "too large"])
def test_a_cache_file_that_is_no_regular_file_is_not_waited_on(tmp_path: Path, kind: str) -> None:
    """Every command read the cache file at its start: a pipe at its name made every command wait for a
    writer, and a link to /dev/zero read without end. Neither is read; a regular file is written in place of
    the link (the command's own cache folder), the pipe is left."""
    from gskit.io.user_cache import read_kept

    path = tmp_path / dataclass_code.cache_file().name
    if kind == "pipe":
        os.mkfifo(path)
    elif kind == "too large":
        path.write_bytes(b"x" * 64)
    else:
        path.symlink_to("/dev/zero")
    assert read_kept(path, limit=32) is None
    env = {**os.environ, "GSKIT_CACHE_DIR": str(tmp_path)}
    example = Path(__file__).parents[1] / "gskit" / "data" / "example.onnx"
    done = subprocess.run(
        [sys.executable, "-m", "gskit.cli", "inspect", str(example)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    if kind != "pipe":
        assert path.is_file() and not path.is_symlink() and dataclass_code._read(path)


@pytest.mark.parametrize("xdg", ["", "relative/cache"])
def test_a_relative_xdg_cache_home_is_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, xdg: str
) -> None:
    """The XDG specification holds a relative $XDG_CACHE_HOME invalid: it named a folder in whatever folder
    the command ran in."""
    from gskit.io.user_cache import user_cache_dir

    monkeypatch.delenv("GSKIT_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", xdg)
    assert user_cache_dir() == tmp_path / ".cache" / "gskit"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_cache_dir() == tmp_path / "xdg" / "gskit"


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user takes root")
def test_a_cache_file_of_another_user_is_not_run(tmp_path: Path) -> None:
    """The file holds code the command line runs: one that another user owns (a shared cache folder, a user's
    cache read under sudo) was loaded and run. It is ignored, and replaced by the run's own."""
    path = tmp_path / "code.marshal"
    with code_kept(path):
        _make()
    assert dataclass_code._read(path)
    os.chown(path, 65534, 65534)  # nobody
    assert dataclass_code._read(path) == {}
    with code_kept(path):
        _make()
    assert path.stat().st_uid == os.geteuid() and dataclass_code._read(path)


def test_a_kept_file_is_read_whole_up_to_its_limit(tmp_path: Path) -> None:
    from gskit.io.user_cache import read_kept

    path = tmp_path / "kept"
    assert read_kept(path) is None  # missing
    path.write_bytes(b"0123456789")
    assert read_kept(path) == b"0123456789" and read_kept(path, limit=10) == b"0123456789"
    assert read_kept(path, limit=9) is None
