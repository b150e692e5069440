r"""What one training step is made of on a GPU: wall time, GPU time and kernel launches, for
accel_mnist's own step (training/step.py) eager and captured, NCHW and channels-last.

    python -m benchmarks.step_profile --model bncnn --batch-size 512 --steps 200

Builds the step as a run does (build_accelerator, prepare, build_step) on synthetic data of
MNIST's shape, resident on the device. Per variant: ms per step between CUDA events over
`--steps` steps after 20 untimed ones; then `--profile-steps` steps under torch.profiler for
the GPU's busy time per step (the kernels' durations summed), the kernels per step and the
host's launch calls per step. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from typing import Any

import torch

LAUNCH_CALLS = ("cudaLaunchKernel", "cudaGraphLaunch", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")


def kernel_profile(one_step: Any, steps: int) -> dict[str, float]:
    """`steps` calls of `one_step` under torch.profiler: per step, the GPU's busy milliseconds
    (kernels, copies and memsets summed), the kernels run and the host's launch calls."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            one_step()
        torch.cuda.synchronize()
    events = prof.events()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    launches = [e for e in events if e.name in LAUNCH_CALLS]
    return {"gpu_ms_per_step": sum(e.time_range.elapsed_us() for e in kernels) / 1e3 / steps,
            "kernels_per_step": len(kernels) / steps, "launch_calls_per_step": len(launches) / steps}  # fmt: skip


def variant(model_name: str, batch: int, steps: int, profile_steps: int, graph: bool, channels_last: bool,
            folder: str) -> dict[str, Any]:  # fmt: skip
    """Time and profile one variant's step."""
    from accel_mnist import TrainConfig
    from accel_mnist.distributed.accelerator import build_accelerator
    from accel_mnist.distributed.prepare import prepare
    from accel_mnist.models import build_model
    from accel_mnist.training.captured_step import build_step
    from accel_mnist.training.step import to_memory_format

    config = TrainConfig(model=model_name, batch_size=batch, lr=1e-2, scheduler="onecycle", cycle_momentum=False,
                         cuda_graph=graph,
                         channels_last=channels_last, output_dir=folder, quiet=True)  # fmt: skip
    accelerator = build_accelerator(config)
    device = accelerator.device
    model = to_memory_format(build_model(model_name).to(device), config)
    total = 20 + steps + profile_steps + 5
    model, optimizer, scheduler = prepare(accelerator, config, model, total, total)
    step = build_step(accelerator, config, model, optimizer, (batch, 1, 28, 28))
    facts = step.facts
    inputs = torch.randn(batch, 1, 28, 28, device=device)
    labels = torch.randint(0, 10, (batch,), device=device)

    def one() -> None:
        step(inputs, labels)
        scheduler.step()

    for _ in range(20):
        one()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        one()
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / steps
    profiled = kernel_profile(one, profile_steps)
    accelerator.free_memory(model, optimizer, scheduler)
    return {"cuda_graph": graph, "channels_last": channels_last, "step": facts["step"],
            "eager_reason": facts.get("eager_reason"), "capture_seconds": facts["capture_seconds"],
            "ms_per_step": ms, **profiled}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Profile every variant and print the JSON line."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.step_profile", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="bncnn")
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--profile-steps", type=int, default=10)
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if not torch.cuda.is_available():
        print("error: benchmarks.step_profile needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for graph in (False, True):
            for channels_last in (False, True):
                try:
                    rows.append(variant(args.model, args.batch_size, args.steps, args.profile_steps, graph,
                                        channels_last, folder))  # fmt: skip
                except Exception as e:  # one variant's failure is a result too; the others still run
                    rows.append({"cuda_graph": graph, "channels_last": channels_last, "error": repr(e)[:500]})
    print(json.dumps({"model": args.model, "batch_size": args.batch_size, "variants": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
