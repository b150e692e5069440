"""A suite's README.md (one table per group, the command of every row) and its time-to-accuracy plot."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from benchmarks import memory_suite


def _stats(values: list[float]) -> str:
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.3g}"
    return f"{statistics.median(values):.3g} ({min(values):.3g}–{max(values):.3g})"


def _ok(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in runs if r["rc"] == 0 and "parsed" in r]


def _median_phases(runs: list[dict[str, Any]]) -> str:
    """A timeline row's (rows until 2026-12-05) median seconds: the start, the imports, each phase, the rest."""
    timelines = [r["parsed"] for r in _ok(runs) if r["parsed"].get("phases")]
    if not timelines:
        return "–"
    values = {k: [t[k] for t in timelines if t.get(k) is not None] for k in ("python_start", "import_cli")}
    for n in sorted({n for t in timelines for n in t["phases"]} - {"train"}):
        values[n] = [t["phases"].get(n, {}).get("seconds", 0.0) for t in timelines]
    values["other_in_train"] = [t["other_in_train"] for t in timelines]
    return "median s: " + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in values.items())


def _step_variants(variants: Any) -> list[str]:
    """benchmarks.step_profile's variants, one phrase each ('cuda_graph NCHW 2.31 ms/step (GPU 2.28, 2 launches)')."""
    if not isinstance(variants, list):
        return []
    return [f"{v['step']} {'channels-last' if v.get('channels_last') else 'NCHW'} {v['ms_per_step']:.3g} ms/step "
            f"(GPU {v['gpu_ms_per_step']:.3g}, {v['launch_calls_per_step']:.0f} launches)"
            for v in variants if isinstance(v, dict) and {"step", "ms_per_step", "gpu_ms_per_step",
                                                          "launch_calls_per_step"} <= set(v)]  # fmt: skip


def steady_ms_per_step(parsed: dict[str, Any]) -> float | None:
    """Training ms per optimizer step past the first (results.json's warm-up step), or None:
    the figure to set beside a benchmark that leaves its warm-up steps untimed."""
    steps, train, warmup = parsed.get("steps"), parsed.get("train_seconds"), parsed.get("warmup_seconds")
    if not isinstance(steps, int) or steps < 2 or train is None or warmup is None:
        return None
    return 1000 * (train - warmup) / (steps - 1)


def _steady(ok: list[dict[str, Any]]) -> str:
    values = [v for v in (steady_ms_per_step(r["parsed"]) for r in ok) if v is not None]
    return f"ms/step past the first {_stats(values)}" if values else ""


def key_numbers(row: dict[str, Any], runs: list[dict[str, Any]]) -> str:
    """The row's numbers for the table, by what its parser read."""
    ok = _ok(runs)
    if row["parse"] == "curve":
        reached = [r["parsed"]["seconds_to_target"] for r in ok if r["parsed"].get("reached")]
        best = [r["parsed"]["best_test_accuracy"] for r in ok if r["parsed"].get("best_test_accuracy") is not None]
        text = (f"{row.get('target', 0.99):.2%} in {len(reached)}/{len(runs)} runs, train s to it {_stats(reached)}; "
                f"best test acc {_stats(best)}")  # fmt: skip
        epochs = [r["parsed"]["epoch_seconds"] for r in ok if len(r["parsed"].get("epoch_seconds", [])) > 1]
        if epochs:
            text += "; s per epoch " + ", ".join(f"{s:.2f}" for s in epochs[0])
        return "; ".join(filter(None, [text, _steady(ok)]))
    if row["parse"] == "results" and ok:
        train = [r["parsed"]["train_seconds"] for r in ok if "train_seconds" in r["parsed"]]
        rates = [r["parsed"]["steady_samples_per_second"] for r in ok if "steady_samples_per_second" in r["parsed"]]
        rate = f"samples/s past the first step {_stats(rates)}" if rates else ""
        return "; ".join(filter(None, [f"train s {_stats(train)}", _steady(ok), rate]))
    if row["name"].endswith("timeline"):
        return _median_phases(runs)
    if row["parse"] == "memory" and ok:
        return memory_suite.numbers(ok[-1]["parsed"])
    if row["parse"] == "json_line" and ok:
        parsed = ok[-1]["parsed"]
        numbers = {k: v for k, v in parsed.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if len(ok) > 1:  # a repeated row: each number's median (min–max) over its runs
            values = {k: [r["parsed"][k] for r in ok if isinstance(r["parsed"].get(k), (int, float))] for k in numbers}
            text = ", ".join(f"{k} {_stats(v)}" for k, v in values.items())
        else:
            text = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in numbers.items())
        return "; ".join([text, *_step_variants(parsed.get("variants"))])
    return "–"


def run_value(run: dict[str, Any], key: str) -> float | None:
    """A run's number for a ratio: its wall seconds, "steady_ms" (steady_ms_per_step), or a parsed key."""
    if key == "wall_seconds":
        return run["wall_seconds"]
    parsed = run.get("parsed") or {}
    value = steady_ms_per_step(parsed) if key == "steady_ms" else parsed.get(key)
    return value if isinstance(value, (int, float)) else None


def _values_by_index(record: dict[str, Any], row: str, key: str) -> dict[int, float]:
    """The row's successful runs' values of `key`, by repeat index."""
    found = {}
    for r in record["runs"]:
        if r["row"] == row and r["rc"] == 0 and (v := run_value(r, key)) is not None:
            found[r.get("index", len(found))] = v
    return found


