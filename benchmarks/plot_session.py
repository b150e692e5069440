"""Bar plot of training throughput per accelerate config from a gpu_session.json.

    python -m benchmarks.plot_session benchmarks/results/h200x2-2026-11-30/gpu_session.json
writes throughput.png beside the JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main(path: str) -> Path:
    session = json.loads(Path(path).read_text())
    rows = [
        (name, run["samples_per_second"])
        for name, run in session["runs"].items()
        if run.get("samples_per_second")
        and run.get("config", {}).get("model") == "cnn"
        and run["config"]["batch_size"] == 512
        and run["config"]["epochs"] == 1
    ]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar([n for n, _ in rows], [v / 1000 for _, v in rows], color="#4c72b0")
    for i, (_, v) in enumerate(rows):
        ax.text(i, v / 1000, f"{v / 1000:.1f}k", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("training samples/s (thousands)")
    ax.set_title(f"cnn, batch 512 per GPU, 1 epoch, data on the device ({session['meta']['hardware'].split(',')[0]})",
                 fontsize=9)  # fmt: skip
    fig.tight_layout()
    out = Path(path).with_name("throughput.png")
    fig.savefig(out, dpi=120)
    return out


if __name__ == "__main__":
    print(main(sys.argv[1]))
