"""The estimate's core: what each process holds under every strategy, and its peak, for a model
built on the meta device (`accel-mnist estimate`, report/estimate_command.py, prints it).

The model states are model_states.predict's and the peak peak.predict_peak's, the code that
also fills `predicted` in a run's results.json: for the same model, strategy, processes,
precision, optimizer and batch the two agree.
"""

from __future__ import annotations

from typing import Any

from ..errors import UsageError
from .model_states import KINDS, OPTIMIZER_STATES, PERSISTENCE_THRESHOLD, STRATEGIES, Setup, predict
from .peak import PeakInputs, fits, largest_batch, predict_peak

# What the device loader holds for MNIST-sized data: 70,000 images as fp32 (normalised once) and int64 labels.
MNIST_DEVICE_BYTES = 70_000 * (28 * 28 * 4 + 8)


def meta_model(model: str, mlp_hidden: str | None = None, device: str = "meta") -> Any:
    """A built-in model, or `package.module:callable`'s, built on the meta device (no memory, no weights), or on
    `device` for a probe."""
    import torch

    from ..models import build_model, model_from_path

    with torch.device(device):
        return model_from_path(model) if ":" in model else build_model(model, mlp_hidden)


def model_numels(model: str, mlp_hidden: str | None = None) -> list[int]:
    """Elements of each trainable parameter tensor of a model (built on the meta device: no memory)."""
    return [p.numel() for p in meta_model(model, mlp_hidden).parameters() if p.requires_grad]


def estimate(
    numels: list[int], *, num_processes: int = 1, num_nodes: int = 1, mixed_precision: str = "fp16",
    optimizer: str = "adam", momentum: float = 0.9, on_accelerator: bool = True,
    persistence_threshold: int = PERSISTENCE_THRESHOLD, strategies: list[str] | None = None,
    peak: PeakInputs | None = None, capacity: int | None = None, sharded_peak: PeakInputs | None = None,
) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Per strategy: the bytes per process by kind, on the device in all, and in host memory per node;
    given `peak`, the predicted peak, and given `capacity` too, whether it fits and the largest batch that does.
    `sharded_peak`: the inputs for DeepSpeed and FSDP where they differ (a probe in their 16-bit weights)."""
    if num_processes < 1 or num_nodes < 1 or num_processes % num_nodes:
        raise UsageError(f"--num-processes {num_processes} must be a positive multiple of --num-nodes {num_nodes}")
    name = "sgd_no_momentum" if optimizer == "sgd" and not momentum else optimizer
    out = {}
    for strategy in strategies or list(STRATEGIES):
        options = STRATEGIES[strategy]
        # Accelerate gives DeepSpeed's offload a CPU Adam, whatever the torch optimizer was.
        states = OPTIMIZER_STATES["adam"] if options.get("offload_optimizer") else OPTIMIZER_STATES[name]
        setup = Setup(num_processes=num_processes, mixed_precision=mixed_precision, optimizer_states=states,
                      on_accelerator=on_accelerator, persistence_threshold=persistence_threshold,
                      **options)  # fmt: skip
        kinds = predict(numels, setup)
        out[strategy] = {"label": setup.label, **kinds, "device_bytes": sum(kinds[k] for k in KINDS[:3]),
                         "host_bytes_per_node": kinds["offloaded_bytes"] * (num_processes // num_nodes)}  # fmt: skip
        inputs = sharded_peak if sharded_peak is not None and setup.family != "replicated" else peak
        if inputs is not None and on_accelerator:
            peak_bytes = predict_peak(numels, setup, inputs)
            out[strategy]["peak_allocated_bytes"] = peak_bytes
            if capacity is not None:
                out[strategy]["fits"] = fits(numels, setup, inputs, capacity)
                out[strategy]["largest_batch"] = largest_batch(numels, setup, inputs, capacity)
    return out


def trace_inputs(module: Any, *, mixed_precision: str, **common: Any) -> tuple[PeakInputs, PeakInputs]:
    """The peak's inputs traced on the meta device as the estimate predicts without a GPU: (autocast beside
    fp32 weights, for one process and DDP; 16-bit weights, for DeepSpeed and FSDP), the same twice in fp32.
    `common`: inputs_for's other arguments. Raises what inputs_for raises (Untraceable among them)."""
    from .peak_inputs import inputs_for

    replicated = inputs_for(module, mixed_precision=mixed_precision, **common, autocast=True)
    if mixed_precision == "no":
        return replicated, replicated
    return replicated, inputs_for(module, mixed_precision=mixed_precision, **common)


def probe_inputs(
    module: Any, *, batch_size: int, eval_batch_size: int, mixed_precision: str, optimizer: str, data_bytes: int,
    sharded: bool, up_to: int | None = None,
) -> PeakInputs:  # fmt: skip
    """The peak's inputs with the activations measured on the visible GPU (probe.py), as a run of that
    precision computes: 16-bit weights under DeepSpeed and FSDP (`sharded`), else fp32 under autocast.
    `up_to`: probe batches up to this one (default: up to `batch_size`, at most probe.PROBE_LIMIT)."""
    from contextlib import nullcontext

    import torch
    import torch.nn.functional as F

    from ..model_output import logits_of
    from .peak_inputs import COMPUTE_DTYPES, probed, strategy_inputs
    from .probe import measure, probe_batches

    compute = COMPUTE_DTYPES.get(mixed_precision)
    dtype = compute if sharded else None
    device = torch.device("cuda", torch.cuda.current_device())

    def autocast() -> Any:
        return torch.autocast("cuda", dtype=compute) if compute is not None and not sharded else nullcontext()

    def loss(model: Any, inputs: Any, labels: Any) -> Any:
        return F.cross_entropy(logits_of(model(inputs.to(dtype or torch.float32))).float(), labels)

    probe = measure(module, device=device, dtype=dtype, input_shape=(1, 28, 28), loss=loss, autocast=autocast,
                    batches=probe_batches(up_to, limit=up_to) if up_to else probe_batches(batch_size),
                    eval_batches=probe_batches(eval_batch_size))  # fmt: skip
    if probe.untrusted:
        raise UsageError(f"--probe: cannot predict: {probe.untrusted}")
    base = strategy_inputs(module, optimizer=optimizer, data_bytes=data_bytes)
    return probed(base, probe, batch_size, eval_batch_size)
