"""A run's memory plan, before `prepare`: its predicted peak (probed on a GPU, else traced) and `batch_size: auto`.

On a GPU the activation terms come from the probe (probe.py), the run's own kernels measured
at three small batches; the meta-device trace runs beside it and is kept as
`trace_peak_allocated_bytes`, with one line where the two are more than TRACE_GAP apart. Where
neither can be trusted the plan says so in one line (`unpredicted`) instead of a number:
FSDP's activation checkpointing (it recomputes what the probe's plain copy keeps), a probe
whose points are not on a line, a model neither can run. On a CPU nothing is predicted (a
run's peak there is the process's resident memory, counted by memory_watch.py).

`batch_size: auto` takes the largest per-process batch whose predicted peak, with room for the
allocator's fragmentation (peak.reserved_peak), fits
peak.FIT_SHARE of what this process's allocator can reach (probe.available), from the
prediction alone: nothing is tried until it stops running out of memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any

import torch
from accelerate import Accelerator
from torch import nn

from ..caller import setting
from ..config import TrainConfig
from ..distributed.strategy import Strategy
from ..errors import UsageError
from ..precision import sixteen_bit_dtype
from .activations import Untraceable
from .model_states import Setup, format_bytes
from .peak import FIT_SHARE, PeakInputs, largest_batch, predict_peak, reserved_peak, why_nothing_fits
from .peak_inputs import TRACE_ERRORS, inputs_for, not_on_meta, probed, short_reason, strategy_inputs
from .probe import Probe, measure, probe_batches

TRACE_GAP = 0.10  # the trace this far from the probe: said in one line, the probe's number used
# A captured step's own pool puts the peak well above the prediction (measured: docs/measurements.md#memoryplanpy).
CAPTURED = ("cannot predict: a captured step (cuda_graph) keeps a memory pool of its own beside the eager "
            "step's, which the prediction does not model")  # fmt: skip


@dataclass(frozen=True)
class PeakPlan:
    """The run's peak prediction: `inputs` (None: not predicted, `unpredicted` says why) and the trace's."""

    inputs: PeakInputs | None = None
    trace: PeakInputs | None = None
    unpredicted: str | None = None
    probe: Probe | None = None
    note: str | None = None  # a line to say: why the trace's number stands in for the probe's

    @property
    def probe_seconds(self) -> float:
        """Seconds the probe took (0 where none ran)."""
        return self.probe.seconds if self.probe is not None else 0.0

    def at_batch(self, batch: int) -> PeakPlan:
        """The plan at another training batch (`batch_size: auto` settles it after the probe)."""
        if self.inputs is None:
            return self
        trace = self.trace.at_batch(batch) if self.trace is not None else None
        return replace(self, inputs=self.inputs.at_batch(batch), trace=trace)

    def refused(self, why: str) -> PeakPlan:
        """The plan with no number, and `why` ("cannot predict: ...") in its place; the trace stays beside it."""
        return replace(self, inputs=None, unpredicted=why)

    def with_data_bytes(self, data_bytes: int, average_bytes: int = 0) -> PeakPlan:
        """The plan with what the data loader really holds on the device, and ema_decay's average beside it."""

        def fix(inputs: PeakInputs | None) -> PeakInputs | None:
            if inputs is None:
                return None
            return replace(inputs, data_bytes=data_bytes, average_bytes=average_bytes)

        return replace(self, inputs=fix(self.inputs), trace=fix(self.trace))

    def predicted(self, numels: list[int], setup: Setup) -> dict[str, Any]:
        """results.json's `memory.predicted` peak fields."""
        peak = predict_peak(numels, setup, self.inputs) if self.inputs is not None else None
        out: dict[str, Any] = {"peak_allocated_bytes": peak,
                               "peak_source": self.inputs.source if self.inputs is not None else None}  # fmt: skip
        if self.trace is not None and self.inputs is not self.trace:
            out["trace_peak_allocated_bytes"] = predict_peak(numels, setup, self.trace)
        if self.unpredicted:
            out["peak_unpredicted"] = self.unpredicted
        return out


