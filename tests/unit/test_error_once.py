"""An error every process of a launch has alike is printed once per machine, by its local main
process; the others exit with the same code in silence. An error of one process alone is printed
by that process."""

from __future__ import annotations

import pytest

from accel_mnist import cli
from accel_mnist.errors import EXIT_STORAGE, StorageError, UsageError, error_for, on_every_rank


@pytest.fixture(autouse=True)
def no_launcher(monkeypatch):
    monkeypatch.setattr(cli, "QUIET_EXIT_SECONDS", 0.0)  # what a quiet process leaves its local main to print
    for name in ("LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


BAD = ["train", "--model", "no-such-model", "--output-dir", "unused"]


@pytest.mark.parametrize("local_rank, printed", [(None, True), ("0", True), ("1", False), ("3", False)])
def test_a_config_error_is_printed_by_the_local_main_process_only(local_rank, printed, monkeypatch, capsys):
    if local_rank is not None:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    assert cli.main(BAD) == 2
    err = capsys.readouterr().err
    assert (err.count("error: ") == 1 and "no-such-model" in err) if printed else err == "", err


def test_mpi_local_ranks_count_too(monkeypatch, capsys):
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1")
    assert cli.main(BAD) == 2
    assert capsys.readouterr().err == ""


def test_an_error_of_one_process_alone_is_printed_by_it(monkeypatch, capsys):
    monkeypatch.setenv("LOCAL_RANK", "1")

    def fails_here_only(args):
        raise StorageError("cannot write x: No space left on device")

    monkeypatch.setattr(cli, "_train", fails_here_only)  # build_parser binds it when main runs
    assert cli.main(["train"]) == EXIT_STORAGE
    assert capsys.readouterr().err == "error: cannot write x: No space left on device\n"


def test_errors_keep_their_exit_code_across_processes():
    """What consensus.agree rebuilds on the processes that did not raise it."""
    assert isinstance(error_for("full", EXIT_STORAGE), StorageError)
    assert type(error_for("bad flag", 2)) is UsageError
    assert on_every_rank(UsageError("x")).every_rank and not UsageError("x").every_rank
