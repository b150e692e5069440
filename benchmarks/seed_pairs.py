r"""The seed's ZeRO-2 step through accel_mnist against DeepSpeed's bare engine, pair by pair in one process.

    accelerate launch --config_file accelerate_configs/zero2.yaml --num_processes 1 \
        -m benchmarks.seed_pairs --pairs 8 [--epochs 1] [--out DIR]

Fresh commands differ by 20-30% from call to call and a pair of them costs a minute of start-up
(benchmarks/results/h200-2026-12-02n), so here both sides run in one process, alternately:
`accel_mnist.train()` with the seed's setup (linear b64, Adam 3e-4, the launch's ZeRO-2 fp16,
prewarmed) and `benchmarks.zero_step_overhead`'s bare `zero2` engine (900 steps after 50
untimed). Pair i runs accel_mnist first when i is even, the engine first when odd, so drift
over the call hits both. accel_mnist's figure is its training clock past the first step over
the steps past the first (report.steady_ms_per_step); the engine's is wall time over its
timed steps with the device synchronised at both ends. Prints one JSON line: both sides' ms
per step by pair, the ratio of each pair and their medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any


def accel_ms(epochs: int, folder: Path, index: int) -> float:
    """One accel_mnist run of the seed's setup in this process: ms per step past the first."""
    import accel_mnist
    from accel_mnist.config import TrainConfig
    from benchmarks import benchlib
    from benchmarks.report import steady_ms_per_step

    config = TrainConfig(model="linear", batch_size=64, lr=3e-4, epochs=epochs, data_dir=benchlib.data_dir(),
                         output_dir=str(folder / f"accel{index}"), overwrite=True, quiet=True, export=False,
                         save_checkpoints=False, prewarm=True, plots=False, download=False)  # fmt: skip
    results = accel_mnist.train(config)
    ms = steady_ms_per_step(results)
    if ms is None:
        raise SystemExit(f"error: run {index} gave no steady step time ({results.get('steps')} steps)")
    return ms


def engine_ms(steps: int) -> float:
    """The bare engine's zero2 variant once (zero_step_overhead.run_variant): ms per step."""
    import torch

    from accel_mnist.data.catalog import DATASETS, load_split
    from accel_mnist.data.device_loader import DeviceLoader
    from benchmarks import benchlib, zero_step_overhead

    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    images, labels = load_split("mnist", benchlib.data_dir(), train=True, download=False)
    meta = DATASETS["mnist"]
    loader = DeviceLoader(images, labels, meta.mean, meta.std, batch_size=64, shuffle=True, seed=0, device=device,
                          num_processes=1, process_index=0, drop_last=True, register_with_accelerate=False)  # fmt: skip
    args = argparse.Namespace(model="linear", batch_size=64, steps=steps, profile_steps=0)
    seconds, _ = zero_step_overhead.run_variant("zero2", args, loader, device)
    return seconds * 1e3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="accel_mnist's seed ZeRO-2 step against the bare engine, interleaved")
    p.add_argument("--pairs", type=int, default=8)
    p.add_argument("--epochs", type=int, default=1, help="accel_mnist's epochs a run (938 steps each)")
    p.add_argument("--engine-steps", type=int, default=900)
    p.add_argument("--out", default=None, help="also write DIR/seed_pairs.json")
    args = p.parse_args(argv)
    pairs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            order = ("accel", "engine") if i % 2 == 0 else ("engine", "accel")
            pair: dict[str, Any] = {"pair": i, "first": order[0]}
            for side in order:
                pair[side] = accel_ms(args.epochs, Path(tmp), i) if side == "accel" else engine_ms(args.engine_steps)
            pair["ratio"] = pair["accel"] / pair["engine"]
            print(f"pair {i}: accel {pair['accel']:.3f} ms, engine {pair['engine']:.3f} ms, "
                  f"ratio {pair['ratio']:.3f}", file=sys.stderr)  # fmt: skip
            pairs.append(pair)
    record = {
        "pairs": pairs,
        "median_accel_ms": statistics.median(p["accel"] for p in pairs),
        "median_engine_ms": statistics.median(p["engine"] for p in pairs),
        "median_ratio": statistics.median(p["ratio"] for p in pairs),
        "ratio_of_medians": statistics.median(p["accel"] for p in pairs)
        / statistics.median(p["engine"] for p in pairs),
    }
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "seed_pairs.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
