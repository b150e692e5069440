"""`--profile N`: N optimizer steps after the first, recorded by torch's profiler through Accelerate's
`accelerator.profile()` and `ProfileKwargs`, under whatever strategy the launch set up. The window is
the first one of N steps that no evaluation or checkpoint interrupts (`quiet_window`), so that the
figures are the training step's alone; where the run has no such window, the first one is recorded
and the table says that it includes them.

Each process writes a Chrome trace (`<output_dir>/profile/profile_<rank>.json`, Accelerate's name,
which Perfetto and chrome://tracing open); the main process prints the operations that took most time,
the kernels per step (on a GPU; on a CPU the aten operations) and the microseconds per step, and
results.json keeps the same numbers under `profile`. The first step is left out: it loads kernels
and, where capture is asked for, records the CUDA graph.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from types import TracebackType
from typing import Any

from accelerate import Accelerator
from accelerate.utils import PROFILE_PATTERN_NAME, ProfileKwargs

from ..errors import UsageError
from .cadence import Cadence

TRACE_FOLDER = "profile"
TOP = 8  # rows of the printed table


class StepProfiler:
    """Records `steps` optimizer steps after the first (none where `steps` is 0): enter it around the
    loop and call `step()` after each optimizer step; `results()` then holds what it found."""

    def __init__(
        self, accelerator: Accelerator, steps: int, output_dir: str, cadence: Cadence, steps_per_epoch: int,
        first_step: int,
    ) -> None:  # fmt: skip
        self.accelerator, self.steps = accelerator, steps
        self.folder = Path(output_dir) / TRACE_FOLDER
        quiet = quiet_window(cadence, steps_per_epoch, first_step, steps) if steps else None
        self.skip, self.interrupted = (quiet, False) if quiet is not None else (1, True)
        self._profiler: Any = None
        self._stack = ExitStack()
        self.found: dict[str, Any] = {}

    @property
    def on_gpu(self) -> bool:
        return self.accelerator.device.type == "cuda"

    def __enter__(self) -> StepProfiler:
        if self.steps:
            handler = ProfileKwargs(
                activities=["cpu", "cuda"] if self.on_gpu else ["cpu"],
                # The first step (at least) is skipped, one more warms the profiler up, then `steps` are recorded.
                schedule_option={"skip_first": self.skip, "wait": 0, "warmup": 1, "active": self.steps, "repeat": 1},
                output_trace_dir=str(self.folder),
            )
            self._profiler = self._stack.enter_context(self.accelerator.profile(handler))
        return self

    def step(self) -> None:
        """After each optimizer step: the profiler's schedule moves on."""
        if self._profiler is not None:
            self._profiler.step()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._profiler is None:
            return
        # On a signal or an error the profiler stops without writing a trace or waiting for other ranks.
        self._stack.__exit__(kind, value, trace)
        if kind is None:  # the trace is written (every rank), and every rank has reached this point
            self.found = profile_summary(self._profiler, self.steps, self.on_gpu, self.folder, self.accelerator)
            if self.found:
                self.found["interrupted"] = self.interrupted
            ended = "profile: the run ended before its steps"  # a resumed run past its window
            self.accelerator.print(profile_table(self.found) if self.found else ended)

    def results(self) -> dict[str, Any]:
        """results.json's `profile` (empty where nothing was recorded)."""
        return {"profile": self.found} if self.found else {}


def check_steps(steps: int, total_steps: int) -> None:
    """Refuse a profile window the run cannot fill: the first step, then `steps`."""
    if steps and total_steps < steps + 1:
        raise UsageError(f"profile: {steps} steps after the first need at least {steps + 1} optimizer steps, and "
                         f"this run has {total_steps}")  # fmt: skip


def quiet_window(cadence: Cadence, steps_per_epoch: int, first_step: int, steps: int) -> int | None:
    """The profiler's `skip_first` for the first window of `steps` recorded optimizer steps that no
    evaluation or checkpoint interrupts, in a run (or a resumed run) that starts after `first_step`;
    None where the run has no such window.

    The profiler's step() follows each optimizer step, and the span it opens holds what the loop does
    after that step (an evaluation, a checkpoint) and then the next optimizer step. With `skip` spans
    skipped and one of warm-up, the spans after steps first_step + skip + 1 .. first_step + skip + steps
    are recorded: nothing may be due after those steps, and the step that closes the last span must
    be one of the run's."""

    def interrupted(step: int) -> bool:
        end_of_epoch = step % steps_per_epoch == 0
        finished = cadence.out_of_steps(step)
        return cadence.evaluate_due(step, end_of_epoch) or cadence.checkpoint_due(step, end_of_epoch, finished)

    skip = 1
    while first_step + skip + steps + 1 <= cadence.total_steps:
        recorded = range(first_step + skip + 1, first_step + skip + steps + 1)
        due = [step for step in recorded if interrupted(step)]
        if not due:
            return skip
        skip = due[-1] - first_step  # the next window starts past the last step with something due
    return None


def profile_summary(profiler: Any, steps: int, on_gpu: bool, folder: Path, accelerator: Accelerator) -> dict[str, Any]:
    """What `steps` recorded steps took: per step the wall time (the profiler's step annotations), the
    device time and the kernels launched (on a CPU: aten operations), and the operations that took most."""
    averages = profiler.key_averages()
    time_of = "self_device_time_total" if on_gpu else "self_cpu_time_total"
    ops = [e for e in averages if not e.key.startswith("ProfilerStep")]
    top = sorted(ops, key=lambda e: getattr(e, time_of), reverse=True)[:TOP]
    wall = sum(e.cpu_time_total for e in averages if e.key.startswith("ProfilerStep"))
    if not wall:  # a resumed run that ended before the window
        return {}
    if on_gpu:
        launched = sum(1 for e in profiler.events() if e.device_type.name == "CUDA")
    else:
        launched = sum(1 for e in profiler.events() if e.key.startswith("aten::"))
    return {
        "steps": steps,
        "trace": str(folder / PROFILE_PATTERN_NAME.format(suffix=accelerator.process_index)),
        "time": "device" if on_gpu else "cpu",
        "us_per_step": round(wall / steps, 1),
        "device_us_per_step": round(sum(getattr(e, time_of) for e in ops) / steps, 1) if on_gpu else None,
        ("kernels_per_step" if on_gpu else "aten_ops_per_step"): round(launched / steps, 1),
        "top": [{"name": e.key, "calls": e.count, "self_us": round(getattr(e, time_of), 1)} for e in top],
    }


def profile_table(found: dict[str, Any]) -> str:
    """The printed form of `profile_summary`: one line of totals, then the operations that took most time."""
    count = (f"{found['kernels_per_step']} kernels" if "kernels_per_step" in found
             else f"{found['aten_ops_per_step']} aten ops")  # fmt: skip
    device = f", {found['device_us_per_step']} us on the device" if found["device_us_per_step"] else ""
    lines = [f"profile: {found['steps']} steps, {found['us_per_step']} us a step{device}, {count} a step; "
             f"trace {found['trace']}"]  # fmt: skip
    if found.get("interrupted"):
        lines.append("  (no window of that many steps without an evaluation or a checkpoint: these include one)")
    width = max((len(row["name"]) for row in found["top"]), default=0)
    lines += [f"  {row['self_us']:>12,.1f} us  {row['calls']:>6} calls  {row['name']:<{width}}" for row in found["top"]]
    return "\n".join(lines)
