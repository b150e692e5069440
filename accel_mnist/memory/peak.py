"""The peak allocated bytes of one process on its accelerator, predicted before the run.

The peak is the largest of three moments, each over what is at rest on the device (the data a
device loader holds, the CUDA libraries' workspaces, the model states that outlive a step):

* the forward and backward pass: the activations (activations.py traces them), the gradients
  as the backward pass makes them, autocast's 16-bit copies of the weights, DeepSpeed's reduce
  bucket (`reduce_bucket_size` elements, allocated as the backward pass begins), the
  parameters ZeRO-3 gathers and FSDP unshards;
* the optimizer step: the gradients at their most (model_states.py) and the temporaries of
  torch's multi-tensor Adam (a full-size fp32 list: `_foreach_sqrt` of the second moments);
  the first step also creates Adam's states, which then stay;
* an evaluation batch's forward pass, without gradients.

Each term follows DeepSpeed 0.19's and torch's code and is checked against a suite of one process
per GPU (docs/memory.md; measured: docs/measurements.md#memorypeakpy), so the terms for several
processes (DDP's buckets, gathering and unsharding across ranks) follow the code alone. Three
numbers are fitted, not derived: the workspaces cuBLAS and the allocator keep after the first step
(66 MiB), an allowance for cuDNN's convolution workspace (32 MiB where the model has a convolution)
and ZeRO-3 offload's bytes in flight per element of the largest tensor (10). Not modelled: a
captured step's CUDA-graph pool, which puts the peak above the prediction (plan.py predicts none).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..caller import setting
from ..precision import is_sixteen_bit, weight_bytes
from .model_states import FP32, KINDS, Setup, format_bytes, predict

MIB = 1 << 20
WORKSPACES = 66 * MIB  # measured after the first step beyond the data and states (docs/measurements.md#memorypeakpy)
CONV_WORKSPACE = 32 * MIB  # fitted: cuDNN's convolution workspace, where the model convolves
REDUCE_BUCKET = 500_000_000  # DeepSpeed's reduce_bucket_size default (elements)
MAX_LIVE = 1_000_000_000  # DeepSpeed's stage3_max_live_parameters default (elements)
# A prediction fits when it is at most this share of the memory: room for the prediction's error
# (within 10% on the suite) and what the allocator holds unallocated even with expandable segments.
FIT_SHARE = 0.9
# Without expandable segments (allocator.py) the caching allocator reserves more than it
# allocates once the first optimizer step has put Adam's states into blocks the activations
# freed: the next step's activations no longer find whole blocks. Fitted on one case, which held
# 0.45 of its training activations unallocated (docs/measurements.md#memorypeakpy). With expandable
# segments the family suite's capped runs fitted at FIT_SHARE alone (docs/memory.md).
FRAGMENTATION = 0.5
BATCH_LIMIT = 1 << 20
# Full-size fp32 temporaries of one torch optimizer step (foreach implementation), per parameter.
STEP_TEMPORARIES = {"adam": 1, "adamw": 1, "adadelta": 1, "sgd": 0, "sgd_no_momentum": 0}


@dataclass(frozen=True)
class PeakInputs:
    """What the peak depends on besides the model states' Setup."""

    train_activation_bytes: int
    eval_activation_bytes: int
    data_bytes: int = 0  # what the data loader holds on the device (the whole splits, or nothing)
    average_bytes: int = 0  # ema_decay's average of the weights and the copy it swaps out (training/averaging.py)
    cast_numel: int = 0  # elements of the weights autocast casts (Linear, Conv): its cache while autocast runs
    convolves: bool = False
    optimizer: str = "adam"
    reduce_bucket_size: int = REDUCE_BUCKET
    reduce_buckets: int = 1  # ZeRO-1/2 double their bucket under overlap_comm
    max_live_parameters: int = MAX_LIVE
    traced_batch: int = 1  # the batch the training activations were traced at
    train_activation_fixed: int = 0  # bytes of a training step that do not grow with the batch (a probe's)
    source: str = "trace"  # where the activation terms come from: "trace" (meta device) or "probe" (the GPU)
    fragmentation: float = FRAGMENTATION  # share of the training activations kept for split blocks (0: expandable)

    def at_batch(self, batch: int) -> PeakInputs:
        """The same run at another per-process batch: the training activations scale with it."""
        return replace(self, train_activation_bytes=self.train_activation_bytes * batch // self.traced_batch,
                       traced_batch=batch)  # fmt: skip

    @property
    def train_activations(self) -> int:
        """Activation bytes of one training step at `traced_batch`."""
        return self.train_activation_bytes + self.train_activation_fixed


