"""Model states each process really holds, counted from the prepared objects' tensors, and its peaks.

`MemoryWatch.start` (after `prepare`) counts the tensors that the prepared model and optimizer
hold, through public attributes: the parameters, their gradients and the torch optimizer's
state; under DeepSpeed the ZeRO optimizer's flat 16-bit buffers, fp32 master partitions,
gradient partitions and buffers. Each storage counts once (views share it), by kind, on the
device or, moved there by an offload, in host memory. Communication buckets are no model
state and are left out (they are part of the peak's overhead).

Parameters and optimizer states are counted at rest: after `prepare` and as every evaluation
begins, before its forward passes (after them ZeRO-3 may keep the whole parameters gathered,
which the peak then shows).
Gradients live only during a step (torch frees them at `zero_grad`, DeepSpeed after its step),
so they are counted also at their two fullest moments of the first step, by hooks that remove
themselves: when the last gradient of the first backward pass has accumulated, and when the
torch optimizer's first step begins. After that first step no hook is left: the training
step costs what it cost before.
"""

from __future__ import annotations

import resource
import sys
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from accelerate import Accelerator

from ..config import TrainConfig
from ..distributed.lean_steps import torch_optimizer
from ..distributed.strategy import Strategy
from .model_states import KINDS, OPTIMIZER_STATES, PERSISTENCE_THRESHOLD, Setup, predict, summary_line
from .peak import PeakInputs
from .plan import PeakPlan

PEAK_FIELDS = ("peak_allocated_bytes", "peak_reserved_bytes", "peak_rss_bytes", "alloc_retries", "ooms")
_GRADIENTS = "gradient_bytes"


def trainable_numels(model: torch.nn.Module) -> list[int]:
    """Elements of each trainable parameter tensor (before `prepare`, which may shard them)."""
    return [p.numel() for p in model.parameters() if p.requires_grad]


def setup_of(accelerator: Accelerator, strategy: Strategy, config: TrainConfig) -> Setup:
    """The prediction's Setup for this run: the strategy Accelerate set up and the optimizer."""
    plugin = accelerator.state.deepspeed_plugin
    ds = plugin.deepspeed_config if plugin is not None else {}
    zero = ds.get("zero_optimization", {})
    family = {"DEEPSPEED": "deepspeed", "FSDP": "fsdp"}.get(strategy.kind, "replicated")
    offload_optimizer = strategy.offload_optimizer != "none"
    name = str(ds.get("optimizer", {}).get("type", config.optimizer)).lower()  # a DeepSpeed JSON's own wins
    name = "sgd_no_momentum" if name == "sgd" and not config.momentum else name
    # Accelerate gives DeepSpeed's offload a CPU Adam, whatever the torch optimizer was.
    states = OPTIMIZER_STATES["adam"] if offload_optimizer else OPTIMIZER_STATES.get(name, 2)
    threshold = zero.get("stage3_param_persistence_threshold", PERSISTENCE_THRESHOLD)
    return Setup(
        family=family,
        num_processes=accelerator.num_processes,
        zero_stage=strategy.zero_stage,
        mixed_precision=strategy.precision,
        offload_optimizer=offload_optimizer,
        offload_param=strategy.offload_param != "none" or strategy.fsdp_offload_params,
        optimizer_states=states,
        on_accelerator=accelerator.device.type != "cpu",
        persistence_threshold=int(threshold) if isinstance(threshold, (int, float)) else PERSISTENCE_THRESHOLD,
    )


