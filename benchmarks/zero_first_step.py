"""What the first step of DeepSpeed's engine spends, where later steps take a few milliseconds.

    python -m benchmarks.zero_first_step [--variant zero2] [--prewarm] [--profile N] [--out DIR]

The seed's setup in DeepSpeed's bare engine (benchmarks.zero_step_overhead's config, linear
b64, Adam 3e-4, fp16 on a GPU), one process. Three fresh engines are built one after another
in this process; each takes three steps, every phase (forward, backward, step) timed apart
with the device synchronised after it. The first engine's first step pays what a process pays
once (kernels loaded on first launch, library handles); the second's first step shows what is
left per engine. `--prewarm` first runs accel_mnist's prewarm on the model, as a training run
does before `prepare`, so the first step shows what that leaves. `--profile N` runs the first
engine's first step under cProfile and prints its N costliest functions (cumulative time) to
stderr. The last stdout line is one JSON object of the phase times in milliseconds.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
import warnings

import torch
import torch.nn.functional as F

from benchmarks import benchlib
from benchmarks.zero_step_overhead import ds_config, init_process_group, sync

ENGINES = 3
STEPS = 3


def timed_steps(variant: str, loader, device: torch.device, prewarm_first: bool, profile: int) -> list[dict]:
    """A fresh engine's first STEPS steps, each phase's milliseconds."""
    import deepspeed

    from accel_mnist.config import TrainConfig
    from accel_mnist.models import build_model
    from accel_mnist.training.prewarm import prewarm

    torch.manual_seed(0)
    model = build_model("linear")
    half = "fp16" if device.type == "cuda" else None
    if prewarm_first:
        config = TrainConfig(model="linear", batch_size=64, lr=3e-4)
        # What Accelerate's autocast is under the seed's fp16; DeepSpeed's own weights are fp16.
        enabled = half is not None
        prewarm(model, config, device, 60000, (), (1, 28, 28),
                lambda: torch.autocast(device.type, dtype=torch.float16, enabled=enabled))  # fmt: skip
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-4)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config(variant, 64, half))
    dtype = next(engine.parameters()).dtype
    it = iter(loader)
    steps = []
    for index in range(STEPS):
        x, y = next(it)
        profiler = cProfile.Profile() if profile and index == 0 else None
        if profiler:
            profiler.enable()
        phases, mark = {}, time.perf_counter()
        loss = F.cross_entropy(engine(x.to(dtype)).float(), y)
        sync(device)
        now = time.perf_counter()
        phases["forward"], mark = (now - mark) * 1e3, now
        engine.backward(loss)
        sync(device)
        now = time.perf_counter()
        phases["backward"], mark = (now - mark) * 1e3, now
        engine.step()
        sync(device)
        phases["step"] = (time.perf_counter() - mark) * 1e3
        if profiler:
            profiler.disable()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(profile)
            print(text.getvalue(), file=sys.stderr)
        steps.append({k: round(v, 3) for k, v in phases.items()})
    return steps


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="the first steps of DeepSpeed's engine, phase by phase")
    p.add_argument("--variant", default="zero2", choices=["zero0", "zero1", "zero2", "zero3"])
    p.add_argument("--prewarm", action="store_true", help="run accel_mnist's prewarm on the model first")
    p.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile the first step, print N rows")
    p.add_argument("--out", default=None, help="also save the record as OUT/<bench>-<stamp>-<tag>.json")
    args = p.parse_args(argv)
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    warnings.filterwarnings("ignore", message=r".*is deprecated.*", category=FutureWarning)
    init_process_group(device)

    from accel_mnist.data.catalog import DATASETS, load_split
    from accel_mnist.data.device_loader import DeviceLoader

    images, labels = load_split("mnist", benchlib.data_dir(), train=True, download=False)
    stats = DATASETS["mnist"]
    loader = DeviceLoader(images, labels, stats.mean, stats.std, batch_size=64, shuffle=True, seed=0,
                          device=device, num_processes=1, process_index=0, drop_last=True,
                          register_with_accelerate=False)  # fmt: skip
    engines = [timed_steps(args.variant, loader, device, args.prewarm, args.profile if i == 0 else 0)
               for i in range(ENGINES)]  # fmt: skip
    for i, steps in enumerate(engines):
        print(f"engine {i + 1}: " + "; ".join(", ".join(f"{k} {v:.1f}" for k, v in s.items()) for s in steps),
              file=sys.stderr)  # fmt: skip
    record = {"variant": args.variant, "prewarm": args.prewarm, "device": str(device), "engines": engines,
              "first_step_ms": [round(sum(steps[0].values()), 3) for steps in engines],
              "later_step_ms": [round(sum(s.values()), 3) for steps in engines for s in steps[1:]]}  # fmt: skip
    benchlib.save_record("zero_first_step", f"{args.variant}{'-prewarm' if args.prewarm else ''}", record, args.out)
    print(json.dumps(record))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
