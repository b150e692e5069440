"""Collect a GPU session's run folders into one session.json, its benchmark tables and a plot.

    python -m benchmarks.session_summary RUNS_DIR [RUNS_DIR ...] --out benchmarks/results/<session>

RUNS_DIR is what gpu_perf_session.sh leaves (one folder per part): `<name>.wall.json` (the whole
command's wall time), `<name>/` (the run's config.json, results.json, metrics.jsonl), `bench/`
(the benchmark scripts' JSON records), gpus.txt and versions.txt. Writes into --out:

  session.json     every run: wall seconds, the results.json numbers, the metrics rows, the
                   first row at >= 99% test accuracy and, for runs of 2+ epochs, the steady
                   samples/s between the first and the last epoch-end rows (warm-up left out);
  <bench>.md/json  the benchmark records, their markdown tables rebuilt;
  throughput.png   samples/s per accelerate config and GPU count (cnn, batch 512 per GPU).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from benchmarks import benchlib

KEEP = ("test_accuracy", "test_loss", "train_seconds", "wall_seconds", "samples_per_second", "steps", "epochs",
        "global_batch_size", "num_processes", "distributed_type", "zero_stage", "mixed_precision", "data_loader",
        "offload_optimizer", "offload_param", "model", "versions")  # fmt: skip


def summarize_run(folder: Path, wall: dict) -> dict:
    entry = {"command_wall_seconds": wall["wall_seconds"], "rc": wall["rc"]}
    results = folder / "results.json"
    if not results.exists():
        return entry
    r = json.loads(results.read_text())
    entry["results"] = {k: r.get(k) for k in KEEP}
    config = json.loads((folder / "config.json").read_text())
    entry["config"] = {k: v for k, v in config.items() if k not in ("output_dir", "data_dir")}
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    entry["metrics"] = [{k: row[k] for k in ("epoch", "step", "train_seconds", "test_accuracy")} for row in rows]
    hit = next((row for row in rows if row["test_accuracy"] >= 0.99), None)
    entry["first_99"] = hit and {k: hit[k] for k in ("step", "train_seconds", "test_accuracy")}
    ends = [row for row in rows if float(row["epoch"]).is_integer()]
    if len(ends) >= 2:  # steady state: from the end of the first epoch to the end of the last
        first, last = ends[0], ends[-1]
        samples = (last["step"] - first["step"]) * r["global_batch_size"]
        entry["steady_samples_per_second"] = samples / (last["train_seconds"] - first["train_seconds"])
    return entry


def plot(session: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = []  # (label, whole-run samples/s, steady samples/s or None)
    for name, run in session["runs"].items():
        res, cfg = run.get("results"), run.get("config")
        if not res or cfg["model"] != "cnn" or cfg["batch_size"] != 512 or name.startswith("tta"):
            continue
        label = f"{run.get('accelerate_config', '?')}\n{res['num_processes']} GPU, {res['epochs']:g} ep"
        bars.append((label, res["samples_per_second"], run.get("steady_samples_per_second")))
    for record in session.get("throughput", []):  # throughput.py's 1-epoch runs: whole run only
        cfg = record["config"]
        if cfg["model"] == "cnn" and cfg["batch_size"] == 512:
            label = f"{record['accelerate_config']}\n{record['num_processes']} GPU, {cfg['epochs']} ep"
            bars.append((label, record["samples_per_second"], None))
    bars.sort(key=lambda b: b[0])
    fig, ax = plt.subplots(figsize=(max(7, 0.9 * len(bars)), 4))
    xs = range(len(bars))
    ax.bar([x - 0.2 for x in xs], [b[1] / 1e3 for b in bars], width=0.4, label="whole run (warm-up included)")
    ax.bar([x + 0.2 for x in xs], [(b[2] or 0) / 1e3 for b in bars], width=0.4, label="steady (after epoch 1)")
    for x, b in zip(xs, bars, strict=True):
        ax.text(x - 0.2, b[1] / 1e3, f"{b[1] / 1e3:.0f}k", ha="center", va="bottom", fontsize=7)
        if b[2]:
            ax.text(x + 0.2, b[2] / 1e3, f"{b[2] / 1e3:.0f}k", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(list(xs), [b[0] for b in bars], fontsize=7)
    ax.set_ylabel("training samples/s (thousands)")
    ax.set_title(f"accel_mnist, cnn, batch 512 per GPU, data on the device ({session['hardware']})", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def strategy_label(results: dict) -> str:
    """The shipped accelerate config a run's results.json describes (multi_gpu, zero2_offload, ...)."""
    if results["distributed_type"] != "DEEPSPEED":
        return "multi_gpu" if results["distributed_type"] == "MULTI_GPU" else "single_gpu"
    offload = "_offload" if results.get("offload_optimizer", "none") != "none" else ""
    return f"zero{results['zero_stage']}{offload}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="collect a GPU session's runs")
    p.add_argument("runs", nargs="+", help="run folders (one per part)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    session: dict = {"command": benchlib.command_line(), "runs": {}}
    for runs in map(Path, args.runs):
        if (runs / "gpus.txt").exists():
            gpus = (runs / "gpus.txt").read_text().splitlines()
            session["hardware"] = f"{len(gpus)}x {gpus[0].split(',')[0]}"
            session["gpus"] = gpus
        if (runs / "versions.txt").exists():
            python, torch, accelerate, deepspeed = (runs / "versions.txt").read_text().split()
            session["versions"] = {"python": python, "torch": torch, "accelerate": accelerate, "deepspeed": deepspeed}
        for wall in sorted(runs.glob("*.wall.json")):
            name = wall.name[: -len(".wall.json")]
            entry = summarize_run(runs / name, json.loads(wall.read_text()))
            if "results" in entry:
                entry["accelerate_config"] = strategy_label(entry["results"])
            session["runs"][name] = entry
        for record in sorted((runs / "bench").glob("*.json")):
            shutil.copy(record, out / record.name)
            if record.name.startswith("throughput-"):
                session.setdefault("throughput", []).append(json.loads(record.read_text()))
    (out / "session.json").write_text(json.dumps(session, indent=1, sort_keys=True) + "\n")
    benchlib.rebuild_tables(out)
    plot(session, out / "throughput.png")
    print(f"wrote {out}/session.json, tables and throughput.png ({len(session['runs'])} runs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
