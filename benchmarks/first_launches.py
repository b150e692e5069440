"""What a fresh process's prewarm waits on: each tensor operation of `training/prewarm.py`'s step, timed on its
first call and again in a second prewarm (on a GPU; a CPU runs it too).

    ACCELERATE_MIXED_PRECISION=bf16 python -m benchmarks.first_launches --config recipes/fast99_graph.yaml

Builds the accelerator and the registry's model as a run does, then runs `prewarm` (one step per batch shape of an
epoch of MNIST's 60,000 training images of 1x28x28, and the evaluation's shape, on a copy) twice under a dispatch
mode that synchronizes the device after every operation and times it. The first prewarm's per-operation seconds
are where a fresh process waits (CUDA loading each kernel's module on its first launch, cuBLAS and cuDNN loading
and searching); the second is what the same work costs warm. Timing each operation alone adds a synchronization
per operation, so the totals are upper bounds: `--untimed` runs the two prewarms without the timer, for their
plain seconds. One JSON line per prewarm, then a table of the operations that waited longest on their first call.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def synchronize() -> None:
    """Wait for the GPU, where there is one (on a CPU the operations are synchronous already)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class OpTimer(TorchDispatchMode):
    """Times every operation dispatched under it, the device synchronized before and after."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, float]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        synchronize()
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        synchronize()
        self.calls.append((str(func), time.perf_counter() - start))
        return out


def main(argv: Sequence[str] | None = None) -> int:
    """Time the prewarm's operations cold, then warm, and print both."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="recipes/fast99_graph.yaml", help="a recipe or config file")
    parser.add_argument("--top", type=int, default=30, help="operations in the table")
    parser.add_argument("--untimed", action="store_true", help="the two prewarms without the per-operation timer")
    args = parser.parse_args(argv)
    from accel_mnist.config import TrainConfig, load_config_file
    from accel_mnist.distributed.accelerator import build_accelerator
    from accel_mnist.distributed.strategy import Strategy
    from accel_mnist.models import build_model
    from accel_mnist.training.prewarm import prewarm

    config = TrainConfig.from_dict(load_config_file(args.config), args.config)
    start = time.perf_counter()
    accelerator = build_accelerator(config)
    torch.zeros(1, device=accelerator.device)
    synchronize()
    context_seconds = time.perf_counter() - start
    torch.backends.cudnn.benchmark = config.cudnn_benchmark
    model = build_model(config.model, config.mlp_hidden).to(accelerator.device)
    precision = Strategy.of(accelerator).copy_precision
    rows: list[dict[str, Any]] = []
    firsts: Counter[str] = Counter()
    for attempt in ("first", "second"):
        timer = OpTimer()
        begin = time.perf_counter()
        with timer if not args.untimed else contextlib.nullcontext():
            seconds = prewarm(
                model, config, accelerator.device, 60_000, (), (1, 28, 28), accelerator.autocast, precision
            )
        total = time.perf_counter() - begin
        if attempt == "first":
            for name, op_seconds in timer.calls:
                firsts[name] = max(firsts[name], op_seconds)
        op_seconds = sum(s for _, s in timer.calls)
        rows.append({"prewarm": attempt, "seconds": round(seconds, 4), "ops": len(timer.calls),
                     "op_seconds": round(op_seconds, 4), "outside_ops": round(total - op_seconds, 4)})  # fmt: skip
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    print(json.dumps({"context_seconds": round(context_seconds, 4), "device": device}))
    for row in rows:
        print(json.dumps(row))
    for name, op_seconds in firsts.most_common(args.top):
        print(f"{op_seconds * 1e3:9.1f} ms  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