def phases(numels: Sequence[int], setup: Setup, inputs: PeakInputs) -> dict[str, int]:
    """Bytes on the device at rest and at each moment's peak (the largest is the prediction)."""
    psi, n, w = sum(numels), max(setup.num_processes, 1), weight_bytes(setup.mixed_precision)
    states = predict(numels, setup)
    params, grads, optim = (states[k] for k in KINDS[:3])
    temp = 0 if setup.offload_optimizer else STEP_TEMPORARIES.get(inputs.optimizer, 1) * FP32 * psi // n
    base = inputs.data_bytes + inputs.average_bytes + (WORKSPACES if setup.on_accelerator else 0)
    base += CONV_WORKSPACE if inputs.convolves and setup.on_accelerator else 0
    act, act_eval = inputs.train_activations, inputs.eval_activation_bytes
    rest = params + optim
    if setup.family == "deepspeed":
        bucket = inputs.reduce_bucket_size * w  # ZeRO-3 allocates one, whatever overlap_comm says
        if setup.zero_stage == 3:
            # The reduce bucket lives for the whole run, and the 16-bit gradient partition where the
            # optimizer stays on the device; parameters another rank or the host holds are gathered
            # for the passes, up to max_live_parameters.
            rest += bucket + (0 if setup.offload_optimizer else w * psi // n)
            gathered = w * min(psi, inputs.max_live_parameters) if (n > 1 or setup.offload_param) else 0
            # Offloading, the largest tensor is on the device in four forms at once as its gradient
            # goes to the host: 16-bit parameter, the next one prefetched, 16-bit gradient and its
            # fp32 copy (fitted: 10.2-11.5 bytes an element over the suite's mlps, 10 is this sum).
            in_flight = (3 * w + FP32) * max(numels, default=0) if setup.offload_param else 0
            train = rest + gathered + in_flight + act
            evaluate = rest + gathered + act_eval
            step = params + optim + bucket + grads + temp
        else:
            own_grads = w * psi if setup.zero_stage <= 1 else w * psi // n
            train = rest + inputs.reduce_buckets * bucket + own_grads + act
            evaluate = rest + act_eval
            step = rest + grads + temp
    elif setup.family == "fsdp":
        # NO_WRAP: one unit, so the whole model is unsharded (and its 16-bit gradients) for the passes.
        train = rest + grads + 2 * w * psi + act
        evaluate = rest + w * psi + act_eval
        step = rest + grads + temp
    else:
        cast = 2 * inputs.cast_numel if is_sixteen_bit(setup.mixed_precision) else 0
        buckets = FP32 * psi if n > 1 else 0  # DDP's flat gradient buckets beside .grad
        train = rest + grads + cast + act + buckets
        evaluate = rest + act_eval
        step = rest + grads + temp + buckets
    return {"at_rest": base + rest, "train": base + train, "step": base + step, "evaluate": base + evaluate}


def predict_peak(numels: Sequence[int], setup: Setup, inputs: PeakInputs) -> int:
    """Predicted peak allocated bytes of one process on its accelerator."""
    moments = phases(numels, setup, inputs)
    return max(moments["train"], moments["step"], moments["evaluate"])


def reserved_peak(numels: Sequence[int], setup: Setup, inputs: PeakInputs) -> int:
    """The bytes the allocator must be able to reserve for the predicted peak: the allocated peak and
    `inputs.fragmentation` of the training activations for the blocks they leave split."""
    return predict_peak(numels, setup, inputs) + int(inputs.fragmentation * inputs.train_activations)


def fits(numels: Sequence[int], setup: Setup, inputs: PeakInputs, capacity: int) -> bool:
    """Whether the run's reserved peak fits `capacity` bytes with FIT_SHARE's room."""
    return reserved_peak(numels, setup, inputs) <= FIT_SHARE * capacity


def largest_batch(numels: Sequence[int], setup: Setup, inputs: PeakInputs, capacity: int) -> int:
    """The largest per-process batch whose predicted peak fits `capacity` (0: not even one sample)."""
    low, high = 0, BATCH_LIMIT
    while low < high:
        middle = (low + high + 1) // 2
        if fits(numels, setup, inputs.at_batch(middle), capacity):
            low = middle
        else:
            high = middle - 1
    return low


def _remedy(part: str) -> str:
    """The change that shrinks `part` of a peak (largest_parts' names), spelled as this caller gives settings."""
    return {
        "the evaluation batch": f"a smaller {setting('eval_batch_size')}",
        "the data on the device": f"{setting('data_loader', 'torch')} (the images stay in host memory)",
        "the average of the weights": f"no {setting('ema_decay')} (its fp32 copy of every parameter is whole on each "
        "process)",
        "the model states": "a strategy that shards or offloads them (accel-mnist estimate --fits names them)",
        "the strategy's buffers": "a smaller reduce_bucket_size or stage3_max_live_parameters in the DeepSpeed config",
        "one sample's activations": "a smaller model or 16-bit precision",
    }.get(part, "a GPU with more memory")


def largest_parts(numels: Sequence[int], setup: Setup, inputs: PeakInputs) -> tuple[str, list[tuple[str, int]]]:
    """At a batch of one: the moment whose peak is largest ("the training step" or "the evaluation") and
    its parts, largest first, each (name, bytes). The strategy's buffers are what the moment holds beyond
    the other parts (DeepSpeed's bucket, gathered or unsharded parameters, DDP's buckets, autocast's copies)."""
    one = inputs.at_batch(1)
    moments = phases(numels, setup, one)
    evaluating = moments["evaluate"] > max(moments["train"], moments["step"])
    states = predict(numels, setup)
    kept = [k for k in KINDS[:3] if not (evaluating and k == KINDS[1])]  # an evaluation holds no gradients
    workspaces = (WORKSPACES + (CONV_WORKSPACE if inputs.convolves else 0)) if setup.on_accelerator else 0
    held = {
        "the data on the device": inputs.data_bytes,
        "the average of the weights": inputs.average_bytes,
        "the CUDA workspaces": workspaces,
        "the model states": sum(states[k] for k in kept),
    }
    if evaluating:
        held["the evaluation batch"] = one.eval_activation_bytes
    else:
        held["one sample's activations"] = one.train_activations
    total = moments["evaluate"] if evaluating else max(moments["train"], moments["step"])
    held["the strategy's buffers"] = max(0, total - sum(held.values()))
    parts = sorted(((k, v) for k, v in held.items() if v > 0), key=lambda kv: -kv[1])
    return ("the evaluation" if evaluating else "the training step"), parts


def why_nothing_fits(numels: Sequence[int], setup: Setup, inputs: PeakInputs, room: int) -> str:
    """Why not even a training batch of one fits `room` bytes, in one line: the largest moment, its two
    largest parts with their bytes, and the change that would shrink the largest part that a setting shrinks."""
    moment, parts = largest_parts(numels, setup, inputs)
    said = ", ".join(f"{name} {format_bytes(size)}" for name, size in parts[:2])
    movable = next((name for name, _ in parts if name != "the CUDA workspaces"), "")
    return (f"{moment} needs {format_bytes(reserved_peak(numels, setup, inputs.at_batch(1)))} at a training batch "
            f"of 1 under {setup.label}, over {FIT_SHARE:.0%} of {format_bytes(room)}: mostly {said}; "
            f"try {_remedy(movable)}")  # fmt: skip