def plan_peak(
    accelerator: Accelerator, config: TrainConfig, strategy: Strategy, model: nn.Module,
    input_shape: tuple[int, ...], data_bytes: int, loss: Any, batches: tuple[int, ...] | None = None,
    examples: Callable[[bool], Sequence[torch.Tensor]] | None = None,
) -> PeakPlan:  # fmt: skip
    """The run's plan for `model` before `prepare`; `loss(model, inputs, labels, dtype)`: the run's forward and
    loss. `config.batch_size` may still be 0 (auto): the probe then covers small batches and `at_batch` settles
    it. `batches`: the training batches to probe (default: probe_batches of the config's); `examples(every)`:
    draws of a few training inputs the probe repeats (probe.measure), asked for one draw where the forward runs
    on the meta device (its path does not depend on the values), for every draw where it does not (default:
    zeros)."""
    device = accelerator.device
    if device.type == "cpu":
        return PeakPlan()
    precision = strategy.precision
    plugin = accelerator.state.deepspeed_plugin
    zero = plugin.deepspeed_config.get("zero_optimization", {}) if plugin is not None else None
    batch = config.batch_size or 1
    fsdp = accelerator.state.fsdp_plugin if strategy.kind == "FSDP" else None
    checkpointing = fsdp is not None and getattr(fsdp, "activation_checkpointing", False)
    base = strategy_inputs(model, optimizer=str(config.optimizer), data_bytes=data_bytes, zero=zero)
    # The trace first: it runs on the meta device and holds no GPU memory, and whether it runs says how many
    # draws of images the probe needs.
    trace, why_not_traced, runs_on_meta = None, "", True
    try:
        trace = inputs_for(model, batch_size=batch, eval_batch_size=config.eval_batch_size,
                           mixed_precision=precision, optimizer=str(config.optimizer), data_bytes=data_bytes,
                           input_shape=input_shape, zero=zero, autocast=strategy.copy_precision.autocast)  # fmt: skip
    except Untraceable as exc:  # it ran, and said which layer it cannot model: the probe measures that layer
        why_not_traced = str(exc)
    except TRACE_ERRORS as exc:
        why_not_traced, runs_on_meta = not_on_meta(exc), False
    if checkpointing:
        why = ("cannot predict: FSDP's activation checkpointing recomputes the activations during the backward "
               "pass, which neither the probe nor the trace models")  # fmt: skip
        return PeakPlan(trace=trace, unpredicted=why)
    draws = list(examples(not runs_on_meta)) if examples is not None else []
    probe, why_not_probed = _probe(accelerator, config, strategy, model, input_shape, loss, batches, draws)
    if probe is None:  # the trace's plan, said in one line, else no prediction
        if trace is None:
            return PeakPlan(unpredicted=f"cannot predict: {why_not_probed}, and {why_not_traced}")
        return PeakPlan(inputs=trace, trace=trace, note=f"peak memory predicted from the meta-device trace only, "
                        f"the weaker of the two: {why_not_probed}")  # fmt: skip
    if probe.untrusted:
        return PeakPlan(trace=trace, probe=probe, unpredicted=f"cannot predict: {probe.untrusted}")
    # A forward the meta device cannot run needs real values, and may take another path on another batch.
    note = None
    if not runs_on_meta:
        note = (f"peak memory: the probe measured {len(draws)} draws of example images and kept the largest; "
                f"{why_not_traced}, so a batch may still take a path none of them took")  # fmt: skip
    return PeakPlan(inputs=probed(base, probe, batch, config.eval_batch_size), trace=trace, probe=probe, note=note)


def _probe(
    accelerator: Accelerator, config: TrainConfig, strategy: Strategy, model: nn.Module,
    input_shape: tuple[int, ...], loss: Any, batches: tuple[int, ...] | None, draws: list[torch.Tensor],
) -> tuple[Probe | None, str]:  # fmt: skip
    """The probe of `model` as the prepared model computes (its weights' precision and autocast), or None and
    why it could not measure."""
    rule = strategy.copy_precision  # the weights' precision and autocast, as the prepared model computes
    dtype = sixteen_bit_dtype(rule.weights) if rule.weights else None
    autocast = accelerator.autocast if rule.autocast else nullcontext
    try:
        probe = measure(model, device=accelerator.device, dtype=dtype, input_shape=input_shape,
                        batches=batches or probe_batches(config.batch_size or None),
                        eval_batches=probe_batches(config.eval_batch_size),
                        loss=lambda m, x, y: loss(m, x, y, dtype or torch.float32),
                        autocast=autocast, examples=draws)  # fmt: skip
    except torch.OutOfMemoryError:
        return None, "the probe's copy of the model ran out of GPU memory"
    except TRACE_ERRORS as exc:
        return None, f"the probe failed ({short_reason(exc)})"
    return probe, ""


