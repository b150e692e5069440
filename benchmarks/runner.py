"""Run one suite of benchmarks/suites.py and write its results folder.

    python -m benchmarks cpu  [--out DIR] [--budget SECONDS] [--dry-run] [--group startup ...] [--row NAME ...]
    python -m benchmarks h200 --recipe recipes/fast99.yaml --out DIR
    python -m benchmarks memory_cpu | memory_h200 | memory_h200x2 --out DIR

Every run is a fresh process. DIR (default benchmarks/results/<hardware>-<UTC date>) gets
`suite.json`, the one results format (every run: command, environment, return code, wall
seconds, what was parsed, curves included, and the records the command saved in its folder;
hardware, versions, load average), `README.md` (one table per group, with each row's
command) and, for suites with curves, `time_to_accuracy.png`. Each run's own folder
(DIR/runs/ROW-N) is removed after parsing unless --keep-runs. `python -m benchmarks.readme`
then rewrites benchmarks/README.md's tables from the newest suite.json files.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import benchlib, memory_suite
from benchmarks.suites import SUITES, Row

TAIL = 2000  # characters of stdout/stderr kept per run


def _bin(name: str) -> str:
    here = Path(sys.executable).with_name(name)
    return str(here) if here.exists() else (shutil.which(name) or name)


def context(out: Path, recipe: str | None) -> dict[str, str]:
    """The values of the command placeholders that do not change between runs."""
    return {"python": sys.executable, "accel_mnist": _bin("accel-mnist"), "accelerate": _bin("accelerate"),
            "data": benchlib.data_dir(), "recipe": recipe or "", "out": str(out)}  # fmt: skip


def fill(cmd: list[str], values: dict[str, Any]) -> list[str]:
    """The argv of `cmd` with every {placeholder} of `values` replaced (other braces stay)."""
    pattern = re.compile(r"\{(" + "|".join(map(re.escape, values)) + r")\}")
    return [pattern.sub(lambda m: str(values[m.group(1)]), part) for part in cmd]


def runs_of(row: Row) -> list[dict[str, Any]]:
    """One dict per run of the row: its index and, for seeded rows, its seed."""
    if "seeds" in row:
        return [{"index": i, "seed": s} for i, s in enumerate(row["seeds"])]
    return [{"index": i, "seed": i} for i in range(row.get("repeat", 1))]


# -- what is read from a run ------------------------------------------------------------------


def parse_json_line(stdout: str, run_dir: Path, row: Row) -> dict[str, Any]:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def results_parser(*keep: str) -> Callable[[str, Path, Row], dict[str, Any]]:
    """A parser that reads these keys of the run's results.json ({} without one)."""

    def parse(stdout: str, run_dir: Path, row: Row) -> dict[str, Any]:
        path = run_dir / "results.json"
        results = json.loads(path.read_text()) if path.is_file() else {}
        return {k: results[k] for k in keep if k in results}

    return parse


parse_results = results_parser("test_accuracy", "train_seconds", "wall_seconds", "steps", "samples_per_second",
                               "warmup_seconds", "steady_samples_per_second")  # fmt: skip


def parse_curve(stdout: str, run_dir: Path, row: Row) -> dict[str, Any]:
    """The (train seconds, test accuracy) curve of metrics.jsonl and the first row at the target."""
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    curve = [(r["train_seconds"], r["test_accuracy"], r["step"]) for r in rows if "train_seconds" in r]
    target = row.get("target", 0.99)
    first = next(((s, a, step) for s, a, step in curve if a >= target), None)
    # Per-epoch training seconds from the rows written at epoch ends (whole epochs only).
    ends = [r for r in rows if r.get("epoch_end") or float(r.get("epoch", 0)).is_integer()]
    epoch_seconds = [
        b["train_seconds"] - a for a, b in zip([0.0] + [e["train_seconds"] for e in ends], ends, strict=False)
    ]
    return {"curve": curve, "target": target, "reached": first is not None,
            "seconds_to_target": first[0] if first else None, "step_at_target": first[2] if first else None,
            "best_test_accuracy": max((a for _, a, _ in curve), default=None),
            "epoch_seconds": epoch_seconds, **parse_results(stdout, run_dir, row)}  # fmt: skip


