r"""The peak-memory suite: every row's predicted peak allocated bytes against the measured one.

    source .device/setup.sh && python3 -m benchmarks.peak_suite --out OUT [--parallel 8] [--only REGEX]

Built-in mlps from 10M to 1.09B parameters (batch 64) and bncnn/cnn at batch 64-8192, under
single_gpu, zero1, zero2, zero3, zero3_offload and fsdp2 (accelerate_configs/, one process, the
config's precision), 4 steps and the final evaluation each; then `held-out` rows that the
prediction's two fitted numbers were not read from: other models, widths, batches and
precisions, DeepSpeed's JSON (its own bucket sizes, overlap_comm), ZeRO-2 offload and a captured
step. Each row is one `accelerate launch
... accel_mnist train`; its results.json holds `memory.predicted.peak_allocated_bytes` (what
accel_mnist.memory.peak predicts before the run) and the process's measured peak. Rows run
`--parallel` at a time on the one GPU (each process's allocator counts its own peak; the sum
of the rows' rough sizes is held under the GPU's memory); writes OUT/peak_suite.json and prints
the table (OUT/peak_suite.md).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

STRATEGIES = ("single_gpu", "zero1", "zero2", "zero3", "zero3_offload", "fsdp2")
MLPS = {"mlp10m": "2048,2048,2048", "mlp121m": ",".join(["4096"] * 8), "mlp342m": ",".join(["8192"] * 6),
        "mlp1b": ",".join(["16384"] * 5)}  # fmt: skip
CNN_BATCHES = (64, 512, 2048, 8192)
# Rough GiB of GPU memory a row may take, to keep the rows running at once under the GPU's.
WEIGHT = {"mlp1b": 34, "mlp342m": 12, "mlp121m": 5}
KEEP = ("num_parameters", "mixed_precision", "memory")  # what a row's record keeps of its results.json
TRAIN = ["-m", "accel_mnist", "train", "--max-steps", "4", "--data-loader", "device", "--no-export",
         "--no-save-checkpoints", "--no-plots", "--quiet", "--overwrite", "--lr", "1e-4"]  # fmt: skip


HELD_OUT = [  # name, config, launch flags, train flags, rough GiB
    ("single_gpu-lenet5-b2048", "single_gpu", [], ["--model", "lenet5", "--batch-size", "2048"], 3),
    ("zero2-lenet5-b2048", "zero2", [], ["--model", "lenet5", "--batch-size", "2048"], 3),
    ("zero1-mlp190m-b64", "zero1", [], ["--model", "mlp", "--mlp-hidden", ",".join(["6144"] * 6)], 8),
    ("zero3_offload-mlp190m-b64", "zero3_offload", [], ["--model", "mlp", "--mlp-hidden", ",".join(["6144"] * 6)],
     4),
    ("fsdp2-mlp190m-b64", "fsdp2", [], ["--model", "mlp", "--mlp-hidden", ",".join(["6144"] * 6)], 6),
    ("zero3-bncnn-b4096", "zero3", [], ["--model", "bncnn", "--batch-size", "4096"], 4),
    ("zero2-cnn-b1024-fp32", "zero2", ["--mixed_precision", "no"], ["--model", "cnn", "--batch-size", "1024"], 3),
    ("single_gpu-mlp121m-b64-fp32", "single_gpu", ["--mixed_precision", "no"],
     ["--model", "mlp", "--mlp-hidden", MLPS["mlp121m"]], 4),
    ("single_gpu-bncnn-b1024-fp16", "single_gpu", ["--mixed_precision", "fp16"],
     ["--model", "bncnn", "--batch-size", "1024"], 3),
    ("zero_file-mlp121m-b64", "zero_file", ["--mixed_precision", "fp16"],
     ["--model", "mlp", "--mlp-hidden", MLPS["mlp121m"]], 4),
    ("zero2_offload-mlp121m-b64", "zero2_offload", [], ["--model", "mlp", "--mlp-hidden", MLPS["mlp121m"]], 4),
    ("single_gpu-bncnn-b512-graph", "single_gpu", [], ["--model", "bncnn", "--batch-size", "512", "--cuda-graph",
                                                       "--optimizer", "adam"], 3),
]  # fmt: skip


def rows() -> list[dict[str, Any]]:
    """Every (strategy, model, batch) row, then the held-out ones: name, flags and rough weight in GiB."""
    out = []
    for strategy in STRATEGIES:
        for name, widths in MLPS.items():
            out.append({"name": f"{strategy}-{name}-b64", "strategy": strategy, "model": "mlp", "batch_size": 64,
                        "flags": ["--model", "mlp", "--mlp-hidden", widths, "--batch-size", "64"],
                        "weight": WEIGHT.get(name, 3)})  # fmt: skip
        for model in ("bncnn", "cnn"):
            for batch in CNN_BATCHES:
                out.append({"name": f"{strategy}-{model}-b{batch}", "strategy": strategy, "model": model,
                            "batch_size": batch, "flags": ["--model", model, "--batch-size", str(batch)],
                            "weight": 3 + batch // 2048 * 2})  # fmt: skip
    for name, strategy, launch, flags, weight in HELD_OUT:
        out.append({"name": name, "strategy": strategy, "launch": launch, "flags": flags, "weight": weight,
                    "held_out": True})  # fmt: skip
    return out


def described(row: dict[str, Any]) -> dict[str, Any]:
    """A row's own keys for its record, without the command's parts."""
    return {k: v for k, v in row.items() if k not in ("flags", "launch", "train", "env")}


def run_row(row: dict[str, Any], folder: Path, timeout: float, keep: tuple[str, ...] = KEEP) -> dict[str, Any]:
    """Launch one row; its results.json's `keep` keys, or the tail of what it printed. A row may name its
    accelerate config file (`config`), the module and flags in place of TRAIN (`train`) and environment (`env`)."""
    run_dir = folder / row["name"]
    accelerate = shutil.which("accelerate") or "accelerate"
    config = row.get("config", f"accelerate_configs/{row['strategy']}.yaml")
    cmd = [accelerate, "launch", "--config_file", config, "--num_processes", "1", "--main_process_port", "0",
           *row.get("launch", []), *row.get("train", TRAIN), *row["flags"], "--output-dir", str(run_dir)]  # fmt: skip
    if os.environ.get("ACCEL_MNIST_DATA_DIR"):
        cmd += ["--data-dir", os.environ["ACCEL_MNIST_DATA_DIR"]]
    start = time.perf_counter()
    try:
        env = {**os.environ, **row.get("env", {})}
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        rc: int | str = proc.returncode
        output = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, output = "timeout", str(exc.stdout or "") + str(exc.stderr or "")
    record = {**described(row), "cmd": " ".join(cmd[1:]), "rc": rc, "seconds": round(time.perf_counter() - start, 1)}
    results = run_dir / "results.json"
    if rc == 0 and results.is_file():
        data = json.loads(results.read_text())
        record.update({key: data.get(key) for key in keep})
    else:
        record["tail"] = output[-3000:]
    return record


def run_rows(rows: list[dict[str, Any]], save_to: Path, *, parallel: int, gib: float, timeout: float,
             run: Callable[[dict[str, Any], Path, float], dict[str, Any]] = run_row,
             deadline: float | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """Run `rows` `parallel` at a time, the sum of their rough GiB (`weight`) held under `gib`, the heaviest first;
    their records in the rows' order, written to `save_to` (JSON) after every row so that a call cut short keeps
    the rows that finished. Past `deadline` (time.monotonic()) a row not yet started is recorded as skipped."""
    budget = threading.Condition()
    held = [0.0]
    done: list[dict[str, Any]] = []
    order = [r["name"] for r in rows]

    def save() -> None:
        done.sort(key=lambda r: order.index(r["name"]))
        save_to.write_text(json.dumps({"rows": done}, indent=1) + "\n")

    def one(row: dict[str, Any], folder: Path) -> dict[str, Any]:
        with budget:
            budget.wait_for(lambda: held[0] == 0 or held[0] + row["weight"] <= gib)
            held[0] += row["weight"]
        record = {**described(row), "rc": "skipped", "seconds": 0.0}  # past the deadline (or the run raised)
        try:
            if deadline is None or time.monotonic() < deadline:
                record = run(row, folder, timeout)
        finally:
            with budget:
                held[0] -= row["weight"]
                done.append(record)
                save()
                budget.notify_all()
        print(f"{record['name']}: rc {record['rc']}, {record['seconds']} s", file=sys.stderr, flush=True)
        return record

    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(parallel) as pool:
        list(pool.map(lambda r: one(r, Path(tmp)), sorted(rows, key=lambda r: -r["weight"])))
    return done


# The estimate's name and precision for each launch config of the suite (one process each).
ESTIMATE = {
    "single_gpu": ("ddp", "bf16"),
    "zero1": ("zero1", "fp16"),
    "zero2": ("zero2", "fp16"),
    "zero3": ("zero3", "fp16"),
    "zero3_offload": ("zero3_offload", "fp16"),
    "zero2_offload": ("zero2_offload", "fp16"),
    "fsdp2": ("fsdp", "bf16"),
    "zero_file": ("zero2", "fp16"),
}
ZERO_FILE = {"reduce_bucket_size": 200_000_000, "overlap_comm": True}  # accelerate_configs/deepspeed_config.json


def _flag(cmd: list[str], name: str, default: str | None = None) -> str | None:
    return cmd[cmd.index(name) + 1] if name in cmd else default


def predict_row(record: dict[str, Any]) -> int:
    """The row's peak as `accel-mnist estimate` predicts it now, from the command the row ran."""
    from accel_mnist.memory.estimate import MNIST_DEVICE_BYTES, estimate, meta_model, trace_inputs

    cmd = record["cmd"].split()
    name, precision = ESTIMATE[record["strategy"]]
    precision = _flag(cmd, "--mixed_precision", precision)
    module = meta_model(_flag(cmd, "--model"), _flag(cmd, "--mlp-hidden"))
    common = {"batch_size": int(_flag(cmd, "--batch-size", "64")), "eval_batch_size": 1000,
              "mixed_precision": precision, "optimizer": "adam", "data_bytes": MNIST_DEVICE_BYTES,
              "zero": ZERO_FILE if record["strategy"] == "zero_file" else None}  # fmt: skip
    inputs, sharded = trace_inputs(module, **common)  # as `estimate` traces
    numels = [p.numel() for p in module.parameters() if p.requires_grad]
    rows = estimate(numels, mixed_precision=precision, optimizer="adam", strategies=[name], peak=inputs,
                    sharded_peak=sharded)  # fmt: skip
    return rows[name]["peak_allocated_bytes"]