class MemoryWatch:
    """One process's model states (by kind: the latest count at rest, the gradients' most) and peaks."""

    def __init__(self, accelerator: Accelerator, model: Any, optimizer: Any, predicted: dict[str, Any]) -> None:
        self.accelerator, self.model, self.optimizer, self.predicted = accelerator, model, optimizer, predicted
        self.held = dict.fromkeys(KINDS, 0)
        self._host = dict.fromkeys(KINDS[:3], 0)  # the part of each kind an offload moved to host memory
        self._gradient_hooks: list[Any] = []
        self._step_hook: Any = None
        self._step_end_hook: Any = None
        self.per_process: list[dict[str, int | None]] = []
        # This process's allocated bytes and peak so far at the first step's moments (accelerators only):
        # where the peak comes from, beside what predicted.peak_allocated_bytes says it should be.
        self.moments: dict[str, dict[str, int]] = {}
        self.numels: list[int] = []
        self.setup: Setup | None = None
        self.peak: PeakInputs | None = None

    @classmethod
    def start(
        cls, accelerator: Accelerator, config: TrainConfig, strategy: Strategy, numels: list[int],
        model: Any, optimizer: Any, plan: PeakPlan | None = None,
    ) -> MemoryWatch:  # fmt: skip
        """Predict for `numels` (trainable_numels before prepare) and, given `plan` (plan.py), the
        peak; count once now (after `prepare`) and hook the first step's two gradient moments."""
        setup = setup_of(accelerator, strategy, config)
        plan = plan or PeakPlan()
        predicted: dict[str, Any] = {**predict(numels, setup), **plan.predicted(numels, setup)}
        watch = cls(accelerator, model, optimizer, predicted)
        watch.numels, watch.setup, watch.peak = numels, setup, plan.inputs  # what an out-of-memory line advises from
        watch.count(at_rest=True)
        watch.moment("after_prepare")
        params = [p for p in model.parameters() if p.requires_grad]
        pending = {id(p) for p in params}

        def accumulated(param: torch.Tensor) -> None:
            pending.discard(id(param))
            if not pending:  # the backward pass's last gradient: every one is there now
                watch.count(at_rest=False)
                watch.moment("backward_end")
                watch._remove_gradient_hooks()

        watch._gradient_hooks = [p.register_post_accumulate_grad_hook(accumulated) for p in params]
        inner = torch_optimizer(optimizer)
        if inner is not None:
            watch._step_hook = inner.register_step_pre_hook(lambda *_: watch._first_step())
            watch._step_end_hook = inner.register_step_post_hook(lambda *_: watch._first_step_end())
        return watch

    def _first_step(self) -> None:
        self.count(at_rest=False)
        self.moment("step_begin")
        self._step_hook.remove()
        self._step_hook = None
        self._remove_gradient_hooks()  # also where a gradient never came (a parameter the forward left out)

    def _first_step_end(self) -> None:
        self.moment("step_end")
        self._step_end_hook.remove()
        self._step_end_hook = None

    def moment(self, name: str) -> None:
        """Keep this process's allocated bytes and peak so far under `name` (the first time only; not on a CPU)."""
        if self.accelerator.device.type == "cpu" or name in self.moments:
            return
        device = self.accelerator.device
        api = _allocator(device)
        self.moments[name] = {"allocated_bytes": int(api.memory_allocated(device)),
                              "peak_allocated_bytes": int(api.max_memory_allocated(device))}  # fmt: skip

    def _remove_gradient_hooks(self) -> None:
        for handle in self._gradient_hooks:
            handle.remove()
        self._gradient_hooks = []

    def count(self, at_rest: bool) -> None:
        """Count the held tensors: parameters and optimizer states when `at_rest`, the gradients' most always."""
        if at_rest and "after_prepare" in self.moments:
            self.moment("first_evaluation")  # at rest again only as an evaluation begins
        tally = _Tally(self.accelerator.device)
        _count_holders(tally, self.model, self.optimizer)
        for kind in KINDS[:3]:
            if kind == _GRADIENTS:
                self.held[kind] = max(self.held[kind], tally.device[kind])
                self._host[kind] = max(self._host[kind], tally.host[kind])
            elif at_rest:
                self.held[kind], self._host[kind] = tally.device[kind], tally.host[kind]
        self.held["offloaded_bytes"] = sum(self._host.values())

    def gather(self) -> list[dict[str, int | None]]:
        """Every process's counts and peaks (a collective: call it on every rank)."""
        row = [self.held[k] for k in KINDS] + [-1 if v is None else v for v in peaks(self.accelerator.device).values()]
        local = torch.tensor([row], dtype=torch.int64, device=self.accelerator.device)
        names = (*KINDS, *PEAK_FIELDS)
        self.per_process = [
            {"rank": rank, **{k: None if v < 0 else v for k, v in zip(names, r, strict=True)}}
            for rank, r in enumerate(self.accelerator.gather(local).tolist())
        ]
        return self.per_process

    def largest_peaks(self) -> dict[str, int | None]:
        """The largest of each peak over the processes at the last gather, under the names and meanings
        of results.json's per-process fields: `peak_allocated_bytes` is the accelerator allocator's
        (None on a CPU, which has none), `peak_rss_bytes` the whole process's resident memory."""
        keys = ("peak_allocated_bytes", "peak_rss_bytes")
        return {k: max((v for p in self.per_process if (v := p[k]) is not None), default=None) for k in keys}

    def results(self) -> dict[str, Any]:
        """results.json's `memory`: every process's counts and peaks, and the prediction."""
        out = {"per_process": self.per_process, "predicted": dict(self.predicted)}
        if self.moments:
            out["moments"] = dict(self.moments)
        return out

    def summary(self) -> str:
        """One line: the model states of the process that holds most, measured and predicted, and the peak."""
        return summary_line(self.results())


