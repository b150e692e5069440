"""Training throughput of accel_mnist per accelerate config and process count, plus baselines.

    python -m benchmarks.throughput --configs single_gpu,multi_gpu,zero1,zero2,zero3 --gpus 1,2 \
        --model cnn --batch-size 512 --epochs 1 [--data-loader device] [--baselines plain]
    python -m benchmarks.throughput --cpu --configs single_gpu,multi_gpu,zero2 --gpus 1,2 \
        --model linear --batch-size 64 --max-steps 20          # CPU smoke test

Each accel_mnist run is one subprocess,
    accelerate launch --config_file accelerate_configs/<config>.yaml --num_processes N \
        -m accel_mnist train --model ... --batch-size ... --epochs ... --output-dir <tmp> ...
and its samples/s, train_seconds and steps come from the run's results.json; ms/step is
train_seconds / steps (the loop's clock excludes evaluation) and wall_seconds is the whole
command, start-up and evaluation included. single_gpu (cpu) runs only with N = 1.

--cpu maps single_gpu -> cpu.yaml and multi_gpu -> multi_cpu.yaml, adds --mixed_precision no
to DeepSpeed configs (fp16 does not run on CPU) and gives each process cores/N threads.
--data-loader X is passed to `train` as `--data-loader X` (TrainConfig.data_loader); leave it
out to use the config's default. Anything after `--` is passed to `train` unchanged.
Baselines (`--baselines plain,seed`, single process): plain_pytorch.py with --data device and
--data dataloader, and the seed post's script (seed_fixed.py, DeepSpeed, linear, batch 64).
Every run writes a JSON and a row of benchmarks/results/throughput.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import benchlib

COLUMNS = ["label", "num_processes", "config.model", "config.batch_size", "data_loader", "samples_per_second",
           "ms_per_step", "train_seconds", "wall_seconds", "steps", "test_accuracy", "run_command"]  # fmt: skip
CPU_CONFIG = {"single_gpu": "cpu", "multi_gpu": "multi_cpu"}
SINGLE = {"single_gpu", "cpu"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="accel_mnist throughput per accelerate config")
    p.add_argument("--configs", default="single_gpu,multi_gpu,zero1,zero2,zero3")
    p.add_argument("--gpus", default="1,2", help="process counts (GPUs, or CPU processes with --cpu)")
    p.add_argument("--model", default="cnn")
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--data-loader", default=None, help="auto, torch or device (TrainConfig.data_loader)")
    p.add_argument("--baselines", default="", help="comma list of: plain, seed")
    p.add_argument("--cpu", action="store_true", help="CPU configs, --mixed_precision no for DeepSpeed")
    p.add_argument("--mixed-precision", default=None, help="override the config's mixed precision")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per run")
    p.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    p.add_argument("--dry-run", action="store_true", help="print the commands only")
    args, extra = p.parse_known_args(argv)
    if extra and extra[0] == "--":
        extra = extra[1:]
    args.extra = extra
    return args


def rel(path: Path | str) -> str:
    """`path` relative to the repo root (the runs' working directory) where it lies inside it."""
    path = Path(path)
    try:
        return str(path.relative_to(benchlib.REPO))
    except ValueError:
        return str(path)


def accelerate_bin() -> str:
    candidate = Path(sys.executable).with_name("accelerate")
    return rel(candidate) if candidate.exists() else "accelerate"


def run_env(args, processes: int) -> dict[str, str]:
    env = {**os.environ, "ACCEL_MNIST_DATA_DIR": benchlib.data_dir(), "PYTHONUNBUFFERED": "1"}
    if args.cpu:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // processes))
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def train_flags(args) -> list[str]:
    from dataclasses import fields

    from accel_mnist.config import TrainConfig

    names = {f.name for f in fields(TrainConfig)}
    flags = ["--model", args.model, "--batch-size", str(args.batch_size), "--epochs", str(args.epochs),
             "--no-download", "--quiet", "--overwrite"]  # fmt: skip
    if args.max_steps is not None:
        flags += ["--max-steps", str(args.max_steps)]
    if args.data_loader:
        flags += ["--data-loader", args.data_loader]
    # A throughput run needs neither checkpoints nor an exported model (where the config has them).
    if "save_checkpoints" in names:
        flags.append("--no-save-checkpoints")
    if "export" in names:
        flags.append("--no-export")
    return flags + list(args.extra)


def run_accel(args, config: str, processes: int, tmp: Path) -> dict:
    out_dir = tmp / f"{config}-n{processes}"
    cmd = [accelerate_bin(), "launch", "--config_file", rel(benchlib.CONFIGS / f"{config}.yaml"),
           "--num_processes", str(processes)]  # fmt: skip
    if args.mixed_precision:
        cmd += ["--mixed_precision", args.mixed_precision]
    elif args.cpu and config.startswith("zero"):
        cmd += ["--mixed_precision", "no"]
    cmd += ["-m", "accel_mnist", "train", *train_flags(args), "--output-dir", str(out_dir)]
    record = {"label": f"accel_mnist {config} x{processes}", "kind": "accel_mnist", "accelerate_config": config,
              "num_processes": processes, "data_loader": args.data_loader or "default",
              "run_command": shlex.join(cmd)}  # fmt: skip
    if args.dry_run:
        print(record["run_command"])
        return record
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=run_env(args, processes),
                          cwd=benchlib.REPO, timeout=args.timeout)  # fmt: skip
    record["wall_seconds"] = time.perf_counter() - started
    record["returncode"] = proc.returncode
    results_file = out_dir / "results.json"
    if proc.returncode != 0 or not results_file.exists():
        record["error"] = proc.stderr[-3000:]
        print(f"FAILED {record['label']} (exit {proc.returncode}):\n{proc.stderr[-3000:]}", file=sys.stderr)
        return record
    results = json.loads(results_file.read_text())
    record.update({
        "samples_per_second": results.get("samples_per_second"),
        "train_seconds": results.get("train_seconds"),
        "steps": results.get("steps"),
        "ms_per_step": results["train_seconds"] / max(results["steps"], 1) * 1e3,
        "test_accuracy": results.get("test_accuracy"),
        "results": {k: v for k, v in results.items() if k != "confusion_matrix"},
    })  # fmt: skip
    if isinstance(results.get("data_loader"), str):
        record["data_loader"] = results["data_loader"]
    return record


