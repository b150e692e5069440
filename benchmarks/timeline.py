"""Where the seconds of one `accel-mnist train ...` command go, phase by phase.

    python -m benchmarks.timeline train --model linear --max-steps 1 --no-export ...

Runs the CLI in this process (same arguments as `accel-mnist`) and prints one JSON line:
`python_start` (process start to this module, from /proc), `import_cli` (importing
accel_mnist.cli: torch, accelerate, ...), then each phase of train() with its seconds and
calls, timed with perf_counter around accel_mnist's own functions (build_accelerator,
load_run_data, Loaders, prewarm, prepare — which builds the first torch optimizer, and with it
imports torch._dynamo —, build_step (the CUDA graph's capture), evaluate, the export,
write_report), and `other` for the rest of train() (the steps, checkpoints, results.json).
Nothing outside accel_mnist is wrapped; the wrappers only time the calls they pass through.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from typing import Any

T0 = time.perf_counter()

PHASES = {  # phase name: (module, attribute); the run looks each up at call time
    "accelerator": ("accel_mnist.training.loop", "build_accelerator"),
    "data": ("accel_mnist.training.start", "load_run_data"),
    "loaders": ("accel_mnist.training.start", "Loaders"),
    "prewarm": ("accel_mnist.training.start", "prewarm"),
    "run_dir": ("accel_mnist.training.loop", "RunDir"),
    "prepare": ("accel_mnist.training.start", "prepare"),
    "step_setup": ("accel_mnist.training.run", "build_step"),  # the CUDA graph's capture, where asked
    "evaluate": ("accel_mnist.training.run", "evaluate"),
    "export": ("accel_mnist.export.model_dir", "full_state_dict"),
    "export_save": ("accel_mnist.export.model_dir", "save_exported"),
    "report": ("accel_mnist.report", "write_report"),
    "train": ("accel_mnist.training.loop", "train"),  # the CLI imports it from there when it runs
}


def process_age() -> float | None:
    """Seconds since this process started (Linux /proc; None elsewhere)."""
    try:
        start_ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
        uptime = float(open("/proc/uptime").read().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def add_phase(record: dict[str, dict[str, float]], name: str, seconds: float) -> None:
    """Count one call of phase `name` that took `seconds` (the record's shape: seconds and calls)."""
    entry = record.setdefault(name, {"seconds": 0.0, "calls": 0})
    entry["seconds"] += seconds
    entry["calls"] += 1


def _timed(name: str, fn: Any, record: dict[str, dict[str, float]]) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        tick = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            add_phase(record, name, time.perf_counter() - tick)

    return wrapper


def main(argv: list[str] | None = None) -> int:
    """Run `accel-mnist ARGV` here and print the timeline as one JSON line."""
    import gc
    import importlib

    age_at_start, main_start = process_age(), time.perf_counter()
    tick = main_start
    if argv is None:  # as `accel-mnist` itself does in its own process, around the imports below
        gc.disable()
    from accel_mnist import cli

    import_cli = time.perf_counter() - tick
    phases: dict[str, dict[str, float]] = {}
    for name, (module_name, attr) in PHASES.items():
        module = importlib.import_module(module_name)
        setattr(module, attr, _timed(name, getattr(module, attr), phases))
    tick = time.perf_counter()
    rc = cli.main(argv)  # None: sys.argv[1:], as the command's own process
    cli_seconds = time.perf_counter() - tick
    total = phases.get("train", {}).get("seconds", 0.0)
    inner = sum(v["seconds"] for k, v in phases.items() if k != "train")
    timeline = {
        "python_start": None if age_at_start is None else age_at_start - (main_start - T0),
        "import_cli": import_cli,
        "phases": phases,
        "other_in_train": total - inner,
        "cli_outside_train": cli_seconds - total,
        "process_seconds": process_age(),
        "rc": rc,
    }
    print(json.dumps(timeline, sort_keys=True))
    return rc


if __name__ == "__main__":
    sys.exit(main())
