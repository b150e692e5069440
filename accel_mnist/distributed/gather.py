"""The full fp32 weights of a prepared model, gathered under any strategy, keyed as the user's module."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .strategy import Strategy


def full_state_dict(accelerator: Any, model: nn.Module, strategy: Strategy | None = None) -> dict[str, torch.Tensor]:
    """A snapshot of the full fp32 CPU weights of a prepared model, keyed as the user's module.
    `strategy`: the one that prepared it (default: the Accelerator's).

    Call it on every process: under ZeRO-3 it gathers the shards, a collective operation.
    """
    strategy = strategy or Strategy.of(accelerator)
    module = unwrapped(accelerator, model, strategy)
    if strategy.runs_engine:
        return _deepspeed_state_dict(module)
    if strategy.kind == "FSDP":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        # torch's gathering, as accelerator.get_state_dict does it for FSDP2; its FSDP1 branch
        # always offloads to the CPU, which FSDP1 refuses in one process (world size 1 turns
        # FULL_SHARD into NO_SHARD: "offload_to_cpu=True and NO_SHARD is not supported yet").
        # Offloaded (several processes), the full dict lands on the main process only and the
        # others get an empty one. Under dynamo, FSDP2 wraps the compiled module ("_orig_mod.").
        options = StateDictOptions(full_state_dict=True, cpu_offload=strategy.num_processes > 1)
        return fp32_cpu(strip_wrapper_prefixes(get_model_state_dict(model, options=options)))
    return fp32_cpu(module.state_dict())


def unwrapped(accelerator: Any, model: nn.Module, strategy: Strategy) -> nn.Module:
    """What accelerator.unwrap_model(model, keep_torch_compile=False) gives, without its cost
    where the wrapper is known: accelerate 1.15 imports deepspeed on every unwrap where it is
    installed, to test for its engine (measured: docs/measurements.md#distributedgatherpy)."""
    from accelerate.utils import is_compiled_module

    if not is_compiled_module(model):
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            return model.module
        if strategy.kind == "NO":
            return model  # Accelerate moved it and may have wrapped its forward, nothing else
    return accelerator.unwrap_model(model, keep_torch_compile=False)


def _deepspeed_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    # Under fp16/bf16 the module's parameters are half precision; the fp32 master weights live,
    # partitioned, in the ZeRO optimizer. safe_get_full_fp32_param assembles one parameter from
    # them (an all-reduce in stages 1-2, an all-gather in stage 3) and returns None where there
    # is none: a frozen parameter, or a model prepared without an optimizer.
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param

    full: dict[int, torch.Tensor] = {}
    params = dict(module.named_parameters(remove_duplicate=False))
    for param in params.values():  # the same order on every rank, as collectives need
        if id(param) in full:
            continue  # tied weights: one collective per tensor
        value = None
        if hasattr(param, "_hp_mapping") or getattr(param, "_z3_optimizer", None) is not None:
            value = safe_get_full_fp32_param(param)
        if value is None:
            # Stage 3 keeps even these partitioned; gathering is a no-op in stages 0-2.
            with deepspeed.zero.GatheredParameters([param], enabled=hasattr(param, "ds_id")):
                value = param.data.detach().clone()
        full[id(param)] = value.detach().to("cpu", torch.float32)
    buffers = dict(module.named_buffers(remove_duplicate=False))
    state: dict[str, torch.Tensor] = {}
    # The keys of state_dict(): parameters and persistent buffers, tied names included.
    for key in module.state_dict().keys():
        if key in params:
            state[key] = full[id(params[key])]
        elif key in buffers:
            state[key] = fp32_cpu({key: buffers[key]})[key]
    return state


def fp32_cpu(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Each tensor of `state` as a CPU copy, floating point in fp32 (non-tensors left out)."""
    # Clone: the snapshot must not change as training goes on, nor share memory between tied
    # names (safetensors refuses shared tensors). Integer buffers keep their type.
    out = {}
    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            continue  # get_extra_state() objects have no place in safetensors
        dtype = torch.float32 if value.is_floating_point() else value.dtype
        out[key] = value.detach().to("cpu", dtype, copy=True)
    return out


def strip_wrapper_prefixes(state: dict[str, Any]) -> dict[str, Any]:
    """`state` keyed as the user's module: wrapper prefixes that every key shares removed."""
    # save_state keeps the model from before DDP wrapped it, so keys come unprefixed; this is
    # for weights saved from a wrapper ("module." of DDP, "_orig_mod." of torch.compile).
    for prefix in ("module.", "_orig_mod."):
        while state and all(k.startswith(prefix) for k in state):
            state = {k[len(prefix) :]: v for k, v in state.items()}
    return state
