"""The command line called in process: exit codes and one-line errors for bad input."""

from __future__ import annotations

import gc
import sys

import pytest

from accel_mnist.cli import main
from tests.helpers import run_command


def test_main_returns_exit_code_in_process(capsys, tmp_path):
    assert main(["train", "--data-dir", str(tmp_path), "--no-download", "--output-dir", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_in_process_calls_leave_the_collector_alone(tmp_path):
    frozen = gc.get_freeze_count()
    assert main(["configs"]) == 0
    assert main(["train", "--data-dir", str(tmp_path), "--no-download", "--output-dir", str(tmp_path / "o")]) == 2
    # Nothing frozen by the calls: a freeze would add every object tracked since. The count may fall: the
    # suite freezes its imported heap after collection (conftest.py), and a call can free some of it.
    assert gc.isenabled() and gc.get_freeze_count() <= frozen


# The command's own process: the collector is off through the imports, then on again with what
# they left frozen. Printed at exit, after the command has run (or failed) and returned.
OWN_PROCESS = """
import atexit, gc, sys
atexit.register(lambda: print("collector", gc.isenabled(), gc.get_freeze_count() > 100000))
sys.argv = ["accel-mnist", *sys.argv[1:]]
import runpy
runpy.run_module("accel_mnist", run_name="__main__")
"""


@pytest.mark.parametrize("argv", [["configs"], ["train", "--data-dir", "MISSING", "--no-download"]])
def test_a_command_freezes_what_its_imports_left(argv, tmp_path):
    argv = [str(tmp_path / "missing") if a == "MISSING" else a for a in argv]
    proc = run_command([sys.executable, "-c", OWN_PROCESS, *argv, *(["--output-dir", str(tmp_path / "o")]
                                                                    if argv[0] == "train" else [])])  # fmt: skip
    assert proc.stdout.strip().splitlines()[-1] == "collector True True", proc.stdout + proc.stderr[-2000:]


def test_boolean_flags_take_a_value_as_accelerates_do(capsys):
    from accel_mnist.cli import build_parser, config_from_args

    parser = build_parser()

    def parsed(*argv: str):
        return config_from_args(parser.parse_args(["train", *argv]))

    assert parsed("--cycle-momentum", "false").cycle_momentum is False
    assert parsed("--cycle-momentum", "True").cycle_momentum is True
    assert parsed("--no-cycle-momentum").cycle_momentum is False
    assert parsed("--plots", "--model", "mlp").plots is True  # no value: true, and the next flag still read
    assert parsed("--plots", "0").plots is False
    for argv, said in ((["--cycle-momentum", "maybe"], "expected true or false, got 'maybe'"),
                       (["--no-plots", "false"], "--no-plots takes no value; use --plots false")):  # fmt: skip
        with pytest.raises(SystemExit) as excinfo:
            parser.parse_args(["train", *argv])
        assert excinfo.value.code == 2
        assert said in capsys.readouterr().err


def test_help_shows_each_boolean_flag_as_it_is_taken(capsys):
    """`--plots [true|false], --no-plots`: help promised `--no-plots [true|false]`, which is refused."""
    from dataclasses import fields

    from accel_mnist.cli import build_parser
    from accel_mnist.config import TrainConfig

    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "--help"])
    text = capsys.readouterr().out
    booleans = [f.name.replace("_", "-") for f in fields(TrainConfig) if f.type in (bool, "bool")]
    assert "plots" in booleans and "quiet" in booleans
    for name in booleans:
        assert f"--{name} [true|false], --no-{name}\n" in text, name
        assert f"--no-{name} [" not in text, name
        assert getattr(parser.parse_args(["train", f"--no-{name}"]), name.replace("-", "_")) is False
