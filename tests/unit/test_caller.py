"""A message names a setting as its caller gives it: a flag for the command line, a TrainConfig field for a
Python caller of train()."""

from __future__ import annotations

from pathlib import Path

import pytest

from accel_mnist import TrainConfig, UsageError, train
from accel_mnist.caller import command_line, setting
from accel_mnist.cli import main


def test_a_setting_is_spelt_as_the_caller_gives_it():
    python = [setting("overwrite", True), setting("resume_from", "auto"), setting("output_dir"),
              setting("cycle_momentum", False), setting("batch_size", 64), setting("deepspeed_config", Path("d.json")),
              setting("resume_from", "auto", again=True)]  # fmt: skip
    assert python == ["overwrite=True", 'resume_from="auto"', "output_dir", "cycle_momentum=False", "batch_size=64",
                      'deepspeed_config="d.json"', 'train() with resume_from="auto"']  # fmt: skip
    with command_line():
        flags = [setting("overwrite", True), setting("resume_from", "auto"), setting("output_dir"),
                 setting("cycle_momentum", False), setting("batch_size", 64),
                 setting("deepspeed_config", Path("d.json")), setting("resume_from", "auto", again=True)]  # fmt: skip
    assert flags == ["--overwrite", "--resume-from auto", "--output-dir", "--cycle-momentum false", "--batch-size 64",
                     "--deepspeed_config d.json", "the same command with --resume-from auto"]  # fmt: skip
    assert setting("overwrite", True) == "overwrite=True"  # outside the command line again


def test_a_finished_run_is_refused_in_the_callers_terms(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.json").write_text("{}")  # a finished run: refused before any data is read
    with pytest.raises(UsageError) as excinfo:
        train(TrainConfig(output_dir=str(out), data_dir=str(tmp_path), download=False))
    message = str(excinfo.value)
    assert 'pass resume_from="auto" to continue it, overwrite=True to replace it, or choose another output_dir' in (
        message
    )
    assert "--overwrite" not in message and "--resume-from" not in message
    assert main(["train", "--output-dir", str(out), "--data-dir", str(tmp_path), "--no-download"]) == 2
    err = capsys.readouterr().err
    assert "pass --resume-from auto to continue it, --overwrite to replace it, or choose another --output-dir" in err
    with pytest.raises(UsageError, match="overwrite=True"):  # the command line's spelling went with it
        train(TrainConfig(output_dir=str(out), data_dir=str(tmp_path), download=False))
