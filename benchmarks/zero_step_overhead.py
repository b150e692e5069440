"""Where the time of one small ZeRO step goes: DeepSpeed's bare engine against a plain loop.

    python -m benchmarks.zero_step_overhead [--model linear] [--batch-size 64] [--steps 900]
        [--variants plain_amp,zero2,zero2_bf16] [--repeats 2]

One process, one device, the whole split on the device (accel_mnist's DeviceLoader), Adam
3e-4: the seed's configuration by default. Each variant builds a fresh engine with
`deepspeed.initialize` in this process (no launcher, no Accelerate), so only the engine's
settings differ; `plain_amp` is the same step without DeepSpeed. ms/step is the
median over repeats of (wall time of `--steps` steps after 50 warm-up steps) / steps, with
the device synchronised at both ends. Under `torchrun --nproc_per_node N` every variant runs
on N processes (plain_amp wrapped in DDP), each rank on its shard. Variants (on CPU fp16 becomes fp32):

  plain_amp         no DeepSpeed: fp32 weights, autocast fp16, GradScaler (a plain loop)
  zero2             what accelerate builds from accelerate_configs/zero2.yaml
  zero2_bf16        zero2 with bf16 instead of fp16 (no loss scaling, no overflow check; GPU only)

The suites run these three. Rows before 2026-12-05 also ran plain_fp16, zero0, zero1, zero3,
zero2_no_contiguous, zero2_overlap, zero2_fused_torch and the (deep)compile variants:
`git show 5a530c8:benchmarks/zero_step_overhead.py` runs them as they ran.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
import warnings

import torch
import torch.nn.functional as F

from benchmarks import benchlib

VARIANTS = ["plain_amp", "zero2", "zero2_bf16"]
WARMUP = 50


def ds_config(variant: str, batch_size: int, half: str | None) -> dict:
    """The config accelerate 1.15 builds from zero2.yaml (after accel_mnist's alignment), varied."""
    config = {
        "train_batch_size": batch_size * torch.distributed.get_world_size(),
        "train_micro_batch_size_per_gpu": batch_size,
        "gradient_accumulation_steps": 1, "gradient_clipping": 0.0, "steps_per_print": float("inf"),
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "none", "nvme_path": None},
                              "offload_param": {"device": "none", "nvme_path": None},
                              "stage3_gather_16bit_weights_on_model_save": False},
        "zero_allow_untested_optimizer": True,
    }  # fmt: skip
    dtype = "bf16" if variant == "zero2_bf16" else half
    if dtype == "fp16":
        config["fp16"] = {"enabled": True, "auto_cast": True}
    elif dtype == "bf16":
        config["bf16"] = {"enabled": True}
    return config


def init_process_group(device: torch.device) -> None:
    """One process group for all variants: torchrun's world, else a world of one."""
    if torch.distributed.is_initialized():
        return
    if "WORLD_SIZE" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import deepspeed

    deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo", verbose=False)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_variant(variant: str, args, loader, device: torch.device) -> tuple[float, float]:
    """Seconds per step over `args.steps` steps after warm-up, and the last loss."""
    from accel_mnist.models import build_model

    torch.manual_seed(0)
    model = build_model(args.model)
    half = "fp16" if device.type == "cuda" else None
    if variant == "plain_amp":
        model = model.to(device)
        dtype = torch.float32
        if torch.distributed.get_world_size() > 1:  # the plain loop of several processes: DDP
            model = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[device] if device.type == "cuda" else None
            )
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-4)
        amp = half is not None
        scaler = torch.amp.GradScaler(device.type, enabled=amp)

        def step(x, y):
            with torch.autocast(device.type, dtype=torch.float16, enabled=amp):
                loss = F.cross_entropy(model(x.to(dtype)).float(), y)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            return loss
    else:
        import deepspeed

        optimizer = torch.optim.Adam(model.parameters(), lr=3e-4)
        engine, *_ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=ds_config(variant, args.batch_size, half)
        )
        dtype = next(engine.parameters()).dtype

        def step(x, y):
            loss = F.cross_entropy(engine(x.to(dtype)).float(), y)
            engine.backward(loss)
            engine.step()
            return loss

    def batches():
        while True:
            yield from loader

    it = batches()
    loss = None
    for _ in range(WARMUP):
        loss = step(*next(it))
    sync(device)
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step(*next(it))
    sync(device)
    seconds = (time.perf_counter() - start) / args.steps
    final = float(loss) if loss is not None else float("nan")
    if args.profile_steps and device.type == "cuda":
        profiled = benchlib.kernel_profile(lambda: step(*next(it)), args.profile_steps)
        print(f"{variant} profile: " + json.dumps({k: round(v, 4) for k, v in profiled.items()}), file=sys.stderr)
    return seconds, final


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="per-step cost of DeepSpeed engine settings, one process")
    p.add_argument("--model", default="linear")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=900)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument(
        "--profile-steps",
        type=int,
        default=0,
        metavar="N",
        help="then N steps under torch.profiler (GPU only): GPU ms, kernels and launches per step",
    )
    p.add_argument("--out", default=None, help="also save the whole record as OUT/<bench>-<stamp>-<tag>.json")
    args = p.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"error: unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    # DeepSpeed calls collectives that torch deprecates with a warning on every call.
    warnings.filterwarnings("ignore", message=r".*is deprecated.*", category=FutureWarning)
    init_process_group(device)
    world, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
    if device.type == "cpu":
        variants = [v for v in variants if v != "zero2_bf16"]

    from accel_mnist.data.catalog import DATASETS, load_split
    from accel_mnist.data.device_loader import DeviceLoader

    images, labels = load_split("mnist", benchlib.data_dir(), train=True, download=False)
    mean, std = DATASETS["mnist"].mean, DATASETS["mnist"].std
    loader = DeviceLoader(images, labels, mean, std, batch_size=args.batch_size, shuffle=True, seed=0,
                          device=device, num_processes=world, process_index=rank, drop_last=True,
                          register_with_accelerate=False)  # fmt: skip
    times: dict[str, list[float]] = {v: [] for v in variants}
    finals: dict[str, float] = {}
    for rep in range(args.repeats):  # interleaved, so that drift on the machine hits all alike
        for v in variants:
            seconds, finals[v] = run_variant(v, args, loader, device)
            times[v].append(seconds * 1e3)
            if rank == 0:
                print(f"{v} rep {rep}: {seconds * 1e3:.3f} ms/step (loss {finals[v]:.4f})", file=sys.stderr)
    for v in variants if rank == 0 else []:
        ms = statistics.median(times[v])
        precision = "bf16" if v == "zero2_bf16" else ("fp16" if device.type == "cuda" else "fp32")
        record = {"variant": v, "config": {"model": args.model, "batch_size": args.batch_size, "steps": args.steps,
                                           "repeats": args.repeats, "warmup": WARMUP},
                  "precision": precision, "ms_per_step": round(ms, 4),
                  "samples_per_second": round(args.batch_size * world / ms * 1e3, 1), "processes": world,
                  "ms_per_step_runs": [round(t, 4) for t in times[v]], "final_loss": round(finals[v], 4)}  # fmt: skip
        benchlib.save_record("zero_step_overhead", f"{args.model}-b{args.batch_size}-n{world}-{v}", record, args.out)
    summary = ", ".join(f"{v} {statistics.median(times[v]):.3f}" for v in variants)
    if rank == 0:
        print(f"ms/step ({world} process(es)): {summary}")
        # The suite's json_line row reads this line.
        print(json.dumps({f"ms_per_step.{v}": round(statistics.median(times[v]), 4) for v in variants}))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
