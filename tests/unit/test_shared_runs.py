"""The session's shared runs (tests/shared_runs.py): one run per command, whoever asks first."""

from __future__ import annotations

import json
import subprocess
import threading
import time

from tests.shared_runs import OUT, made_once, run_key


def test_a_port_does_not_make_another_run_but_any_other_argument_does():
    base = ["accelerate", "launch", "--config_file", "a.yaml", "--main_process_port", "0", "-m", "x", OUT]
    assert run_key(base) == run_key([*base[:5], "29511", *base[6:]])
    torchrun = ["torchrun", "--master_port", "1", "-m", "x"]
    assert run_key(torchrun) == run_key([*torchrun[:2], "2", *torchrun[3:]])
    assert run_key(base) != run_key([*base, "--max-steps", "3"])
    assert run_key(base) != run_key([*base[:3], "b.yaml", *base[4:]])


def test_the_same_command_runs_once_even_when_asked_at_once(tmp_path):
    calls = []

    def run(argv):
        calls.append(argv)
        time.sleep(0.3)  # long enough for the other thread to ask meanwhile
        out = argv[-1]
        subprocess.run(["mkdir", "-p", out], check=True)
        with open(f"{out}/results.json", "w") as f:
            json.dump({"steps": 3}, f)
        return subprocess.CompletedProcess(argv, 0, stdout="trained\n", stderr="")

    got = []
    threads = [threading.Thread(target=lambda: got.append(made_once(tmp_path, ["train", OUT], run))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and calls[0][-1] == str(got[0].out)
    assert got[0] == got[1] and got[0].returncode == 0 and got[0].stdout == "trained\n"
    assert got[0].results == {"steps": 3}
    # Another command is another run, in a folder of its own.
    other = made_once(tmp_path, ["train", "--seed", "1", OUT], run)
    assert len(calls) == 2 and other.out != got[0].out


def test_a_failed_run_is_kept_as_failed(tmp_path):
    def run(argv):
        return subprocess.CompletedProcess(argv, 2, stdout="", stderr="error: no data\n")

    failed = made_once(tmp_path, ["train", OUT], run)
    assert (failed.returncode, failed.stderr, failed.results) == (2, "error: no data\n", None)
    assert made_once(tmp_path, ["train", OUT], lambda argv: 1 / 0) == failed  # not run again
