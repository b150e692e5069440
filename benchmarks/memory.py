"""Per-GPU peak memory by ZeRO stage for a >= 1B-parameter MLP, beside the ZeRO paper's model states.

One configuration per launch (the strategy comes from the accelerate config):

    accelerate launch --config_file accelerate_configs/multi_gpu.yaml --mixed_precision fp16 \
        --num_processes 2 -m benchmarks.memory
    accelerate launch --config_file accelerate_configs/zero2.yaml --num_processes 2 -m benchmarks.memory

or all of them, one launch each:

    python -m benchmarks.memory --launch ddp,zero1,zero2,zero3 --gpus 2

Candidates beside the shipped settings: `ddp_bucket_view` (DDP's gradient_as_bucket_view),
`*_fused_adam` (torch.optim.Adam(fused=True) instead of the default foreach Adam) and
`zeroN_small_buckets` (benchmarks/configs/zeroN_small_buckets.json: DeepSpeed's bucket,
prefetch and live-parameter sizes cut 10x from their defaults).

Model: 784 -> H -> (H -> H) x L -> 10 with ReLU, default H=20480, L=3: 1.275B parameters.
fp16 (DDP: autocast + GradScaler over fp32 weights; DeepSpeed: fp16 weights + fp32 master
copy), torch.optim.Adam, batch 8 of random inputs, --steps optimizer steps. Reported per
rank: torch.cuda.max_memory_allocated over the steps (peak stats reset after prepare) and
memory_allocated after them, next to the model-state bytes that accel_mnist predicts for them
(accel_mnist/memory/model_states.py: the ZeRO paper's accounting with DeepSpeed's own
copies). Activations, buffers (DeepSpeed's bucket sizes) and fragmentation come on top. The
memory suites (`python -m benchmarks memory_cpu|memory_h200`, benchmarks/memory_suite.py)
measure accel_mnist's own runs instead.

Imports without a GPU; on a machine without CUDA it prints why and exits 0.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import benchlib

GIB = 1024**3
FP16 = ["--mixed_precision", "fp16"]
LAUNCH = {  # --launch name -> (accelerate config, extra launch args, extra args of this script)
    "ddp": ("multi_gpu", FP16, []),
    "zero1": ("zero1", [], []),
    "zero2": ("zero2", [], []),
    "zero3": ("zero3", [], []),
    # Candidate settings, measured against the shipped ones above.
    "ddp_bucket_view": ("multi_gpu", FP16, ["--gradient-as-bucket-view"]),
    "ddp_fused_adam": ("multi_gpu", FP16, ["--fused-adam"]),
    "ddp_bucket_view_fused_adam": ("multi_gpu", FP16, ["--gradient-as-bucket-view", "--fused-adam"]),
    "zero2_fused_adam": ("zero2", [], ["--fused-adam"]),
    "zero3_fused_adam": ("zero3", [], ["--fused-adam"]),
    **{
        f"zero{s}_small_buckets": (
            "zero_file",
            [*FP16, "--deepspeed_config_file", f"benchmarks/configs/zero{s}_small_buckets.json"],
            [],
        )
        for s in (1, 2, 3)
    },
}


def predicted_model_states(numels: list[int], n: int, stage: int, mixed_precision: str = "fp16") -> int:
    """Model-state bytes per GPU, Adam, as accel_mnist predicts them (and `accel-mnist estimate` prints)."""
    from accel_mnist.memory.model_states import Setup, predict

    family = "deepspeed" if stage else "replicated"
    return sum(predict(numels, Setup(family, n, stage, mixed_precision)).values())


def mlp_parameters(hidden: int, layers: int) -> int:
    return (784 * hidden + hidden) + layers * (hidden * hidden + hidden) + (hidden * 10 + 10)


def build_mlp(hidden: int, layers: int):
    from torch import nn

    mods = [nn.Linear(784, hidden), nn.ReLU()]
    for _ in range(layers):
        mods += [nn.Linear(hidden, hidden), nn.ReLU()]
    mods.append(nn.Linear(hidden, 10))
    return nn.Sequential(*mods)


def measure(args) -> int:
    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        print("memory.py: skipped: no CUDA GPU here (it measures torch.cuda.max_memory_allocated)")
        return 0
    from accel_mnist.config import TrainConfig
    from accel_mnist.distributed.accelerator import build_accelerator
    from accel_mnist.distributed.strategy import Strategy

    config = TrainConfig(model="mlp", batch_size=args.batch_size, lr=1e-4)
    handlers = []
    if args.gradient_as_bucket_view:  # DDP's gradients become views into its buckets: one copy less
        from accelerate.utils import DistributedDataParallelKwargs

        handlers.append(DistributedDataParallelKwargs(gradient_as_bucket_view=True))
    accelerator = build_accelerator(config, kwargs_handlers=handlers)
    torch.manual_seed(0)
    # Built on the GPU (a 1.3B-parameter init on the CPU takes long); the peak is reset after prepare.
    with torch.device(accelerator.device):
        model = build_mlp(args.hidden, args.layers)
    numels = [p.numel() for p in model.parameters()]
    psi = sum(numels)
    # fused: one kernel and no temporaries; the default (foreach) makes a full-size sqrt(v) temporary.
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, fused=True if args.fused_adam else None)
    model, optimizer = accelerator.prepare(model, optimizer)
    strategy = Strategy.of(accelerator).fields()
    stage = strategy["zero_stage"]
    name = args.label or (f"zero{stage}" if strategy["distributed_type"] == "DEEPSPEED" else "ddp")
    input_dtype = next(model.parameters()).dtype
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    x = torch.randn(args.batch_size, 784, device=accelerator.device)
    y = torch.randint(0, 10, (args.batch_size,), device=accelerator.device)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        with accelerator.autocast():
            loss = F.cross_entropy(model(x.to(input_dtype)).float(), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / args.steps
    local = torch.tensor([torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated()],
                         dtype=torch.float64, device=accelerator.device)  # fmt: skip
    both = accelerator.gather(local.unsqueeze(0)).cpu()  # (N, 2)
    n = accelerator.num_processes
    if accelerator.is_main_process:
        peaks = [round(v / GIB, 3) for v in both[:, 0].tolist()]
        allocated = [round(v / GIB, 3) for v in both[:, 1].tolist()]
        record = {
            "benchmark": "memory", "strategy": name, "num_processes": n, "num_parameters": psi,
            "config": {"hidden": args.hidden, "layers": args.layers, "batch_size": args.batch_size,
                       "steps": args.steps, "mixed_precision": accelerator.mixed_precision,
                       "optimizer": "torch Adam" + (" fused" if args.fused_adam else ""),
                       **strategy},
            "peak_gib_per_rank": peaks, "peak_gib_max": max(peaks),
            "allocated_gib_per_rank": allocated, "allocated_gib_max": max(allocated),
            "predicted_model_states_gib": round(
                predicted_model_states(numels, n, stage, accelerator.mixed_precision) / GIB, 3
            ),
            "seconds_per_step": seconds, "final_loss": loss.item(),
        }  # fmt: skip
        benchlib.save_record("memory", f"{name}-n{n}", record, args.out)
        print(
            f"{name} x{n}: {psi / 1e9:.3f}B params; peak per GPU {max(peaks):.2f} GiB "
            f"(allocated after steps {max(allocated):.2f} GiB); predicted model states "
            f"{record['predicted_model_states_gib']:.2f} GiB"
        )
    accelerator.wait_for_everyone()
    model, optimizer = accelerator.free_memory(model, optimizer)  # see loop.py: gloo exit abort
    accelerator.end_training()
    return 0


def launch_all(args) -> int:
    """One `accelerate launch` per strategy in --launch, for each count in --gpus."""
    import torch

    if not torch.cuda.is_available():
        print("memory.py: skipped: no CUDA GPU here (it measures torch.cuda.max_memory_allocated)")
        return 0
    accelerate = Path(sys.executable).with_name("accelerate")
    failures = 0
    for n in [int(c) for c in args.gpus.split(",")]:
        if n > torch.cuda.device_count():
            print(f"memory.py: skipping {n} processes: only {torch.cuda.device_count()} GPU(s)")
            continue
        for name in args.launch.split(","):
            config, extra, script_args = LAUNCH[name]
            cmd = [str(accelerate if accelerate.exists() else "accelerate"), "launch", "--config_file",
                   f"accelerate_configs/{config}.yaml", "--num_processes", str(n), *extra,
                   "-m", "benchmarks.memory", "--hidden", str(args.hidden), "--layers", str(args.layers),
                   "--batch-size", str(args.batch_size), "--steps", str(args.steps), "--label", name,
                   *script_args]  # fmt: skip
            if args.out:
                cmd += ["--out", args.out]
            print("$ " + shlex.join(cmd), flush=True)
            proc = subprocess.run(cmd, cwd=benchlib.REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"})
            failures += proc.returncode != 0
    return 1 if failures else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="per-GPU peak memory by ZeRO stage, >= 1B-parameter MLP")
    p.add_argument("--hidden", type=int, default=20480)
    p.add_argument("--layers", type=int, default=3, help="hidden-to-hidden layers")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--launch", default=None, help=f"comma list of {','.join(LAUNCH)}: launch each")
    p.add_argument("--gpus", default="2", help="process counts for --launch")
    p.add_argument("--label", default=None, help="strategy name in the record (default: from the accelerate config)")
    p.add_argument("--fused-adam", action="store_true", help="torch.optim.Adam(fused=True)")
    p.add_argument("--gradient-as-bucket-view", action="store_true", help="DDP: gradients as views into its buckets")
    p.add_argument("--out", default=None, help="also save the whole record as OUT/<bench>-<stamp>-<tag>.json")
    args = p.parse_args(argv)
    if args.launch:
        unknown = set(args.launch.split(",")) - set(LAUNCH)
        if unknown:
            raise SystemExit(f"error: unknown strategies {sorted(unknown)}; choose from {', '.join(LAUNCH)}")
        return launch_all(args)
    return measure(args)


if __name__ == "__main__":
    sys.exit(main())
