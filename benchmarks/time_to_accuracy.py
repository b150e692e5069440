"""Time for accel_mnist to reach a test accuracy (default 99.0%), per accelerate config.

    python -m benchmarks.time_to_accuracy --configs single_gpu --gpus 1 --model cnn \
        --batch-size 512 --epochs 3 --eval-every 20 [--data-loader device] [--target 0.99]
    python -m benchmarks.time_to_accuracy --cpu --configs single_gpu --model linear \
        --batch-size 64 --max-steps 60 --eval-every 20 --target 0.85      # CPU smoke test

Each run is `accelerate launch ... -m accel_mnist train --eval-every N ...` (see
throughput.py for the launch details: --cpu, --data-loader, extra args after `--`).
From the run's metrics.jsonl (one row per evaluation) it reports the first row whose
test_accuracy >= target:

  train_seconds_to_target  training time up to that evaluation: the row's train_seconds
                           where the loop writes it, else step * global batch / the row's
                           samples_per_second (the loop's clock, evaluations excluded);
  wall_seconds             the whole command (start-up, all epochs, every evaluation).
The time resolution is --eval-every steps: use a small value for a fine reading.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from benchmarks import benchlib, throughput

COLUMNS = ["label", "num_processes", "config.model", "config.batch_size", "data_loader", "target",
           "reached", "step_at_target", "train_seconds_to_target", "wall_seconds", "best_test_accuracy",
           "run_command"]  # fmt: skip


def first_at_target(rows: list[dict], target: float, global_batch: int) -> dict | None:
    for row in rows:
        if row.get("test_accuracy", 0.0) >= target:
            if "train_seconds" in row:
                seconds = row["train_seconds"]
            else:
                seconds = row["step"] * global_batch / max(row["samples_per_second"], 1e-12)
            return {"step": row["step"], "epoch": row.get("epoch"), "train_seconds": seconds,
                    "test_accuracy": row["test_accuracy"]}  # fmt: skip
    return None


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    target, eval_every = 0.99, 20
    rest = []
    it = iter(argv)
    for a in it:  # our own two flags; everything else is throughput.py's
        if a == "--target":
            target = float(next(it))
        elif a == "--eval-every":
            eval_every = int(next(it))
        else:
            rest.append(a)
    args = throughput.parse_args(rest)
    args.extra = ["--eval-every", str(eval_every), *args.extra]
    if args.baselines:
        raise SystemExit("error: time_to_accuracy has no baselines")
    counts = [int(n) for n in args.gpus.split(",") if n.strip()]
    if not args.cpu:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("error: no CUDA GPU found; pass --cpu to use the CPU configs")
        counts = [n for n in counts if n <= torch.cuda.device_count()]
    failures = 0
    with tempfile.TemporaryDirectory(prefix="accel_mnist_tta_") as tmp:
        for name in [c.strip() for c in args.configs.split(",") if c.strip()]:
            cfg = throughput.CPU_CONFIG.get(name, name) if args.cpu else name
            for n in counts:
                if cfg in throughput.SINGLE and n != 1:
                    continue
                run = throughput.run_accel(args, cfg, n, Path(tmp))
                if args.dry_run:
                    continue
                record = {"benchmark": "time_to_accuracy", "target": target, "eval_every": eval_every,
                          "config": {"model": args.model, "batch_size": args.batch_size, "epochs": args.epochs,
                                     "max_steps": args.max_steps, "cpu": args.cpu, "extra_train_args": args.extra},
                          **{k: v for k, v in run.items() if k != "results"}}  # fmt: skip
                metrics_file = Path(tmp) / f"{cfg}-n{n}" / "metrics.jsonl"
                if run.get("returncode") == 0 and metrics_file.exists():
                    rows = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
                    global_batch = run["results"].get("global_batch_size", args.batch_size * n)
                    hit = first_at_target(rows, target, global_batch)
                    record.update({
                        "rows": rows,
                        "reached": hit is not None,
                        "step_at_target": hit and hit["step"],
                        "epoch_at_target": hit and hit["epoch"],
                        "train_seconds_to_target": hit and hit["train_seconds"],
                        "best_test_accuracy": max((r.get("test_accuracy", 0.0) for r in rows), default=None),
                        "final": {k: run["results"].get(k) for k in ("test_accuracy", "train_seconds", "steps")},
                    })  # fmt: skip
                else:
                    failures += 1
                benchlib.record_result("time_to_accuracy", record["label"].replace(" ", "_"), record, COLUMNS,
                                       args.out)  # fmt: skip
                hit_text = (f"{record['train_seconds_to_target']:.2f} train s at step {record['step_at_target']}"
                            if record.get("reached") else "not reached")  # fmt: skip
                print(
                    f"{record['label']}: target {target} {hit_text}; wall {record.get('wall_seconds', 0):.1f} s; "
                    f"best {record.get('best_test_accuracy')}"
                )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