def ratio_lines(record: dict[str, Any]) -> list[str]:
    """Each ratio the suite names, `(numerator row, denominator row, statistic[, its key, their key])`:
    of wall seconds unless keys are given; statistic "median", "min", "pairs" (the median of
    run-by-run ratios, runs paired by their repeat index, as the runner interleaves them), or
    "scaling" (the ratio of medians, and that ratio over the ratio of the rows' `processes`: the
    share of linear scaling)."""
    lines = []
    for num, den, stat, *keys in record.get("ratios", []):
        num_key, den_key = keys or ("wall_seconds", "wall_seconds")
        a, b = _values_by_index(record, num, num_key), _values_by_index(record, den, den_key)
        label = "wall seconds" if not keys else f"{num_key} / {den_key}"
        if stat == "pairs":
            pairs = [a[i] / b[i] for i in sorted(a.keys() & b.keys()) if b[i]]
            if pairs:
                lines.append(f"* {num} / {den} ({label}, run by run): median **{statistics.median(pairs):.3f}** "
                             f"({min(pairs):.3f}–{max(pairs):.3f}) over {len(pairs)} pairs")  # fmt: skip
        elif stat == "scaling" and a and b:
            processes = {row["name"]: row.get("processes", 1) for row in record.get("rows", [])}
            n = processes.get(num, 1) / processes.get(den, 1)
            x, y = statistics.median(a.values()), statistics.median(b.values())
            lines.append(f"* {num} / {den} (median {label}): {x:.4g} / {y:.4g} = **{x / y:.2f}x** on {n:g}x "
                         f"the processes: **{x / y / n:.0%}** of linear")  # fmt: skip
        elif a and b:
            f = statistics.median if stat == "median" else min
            x, y = f(a.values()), f(b.values())
            lines.append(f"* {num} / {den} ({stat} {label}): {x:.2f} / {y:.2f} = **{x / y:.2f}**")
    return lines


def readme(record: dict[str, Any]) -> str:
    """The results folder's README.md: hardware, versions, ratios, then one table per group."""
    v = record["versions"]
    loads = [r["loadavg_1m"] for r in record["runs"]]
    lines = [
        f"# `python -m benchmarks {record['suite']}`, {record['date']}",
        "",
        f"Hardware: {record['hardware_label']}; load average (1 min) at the runs' starts: "
        f"{min(loads, default=0):.2f}–{max(loads, default=0):.2f}. "
        + ", ".join(f"{k} {val}" for k, val in v.items())
        + ".",
        f"Command: `{record['command']}`"
        + (f" (recipe `{record['recipe']}`)" if record.get("recipe") else "")
        + f"; {record['suite_seconds']:.0f} s in all. Every run was a fresh process; the raw record of each "
        "(command, environment, return code, output tail, parsed numbers) is in `suite.json`.",
        "",
        *ratio_lines(record),
    ]
    for name, reason in record.get("skipped", {}).items():
        lines.append(f"* skipped {name}: {reason}")
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in record["rows"]:
        groups.setdefault(row["group"], []).append(row)
    for group, rows in groups.items():
        lines += ["", f"## {group}", "", "| row | what | runs ok | wall s, median (min–max) | numbers | command |",
                  "|---|---|---:|---:|---|---|"]  # fmt: skip
        for row in rows:
            runs = [r for r in record["runs"] if r["row"] == row["name"]]
            if not runs:
                continue
            walls = [r["wall_seconds"] for r in runs if r["rc"] == 0]
            env = " ".join(f"{k}={val}" for k, val in row.get("env", {}).items())
            command = (env + " " if env else "") + runs[0]["command"]
            numbers = key_numbers(row, runs).replace("|", "\\|")
            lines.append(f"| {row['name']} | {row['what']} | {len(walls)}/{len(runs)} | {_stats(walls)} | "
                         f"{numbers} | `{command}` |")  # fmt: skip
    lines += memory_suite.readme_section(record)
    if any(row["parse"] == "curve" for row in record["rows"]):
        lines += ["", "Curves (test accuracy against training seconds, every run): `time_to_accuracy.png`."]
    return "\n".join(lines) + "\n"


def plot_curves(record: dict[str, Any], rows: list[str], path: Path) -> Path | None:
    """Test accuracy against training seconds (metrics.jsonl), one line per run, a colour per row."""
    from matplotlib.figure import Figure

    runs = [r for r in _ok(record["runs"]) if r["row"] in rows and r["parsed"].get("curve")]
    if not runs:
        return None
    fig = Figure(figsize=(9, 5), dpi=110)
    ax = fig.add_subplot()
    colours = {name: f"C{i}" for i, name in enumerate(rows)}
    labelled = set()
    for r in runs:
        seconds, accuracy = [c[0] for c in r["parsed"]["curve"]], [c[1] for c in r["parsed"]["curve"]]
        label = None if r["row"] in labelled else r["row"]
        labelled.add(r["row"])
        ax.plot(seconds, accuracy, marker=".", color=colours[r["row"]], label=label, alpha=0.8)
    ax.axhline(0.99, color="grey", linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ax.set_ylim(0.8, 1.0)
    ax.set_xlabel("training seconds (the run's own clock, evaluation excluded)")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"time to accuracy, {record['hardware_label']}, {record['date'][:10]}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.savefig(path)
    return path
