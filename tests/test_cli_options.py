"""Options of the ``gskit`` command itself: ``--version``, and ``--debug``/``--verbose`` anywhere."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gskit.cli import hoist_global_flags, main


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    name, ver = out.split()
    assert name == "gskit" and (ver[0].isdigit() or ver == "unknown")


def test_debug_after_the_subcommand_is_accepted(tmp_path) -> None:
    # Before the fix argparse rejected it with the top-level usage and exit code 2.
    proc = subprocess.run(
        [sys.executable, "-m", "gskit.cli", "plugin", "list", "--debug"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "DEBUG gskit.plugin" in proc.stderr


def test_hoist_keeps_order_and_stops_at_double_dash() -> None:
    assert hoist_global_flags(["prepare", "m.onnx", "-o", "out", "--debug"]) == [
        "--debug",
        "prepare",
        "m.onnx",
        "-o",
        "out",
    ]
    assert hoist_global_flags(["edit", "--", "--debug"]) == ["edit", "--", "--debug"]


def test_prepare_output_named_like_a_model_file_is_refused(tmp_path, capsys) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"")
    out = tmp_path / "out" / "model.onnx"
    assert main(["prepare", str(model), "-o", str(out)]) == 2
    assert "give an output folder" in capsys.readouterr().err
    assert not out.exists()
