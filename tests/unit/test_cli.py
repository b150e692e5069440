"""The command line called in process: exit codes and one-line errors for bad input."""

from __future__ import annotations

from accel_mnist.cli import main


def test_main_returns_exit_code_in_process(capsys, tmp_path):
    assert main(["train", "--data-dir", str(tmp_path), "--no-download", "--output-dir", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.startswith("error: ")
