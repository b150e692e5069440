"""A torch.profiler trace (Python calls included) of one short training run, to see where the
first steps' time goes:

    python -m benchmarks.step_trace --config recipes/fast99.yaml --max-steps 15 --out DIR

Writes DIR/trace.json.gz (open in Perfetto or chrome://tracing) and prints, for the run's
`accel_mnist.train()` call, its ten longest direct children and the longest calls inside each
of the first training steps (each from the end of the previous one, the first from the start of
the loop's `fit`, to the end of its `micro_batch`: the scheduler's and bookkeeping's share of a
step then falls in the next one's window).
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
from pathlib import Path
from typing import Any


def run(config_path: str, max_steps: int, out: Path, data_dir: str | None) -> Path:
    """Train `config_path` for `max_steps` under the profiler; returns the gzipped trace."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from accel_mnist import TrainConfig, train
    from accel_mnist.config import load_config_file

    overrides: dict[str, Any] = {"max_steps": max_steps, "stop_at_accuracy": None, "export": False,
                                 "save_checkpoints": False, "output_dir": str(out / "run"), "overwrite": True,
                                 "quiet": True}  # fmt: skip
    if data_dir:
        overrides["data_dir"] = data_dir
    config = TrainConfig.from_dict({**load_config_file(config_path), **overrides}, source=config_path)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities, with_stack=True) as prof:
        results = train(config)
    print(json.dumps({k: results.get(k) for k in ("train_seconds", "warmup_seconds", "prewarm_seconds", "steps")}))
    raw = out / "trace.json"
    prof.export_chrome_trace(str(raw))
    packed = out / "trace.json.gz"
    with raw.open("rb") as src, gzip.open(packed, "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    return packed


def summarize(trace: Path, first_steps: int = 3) -> dict[str, Any]:
    """The longest calls in the first steps of the traced run (durations in ms)."""
    with gzip.open(trace, "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "python_function"]
    # accel_mnist.train() (training/loop.py); its steps are the loop's micro_batch calls, which
    # every step takes, replayed as a CUDA graph or not.
    trains = [e for e in events if "training/loop.py" in e["name"] and e["name"].endswith(": train")]
    if not trains:
        return {"error": "no accel_mnist train() call in the trace"}
    root = max(trains, key=lambda e: e["dur"])
    lo, hi = root["ts"], root["ts"] + root["dur"]
    inside = [e for e in events if lo <= e["ts"] and e["ts"] + e["dur"] <= hi and e is not root]
    children = _direct_children(root, inside)
    fits = [e for e in inside if "training/loop.py" in e["name"] and e["name"].endswith(": fit")]
    after = min((e["ts"] for e in fits), default=lo)
    steps = sorted((e for e in inside if e["ts"] >= after and "training/loop.py" in e["name"]
                    and e["name"].endswith(": micro_batch")), key=lambda e: e["ts"])  # fmt: skip
    report: dict[str, Any] = {
        "train_ms": root["dur"] / 1e3,  # the whole train() call
        "children": [(c["name"], round(c["dur"] / 1e3, 2)) for c in sorted(children, key=lambda e: -e["dur"])[:10]],
        "steps": [],
    }
    start = after
    for step in steps[:first_steps]:
        begin = start
        end = step["ts"] + step["dur"]
        window = [e for e in inside if begin <= e["ts"] and e["ts"] + e["dur"] <= end]
        top = sorted(window, key=lambda e: -e["dur"])[:12]
        report["steps"].append({"ms": round((end - begin) / 1e3, 2),
                                "longest": [(e["name"], round(e["dur"] / 1e3, 2)) for e in top]})  # fmt: skip
        start = end
    return report


def _direct_children(root: dict[str, Any], inside: list[dict[str, Any]]) -> list[dict[str, Any]]:
    children: list[dict[str, Any]] = []
    end = -1.0
    for e in sorted(inside, key=lambda e: (e["ts"], -e["dur"])):
        if e["ts"] >= end:
            children.append(e)
            end = e["ts"] + e["dur"]
    return children


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True)
    p.add_argument("--max-steps", type=int, default=15)
    p.add_argument("--data-dir")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    trace = run(args.config, args.max_steps, args.out, args.data_dir)
    summary = summarize(trace)
    (args.out / "trace_summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
