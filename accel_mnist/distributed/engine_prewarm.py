"""An untimed step of a throwaway DeepSpeed engine, so that the run's first step loads no kernels.

prewarm (training/prewarm.py) steps a torch copy of the model. DeepSpeed's step then still
launches kernels that no torch step does (its loss scaler's overflow check, the gradient norm
over flat partitions, the collectives around them), and a CUDA process loads each kernel on its
first launch. A second engine built in the same process takes its first step in a fraction of
the first engine's time, so what the first step pays is per process, not per engine (measured:
docs/measurements.md#distributedengine_prewarmpy).

So, where a DeepSpeed run asks for prewarm, a second engine is built from a copy of the model
and the run's own DeepSpeed config (as Accelerate filled it in), takes one step on zeros and is
dropped, before the training clock starts; its seconds go to `prewarm_seconds`. The run's
engine, weights and RNG streams are untouched. What it costs, while it lives: the engine's
setup (a few hundred milliseconds), a second copy of the model states, and its communication
buckets (ZeRO-2's default bucket is 5e8 elements), freed to the caching allocator before the
run's first step, which reuses those blocks. Every process builds one, since its setup and
step are collectives.
"""

from __future__ import annotations

import copy
import gc
import time
from collections.abc import Callable
from typing import Any

import torch
from accelerate import Accelerator
from torch import nn

from ..config import TrainConfig

# Sections that make an engine write files or reports of its own: the throwaway engine writes none.
OUTPUT_SECTIONS = ("tensorboard", "wandb", "csv_monitor", "comet", "flops_profiler", "comms_logger", "monitor_config")

Loss = Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.dtype], torch.Tensor]


def scratch_config(ds_config: dict[str, Any], world_size: int) -> dict[str, Any]:
    """The run's DeepSpeed config for one step of one micro-batch, with nothing written to disk."""
    found = copy.deepcopy(ds_config)
    for key in OUTPUT_SECTIONS:
        found.pop(key, None)
    found.pop("checkpoint", None)  # load_universal and the like: the scratch engine loads nothing
    # Under offload Accelerate swaps a torch Adam for DeepSpeedCPUAdam, and DeepSpeed refuses a
    # torch optimizer: the scratch engine keeps torch's, whose host step loads no GPU kernels either way.
    found["zero_force_ds_cpu_optimizer"] = False
    found["gradient_accumulation_steps"] = 1
    found["train_batch_size"] = int(found["train_micro_batch_size_per_gpu"]) * world_size
    return found


def prewarm_engine(
    accelerator: Accelerator,
    model: nn.Module,
    config: TrainConfig,
    batch_shape: tuple[int, ...],
    loss: Loss,
) -> float:
    """One step of a DeepSpeed engine built on `model` (a copy the run does not train) with the
    run's config; returns the seconds it took. `loss(engine, inputs, labels, input_dtype)`: the
    run's forward and loss."""
    import deepspeed

    from ..optim import build_optimizer

    plugin = accelerator.state.deepspeed_plugin
    ds_config = scratch_config(plugin.deepspeed_config, accelerator.num_processes)
    device = accelerator.device
    start = time.perf_counter()
    devices = [] if device.type == "cpu" else [device.index or 0]
    with torch.random.fork_rng(devices=devices, device_type=device.type):
        # A JSON's own optimizer section is built by DeepSpeed itself, as for the run.
        optimizer = None if "optimizer" in ds_config else build_optimizer(model, config)
        engine, *_ = deepspeed.initialize(
            model=model, optimizer=optimizer, model_parameters=model.parameters(), config=ds_config
        )
        input_dtype = next(engine.parameters()).dtype
        inputs = torch.zeros(batch_shape, device=device)
        labels = torch.zeros(batch_shape[0], dtype=torch.long, device=device)
        engine.backward(loss(engine, inputs, labels, input_dtype))
        engine.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        engine.destroy()  # its hooks and references to the parameters
    del engine, optimizer, inputs, labels
    gc.collect()  # the engine's reference cycles hold its buffers until collected
    return time.perf_counter() - start