def measured_peak(record: dict[str, Any]) -> int | None:
    """The row's measured peak allocated bytes (its one process)."""
    rows = (record.get("memory") or {}).get("per_process") or []
    return max((r.get("peak_allocated_bytes") or 0 for r in rows), default=None) or None


def table(records: list[dict[str, Any]]) -> str:
    """Markdown: per row the parameters, predicted and measured peak (MiB) and their ratio."""
    lines = ["| row | parameters | precision | predicted MiB | measured MiB | measured / predicted |",
             "|---|---:|---|---:|---:|---:|"]  # fmt: skip
    for r in records:
        measured = measured_peak(r)
        predicted = ((r.get("memory") or {}).get("predicted") or {}).get("peak_allocated_bytes")
        ratio = f"{measured / predicted:.3f}" if measured and predicted else "–"
        cells = [r["name"], f"{r.get('num_parameters') or 0:,}", str(r.get("mixed_precision", "–")),
                 f"{predicted / 2**20:.0f}" if predicted else "–", f"{measured / 2**20:.0f}" if measured else
                 f"rc {r['rc']}", ratio]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def suite_parser(description: str, parallel: int) -> argparse.ArgumentParser:
    """The flags both GPU memory suites take (this one and family_suite.py)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", required=True, help="the folder for the tables and the records")
    p.add_argument("--parallel", type=int, default=parallel, help="rows at once")
    p.add_argument("--gib", type=float, default=110.0, help="the rows' rough GiB held under this at once")
    p.add_argument("--only", default=None, help="a regular expression: the rows whose name it matches")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds a launch may take")
    return p


def main(argv: list[str] | None = None) -> int:
    args = suite_parser("predicted against measured peak memory, row by row, on one GPU", parallel=8).parse_args(argv)
    chosen = [r for r in rows() if not args.only or re.search(args.only, r["name"])]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    done = run_rows(chosen, out / "peak_suite.json", parallel=args.parallel, gib=args.gib, timeout=args.timeout)
    text = table(done)
    (out / "peak_suite.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