def run_baseline(args, name: str, tmp: Path) -> dict:
    out = tmp / f"baseline-{name.replace(':', '-')}"
    if name.startswith("plain"):
        data = name.split(":")[1]
        cmd = [rel(sys.executable), "-m", "benchmarks.baselines.plain_pytorch", "--model", args.model, "--batch-size",
               str(args.batch_size), "--epochs", str(args.epochs), "--data", data, "--out", str(out)]  # fmt: skip
        if args.max_steps is not None:
            cmd += ["--max-steps", str(args.max_steps)]
        if args.cpu:
            cmd += ["--cpu", "--threads", str(os.cpu_count() or 1)]
        elif args.mixed_precision in ("fp16", "bf16"):
            cmd += ["--precision", args.mixed_precision]
        label, loader = f"plain_pytorch {data}", data
    else:  # seed
        cmd = [
            rel(sys.executable),
            "-m",
            "benchmarks.baselines.seed_fixed",
            "--epochs",
            str(args.epochs),
            "--out",
            str(out),
        ]
        if args.max_steps is not None:
            cmd += ["--max-steps", str(args.max_steps)]
        label, loader = "seed post (DeepSpeed ZeRO-2, linear, b64)", "dataloader"
    record = {"label": label, "kind": "baseline", "num_processes": 1, "data_loader": loader,
              "run_command": shlex.join(cmd)}  # fmt: skip
    if args.dry_run:
        print(record["run_command"])
        return record
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=run_env(args, 1), cwd=benchlib.REPO,
                          timeout=args.timeout)  # fmt: skip
    record["wall_seconds"] = time.perf_counter() - started
    record["returncode"] = proc.returncode
    files = sorted(out.glob("*.json"))
    if proc.returncode != 0 or not files:
        record["error"] = proc.stderr[-3000:]
        print(f"FAILED {label} (exit {proc.returncode}):\n{proc.stderr[-3000:]}", file=sys.stderr)
        return record
    result = json.loads(files[-1].read_text())
    record.update({k: result.get(k) for k in ("samples_per_second", "ms_per_step", "train_seconds", "steps",
                                              "test_accuracy")})  # fmt: skip
    record["results"] = result
    if name == "seed":
        record["config_override"] = result.get("config")
    return record


def main(argv=None) -> int:
    args = parse_args(argv)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    counts = [int(n) for n in args.gpus.split(",") if n.strip()]
    baselines = [b.strip() for b in args.baselines.split(",") if b.strip()]
    unknown = set(baselines) - {"plain", "seed"}
    if unknown:
        raise SystemExit(f"error: unknown baselines {sorted(unknown)} (plain, seed)")
    if not args.cpu and not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("error: no CUDA GPU found; pass --cpu to benchmark the CPU configs")
        available = torch.cuda.device_count()
        if max(counts) > available:
            print(f"note: only {available} GPU(s); skipping process counts above that", file=sys.stderr)
            counts = [n for n in counts if n <= available]
    failures = 0
    config = {"model": args.model, "batch_size": args.batch_size, "epochs": args.epochs,
              "max_steps": args.max_steps, "cpu": args.cpu, "extra_train_args": args.extra}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="accel_mnist_throughput_") as tmp:
        jobs = []
        for name in configs:
            cfg = CPU_CONFIG.get(name, name) if args.cpu else name
            if not (benchlib.CONFIGS / f"{cfg}.yaml").exists():
                raise SystemExit(f"error: no accelerate config {cfg}.yaml in {benchlib.CONFIGS}")
            for n in counts:
                if cfg in SINGLE and n != 1:
                    continue
                jobs.append(("accel", cfg, n))
        for b in baselines:
            if b == "plain":
                jobs += [("baseline", "plain:device", 1), ("baseline", "plain:dataloader", 1)]
            else:
                jobs.append(("baseline", "seed", 1))
        for kind, name, n in jobs:
            if kind == "accel":
                record = run_accel(args, name, n, Path(tmp))
            else:
                record = run_baseline(args, name, Path(tmp))
            if args.dry_run:
                continue
            record = {"benchmark": "throughput", "config": dict(config), **record}
            if record.get("config_override"):
                record["config"].update(record.pop("config_override"))
            failures += record.get("returncode", 1) != 0
            benchlib.record_result("throughput", record["label"].replace(" ", "_"), record, COLUMNS, args.out)
            if "samples_per_second" in record and record["samples_per_second"] is not None:
                print(
                    f"{record['label']}: {record['samples_per_second']:.0f} samples/s, "
                    f"{record['ms_per_step']:.2f} ms/step, train {record['train_seconds']:.2f} s, "
                    f"wall {record['wall_seconds']:.1f} s, test_accuracy {record.get('test_accuracy')}"
                )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
