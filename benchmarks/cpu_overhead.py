"""CPU step time: accel_mnist's train() against a plain PyTorch loop, per data path.

    python -m benchmarks.cpu_overhead [--models linear,cnn] [--batch-size 64] [--threads 2]
        [--steps linear=400,cnn=60] [--repeats 3]

The issue's CPU target: accel_mnist single-process step time <= 1.10x a plain PyTorch loop
(same model, batch, threads). Four variants, run in-process and interleaved `--repeats`
times (other load on the machine then hits all of them alike); the median of each counts:

  plain/dataloader   benchmarks/baselines/plain_pytorch.py, torch DataLoader
  plain/device       benchmarks/baselines/plain_pytorch.py, whole split in memory
  accel/torch        accel_mnist.train(), data_loader=torch (the prepared DataLoader)
  accel/device       accel_mnist.train() with the DeviceLoader (config data_loader=device)

A forward pre-hook on the model stamps every training step in both loops (train() takes the
model as an argument), so on CPU ms/step is the steady-state median interval between steps
(first 10 left out), then the median over repeats; train_seconds / steps (warm-up included)
is kept too. Prints one JSON line (the ratios); `--out` also saves one record per model.
(Records gpu_overhead came from a --gpu option, gone since: `git show 5a530c8:benchmarks/cpu_overhead.py`
runs them as they ran.) --plain-gather makes the
plain loop gather batches as accel_mnist's DeviceLoader does, so that the ratio measures the loop
alone: `index_select` (`images[idx]`, the inline default, costs about 20 us more per batch of 64
on CPU) or `normalised` (index_select from a split normalised once, as the DeviceLoader does
where a float32 copy of it fits: four tensor ops fewer per batch). (Rows before 2026-11-30
16:00 UTC had `--cache-lomo-check`, which cached accelerate's per-step `is_lomo_available()`;
accel_mnist now always does. Rows before 2026-12-01 11:30 UTC had accel/device_thin, a thin
optimizer step that accel_mnist.distributed.step.DirectStep now is.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile

import torch

from benchmarks import benchlib
from benchmarks.baselines import plain_pytorch

WARMUP = 10  # per-step intervals left out of the steady-state median


def timed_model(name: str):
    """A registry model that stamps the time of each training-mode forward call.

    The interval between two consecutive forwards is one whole training step (batch fetch,
    forward, backward, optimizer, loop bookkeeping), measured the same way in both loops.
    """
    import time

    from accel_mnist.models import build_model

    model = build_model(name)
    model.step_times = []

    def stamp(module, _inputs):
        if module.training:
            module.step_times.append(time.perf_counter())

    model.register_forward_pre_hook(stamp)
    return model


def step_stats(times: list[float]) -> dict:
    intervals = [b - a for a, b in zip(times, times[1:], strict=False)][WARMUP:]
    if not intervals:
        return {"ms_per_step_median": float("nan"), "ms_per_step_min": float("nan")}
    return {"ms_per_step_median": statistics.median(intervals) * 1e3, "ms_per_step_min": min(intervals) * 1e3,
            "ms_per_step_steady_mean": sum(intervals) / len(intervals) * 1e3}  # fmt: skip


def accel_run(model: str, batch_size: int, steps: int, data_loader: str, data_dir: str, out: str) -> dict:
    from accel_mnist.config import TrainConfig
    from accel_mnist.training import loop

    config = TrainConfig(model=model, batch_size=batch_size, max_steps=steps, data_dir=data_dir, download=False,
                         output_dir=out, overwrite=True, quiet=True, eval_batch_size=1000, export=False,
                         save_checkpoints=False, data_loader=data_loader)  # fmt: skip
    net = timed_model(model)
    results = loop.train(config, model=net)
    if results["data_loader"] != data_loader:
        raise RuntimeError(f"asked for data_loader={data_loader}, the run used {results['data_loader']}")
    return {"steps": results["steps"], "train_seconds": results["train_seconds"],
            "test_accuracy": results.get("test_accuracy"), **step_stats(net.step_times)}  # fmt: skip


def plain_run(model: str, batch_size: int, steps: int, data: str, threads: int, data_dir: str,
              gather: str = "index") -> dict:  # fmt: skip
    args = plain_pytorch.parse_args([
        "--model", model, "--batch-size", str(batch_size), "--max-steps", str(steps), "--data", data,
        "--gather", gather,
        "--threads", str(threads), "--warmup-steps", "0", "--data-dir", data_dir, "--cpu",
    ])  # fmt: skip
    net = timed_model(model)
    original = plain_pytorch.build_model
    plain_pytorch.build_model = lambda _name: net
    try:
        result = plain_pytorch.run(args)
    finally:
        plain_pytorch.build_model = original
    return {"steps": result["steps"], "train_seconds": result["train_seconds"],
            "test_accuracy": result.get("test_accuracy"), **step_stats(net.step_times)}  # fmt: skip


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="accel_mnist vs plain PyTorch step time on CPU")
    p.add_argument("--models", default="linear,cnn")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", default="linear=400,cnn=60", help="steps per run, per model")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--plain-gather", choices=["index", "index_select", "normalised"], default="index",
                   help="how plain/device gathers a batch: images[idx] (as written inline), index_select "
                   "(what accel_mnist's DeviceLoader calls), or index_select from a split normalised once "
                   "(what the DeviceLoader does where the float32 copy fits)")  # fmt: skip
    p.add_argument("--out", default=None, help="also save the whole record as OUT/<bench>-<stamp>-<tag>.json")
    args = p.parse_args(argv)
    if torch.cuda.is_available():
        raise SystemExit("error: a GPU is visible; run with CUDA_VISIBLE_DEVICES= for the CPU comparison")
    bench = "cpu_overhead"
    steps_for = dict(item.split("=") for item in args.steps.split(","))
    data_dir = benchlib.data_dir()
    variants = ["plain/dataloader", "plain/device", "accel/torch", "accel/device"]
    summary: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            steps = int(steps_for.get(model, 100))
            runs: dict[str, list[dict]] = {v: [] for v in variants}
            for rep in range(args.repeats):
                for v in variants:
                    torch.set_num_threads(args.threads)
                    torch.manual_seed(0)
                    kind, data = v.split("/")
                    if kind == "plain":
                        r = plain_run(model, args.batch_size, steps, data, args.threads, data_dir, args.plain_gather)
                    else:
                        r = accel_run(model, args.batch_size, steps, data, data_dir, f"{tmp}/{model}-{data}-{rep}")
                    r["ms_per_step_total"] = r["train_seconds"] / r["steps"] * 1e3
                    r["threads_after"] = torch.get_num_threads()
                    runs[v].append(r)
                    print(
                        f"{model} {v} rep {rep}: steady median {r['ms_per_step_median']:.3f} ms/step, "
                        f"total {r['ms_per_step_total']:.3f} ms/step "
                        f"(acc {r.get('test_accuracy') or float('nan'):.3f})",
                        file=sys.stderr,
                    )
            # Steady-state step time (median per-step interval, warm-up left out), the median over repeats.
            key = "ms_per_step_median"
            ms = {v: statistics.median(r[key] for r in runs[v]) for v in variants}
            ms_total = {v: statistics.median(r["ms_per_step_total"] for r in runs[v]) for v in variants}
            ms_min = {v: min(r["ms_per_step_min"] for r in runs[v]) for v in variants}
            record = {
                "benchmark": bench,
                "config": {"model": model, "batch_size": args.batch_size, "threads": args.threads,
                           "steps": steps, "repeats": args.repeats, "plain_gather": args.plain_gather},
                "ms_per_step": ms,
                "ms_per_step_basis": key,
                "ms_per_step_total": ms_total,
                "ms_per_step_min": ms_min,
                "ratio_accel_device_to_plain_device": ms["accel/device"] / ms["plain/device"],
                # The fastest step seen: on a shared machine the least disturbed reading.
                "ratio_min_accel_device_to_plain_device": ms_min["accel/device"] / ms_min["plain/device"],
                "ratio_accel_torch_to_plain_dataloader": ms["accel/torch"] / ms["plain/dataloader"],
                "ratio_device_speedup_accel": ms["accel/torch"] / ms["accel/device"],
                "ratio_device_speedup_plain": ms["plain/dataloader"] / ms["plain/device"],
                "runs": runs,
                "note": ("ms_per_step: median over repeats of each run's median per-step interval "
                         f"(first {WARMUP} steps left out)"),
            }  # fmt: skip
            benchlib.save_record(bench, f"{model}-b{args.batch_size}-t{args.threads}", record, args.out)
            summary[model] = {"ms_per_step": ms, **{k: v for k, v in record.items() if k.startswith("ratio")}}
            print(
                f"{model}: "
                + ", ".join(f"{v} {ms[v]:.3f} ms" for v in variants)
                + f"; accel/device : plain/device = {record['ratio_accel_device_to_plain_device']:.3f}"
            )
    # The last line for `python -m benchmarks`: the ratio per model.
    print(
        json.dumps(
            {f"{m}_{k}": v for m, d in summary.items() for k, v in d.items() if k.startswith("ratio")}
            | {f"{m}_ms_{v}": x for m, d in summary.items() for v, x in d["ms_per_step"].items()}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
