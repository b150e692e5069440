"""What each process should hold in model states: parameters, gradients and optimizer states.

The ZeRO paper's accounting (Rajbhandari et al. 2020, sec. 3 and 5): for Psi parameters on N
processes, mixed-precision Adam holds 2 Psi bytes of 16-bit parameters, 2 Psi of 16-bit
gradients and K Psi = 12 Psi of fp32 master copy, momentum and variance; ZeRO-1 divides the
optimizer states by N, ZeRO-2 the gradients too, ZeRO-3 the parameters too. Here the same
count is made for the precision a strategy really keeps, together with what DeepSpeed 0.19
does besides the paper, each seen in fp32 on CPUs (docs/measurements.md#memorymodel_statespy;
the offload and FSDP accounting follows DeepSpeed's and torch's code and is checked by the gpu
tests; docs/strategies.md#what-each-process-holds):

* The fp32 master partition is a copy even when training in fp32 (the paper assumes fp16):
  ZeRO-1/2 clone it, and ZeRO-3's test for sharing the parameters' storage compares a
  torch.device with a string and so never shares it.
* Gradients at their most: the full gradients at the end of the backward pass where a stage
  does not partition them (DDP, ZeRO-1), and at the optimizer step the fp32 copy of this
  process's gradient partition that DeepSpeed hands its optimizer (ZeRO-1/2), besides, under
  ZeRO-3, the gradient partition buffer it keeps for the whole run.
* ZeRO-3 keeps parameters of up to `stage3_param_persistence_threshold` elements (1e5 by
  default) whole on every process.

Communication buckets, activations and the allocator's slack are not model states: they are
the peak's overhead above these numbers (README.md#what-a-strategy-costs-in-memory).
Pure Python, no torch: `accel-mnist estimate` and a run's `predicted` both come from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..precision import weight_bytes

KINDS = ("parameter_bytes", "gradient_bytes", "optimizer_state_bytes", "offloaded_bytes")
NAMES = ("parameters", "gradients", "optimizer states", "offloaded")
FP32 = 4
PERSISTENCE_THRESHOLD = 100_000  # DeepSpeed's stage3_param_persistence_threshold default

# Each strategy as a launch with one of accelerate_configs/ sets it up.
STRATEGIES: dict[str, dict[str, Any]] = {
    "ddp": {"family": "replicated"},
    "zero1": {"family": "deepspeed", "zero_stage": 1},
    "zero2": {"family": "deepspeed", "zero_stage": 2},
    "zero3": {"family": "deepspeed", "zero_stage": 3},
    "zero2_offload": {"family": "deepspeed", "zero_stage": 2, "offload_optimizer": True},
    "zero3_offload": {"family": "deepspeed", "zero_stage": 3, "offload_optimizer": True, "offload_param": True},
    "fsdp": {"family": "fsdp"},
    "fsdp_offload": {"family": "fsdp", "offload_param": True},
}
# fp32 state tensors per parameter that each optimizer keeps (torch's; DeepSpeed's CPU Adam alike).
OPTIMIZER_STATES = {"adam": 2, "adamw": 2, "adadelta": 2, "sgd": 1, "sgd_no_momentum": 0}


@dataclass(frozen=True)
class Setup:
    """A strategy as the prediction needs it.

    `family`: "replicated" (one process, DDP), "deepspeed" or "fsdp". `on_accelerator`: the
    processes train on a GPU (or another accelerator), so that offloading moves states to the
    host; on a CPU everything lives in the same memory and nothing counts as offloaded.
    """

    family: str = "replicated"
    num_processes: int = 1
    zero_stage: int = 0
    mixed_precision: str = "no"
    offload_optimizer: bool = False
    offload_param: bool = False
    optimizer_states: int = 2
    on_accelerator: bool = True
    persistence_threshold: int = PERSISTENCE_THRESHOLD

    @property
    def label(self) -> str:
        """'DDP', 'ZeRO-2 + offload', 'FSDP' ... for tables."""
        if self.family == "deepspeed":
            moved = (("optimizer", self.offload_optimizer), ("params", self.offload_param))
            offload = [name for name, on in moved if on]
            return f"ZeRO-{self.zero_stage}" + (f" + offload ({', '.join(offload)})" if offload else "")
        if self.family == "fsdp":
            return "FSDP" + (" + offload" if self.offload_param else "")
        return "DDP" if self.num_processes > 1 else "one process"


def average_bytes(numels: Sequence[int], weight_size: int = FP32) -> int:
    """Device bytes per process of ema_decay's average of the weights (training/averaging.py): its fp32 copy of
    each parameter for the whole run, and the parameters' own copy (`weight_size` bytes an element) while the
    average stands in for them at an evaluation, counted throughout as a bound. Whole on every process."""
    return sum(numels) * (FP32 + weight_size)


def predict(numels: Sequence[int], setup: Setup) -> dict[str, int]:
    """Bytes per process by kind (KINDS) for trainable parameter tensors of `numels` elements.

    Device kinds count what lives on the device; `offloaded_bytes` what the strategy keeps in
    host memory instead (every kind together).
    """
    psi = sum(numels)
    n = max(setup.num_processes, 1)
    states = setup.optimizer_states * FP32
    # Kind -> (bytes on the device, bytes in host memory).
    if setup.family == "deepspeed":
        kinds = _zero_3(numels, setup) if setup.zero_stage == 3 else _zero_1_2(psi, setup)
    elif setup.family == "fsdp":
        # Flat fp32 shards are both the parameters and the optimizer's; mixed precision casts
        # them for the forward and backward passes only. Offload keeps all three on the host.
        shard = {"parameter_bytes": FP32 * psi / n, "gradient_bytes": FP32 * psi / n,
                 "optimizer_state_bytes": states * psi / n}  # fmt: skip
        kinds = {k: (0.0, v) if setup.offload_param else (v, 0.0) for k, v in shard.items()}
    else:
        # Autocast keeps fp32 weights: they are the master copy as well.
        kinds = {"parameter_bytes": (FP32 * psi, 0.0), "gradient_bytes": (FP32 * psi, 0.0),
                 "optimizer_state_bytes": (states * psi, 0.0)}  # fmt: skip
    if not setup.on_accelerator:  # one memory: "offloaded" states stay where they were counted
        kinds = {k: (device + host, 0.0) for k, (device, host) in kinds.items()}
    out = {k: round(kinds[k][0]) for k in KINDS[:3]}
    out["offloaded_bytes"] = round(sum(host for _, host in kinds.values()))
    return out


def _zero_1_2(psi: int, setup: Setup) -> dict[str, tuple[float, float]]:
    n, w = max(setup.num_processes, 1), weight_bytes(setup.mixed_precision)
    states = setup.optimizer_states * FP32
    # The fp32 master partition is a copy in either precision (stage_1_and_2.py clones it).
    optimizer = (FP32 + states) * psi / n
    # At the step: the fp32 copy of this process's gradient partition. ZeRO-1 held every
    # gradient at the end of the backward pass before reducing them.
    at_step = FP32 * psi / n
    gradients = max(w * psi, at_step) if setup.zero_stage <= 1 else at_step
    if not setup.offload_optimizer:
        return {"parameter_bytes": (w * psi, 0.0), "gradient_bytes": (gradients, 0.0),
                "optimizer_state_bytes": (optimizer, 0.0)}  # fmt: skip
    # Offload: master, states and the fp32 gradient partition live on the host, beside a
    # 16-bit staging copy of the parameter partition; ZeRO-1 still holds the full gradients.
    device_gradients = w * psi if setup.zero_stage <= 1 else 0.0
    return {"parameter_bytes": (w * psi, w * psi / n), "gradient_bytes": (device_gradients, at_step),
            "optimizer_state_bytes": (0.0, optimizer)}  # fmt: skip


def _zero_3(numels: Sequence[int], setup: Setup) -> dict[str, tuple[float, float]]:
    n, w = max(setup.num_processes, 1), weight_bytes(setup.mixed_precision)
    psi = sum(numels)
    states = setup.optimizer_states * FP32
    # Small parameters stay whole on every process, besides their partition (which, on one
    # process, is the whole parameter and shares its storage).
    persistent = sum(k for k in numels if k <= setup.persistence_threshold) if n > 1 else 0
    partition = w * psi / n
    optimizer = (FP32 + states) * psi / n
    # The gradient partition buffer (in the parameters' precision) and, at the step, the
    # optimizer's fp32 gradient: a flattened copy of it.
    gradients = (w + FP32) * psi / n
    params = (w * persistent + (0.0 if setup.offload_param else partition), partition if setup.offload_param else 0.0)
    if setup.offload_optimizer:
        return {"parameter_bytes": params, "gradient_bytes": (0.0, gradients),
                "optimizer_state_bytes": (0.0, optimizer)}  # fmt: skip
    return {"parameter_bytes": params, "gradient_bytes": (gradients, 0.0), "optimizer_state_bytes": (optimizer, 0.0)}


def summary_line(memory: dict[str, Any]) -> str:
    """results.json's `memory` in one line: the model states of the process holding most,
    measured/predicted by kind, and the largest peak of any process (allocated; RSS on CPUs)."""
    rows, predicted = memory["per_process"], memory["predicted"]
    largest = max(rows, key=lambda r: sum(r[k] for k in KINDS))
    parts = ", ".join(
        f"{name} {format_bytes(largest[k])}/{format_bytes(predicted[k])}" for k, name in zip(KINDS, NAMES, strict=True)
    )
    allocated = [r["peak_allocated_bytes"] for r in rows if r["peak_allocated_bytes"] is not None]
    rss = [r["peak_rss_bytes"] for r in rows if r["peak_rss_bytes"] is not None]
    expected_peak, source = predicted.get("peak_allocated_bytes"), predicted.get("peak_source")
    beside = (
        f" ({format_bytes(expected_peak)} predicted{f' by the {source}' if source else ''})" if expected_peak else ""
    )
    if not expected_peak and predicted.get("peak_unpredicted"):
        beside = f" ({predicted['peak_unpredicted']})"
    peak = (
        f"peak {format_bytes(max(allocated))} allocated" + beside
        if allocated
        else f"peak RSS {format_bytes(max(rss, default=None))}"
    )
    of = f" (rank {largest['rank']}, the largest of {len(rows)})" if len(rows) > 1 else ""
    measured, expected = (format_bytes(sum(r[k] for k in KINDS)) for r in (largest, predicted))
    return (
        f"model states per process{of}: {measured} measured, {expected} predicted (measured/predicted: {parts}); {peak}"
    )


def format_bytes(value: int | None) -> str:
    """'28.4 MiB', '1.2 GiB', '1023 MiB', '0 B'; '-' for None: three significant figures, and whole units
    from 100 on (never '1.02e+03 MiB')."""
    if value is None:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(value) >= scale:
            scaled = value / scale
            return f"{scaled:.0f} {unit}" if abs(scaled) >= 100 else f"{scaled:.3g} {unit}"
    return f"{value} B"
