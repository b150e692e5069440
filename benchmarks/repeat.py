r"""Time to accuracy over many seeds in one process, as speed records time it.

    python -m benchmarks.repeat --config recipes/fast99.yaml --seeds 0-19
    python -m benchmarks.repeat --runner plain --config recipes/fast99.yaml --seeds 0-19 -- --cuda-graph

airbench and the like time many runs in one process, with compilation and kernel loading left
to a first run that is not counted; each fresh `accel-mnist train` command pays both again.
`--runner accel` calls `accel_mnist.train()` with the recipe's TrainConfig (`--set KEY=VALUE`
overrides a key) once per seed; `--model package.module:callable` trains the model that callable returns
(built under the seed, as `train()` builds the registry's) in place of the recipe's, for instance one of
benchmarks/variants.py's. `--runner plain` runs the plain PyTorch twin's `run()` (flags after `--` go to
it). One run (seed 1000) is made first and left out (`--warmup-runs 0` where only the steps count). Prints
one JSON line: per seed the training clock to the first evaluation at or above 99% (None where never
reached), the final accuracy, and their mean, spread (standard deviation, min, max) and the share of seeds
that reached the target.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

TARGET = 0.99
WARMUP_RUNS = 1  # uncounted runs first (seed 1000 + i)


def seeds_of(text: str) -> list[int]:
    """'0-19' or '0,3,5' (or both, comma-separated) as a list of seeds."""
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        seeds += list(range(int(low), int(high) + 1)) if high else [int(low)]
    return seeds


def first_at(curve: list[dict[str, Any]], target: float) -> float | None:
    """Training seconds of the first evaluation at or above `target`."""
    return next((row["train_seconds"] for row in curve if row["test_accuracy"] >= target), None)


def accel_run(
    config: Any, seed: int, folder: Path, model: str | None = None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One accel_mnist run in this process: its metrics rows and results. `model` (`package.module:callable`)
    is built under the seed, as `train()` builds the registry's model, and passed to `train()`."""
    import accel_mnist

    module = None
    if model is not None:
        from accelerate.utils import set_seed

        from accel_mnist.models import model_from_path

        set_seed(seed)
        module = model_from_path(model)
    out = folder / f"seed{seed}"
    results = accel_mnist.train(config.replace(seed=seed, output_dir=str(out), overwrite=True), module)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return rows, results


def plain_run(argv: list[str], seed: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One plain-twin run in this process."""
    from benchmarks.baselines import plain_pytorch

    result = plain_pytorch.run(plain_pytorch.parse_args([*argv, "--seed", str(seed), "--no-eval"]))
    return result["curve"], result


def summary(times: list[float | None], accuracies: list[float]) -> dict[str, Any]:
    """Mean, spread and share of the seeds that reached the target."""
    reached = [t for t in times if t is not None]
    spread = statistics.stdev(reached) if len(reached) > 1 else 0.0
    return {
        "runs": len(times),
        "share_reached": len(reached) / len(times) if times else 0.0,
        "mean_seconds": statistics.fmean(reached) if reached else None,
        "stdev_seconds": spread,
        "min_seconds": min(reached, default=None),
        "max_seconds": max(reached, default=None),
        "mean_accuracy": statistics.fmean(accuracies) if accuracies else None,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the seeds and print the JSON line."""
    argv = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in argv:
        argv, extra = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    p = argparse.ArgumentParser(prog="python -m benchmarks.repeat", description=__doc__.split("\n\n")[0])
    p.add_argument("--runner", choices=["accel", "plain"], default="accel")
    p.add_argument("--config", required=True, help="the recipe (an accel_mnist training config file)")
    p.add_argument("--seeds", default="0-19")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a recipe key (accel)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--warmup-runs", type=int, default=WARMUP_RUNS, help="uncounted runs first (seeds 1000 on)")
    p.add_argument("--model", default=None, metavar="MODULE:CALLABLE", help="a model factory (accel)")
    args = p.parse_args(argv)
    seeds = seeds_of(args.seeds)
    with tempfile.TemporaryDirectory() as tmp:
        if args.runner == "accel":
            from accel_mnist import TrainConfig
            from accel_mnist.config import load_config_file

            values = {**load_config_file(args.config), "quiet": True, "export": False, "plots": False,
                      "save_checkpoints": False, "download": False}  # fmt: skip
            values.update(dict(item.split("=", 1) for item in args.set))
            if args.data_dir:
                values["data_dir"] = args.data_dir
            config = TrainConfig.from_dict(values, source=args.config)

            def one(seed: int) -> tuple[list[dict[str, Any]], float, dict[str, Any]]:
                rows, results = accel_run(config, seed, Path(tmp), args.model)
                facts = {k: results.get(k) for k in ("step", "capture_seconds", "prewarm_seconds", "eager_reason")}
                return rows, results["test_accuracy"], facts
        else:
            plain_argv = ["--config", args.config, "--data", "device", *extra]
            if args.data_dir:
                plain_argv += ["--data-dir", args.data_dir]

            def one(seed: int) -> tuple[list[dict[str, Any]], float, dict[str, Any]]:
                curve, result = plain_run(plain_argv, seed)
                facts = {k: result.get(k) for k in ("cuda_graph", "capture_seconds")}
                return curve, curve[-1]["test_accuracy"], facts

        for i in range(args.warmup_runs):
            one(1000 + i)
        times, accuracies, per_seed = [], [], []
        for seed in seeds:
            rows, accuracy, facts = one(seed)
            seconds = first_at(rows, TARGET)
            times.append(seconds)
            accuracies.append(accuracy)
            per_seed.append({"seed": seed, "seconds_to_target": seconds, "final_accuracy": accuracy,
                             "steps": rows[-1]["step"], **facts})  # fmt: skip
    print(json.dumps({"runner": args.runner, "config": args.config, "set": args.set, "model": args.model,
                      "plain_flags": extra,
                      "target": TARGET, "warmup_runs": args.warmup_runs, **summary(times, accuracies),
                      "seeds": per_seed}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
