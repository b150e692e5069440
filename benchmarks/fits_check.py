r"""`accel-mnist estimate --fits` against real runs at its boundary, on one GPU capped to a smaller one.

    accelerate launch --config_file accelerate_configs/single_gpu.yaml --num_processes 1 \
        -m benchmarks.fits_check --strategy ddp --mixed-precision bf16 --model bncnn --cap-gib 2 [--out DIR]

`--strategy` is the estimate's name for what the launch's config sets up (single_gpu.yaml at
one process: `ddp`'s row; zero2.yaml: `zero2` ...). The allocator is capped at `--cap-gib`
(benchmarks.capped); the estimate is asked for the largest batch per process that fits that
many bytes; then, in this process, `accel_mnist.train()` runs 3 steps and the final evaluation
at that batch and at the sizes above it (x1.1, x1.25, x2), each with the peak counters reset.
Prints one JSON line: the estimate's answer and, per batch, trained or the out-of-memory line,
with the measured and predicted peaks.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any


def estimate_largest(model: str, strategy: str, precision: str, capacity: int) -> dict[str, Any]:
    """The estimate's row for `strategy` with --fits `capacity` (the CLI's JSON)."""
    from accel_mnist.cli import main as cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli(["estimate", "--model", model, "--strategy", strategy, "--mixed-precision", precision,
                  "--num-processes", "1", "--fits", str(capacity), "--json"])  # fmt: skip
    if rc:
        raise SystemExit(f"error: estimate returned {rc}")
    return json.loads(out.getvalue())["per_process"][strategy]


def try_batch(model: str, batch: int, folder: Path) -> dict[str, Any]:
    """3 steps and the final evaluation at `batch`: the peaks, or the out-of-memory line."""
    import torch

    import accel_mnist
    from accel_mnist.config import TrainConfig
    from accel_mnist.errors import OutOfMemory
    from benchmarks import benchlib

    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    config = TrainConfig(model=model, batch_size=batch, max_steps=3, data_dir=benchlib.data_dir(), download=False,
                         output_dir=str(folder / f"b{batch}"), overwrite=True, quiet=True, export=False,
                         save_checkpoints=False, plots=False, data_loader="device")  # fmt: skip
    try:
        results = accel_mnist.train(config)
    except OutOfMemory as exc:
        return {"batch": batch, "trained": False, "line": f"error: {exc}"}
    top = results["memory"]["per_process"][0]
    return {"batch": batch, "trained": True, "peak_allocated_bytes": top["peak_allocated_bytes"],
            "peak_reserved_bytes": top["peak_reserved_bytes"],
            "predicted_peak_bytes": results["memory"]["predicted"].get("peak_allocated_bytes")}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="estimate --fits against runs at its boundary under a memory cap")
    p.add_argument("--strategy", required=True, help="the estimate's name for the launch's strategy")
    p.add_argument("--mixed-precision", required=True, choices=("no", "fp16", "bf16"))
    p.add_argument("--model", default="bncnn")
    p.add_argument("--cap-gib", type=float, required=True)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    from benchmarks.capped import cap

    cap(args.cap_gib)
    capacity = int(args.cap_gib * (1 << 30))
    row = estimate_largest(args.model, args.strategy, args.mixed_precision, capacity)
    largest = row["largest_batch"]
    sizes = sorted({largest, math.ceil(largest * 1.1), math.ceil(largest * 1.25), 2 * largest} - {0})
    with tempfile.TemporaryDirectory() as tmp:
        tries = [try_batch(args.model, batch, Path(tmp)) for batch in sizes]
    record = {"strategy": args.strategy, "model": args.model, "mixed_precision": args.mixed_precision,
              "cap_bytes": capacity, "estimate_largest_batch": largest, "tries": tries}  # fmt: skip
    for t in tries:
        print(f"batch {t['batch']}: " + ("trained" if t["trained"] else t["line"]), file=sys.stderr)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        name = f"fits_{args.strategy}_{args.model}.json"
        (Path(args.out) / name).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
