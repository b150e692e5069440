"""`train()`: one loop for every strategy, because Accelerate hides the strategy.

It reads as plan, start, fit, finish: the output directory's plan (run/directory.py), the run
set up (training/start.py), then trained and finished (training/run.py, whose `fit` asks the
`Cadence` what is due after each optimizer step); what the strategy changes lives in
`distributed/`, not here.
"""

from __future__ import annotations

import atexit
import time
from typing import Any

import torch
from accelerate import Accelerator
from torch import nn

from ..config import TrainConfig
from ..distributed.accelerator import build_accelerator
from ..distributed.compile_keys import prefetch_for_launch
from ..distributed.compile_threads import default_compile_threads
from ..distributed.strategy import Strategy
from ..errors import UsageError, on_every_rank
from ..memory.allocator import default_settings
from ..memory.out_of_memory import out_of_memory_error
from ..run.directory import RunDir
from .inputs import OwnData
from .preemption import StopSignals
from .resolved import with_launch
from .run import TrainingRun
from .start import start_run


def train(
    config: TrainConfig,
    model: nn.Module | None = None,
    *,
    train_data: Any = None,
    test_data: Any = None,
    mean: float | None = None,
    std: float | None = None,
    plots_in_background: bool = False,
) -> dict[str, Any]:
    """Train `model` (default: the registry's `config.model`, sized to the data's classes) on
    `config.dataset`, or on `train_data` and `test_data` (torch or Hugging Face Datasets, see
    data/own.py), and return results.json's fields. `mean`/`std`: normalise with these instead
    of the training pixels' own. What the model may return: model_output.py.

    Runs unchanged on CPU, one or several GPUs, DDP, DeepSpeed ZeRO 1-3 and FSDP: the strategy
    comes from the accelerate config of the launch (`accelerate launch --config_file ...`), or
    from `config.deepspeed_config` under any launcher; the first line printed says which. With
    `config.plots` the PNGs are drawn before this returns, or, with `plots_in_background` (the
    CLI's choice, so that a command does not wait for matplotlib), by a process of their own.
    """
    start = time.perf_counter()
    own = OwnData(train_data, test_data, mean, std)
    default_settings()  # expandable segments, before the Accelerator starts CUDA (memory/allocator.py)
    default_compile_threads()  # one, before anything compiles (distributed/compile_threads.py)
    prefetch_for_launch()  # a compiled run's cache keys hashed during its setup (distributed/compile_keys.py)
    try:
        accelerator = build_accelerator(config, announce=True)
    except UsageError as e:  # from the launch's settings, which every process reads alike
        raise on_every_rank(e) from None
    config = with_launch(accelerator, config)  # the accumulation settled, before the directory is read
    run: TrainingRun | None = None
    try:
        with StopSignals() as stop, RunDir(accelerator, config) as run_dir:
            plan = run_dir.plan()  # locked, then agreed by every rank: what --resume-from means here
            if plan.finished is not None:
                accelerator.print(f"{config.output_dir} holds a finished run (results.json): nothing to train")
                return plan.finished
            run = start_run(accelerator, config, model, stop, run_dir, plan, own)
            run.fit()
            return run.finish(start, plots_in_background)
    except torch.OutOfMemoryError as exc:
        if run is None:
            raise out_of_memory_error(accelerator, config.batch_size, None, None, None, exc) from None
        batch = run.config.batch_size  # `batch_size: auto` is settled there
        raise out_of_memory_error(accelerator, batch, run.memory, run.progress.step, run.last_checkpoint, exc) from None
    finally:
        if run is not None:
            run.release()  # done already where the run finished or was preempted
        end_run(accelerator)


def end_run(accelerator: Accelerator) -> None:
    """Close the run's trackers (also on failure), clear dynamo's state after a compiled run, and leave the
    process group to the process's exit.

    Accelerate's end_training also destroys the process group, but DeepSpeed keeps the groups it
    derived from it for the next engine, and a second train() in the same process (a sweep, a
    notebook, the option matrix's cells) then fails in its first collective ("Group ... is not
    registered"). The group is destroyed once, at interpreter exit, as end_training would have.
    """
    for tracker in accelerator.trackers:
        tracker.finish()
    if Strategy.of(accelerator).dynamo != "no":  # the launch's dynamo, read where every stage reads it
        # The run's compiled code goes with its model. Kept, it would make the next run in this process
        # (a sweep, a notebook, the option matrix's cells) compile anew beside it: under mixed precision
        # dynamo guards on the autocast wrapper Accelerate puts on each model's forward, and past its
        # recompile limit (8) it runs the model uncompiled, with one warning. The cost: every function
        # compiled in this process compiles again on its next call (from the compile caches on disk).
        torch.compiler.reset()
    global _TEARDOWN_REGISTERED
    if not _TEARDOWN_REGISTERED:
        atexit.register(accelerator.state.destroy_process_group)
        _TEARDOWN_REGISTERED = True


_TEARDOWN_REGISTERED = False
