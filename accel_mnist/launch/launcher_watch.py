"""What the launcher that started this process says about it, and a watch on the launcher's life.

`accelerate launch` runs torchrun's agent in its own process, and the agent starts every worker
in a session of its own, so a worker does not die with its launcher: after a SIGKILL of the
`accelerate launch` a user sees (or of the shell and process group around it), two DDP workers
on CPU went on training for minutes, orphans writing into the output directory and holding
memory (on a GPU, the GPU); workers hung in a collective stay for good. Each worker therefore
watches its parent, and exits within WATCH_SECONDS once the parent is gone (it is re-parented
to init or a subreaper). What it leaves is the last complete checkpoint; a save it was in the
middle of is a hidden temporary folder that the next run ignores and removes.

No torch here: the CLI reads the local rank before anything heavy is imported.
"""

from __future__ import annotations

import os
import threading
import time

# Where launchers put the rank of a process on its machine, in the order Accelerate reads them
# (accelerate.utils.environment.get_cpu_distributed_information): torchrun's, then MPI's.
LOCAL_RANK_VARS = ("LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK")
WATCH_SECONDS = 1.0
EXIT_ORPHANED = 1  # nobody is left to read it but a subreaper; it says "failed"
_watching: list[int] = []
_exiting = threading.Lock()


def local_rank() -> int | None:
    """This process's rank on its machine, as its launcher set it; None outside a launcher."""
    for name in LOCAL_RANK_VARS:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


def local_main_process() -> bool:
    """Whether this is the first process of a launch on this machine (or the only process)."""
    return local_rank() in (None, 0)


def started_by_launcher() -> bool:
    """Whether a launcher (`accelerate launch`, torchrun, deepspeed, mpirun) started this process:
    a launcher's child must not outlive it. A command started by a shell may (nohup)."""
    # Every accelerate launcher exports ACCELERATE_MIXED_PRECISION, the one-process one included.
    return local_rank() is not None or "TORCHELASTIC_RUN_ID" in os.environ or "ACCELERATE_MIXED_PRECISION" in os.environ


def watch_launcher() -> bool:
    """Exit this process soon after its launcher dies (once started, for the process's life);
    returns whether it is watched. A no-op outside a launcher."""
    if _watching or not started_by_launcher():
        return bool(_watching)
    parent = os.getppid()
    _watching.append(parent)
    threading.Thread(target=_watch, args=(parent,), name="accel_mnist-launcher-watch", daemon=True).start()
    return True


def orphaned() -> bool:
    """Whether this process is watched and its launcher is gone. An error in the main thread
    checks it first: when the launcher dies, the peer whose watch fires first exits and the
    others' collectives fail ("Connection reset by peer") before their own watch wakes; the
    cause to report is the launcher, not the collective."""
    return bool(_watching) and os.getppid() != _watching[0]


def exit_orphaned() -> None:
    """Say (once per machine) that the launcher is gone, and exit at once."""
    with _exiting:  # the main thread and the watch may both get here: one line, one exit
        if local_main_process():  # one line per machine, as for every error (cli.py)
            message = (
                f"error: the launcher (pid {_watching[0]}) is gone, so this run stops (pid {os.getpid()} exits); "
                "the same command with --resume-from auto continues from the last complete checkpoint\n"
            )
            try:
                os.write(2, message.encode())
            except OSError:
                pass  # the terminal went with the launcher
        # Not sys.exit: the main thread may be blocked in a collective whose peers are gone.
        os._exit(EXIT_ORPHANED)


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(WATCH_SECONDS)
    exit_orphaned()
