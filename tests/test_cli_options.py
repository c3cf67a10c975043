"""Options of the ``gskit`` command itself: ``--version``, and ``--debug``/``--verbose`` anywhere."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gskit.cli import hoist_global_flags, main


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0  # returned, like every command's code (argparse's action would exit)
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
    assert "DEBUG gskit.plugin.discovery" in proc.stderr


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


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["prepar", "m.onnx"], "gskit: error: argument COMMAND: unknown 'prepar'; did you mean prepare?"),
        (["prepare", "m.onnx", "-o", "out", "--atl", "1e-3"], "unknown option --atl; did you mean --atol?"),
        (["prepare", "m.onnx", "--atl=1e-3"], "unknown option --atl; did you mean --atol?"),
        (["--debg", "inspect", "m.onnx"], "gskit: error: unknown option --debg; did you mean --debug?"),
        (["plugin", "lst"], "gskit plugin: error: argument ACTION: unknown 'lst'; did you mean list?"),
        (["plugin", "list", "--jsn"], "gskit plugin list: error: unknown option --jsn; did you mean --json?"),
        (["compare", "a", "b", "--backend", "onxruntime"], "unknown 'onxruntime'; did you mean onnxruntime?"),
        (["inspect", "m.onnx", "--zzzzzz"], "gskit inspect: error: unknown option --zzzzzz"),
    ],
)
def test_misspelled_options_and_commands_get_a_suggestion(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("usage: gskit") and err[-1].endswith(message)  # usage, then one line


def test_negative_numbers_are_values_not_unknown_options(tmp_path, capsys) -> None:
    # -1 reaches the seed check as a value (a seed must be >= 0), not argparse as an unknown option
    assert main(["prepare", "--print-recipe", "--seed", "-1"]) == 2
    assert "seed must be an integer >= 0, got -1" in capsys.readouterr().err
