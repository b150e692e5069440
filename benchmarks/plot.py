"""Bar plot of training throughput (samples/s) per run, from throughput.py's JSON results.

    python -m benchmarks.plot [--results benchmarks/results] [--out benchmarks/results/throughput.png]
        [--hardware SUBSTRING] [--model cnn] [--latest]

One bar per run label (accelerate config x processes, data loader, baselines), one panel per
hardware/model/batch-size group. --latest keeps only the newest result of each label.
Needs matplotlib (not a package dependency): `.venv/bin/pip install matplotlib`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from benchmarks import benchlib


def load(results: Path, hardware: str | None, model: str | None) -> list[dict]:
    records = []
    for path in sorted(results.glob("throughput-*.json")):
        r = json.loads(path.read_text())
        if r.get("samples_per_second") is None:
            continue
        if hardware and hardware.lower() not in r.get("hardware_label", "").lower():
            continue
        if model and r.get("config", {}).get("model") != model:
            continue
        records.append(r)
    return records


def label_of(r: dict) -> str:
    label = r["label"]
    loader = r.get("data_loader")
    if r.get("kind") == "accel_mnist" and loader not in (None, "default"):
        label += f" [{loader}]"
    return label


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="bar plot of throughput results")
    p.add_argument("--results", default=str(benchlib.RESULTS))
    p.add_argument("--out", default=None, help="PNG path (default <results>/throughput.png)")
    p.add_argument("--hardware", default=None, help="only results whose hardware label contains this")
    p.add_argument("--model", default=None)
    p.add_argument("--latest", action="store_true", help="newest result per label only")
    args = p.parse_args(argv)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("error: plot.py needs matplotlib: .venv/bin/pip install matplotlib") from None

    results = Path(args.results)
    records = load(results, args.hardware, args.model)
    if not records:
        raise SystemExit(f"error: no throughput results in {results}")
    groups: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for r in sorted(records, key=lambda r: r["date"]):
        cfg = r.get("config", {})
        key = (r["hardware_label"], cfg.get("model"), cfg.get("batch_size"))
        lab = label_of(r)
        if args.latest or lab not in groups[key]:
            groups[key][lab] = r
        else:  # keep every run: number repeated labels
            n = sum(1 for k in groups[key] if k == lab or k.startswith(lab + " #")) + 1
            groups[key][f"{lab} #{n}"] = r

    fig, axes = plt.subplots(len(groups), 1, figsize=(10, 1.2 + 0.45 * max(len(g) for g in groups.values()) + 0.6)
                             if len(groups) == 1 else (10, 3.5 * len(groups)), squeeze=False)  # fmt: skip
    for ax, ((hw, model, batch), runs) in zip(axes[:, 0], groups.items(), strict=True):
        labels = list(runs)
        values = [runs[k]["samples_per_second"] for k in labels]
        colors = ["tab:gray" if runs[k].get("kind") == "baseline" else "tab:blue" for k in labels]
        bars = ax.barh(labels, values, color=colors)
        ax.invert_yaxis()
        ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values], padding=3, fontsize=8)
        ax.set_xlabel("samples/s (training, evaluation excluded)")
        ax.set_title(f"{hw} — {model}, batch {batch} per process", fontsize=10)
        ax.set_xlim(0, max(values) * 1.18)
        ax.tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    out = Path(args.out) if args.out else results / "throughput.png"
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
