r"""The meta-device trace judged on a CPU against peaks measured on a GPU: the family suite's committed rows.

    python3 -m benchmarks.trace_check [--rows GLOB ...] [--out DIR]      # DIR/trace_check.{md,json}

Each committed row of benchmarks/family_suite.py (its family, strategy, batch and precision; the
measured peak allocated bytes of its one process) is predicted again here, on the CPU, from the
trace alone, as `accel-mnist estimate` predicts without a GPU: the family's model built on the meta
device, the trace under the strategy's precision rule (autocast beside fp32 weights for one process,
16-bit weights under DeepSpeed and FSDP2), the strategy's model states. A row is within 10%, over
(the prediction above the measurement by more than 10%: the safe side), under (the measurement above
it by more than 10%: a "fits" that may run out), or refused: the trace says in one line what it
cannot model, and nothing is predicted. Rows the family suite holds out (benchmarks/family_suite.py
HELD_OUT) are reported apart. No GPU is needed.
"""

from __future__ import annotations

import argparse
import glob
import json
from pathlib import Path
from typing import Any

ROWS = ("benchmarks/results/h200-2026-12-04-memory/family_suite_call2.json",
        "benchmarks/results/h200-2026-12-04-memory/family_suite_fsdp2.json")  # fmt: skip
# The family suite's strategies as `estimate` names them; fsdp2_layer differs from fsdp2 in its wrap only.
ESTIMATE = {"single_gpu": "ddp", "zero2": "zero2", "zero3": "zero3", "fsdp2": "fsdp", "fsdp2_layer": "fsdp"}


def committed_rows(patterns: tuple[str, ...] = ROWS) -> list[dict[str, Any]]:
    """The rows that trained and measured a peak, one per name (the last file's wins)."""
    rows: dict[str, dict[str, Any]] = {}
    for pattern in patterns:
        for path in sorted(glob.glob(pattern)):
            for row in json.loads(Path(path).read_text())["rows"]:
                if row.get("rc") == 0 and row.get("peak_allocated_bytes") and row["strategy"] in ESTIMATE:
                    rows[row["name"]] = row
    return [rows[name] for name in sorted(rows)]


def predict(row: dict[str, Any]) -> tuple[int | None, str]:
    """The row's peak predicted from the trace alone, and '' (or the trace's one line where it predicts none)."""
    import torch

    from accel_mnist.memory.activations import Untraceable
    from accel_mnist.memory.estimate import MNIST_DEVICE_BYTES, estimate, trace_inputs
    from accel_mnist.memory.peak_inputs import TRACE_ERRORS
    from benchmarks.families import FAMILIES

    with torch.device("meta"):
        model = FAMILIES[row["family"]]()
    name, precision = ESTIMATE[row["strategy"]], row["mixed_precision"]
    zero = {"stage": int(name[-1])} if name.startswith("zero") else None
    common = {"batch_size": row["batch"], "eval_batch_size": 1000, "mixed_precision": precision,
              "optimizer": "adam", "data_bytes": MNIST_DEVICE_BYTES, "zero": zero}  # fmt: skip
    try:
        inputs, sharded = trace_inputs(model, **common)
    except Untraceable as exc:
        return None, str(exc)
    except TRACE_ERRORS as exc:
        return None, f"its forward pass does not run on the meta device ({type(exc).__name__})"
    numels = [p.numel() for p in model.parameters() if p.requires_grad]
    rows = estimate(numels, mixed_precision=precision, optimizer="adam", strategies=[name], peak=inputs,
                    sharded_peak=sharded)  # fmt: skip
    return rows[name]["peak_allocated_bytes"], ""


def judge(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row with its trace prediction, measured / predicted and its verdict."""
    out = []
    for row in rows:
        predicted, why = predict(row)
        ratio = row["peak_allocated_bytes"] / predicted if predicted else None
        verdict = ("refused" if ratio is None else "within" if abs(ratio - 1) <= 0.10 else
                   "under" if ratio > 1 else "over")  # fmt: skip
        out.append({"name": row["name"], "held_out": bool(row["held_out"]), "measured": row["peak_allocated_bytes"],
                    "predicted": predicted, "ratio": round(ratio, 3) if ratio else None, "verdict": verdict,
                    "why": why})  # fmt: skip
    return out


def summary(judged: list[dict[str, Any]], held_out: bool) -> str:
    """One line: how many rows of the tuning (or held-out) part are within, over, under and refused."""
    part = [j for j in judged if j["held_out"] == held_out]
    counts = {v: sum(j["verdict"] == v for j in part) for v in ("within", "over", "under", "refused")}
    return (f"{'held out' if held_out else 'tuning'}: {len(part)} rows, {counts['within']} within 10%, "
            f"{counts['over']} over by more than 10%, {counts['under']} under by more than 10%, "
            f"{counts['refused']} refused in one line")  # fmt: skip


def markdown(judged: list[dict[str, Any]]) -> str:
    """The rows as a table, then the two summary lines."""
    mib = 2**20
    lines = [
        "| row | held out | measured MiB | trace MiB | measured / trace | verdict |",
        "|---|---|---:|---:|---:|---|",
    ]
    for j in judged:
        trace = f"{j['predicted'] / mib:.0f}" if j["predicted"] else "–"
        verdict = j["verdict"] + (f": {j['why']}" if j["why"] else "")
        lines.append(f"| {j['name']} | {'yes' if j['held_out'] else ''} | {j['measured'] / mib:.0f} | {trace} | "
                     f"{j['ratio'] or '–'} | {verdict} |")  # fmt: skip
    return "\n".join([*lines, "", summary(judged, False), "", summary(judged, True), ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.trace_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="+", default=list(ROWS), help="family suite JSON files (globs)")
    parser.add_argument("--out", type=Path, help="write trace_check.md and trace_check.json there")
    args = parser.parse_args(argv)
    judged = judge(committed_rows(tuple(args.rows)))
    text = markdown(judged)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "trace_check.md").write_text(text)
        (args.out / "trace_check.json").write_text(json.dumps(judged, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
