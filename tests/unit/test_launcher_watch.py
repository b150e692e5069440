"""An error raised after the launcher died reports the launcher, once, and no traceback.

When `accelerate launch` is killed, the worker whose watch fires first exits, and a peer in a
collective fails with gloo's "Connection reset by peer" before its own watch wakes: that error
is a consequence, and the one line a user reads must name the cause.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.helpers import ENV, REPO

# The worker: watched with a watch too slow to fire, so that the main thread's error comes first,
# as in the race of a two-process launch.
WORKER = textwrap.dedent(
    """
    import os, sys, time
    from accel_mnist import cli
    from accel_mnist.launch import launcher_watch

    launcher_watch.WATCH_SECONDS = 120
    assert launcher_watch.watch_launcher()
    parent = os.getppid()

    def failing_collective(args):
        open(sys.argv[1], "w").close()  # ready: the launcher may die now
        while os.getppid() == parent:
            time.sleep(0.01)
        raise RuntimeError("[pair.cc:545] Read error [127.0.0.1]:17551: Connection reset by peer")

    cli._train = failing_collective
    sys.exit(cli.main(["train"]))
    """
)

# The launcher: starts the worker and dies once the worker is ready, without waiting for it.
LAUNCHER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    ready = sys.argv[1]
    worker = subprocess.Popen([sys.executable, "-c", sys.argv[2], ready], env=dict(os.environ, LOCAL_RANK="0"))
    print(os.getpid(), flush=True)
    while not os.path.exists(ready):
        time.sleep(0.01)
    os._exit(0)
    """
)

# A subreaper above the launcher, so that the orphaned worker's exit code can be read.
REAPER = textwrap.dedent(
    """
    import ctypes, os, subprocess, sys
    PR_SET_CHILD_SUBREAPER = 36
    assert ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    launcher = subprocess.Popen([sys.executable, "-c", sys.argv[2], sys.argv[1], sys.argv[3]])
    codes = {}
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        codes[pid] = os.waitstatus_to_exitcode(status)
    worker = [code for pid, code in codes.items() if pid != launcher.pid]
    print("worker exit", worker[0], flush=True)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a subreaper is Linux's")
def test_an_error_after_the_launcher_died_names_the_launcher_once(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", REAPER, str(tmp_path / "ready"), LAUNCHER, WORKER],
        env=ENV, cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    launcher_pid, worker_exit = proc.stdout.split("\n")[0], proc.stdout.split("worker exit ")[1].strip()
    assert worker_exit == "1", proc.stderr  # EXIT_ORPHANED
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: the launcher (pid {launcher_pid.strip()}) is gone, so this run stops"), lines