def trace_gap_line(plan: PeakPlan, numels: list[int], setup: Setup) -> str | None:
    """One line where the trace and the probe disagree by more than TRACE_GAP (None: they agree or one is missing)."""
    if plan.inputs is None or plan.trace is None or plan.inputs.source != "probe":
        return None
    probed_peak, traced_peak = predict_peak(numels, setup, plan.inputs), predict_peak(numels, setup, plan.trace)
    gap = traced_peak / probed_peak - 1
    if abs(gap) <= TRACE_GAP:
        return None
    side = "over" if gap > 0 else "under"
    return (f"peak memory: the meta-device trace is {abs(gap):.0%} {side} the probe for this model "
            f"({format_bytes(traced_peak)} against {format_bytes(probed_peak)}: kernels' own memory it cannot see); "
            "the probe's prediction is used")  # fmt: skip


def settle_auto_batch(
    plan: PeakPlan, numels: list[int], setup: Setup, room: int, samples: int,
    probe_at: Callable[[int], PeakPlan], agreed: Callable[[Callable[[], int]], int], most: int | None = None,
) -> tuple[PeakPlan, int, str]:  # fmt: skip
    """`batch_size: auto` settled from the prediction: the largest batch the first probe's line allows, then
    probed again up to that batch (`probe_at`) twice, so that the line is measured where it is used. `room`:
    the bytes this process may use (probe.available); `samples`: one process's share of the training set;
    `most`: the user's max_batch_size; `agreed(choose)`: every process's `choose()`, the smallest taken (a
    UsageError on one is raised on all), so that all step alike. Returns (the plan, the batch, the line that
    says which batch and why)."""
    batch = agreed(lambda: auto_batch(plan, numels, setup, room, samples, most))
    for _ in range(2):
        again = probe_at(batch)
        closer = agreed(lambda: _closer(again, numels, setup, room, samples, most))  # noqa: B023 (called at once)
        if not closer:
            break
        plan, settled, batch = again, closer == batch, closer
        if settled:
            break
    return plan, batch, auto_line(plan, numels, setup, room, batch, samples, most)


def _closer(plan: PeakPlan, numels: list[int], setup: Setup, room: int, samples: int, most: int | None) -> int:
    """auto_batch on a later probe, 0 where it could not run (out of memory, not on a line): the last answer stands."""
    try:
        return auto_batch(plan, numels, setup, room, samples, most)
    except UsageError:
        return 0


def auto_batch(
    plan: PeakPlan, numels: list[int], setup: Setup, room: int, samples: int, most: int | None = None
) -> int:
    """The largest per-process batch whose predicted peak fits `room` bytes, at most `samples` (one process's
    share of the training set) and `most` (the user's max_batch_size); UsageError where there is no
    prediction or not even one sample fits (the line says what takes the room)."""
    if plan.inputs is None and plan.unpredicted is None:  # on a CPU nothing is predicted
        raise UsageError("batch_size auto needs a GPU: a CPU run's peak memory is not predicted; give a number")
    if plan.inputs is None:
        raise UsageError(f"batch_size auto: {plan.unpredicted}; give a number")
    batch = largest_batch(numels, setup, plan.inputs, room)
    if batch < 1:
        raise UsageError(f"batch_size auto: no batch fits: {why_nothing_fits(numels, setup, plan.inputs, room)}")
    return min(batch, samples, most or samples)


def auto_line(
    plan: PeakPlan, numels: list[int], setup: Setup, room: int, batch: int, samples: int, most: int | None = None
) -> str:
    """The line that says which batch `batch_size: auto` took, and why: the largest that fits, or the bound
    it stopped at (`most`, the user's max_batch_size, or `samples`, one process's share of the training set)."""
    assert plan.inputs is not None
    inputs = plan.inputs.at_batch(batch)
    peak, reserved = predict_peak(numels, setup, inputs), reserved_peak(numels, setup, inputs)
    fits = (f"predicted peak ({format_bytes(peak)}, from the {plan.inputs.source}) with "
            f"{format_bytes(reserved - peak)} for the allocator's fragmentation fits {FIT_SHARE:.0%} of the "
            f"{format_bytes(room)} this process may use under {setup.label}")  # fmt: skip
    if most is not None and batch == most <= samples:
        return f"batch size auto: {batch:,} per process, the {setting('max_batch_size')} asked for (its {fits})"
    if batch == samples:
        return (f"batch size auto: {batch:,} per process, the whole training split (its {samples:,} samples per "
                f"process, one batch a step: more would fit; its {fits})")  # fmt: skip
    return f"batch size auto: {batch:,} per process, the largest whose {fits}"