def saved_records(run_dir: Path) -> list[dict[str, Any]]:
    """The records the command saved in its folder (benchlib.save_record), oldest first: suite.json keeps them."""
    records = []
    for path in sorted(run_dir.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and "benchmark" in data:
            records.append(data)
    return records


PARSERS = {"wall": lambda *_: {}, "json_line": parse_json_line, "results": parse_results, "curve": parse_curve,
           "memory": results_parser(*memory_suite.FACTS, "memory")}  # fmt: skip


def run_once(row: Row, run: dict[str, Any], ctx: dict[str, str], out: Path, timeout: float,
             keep: bool = False) -> dict[str, Any]:  # fmt: skip
    """Start the row's command once in a fresh process and read what its `parse` names."""
    run_dir = out / "runs" / f"{row['name']}-{run['index']}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    argv = fill(row["cmd"], {**ctx, "run": str(run_dir), "seed": run["seed"]})
    env = {**os.environ, **row.get("env", {})}
    record: dict[str, Any] = {"row": row["name"], **run, "command": shlex.join(argv), "env": row.get("env", {}),
                              "loadavg_1m": round(os.getloadavg()[0], 2)}  # fmt: skip
    tick = time.perf_counter()
    try:
        limit = None if timeout == float("inf") else max(timeout, 1)
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=limit, cwd=benchlib.REPO)
        record.update(rc=proc.returncode, stdout_tail=proc.stdout[-TAIL:], stderr_tail=proc.stderr[-TAIL:])
        stdout = proc.stdout
    except subprocess.TimeoutExpired as e:
        record.update(rc="timeout", stderr_tail=str(e.stderr or "")[-TAIL:])
        stdout = ""
    record["wall_seconds"] = time.perf_counter() - tick
    if record["rc"] == 0:
        try:
            record["parsed"] = PARSERS[row["parse"]](stdout, run_dir, row)
        except (OSError, ValueError, KeyError) as e:
            record["parse_error"] = f"{type(e).__name__}: {e}"
    records = saved_records(run_dir)
    if records:
        record["records"] = records
    if not keep:  # what was parsed is in the record; the run's own files (PNGs, checkpoints) go
        shutil.rmtree(run_dir, ignore_errors=True)
    return record


# -- the suite --------------------------------------------------------------------------------


def skip_reason(row: Row, suite: dict[str, Any], recipe: str | None) -> str | None:
    """Why the row cannot run here (None: it can)."""
    needs = {suite.get("needs"), row.get("needs")}
    # "cuda": a GPU; "cudaN": N GPUs or more on this machine.
    gpus = [int(need[4:] or 1) for need in needs if isinstance(need, str) and re.fullmatch(r"cuda\d*", need)]
    if gpus:
        import torch

        if not torch.cuda.is_available():
            return "needs a CUDA GPU"
        if torch.cuda.device_count() < max(gpus):
            return f"needs {max(gpus)} CUDA GPUs"
    if "recipe" in needs and not recipe:
        return "needs --recipe"
    return None


