"""Preemption: SIGTERM or SIGUSR1 ask the run to checkpoint at the current step and exit.

Schedulers (SLURM, Kubernetes) send the signal and kill the job some seconds later (30 s by
default). A handler only records the request: the loop asks every rank at its next step
boundary whether any of them was signalled (one collective, shared with the finiteness
check), so all ranks save the same step together and none is left waiting in a collective
that the others have left. The process then exits with EXIT_PREEMPTED.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType, TracebackType

from ..caller import setting

# sysexits.h's EX_TEMPFAIL, "try again later": what a requeue script looks for.
EXIT_PREEMPTED = 75
SIGNALS = ("SIGTERM", "SIGUSR1")


class Preempted(Exception):
    """Training stopped on a signal after saving a checkpoint; the same command with
    `--resume-from auto` (train() with `resume_from="auto"`) continues it."""

    def __init__(self, signal_name: str, step: int, checkpoint: Path) -> None:
        self.signal_name, self.step, self.checkpoint = signal_name, step, checkpoint
        super().__init__(
            f"preempted by {signal_name} at step {step}: saved {checkpoint}; "
            f"{setting('resume_from', 'auto', again=True)} continues the run"
        )


class StopSignals:
    """While active, SIGTERM/SIGUSR1 are recorded instead of ending the process.

    `agreed` is set by the loop once every rank knows that some rank was signalled. Outside
    the main thread (signal handlers cannot be installed there) it records nothing.
    """

    def __init__(self) -> None:
        self.received: str | None = None
        self.agreed = False
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for name in SIGNALS:
                sig = getattr(signal, name, None)
                if sig is not None:
                    self._previous[sig] = signal.signal(sig, self._record)
        return self

    def _record(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signal.Signals(signum).name

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()
