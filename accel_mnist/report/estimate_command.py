"""`accel-mnist estimate`: what each process holds under every strategy, and its peak, before any run.

    accel-mnist estimate --model mlp --mlp-hidden 4096,4096,4096,4096,4096,4096,4096,4096
    accel-mnist estimate --model bncnn --batch-size 8192 --fits 8e9
    accel-mnist estimate --model mypackage.models:build --fits        # a model of your own; the visible GPU
    accel-mnist estimate --parameters 1.2e9 --num-processes 16 --num-nodes 2 --json

The numbers are memory/estimate.py's, the code that also fills `predicted` in a run's
results.json. `--fits` answers which strategies fit a GPU and
the largest batch per process each could take.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import Any

from ..errors import UsageError
from ..memory.activations import Untraceable
from ..memory.estimate import MNIST_DEVICE_BYTES, estimate, meta_model, probe_inputs, trace_inputs
from ..memory.model_states import KINDS, PERSISTENCE_THRESHOLD, STRATEGIES, average_bytes, format_bytes
from ..memory.peak import PeakInputs
from ..memory.peak_inputs import TRACE_ERRORS, not_on_meta
from .tables import text_table

PRECISIONS = ("no", "fp16", "bf16")


def _gib(value: int) -> str:
    if value == 0:
        return "0"
    return f"{value / (1 << 30):.3f}" if value >= 1 << 27 else f"{value / (1 << 20):.1f} Mi"


def table(rows: dict[str, dict[str, Any]]) -> str:
    """The estimate as a text table (GiB, or MiB where marked 'Mi')."""
    header: tuple[str, ...] = ("strategy", "", "parameters", "gradients", "optimizer states", "on device",
                               "offloaded", "host/node")  # fmt: skip
    first = next(iter(rows.values()), {})
    header += ("peak",) * ("peak_allocated_bytes" in first) + ("fits", "largest batch") * ("fits" in first)
    lines = [header]
    for name, row in rows.items():
        cells = [name, row["label"], *(_gib(row[k]) for k in (*KINDS[:3], "device_bytes", "offloaded_bytes",
                                                              "host_bytes_per_node"))]  # fmt: skip
        if "peak_allocated_bytes" in row:
            cells.append(_gib(row["peak_allocated_bytes"]))
        if "fits" in row:
            cells += ["yes" if row["fits"] else "no", f"{row['largest_batch']:,}"]
        lines.append(tuple(cells))
    return text_table(lines, left=2)


def gpu_capacity(text: str) -> int:
    """--fits's bytes: a number (8e9, 80GiB-style suffixes not taken), or 'gpu' for what this process's allocator
    can reach on the visible GPU (memory/probe.available: free memory, within a per-process fraction where one is
    set), the same room `--batch-size auto` fills."""
    if text == "gpu":
        import torch

        from ..memory.probe import available

        if not torch.cuda.is_available():
            raise UsageError("--fits: no GPU is visible here; give the GPU's memory in bytes, e.g. --fits 80e9")
        return available(torch.device("cuda", torch.cuda.current_device()))
    value = _count(text, "--fits", "a number of bytes (e.g. 80e9)")
    return value


def _count(text: str, flag: str = "--parameters", what: str = "a number of parameters (e.g. 1.2e9)") -> int:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{flag}: expected {what}, got {text!r}") from None
    if not value >= 1 or value != value or value == float("inf"):
        raise UsageError(f"{flag}: must be >= 1, got {text!r}")
    return int(value)


def _model_and_peak(
    args: argparse.Namespace,
) -> tuple[list[int], str, PeakInputs | None, int | None, PeakInputs | None]:
    """The parameter tensors' sizes, their description, the peak's inputs, --fits's bytes (None: not asked) and,
    probing, the inputs of DeepSpeed and FSDP (their 16-bit weights)."""
    if args.batch_size < 1 or args.eval_batch_size < 1:
        raise UsageError("--batch-size and --eval-batch-size must be >= 1")
    if args.parameters is not None:
        if args.fits is not None:
            raise UsageError("--fits needs --model: the peak depends on the model's activations, not only its size")
        return [_count(args.parameters)], "parameters (one tensor: no ZeRO-3 persistent ones)", None, None, None
    probing = args.probe or args.fits == "gpu"  # the visible GPU: measured there
    if probing and args.cpu:
        raise UsageError("--probe measures on a GPU; --cpu asks for CPU processes")
    if probing:
        return _probed(args, "--probe" if args.probe else "--fits")
    module = meta_model(args.model, args.mlp_hidden)
    numels = [p.numel() for p in module.parameters() if p.requires_grad]
    what = f"parameters ({args.model}" + (f" {args.mlp_hidden}" if args.mlp_hidden else "") + ")"
    if args.cpu:
        return numels, what, None, None, None
    common = {"batch_size": args.batch_size, "eval_batch_size": args.eval_batch_size,
              "mixed_precision": args.mixed_precision, "optimizer": args.optimizer,
              "data_bytes": MNIST_DEVICE_BYTES if args.data_loader == "device" else 0}  # fmt: skip
    capacity = gpu_capacity(args.fits) if args.fits is not None else None
    try:
        peak, sharded = trace_inputs(module, **common)
    except Untraceable as exc:  # no number that may be under: the line says why, and --fits names no batch
        why = str(exc)
    except TRACE_ERRORS as exc:  # a value read, a custom kernel with no fake implementation: the same
        why = not_on_meta(exc)
    else:
        return numels, what, peak, capacity, sharded
    print(f"peak: not predicted: {why}; `--probe` measures it on a GPU", file=sys.stderr)
    return numels, what, None, capacity, None


def _probed(
    args: argparse.Namespace, flag: str, up_to: int | None = None
) -> tuple[list[int], str, PeakInputs, int | None, PeakInputs]:
    """_model_and_peak's answer with the activations measured on the visible GPU (memory/probe.py), at batches up
    to `up_to` where given."""
    import torch

    if not torch.cuda.is_available():
        hint = "give the GPU's memory in bytes, e.g. --fits 80e9" if flag == "--fits" else "leave --probe out"
        raise UsageError(f"{flag}: no GPU is visible here; {hint} (the estimate then traces on the meta device)")
    module = meta_model(args.model, args.mlp_hidden, device="cpu")
    numels = [p.numel() for p in module.parameters() if p.requires_grad]
    what = f"parameters ({args.model}" + (f" {args.mlp_hidden}" if args.mlp_hidden else "") + "; activations probed)"
    common = {"batch_size": args.batch_size, "eval_batch_size": args.eval_batch_size,
              "mixed_precision": args.mixed_precision, "optimizer": args.optimizer,
              "data_bytes": MNIST_DEVICE_BYTES if args.data_loader == "device" else 0, "up_to": up_to}  # fmt: skip
    try:
        peak = probe_inputs(module, sharded=False, **common)
        sharded = probe_inputs(module, sharded=True, **common) if args.mixed_precision != "no" else peak
    except torch.OutOfMemoryError:
        raise UsageError("--probe: a copy of the model at these batches does not fit the visible GPU") from None
    return numels, what, peak, gpu_capacity(args.fits) if args.fits is not None else None, sharded


def _averaged_strategies(args: argparse.Namespace, strategies: list[str] | None) -> list[str] | None:
    """The strategies to estimate: with --ema-decay, those that keep the parameters whole on each process (ZeRO-3
    and FSDP refuse ema_decay, as a run does: distributed/option_rules.py), said on stderr."""
    if args.ema_decay is None:
        return strategies
    if not 0.0 < args.ema_decay < 1.0:
        raise UsageError(f"--ema-decay: must be in (0, 1), got {args.ema_decay}")
    asked = strategies or list(STRATEGIES)
    refused = [n for n in asked if STRATEGIES[n].get("zero_stage") == 3 or STRATEGIES[n]["family"] == "fsdp"]
    kept = [n for n in asked if n not in refused]
    if not kept:
        verb = "shards" if len(refused) == 1 else "shard"
        raise UsageError(f"--ema-decay: {', '.join(refused)} {verb} the parameters, and the average needs them whole")
    if refused:
        print(f"--ema-decay: {', '.join(refused)} left out: they shard the parameters, and a run refuses the "
              "average there", file=sys.stderr)  # fmt: skip
    return kept


def _with_average(args: argparse.Namespace, numels: list[int], peak: PeakInputs | None) -> PeakInputs | None:
    """The peak's inputs with --ema-decay's average on each process (the fp32 weights a run builds it from)."""
    if peak is None or args.ema_decay is None:
        return peak
    return replace(peak, average_bytes=average_bytes(numels))


def _estimate(args: argparse.Namespace) -> int:
    numels, what, peak, capacity, sharded_peak = _model_and_peak(args)
    strategies = args.strategy.split(",") if args.strategy else None
    unknown = sorted(set(strategies or []) - set(STRATEGIES))
    if unknown:
        raise UsageError(f"--strategy {','.join(unknown)}: not one of {', '.join(STRATEGIES)}")
    strategies = _averaged_strategies(args, strategies)
    peak, sharded_peak = _with_average(args, numels, peak), _with_average(args, numels, sharded_peak)
    common = {"num_processes": args.num_processes, "num_nodes": args.num_nodes,
              "mixed_precision": args.mixed_precision, "optimizer": args.optimizer, "momentum": args.momentum,
              "on_accelerator": not args.cpu, "persistence_threshold": args.persistence_threshold,
              "strategies": strategies, "capacity": capacity}  # fmt: skip
    rows = estimate(numels, peak=peak, sharded_peak=sharded_peak, **common)
    if capacity is not None and peak is not None and peak.source == "probe":
        # The largest batches were extrapolated from small ones (a GRU's by 64 times, 10% under): probe again up
        # to the largest named, twice, as batch_size auto does, so that each is measured, not extrapolated.
        for _ in range(2):
            top = max((row["largest_batch"] for row in rows.values()), default=0)
            if top <= max(args.batch_size, 1):
                break
            try:
                *_, peak, _, sharded_peak = _probed(args, "--fits", up_to=top)
            except UsageError as exc:  # no copy fits at that batch, or its points bend: the last answer stands
                print(f"the largest batches are extrapolated from smaller ones: at batch {top}, {exc}", file=sys.stderr)
                break
            peak, sharded_peak = _with_average(args, numels, peak), _with_average(args, numels, sharded_peak)
            rows = estimate(numels, peak=peak, sharded_peak=sharded_peak, **common)
    if args.json:
        facts = {"num_parameters": sum(numels), "num_processes": args.num_processes, "num_nodes": args.num_nodes,
                 "mixed_precision": args.mixed_precision, "optimizer": args.optimizer, "on_accelerator": not args.cpu,
                 "batch_size": args.batch_size, "eval_batch_size": args.eval_batch_size,
                 "capacity_bytes": capacity, "ema_decay": args.ema_decay}  # fmt: skip
        print(json.dumps({**facts, "per_process": rows}, indent=2, sort_keys=True))
        return 0
    peak_column = f", then the peak allocated on the GPU at batch {args.batch_size}" if peak is not None else ""
    print(f"{sum(numels):,} {what}; {args.num_processes} process(es) on {args.num_nodes} node(s), "
          f"{args.mixed_precision}, {args.optimizer}; bytes per process in GiB, host memory per node"
          f"{peak_column}")  # fmt: skip
    print(table(rows))
    if args.ema_decay is not None:  # beside the model states, whole on every process
        where = "counted in each peak" if peak is not None else "not in the columns above"
        print(f"ema_decay's average of the weights: {format_bytes(average_bytes(numels))} per process more on the "
              f"device ({where})")  # fmt: skip
    if capacity is not None and peak is None:
        print(f"fits in {format_bytes(capacity)}: not answered, no peak is predicted for this model (the line above)")
    elif capacity is not None:
        fitting = [name for name, row in rows.items() if row["fits"]]
        print(f"fits in {format_bytes(capacity)} (a peak of at most 90% of it) at batch {args.batch_size}: "
              + (", ".join(fitting) if fitting else "none; the largest batch column says what would"))  # fmt: skip
    return 0


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add `estimate` to the CLI's subparsers (handler: args.handler)."""
    parser = subparsers.add_parser(
        "estimate", help="model states and the peak per process under DDP, ZeRO-1/2/3, offload and FSDP",
        description="Parameters, gradients and optimizer states (fp32 master copies included) that each process "
        "holds for a model under every strategy, by the ZeRO paper's accounting and DeepSpeed's own copies, and the "
        "peak allocated on the GPU (activations traced on the meta device, DeepSpeed's buckets, workspaces); the same "
        "numbers as `predicted` in a run's results.json. --fits: which strategies fit a GPU, the largest batch each.",
    )  # fmt: skip
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--model",
        default="mlp",
        help="a built-in model, or package.module:callable returning your nn.Module (default: mlp)",
    )
    which.add_argument("--parameters", metavar="N", help="a parameter count instead of a model, e.g. 1.2e9")
    parser.add_argument("--mlp-hidden", default=None, metavar="W,W,...", help="the mlp's hidden widths")
    parser.add_argument("--num-processes", type=int, default=1, help="processes in all, over every node (default 1)")
    parser.add_argument("--num-nodes", type=int, default=1, help="machines (default 1)")
    parser.add_argument("--mixed-precision", choices=PRECISIONS, default="fp16",
                        help="the launch's precision (default fp16, as accelerate_configs/zero*.yaml)")  # fmt: skip
    parser.add_argument("--optimizer", choices=("adam", "adamw", "sgd", "adadelta"), default="adam")
    parser.add_argument("--momentum", type=float, default=0.9, help="sgd's momentum (0: no state)")
    parser.add_argument("--strategy", default=None, help=f"comma list of {','.join(STRATEGIES)} (default: all)")
    parser.add_argument("--cpu", action="store_true", help="processes on CPUs: host memory is their memory")
    parser.add_argument("--persistence-threshold", type=int, default=PERSISTENCE_THRESHOLD,
                        help="ZeRO-3's stage3_param_persistence_threshold (default 1e5)")  # fmt: skip
    parser.add_argument("--batch-size", type=int, default=64, help="training batch per process (default 64)")
    parser.add_argument("--eval-batch-size", type=int, default=1000, help="evaluation batch per process")
    parser.add_argument(
        "--data-loader",
        choices=("device", "torch"),
        default="device",
        help="device: the whole MNIST-sized split on the GPU (the default on a GPU that holds it)",
    )
    parser.add_argument("--fits", nargs="?", const="gpu", metavar="BYTES",
                        help="which strategies fit a GPU of BYTES (default: the visible GPU), and each one's "
                        "largest batch per process")  # fmt: skip
    parser.add_argument("--probe", action="store_true",
                        help="measure the activations on the visible GPU (a copy of the model at three small "
                        "batches) instead of tracing them on the meta device; --fits without BYTES probes "
                        "too")  # fmt: skip
    parser.add_argument("--ema-decay", type=float, default=None, metavar="D",
                        help="the run's ema_decay: its average of the weights counts in each peak (whole on every "
                        "process; ZeRO-3 and FSDP refuse it)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.set_defaults(handler=_estimate)
    return parser