def run_suite(name: str, out: Path, recipe: str | None = None, budget: float = float("inf"), dry_run: bool = False,
              keep_runs: bool = False, only: list[str] | None = None,
              rows_only: list[str] | None = None) -> dict[str, Any]:  # fmt: skip
    """Run every row of suite `name` (interleaved within groups; `only`: these groups; `rows_only`:
    these rows) and return the record."""
    suite = SUITES[name]
    ctx = context(out, recipe)
    groups: dict[str, list[Row]] = {}
    for row in suite["rows"]:
        if (only is None or row["group"] in only) and (rows_only is None or row["name"] in rows_only):
            groups.setdefault(row["group"], []).append(row)
    start = time.perf_counter()
    records: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    for rows in groups.values():
        plan = []  # (row, run), interleaved: repeat 0 of every row, then repeat 1, ...
        for row in rows:
            reason = None if dry_run else skip_reason(row, suite, recipe)
            if reason:
                skipped[row["name"]] = reason
        live = [row for row in rows if row["name"] not in skipped]
        for k in range(max((len(runs_of(r)) for r in live), default=0)):
            plan += [(row, runs_of(row)[k]) for row in live if k < len(runs_of(row))]
        row_spent: dict[str, float] = {}
        for row, run in plan:
            if dry_run:
                print(shlex.join(fill(row["cmd"], {**ctx, "run": f"{out}/runs/{row['name']}-{run['index']}",
                                                   "seed": run["seed"]})))  # fmt: skip
                continue
            left = budget - (time.perf_counter() - start)
            row_left = row.get("budget", float("inf")) - row_spent.get(row["name"], 0.0)
            if min(left, row_left) < 1:
                skipped[row["name"]] = "time budget spent"
                continue
            record = run_once(row, run, ctx, out, min(left, row_left), keep_runs)
            row_spent[row["name"]] = row_spent.get(row["name"], 0.0) + record["wall_seconds"]
            records.append(record)
            print(f"[{name}] {row['name']} #{run['index']}: rc {record['rc']}, {record['wall_seconds']:.2f} s",
                  file=sys.stderr, flush=True)  # fmt: skip
    hw = benchlib.hardware()
    names = {row["name"] for rows in groups.values() for row in rows}  # the ratios of rows that ran here
    return {"suite": name, "date": benchlib.utc_now(), "hardware": hw, "hardware_label": benchlib.hardware_label(hw),
            "versions": benchlib.versions(), "command": shlex.join(["python", "-m", "benchmarks", *sys.argv[1:]]),
            "recipe": recipe,
            "rows": [row for rows in groups.values() for row in rows],
            "ratios": [r for r in suite.get("ratios", []) if {r[0], r[1]} <= names],
            "runs": records, "skipped": skipped,
            "suite_seconds": time.perf_counter() - start}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """`python -m benchmarks SUITE`: run it and write DIR/suite.json, DIR/README.md (and plots)."""
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    p.add_argument("suite", choices=sorted(SUITES))
    p.add_argument("--out", default=None, help="results folder (default benchmarks/results/<hardware>-<date>)")
    p.add_argument("--recipe", default=None, help="a training-config file for the time-to-99%% rows")
    p.add_argument("--budget", type=float, default=float("inf"), help="stop starting runs after this many seconds")
    p.add_argument("--dry-run", action="store_true", help="print the commands only")
    p.add_argument("--keep-runs", action="store_true", help="keep each run's folder under DIR/runs/")
    p.add_argument("--group", action="append", default=None, help="run only this group's rows (repeatable)")
    p.add_argument("--row", action="append", default=None, help="run only this row (repeatable)")
    args = p.parse_args(argv)
    for flag, key, asked in (("group", "group", args.group), ("row", "name", args.row)):
        known = {row[key] for row in SUITES[args.suite]["rows"]}
        if asked and set(asked) - known:
            print(f"error: --{flag} {', '.join(sorted(set(asked) - known))}: not a {flag} of {args.suite} "
                  f"({', '.join(sorted(known))})", file=sys.stderr)  # fmt: skip
            return 2
    if args.recipe and not Path(args.recipe).is_file():
        print(f"error: --recipe {args.recipe}: no such file", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else benchlib.default_out_dir(benchlib.hardware())
    record = run_suite(args.suite, out, args.recipe, args.budget, args.dry_run, args.keep_runs, args.group, args.row)
    if args.dry_run:
        return 0
    from benchmarks import report

    out.mkdir(parents=True, exist_ok=True)
    (out / "suite.json").write_text(json.dumps(record, indent=1, sort_keys=True, default=str) + "\n")
    (out / "README.md").write_text(report.readme(record))
    if SUITES[args.suite].get("plot"):
        report.plot_curves(record, SUITES[args.suite]["plot"], out / "time_to_accuracy.png")
    print(f"wrote {out / 'README.md'}")
    failed = [r for r in record["runs"] if r["rc"] != 0]
    return 1 if failed else 0
