"""`accel-mnist estimate`: the model states each process holds under every strategy, before any run.

    accel-mnist estimate --model mlp --mlp-hidden 4096,4096,4096,4096,4096,4096,4096,4096
    accel-mnist estimate --parameters 1.2e9 --num-processes 16 --num-nodes 2 --json

The numbers are those of model_states.predict, the code that also fills `predicted` in a run's
results.json: for the same model, strategy, processes, precision and optimizer the two agree.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..distributed.model_states import KINDS, OPTIMIZER_STATES, PERSISTENCE_THRESHOLD, Setup, predict
from ..errors import UsageError
from .tables import text_table

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
PRECISIONS = ("no", "fp16", "bf16")


def model_numels(model: str, mlp_hidden: str | None = None) -> list[int]:
    """Elements of each trainable parameter tensor of a built-in model (built on the meta device: no memory)."""
    import torch

    from ..models import build_model

    with torch.device("meta"):
        module = build_model(model, mlp_hidden)
    return [p.numel() for p in module.parameters() if p.requires_grad]


def estimate(
    numels: list[int], *, num_processes: int = 1, num_nodes: int = 1, mixed_precision: str = "fp16",
    optimizer: str = "adam", momentum: float = 0.9, on_accelerator: bool = True,
    persistence_threshold: int = PERSISTENCE_THRESHOLD, strategies: list[str] | None = None,
) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Per strategy: the bytes per process by kind, on the device in all, and in host memory per node."""
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
    return out


def _gib(value: int) -> str:
    if value == 0:
        return "0"
    return f"{value / (1 << 30):.3f}" if value >= 1 << 27 else f"{value / (1 << 20):.1f} Mi"


def table(rows: dict[str, dict[str, Any]]) -> str:
    """The estimate as a text table (GiB, or MiB where marked 'Mi')."""
    header = ("strategy", "", "parameters", "gradients", "optimizer states", "on device", "offloaded", "host/node")
    lines = [header]
    for name, row in rows.items():
        lines.append((name, row["label"], *(_gib(row[k]) for k in (*KINDS[:3], "device_bytes", "offloaded_bytes",
                                                                   "host_bytes_per_node"))))  # fmt: skip
    return text_table(lines, left=2)


def _count(text: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"--parameters: expected a number of parameters (e.g. 1.2e9), got {text!r}") from None
    if not value >= 1 or value != value:
        raise UsageError(f"--parameters: must be >= 1, got {text!r}")
    return int(value)


def _estimate(args: argparse.Namespace) -> int:
    if args.parameters is not None:
        numels, what = [_count(args.parameters)], "parameters (one tensor: no ZeRO-3 persistent ones)"
    else:
        numels = model_numels(args.model, args.mlp_hidden)
        what = f"parameters ({args.model}" + (f" {args.mlp_hidden}" if args.mlp_hidden else "") + ")"
    strategies = args.strategy.split(",") if args.strategy else None
    unknown = sorted(set(strategies or []) - set(STRATEGIES))
    if unknown:
        raise UsageError(f"--strategy {','.join(unknown)}: not one of {', '.join(STRATEGIES)}")
    rows = estimate(numels, num_processes=args.num_processes, num_nodes=args.num_nodes,
                    mixed_precision=args.mixed_precision, optimizer=args.optimizer, momentum=args.momentum,
                    on_accelerator=not args.cpu, persistence_threshold=args.persistence_threshold,
                    strategies=strategies)  # fmt: skip
    if args.json:
        facts = {
            "num_parameters": sum(numels),
            "num_processes": args.num_processes,
            "num_nodes": args.num_nodes,
            "mixed_precision": args.mixed_precision,
            "optimizer": args.optimizer,
            "on_accelerator": not args.cpu,
        }
        print(json.dumps({**facts, "per_process": rows}, indent=2, sort_keys=True))  # fmt: skip
        return 0
    print(f"{sum(numels):,} {what}; {args.num_processes} process(es) on {args.num_nodes} node(s), "
          f"{args.mixed_precision}, {args.optimizer}; bytes per process in GiB, host memory per node last")  # fmt: skip
    print(table(rows))
    return 0


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add `estimate` to the CLI's subparsers (handler: args.handler)."""
    parser = subparsers.add_parser(
        "estimate", help="model states per process under DDP, ZeRO-1/2/3, offload and FSDP",
        description="Parameters, gradients and optimizer states (fp32 master copies included) that each process "
        "holds for a model under every strategy, by the ZeRO paper's accounting and DeepSpeed's own copies; the same "
        "numbers as `predicted` in a run's results.json. Activations and communication buckets come on top.",
    )  # fmt: skip
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--model", default="mlp", help="a built-in model (default: mlp)")
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
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.set_defaults(handler=_estimate)
    return parser