def peaks(device: torch.device) -> dict[str, int | None]:
    """This process's peaks since it started: the accelerator's allocator (None on a CPU) and the peak RSS."""
    out: dict[str, int | None] = dict.fromkeys(PEAK_FIELDS)
    out["peak_rss_bytes"] = peak_rss_bytes()
    if device.type == "cpu":
        return out
    api = _allocator(device)
    stats = api.memory_stats(device)
    out.update(
        peak_allocated_bytes=int(api.max_memory_allocated(device)),
        peak_reserved_bytes=int(api.max_memory_reserved(device)),
        alloc_retries=int(stats.get("num_alloc_retries", 0)),
        ooms=int(stats.get("num_ooms", 0)),
    )
    return out


def _allocator(device: torch.device) -> Any:
    """torch.accelerator where it has the memory API (torch >= 2.8), else torch.cuda and the like."""
    return torch.accelerator if hasattr(torch.accelerator, "max_memory_allocated") else getattr(torch, device.type)


def peak_rss_bytes() -> int:
    """The process's peak resident set size (ru_maxrss: kilobytes on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


class _Tally:
    """Bytes by kind, each storage once, on the device or in host memory."""

    def __init__(self, device: torch.device) -> None:
        self.on_accelerator = device.type != "cpu"
        self.device = dict.fromkeys(KINDS[:3], 0)
        self.host = dict.fromkeys(KINDS[:3], 0)
        self.seen: set[tuple[str, int]] = set()

    def add(self, kind: str | None, tensors: Any) -> None:
        """Count `tensors` (a tensor, or lists/dicts of them) as `kind`; None: only mark them seen."""
        for tensor in _tensors(tensors):
            # 0-dim: a step counter, no state (torch's Adam keeps one per parameter on the host
            # unless capturable or fused; counted, 44 B of bncnn's read as "offloaded" on a GPU).
            if tensor.device.type == "meta" or tensor.dim() == 0:
                continue
            storage = tensor.untyped_storage()
            key = (str(tensor.device), storage.data_ptr())
            if key in self.seen or storage.nbytes() == 0:
                continue
            self.seen.add(key)
            if kind is not None:
                where = self.host if self.on_accelerator and tensor.device.type == "cpu" else self.device
                where[kind] += storage.nbytes()


def _tensors(obj: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield _local(obj)
    elif depth < 4 and isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors(value, depth + 1)
    elif depth < 4 and isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors(value, depth + 1)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (FSDP2), the tensor itself otherwise."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


# The ZeRO optimizers' 16-bit parameters: flat (ZeRO-1/2), partitioned (ZeRO-3), host copies (offload).
_ZERO_PARAMETERS = ("bit16_groups_flat", "fp16_partitioned_groups_flat",
                    "param_buffer_of_bit16_for_cpu_offload_groups", "param_groups_fp16_flat_cpu_memory")  # fmt: skip


def _count_holders(tally: _Tally, model: Any, optimizer: Any) -> None:
    """Every tensor of the model states, by kind; DeepSpeed's ZeRO optimizers through their own attributes."""
    # A DeepSpeed engine's ZeRO optimizer (an engine is a module with zero_optimization_stage()).
    zero = getattr(model, "optimizer", None) if callable(getattr(model, "zero_optimization_stage", None)) else None
    params = list(model.parameters())
    if zero is not None:
        # Buckets first, so that gradients copied into them are not taken for model states.
        tally.add(None, [getattr(b, "buffer", None) for b in getattr(zero, "ipg_buckets", {}).values()])
        tally.add(None, [getattr(zero, n, None) for n in ("temp_grad_buffer_for_cpu_offload",
                                                          "temp_grad_buffer_for_gpu_offload")])  # fmt: skip
        for name in _ZERO_PARAMETERS:
            tally.add("parameter_bytes", getattr(zero, name, None))
        tally.add("parameter_bytes", [getattr(p, "ds_tensor", None) for p in params])
    tally.add("parameter_bytes", params)
    inner = torch_optimizer(optimizer)
    masters: list[Any] = []
    if zero is not None:
        masters = list(getattr(zero, "single_partition_of_fp32_groups", None) or [])
        masters += list(getattr(zero, "fp32_partitioned_groups_flat", None) or [])
        tally.add("optimizer_state_bytes", masters)
    if inner is not None:
        tally.add("optimizer_state_bytes", list(inner.state.values()))
        masters += [p for group in inner.param_groups for p in group["params"]]
    tally.add("gradient_bytes", [p.grad for p in _unique(params + masters)])
    if zero is not None:
        for name in ("grads_in_partition", "grad_partitions_flat_buffer", "averaged_gradients",
                     "accumulated_grads_in_cpu"):  # fmt: skip
            tally.add("gradient_bytes", getattr(zero, name, None))


def _unique(tensors: Iterable[Any]) -> list[Any]:
    seen: dict[int, Any] = {}
    for t in tensors:
        seen.setdefault(id(t), t)
    return list(seen.values())