def split_global_batch(global_batch: int, fits: int, processes: int, samples: int) -> tuple[int, int]:
    """(micro-batch, accumulation) that keep `global_batch` exactly: the largest per-process micro-batch no
    larger than `fits` (what batch_size auto settled) that a whole number of accumulation steps times
    `processes` brings to it. UsageError where it is no multiple of the processes, where one optimizer step
    would need more than `samples` (one process's share of the training set), or where its divisors leave
    micro-batches under half of what fits (a prime global batch would step one sample at a time)."""
    if global_batch % processes:
        nearest = global_batch - global_batch % processes or processes
        raise UsageError(f"global_batch_size {global_batch:,} is not a multiple of the {processes} processes; "
                         f"give one that is, e.g. {nearest:,}")  # fmt: skip
    per_process = global_batch // processes
    if per_process > samples:
        raise UsageError(f"global_batch_size {global_batch:,}: one step would take {per_process:,} samples per "
                         f"process, more than the {samples:,} of its share of the training set")  # fmt: skip
    accumulation = -(-per_process // fits)  # the fewest micro-batches whose size fits
    while per_process % accumulation:
        accumulation += 1
    if 2 * (per_process // accumulation) < fits and accumulation > 1:  # a prime, say: steps of tiny micro-batches
        below, above = fits * (per_process // fits) * processes, fits * -(-per_process // fits) * processes
        raise UsageError(f"global_batch_size {global_batch:,} splits into micro-batches of at most "
                         f"{per_process // accumulation:,} per process where {fits:,} fit; give one with a divisor "
                         f"near {fits:,}, e.g. {below or above:,} or {above:,}")  # fmt: skip
    return per_process // accumulation, accumulation


def keep_global_batch(
    wanted: int | None, fits: int, accumulation: int, processes: int, samples: int,
    agreed: Callable[[Callable[[], tuple[int, int]]], tuple[int, int]],
) -> tuple[int, int, str]:  # fmt: skip
    """(per-process batch, accumulation, the line's part on the global batch) once batch_size auto settled
    `fits`: `wanted` (global_batch_size) kept by `split_global_batch`, as every process agrees (`agreed`);
    without one, the batch that fits and the launch's `accumulation`."""
    if wanted is None:
        return fits, accumulation, f"global batch {global_batch(fits, accumulation, processes)}"
    batch, accumulation = agreed(lambda: split_global_batch(wanted, fits, processes, samples))
    return batch, accumulation, global_batch_line(wanted, batch, accumulation, processes, fits)


def global_batch_line(global_batch: int, batch: int, accumulation: int, processes: int, fits: int) -> str:
    """The line that says how `global_batch_size` is kept: its micro-batch, the accumulation, and the fit."""
    if accumulation == 1:
        largest = "it fits in one pass"
    elif batch == fits:
        largest = "the largest that fits"
    else:
        largest = f"the largest that divides it of the {fits:,} that fit"
    return (
        f"global batch {global_batch:,} as asked: {batch:,} per process x {accumulation} accumulation x "
        f"{processes} process{'es' * (processes > 1)} ({batch:,}: {largest})"
    )


def planned_data_bytes(config: TrainConfig, splits: list[Any]) -> int:
    """What the device loader would hold of `splits` (its images and int64 labels), before it is built."""
    if config.data_loader == "torch":
        return 0
    held = all(isinstance(getattr(s, "images", None), torch.Tensor) for s in splits)
    # The device loader normalises the images once into fp32 where that fits (data/device_loader.py).
    return sum(4 * s.images.numel() + 8 * s.labels.numel() for s in splits) if held else 0


def global_batch(batch: int, accumulation: int, processes: int) -> str:
    """'5,473 (5,473 x 1 accumulation x 1 process)'."""
    total = batch * accumulation * processes
    return f"{total:,} ({batch:,} x {accumulation} accumulation x {processes} process{'es' * (processes > 1)})"
