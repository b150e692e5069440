r"""The family memory suite: predicted against measured peak GPU memory for architectures users bring.

    source .device/setup.sh && python3 -m benchmarks.family_suite --out OUT [--only REGEX] [--budget 270]
        [--alloc-conf expandable_segments:True]                    # OUT/family_suite.{json,md}
    python3 -m benchmarks.family_suite --out OUT --capped           # OUT/capped.{json,md}
    python3 -m benchmarks.family_suite --out OUT --merge A/family_suite.json B/family_suite.json   # one table

Rows: every family of benchmarks/families.py x batch (64, 1024, 4096) x accelerate_configs/
{single_gpu,zero2,zero3,fsdp2,zero3_offload}.yaml, and at batches 1024 and 4096 fsdp2.yaml as the
`accelerate config` wizard's other answers write it (into OUT/configs/): `fsdp2_size`
(SIZE_BASED_WRAP, 100000 parameters), `fsdp2_layer` (TRANSFORMER_BASED_WRAP of the family's block
class; not the RNNs), `fsdp2_ckpt` (activation checkpointing, with the layer wrap, else the size
wrap). A row is one `accelerate launch --num_processes 1 -m benchmarks.family_worker --family F`,
4 steps and the final evaluation, its results.json's predicted and measured peaks read back;
rows run `--parallel` at a time under `--gib` (peak_suite.py's runner). Held out, never used to
tune the prediction and reported apart: the families lstm, vit and grouped, and every batch-4096 row.

`--capped`: each CAPPED case runs under a capped allocator at `--batch-size auto` (the largest
batch the prediction fits under the cap), then at ceil(1.25 x that batch) under the same cap,
which should run out of memory; where it trains instead, the estimate was conservative by at
least 25% there.
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path
from typing import Any

import yaml

from accel_mnist.errors import EXIT_OUT_OF_MEMORY
from benchmarks.families import FAMILIES, LAYER_CLASSES
from benchmarks.peak_suite import TRAIN, measured_peak, run_row, run_rows, suite_parser

STRATEGIES = ("single_gpu", "zero2", "zero3", "fsdp2", "zero3_offload")
BATCHES = (64, 1024, 4096)
VARIANTS = ("fsdp2_size", "fsdp2_layer", "fsdp2_ckpt")  # accelerate_configs/fsdp2.yaml changed as fsdp_config() says
VARIANT_BATCHES = (1024, 4096)
HELD_OUT_FAMILIES = ("lstm", "vit", "grouped")
HELD_OUT_BATCH = 4096
# Rough GiB of activations per 1024 samples, for the rows' weights (the probe alone reaches batch 1024).
GIB_PER_1K = {"gru": 0.3, "lstm": 0.8, "encoder": 0.5, "vit": 2.5, "dwconv": 1.2, "grouped": 1.5, "embed": 3.5,
              "branchy": 1.2}  # fmt: skip
WORKER = ["-m", "benchmarks.family_worker"]
KEEP = ("num_parameters", "mixed_precision", "memory", "probe_seconds", "batch_size")
# (family, strategy, cap GiB); ZeRO's reduce bucket (5e8 fp16 elements, 0.93 GiB) needs the larger caps.
CAPPED = [("gru", "single_gpu", 1.5), ("gru", "zero2", 3), ("gru", "fsdp2", 2),
          ("encoder", "single_gpu", 2), ("encoder", "zero3", 3), ("encoder", "fsdp2", 2),
          ("dwconv", "single_gpu", 3), ("dwconv", "zero2", 4), ("dwconv", "zero3", 4)]  # fmt: skip
OOM = "out of CUDA memory"  # the start of accel_mnist's out-of-memory line


def fsdp_config(strategy: str, family: str) -> dict[str, Any] | None:
    """The fsdp_config keys a variant sets (the wizard's names, accelerate/commands/config/cluster.py); {} for a
    plain strategy, None where the variant does not apply to the family."""
    size = {"fsdp_auto_wrap_policy": "SIZE_BASED_WRAP", "fsdp_min_num_params": 100000}
    layer = ({"fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_transformer_layer_cls_to_wrap":
              LAYER_CLASSES[family]} if family in LAYER_CLASSES else None)  # fmt: skip
    # fsdp2_ckpt: accelerate checkpoints the modules the wrap policy picks, so it needs one
    ckpt = {**(layer or size), "fsdp_activation_checkpointing": True}
    return {"fsdp2_size": size, "fsdp2_layer": layer, "fsdp2_ckpt": ckpt}.get(strategy, {})


def worker_row(name: str, family: str, alloc_conf: str | None, weight: float, own: list[str], flags: list[str],
               **facts: Any) -> dict[str, Any]:  # fmt: skip
    """A row that launches benchmarks.family_worker (`own`: its flags before accel_mnist's)."""
    return {"name": name, "family": family, **facts, "alloc_conf": alloc_conf, "weight": weight,
            "env": {"PYTORCH_CUDA_ALLOC_CONF": alloc_conf} if alloc_conf else {},
            "train": [*WORKER, "--family", family, *own, *TRAIN[3:]], "flags": flags}  # fmt: skip


def rows(out: Path, alloc_conf: str | None = None) -> list[dict[str, Any]]:
    """Every (strategy, family, batch) row: name, held_out, rough weight in GiB and the worker's flags."""
    found = []
    for strategy in (*STRATEGIES, *VARIANTS):
        for family in FAMILIES:
            changes = fsdp_config(strategy, family)
            for batch in () if changes is None else BATCHES if strategy in STRATEGIES else VARIANT_BATCHES:
                found.append(worker_row(f"{strategy}-{family}-b{batch}", family, alloc_conf,
                                        round(2 + GIB_PER_1K[family] * max(batch, 1024) / 1024, 1), [],
                                        ["--batch-size", str(batch)], strategy=strategy, batch=batch,
                                        held_out=family in HELD_OUT_FAMILIES or batch == HELD_OUT_BATCH))  # fmt: skip
                if changes:
                    found[-1].update(fsdp_config=changes, config=str(out / "configs" / f"{strategy}-{family}.yaml"))
    return found


def capped_rows(alloc_conf: str | None = None) -> list[dict[str, Any]]:
    """One row per CAPPED case: the worker under the cap at `--batch-size auto`, 3 steps."""
    return [worker_row(f"capped-{strategy}-{family}-{cap}g", family, alloc_conf, cap + 1,
                       ["--cap-gib", str(cap)], ["--max-steps", "3", "--batch-size", "auto"], strategy=strategy,
                       cap_gib=cap) for family, strategy, cap in CAPPED]  # fmt: skip


def write_configs(chosen: list[dict[str, Any]]) -> None:
    """accelerate_configs/fsdp2.yaml with each variant row's fsdp_config keys, at the row's `config` path."""
    for row in chosen:
        if "config" in row:
            config = yaml.safe_load(Path("accelerate_configs/fsdp2.yaml").read_text())
            config["fsdp_config"].update(row["fsdp_config"])
            Path(row["config"]).parent.mkdir(parents=True, exist_ok=True)
            Path(row["config"]).write_text(f"# accelerate_configs/fsdp2.yaml with {row['fsdp_config']}\n"
                                           + yaml.safe_dump(config, sort_keys=False))  # fmt: skip


def flatten(record: dict[str, Any]) -> dict[str, Any]:
    """The record with the predicted and measured peaks from its results.json's `memory` beside it."""
    memory = record.get("memory") or {}
    predicted = memory.get("predicted") or {}
    first = (memory.get("per_process") or [{}])[0]
    measured, guess = measured_peak(record), predicted.get("peak_allocated_bytes")
    return {**record, "peak_allocated_bytes": measured, "peak_reserved_bytes": first.get("peak_reserved_bytes"),
            "predicted_peak_allocated_bytes": guess, "ratio": measured / guess if measured and guess else None,
            "peak_source": predicted.get("peak_source"), "peak_unpredicted": predicted.get("peak_unpredicted"),
            "trace_peak_allocated_bytes": predicted.get("trace_peak_allocated_bytes")}  # fmt: skip


def run_capped(row: dict[str, Any], folder: Path, timeout: float) -> dict[str, Any]:
    """The auto-batch run under the cap, then the same cap at ceil(1.25 x its batch)."""
    first = flatten(run_row(row, folder, timeout, keep=KEEP))
    auto = first.get("batch_size") if first["rc"] == 0 else None
    record = {**first, "auto_batch": auto, "auto_oom": ran_out(first)}
    if not auto:
        return {**record, "note": "no auto batch: " + (note(first) if first["rc"] else "results.json has none")}
    bigger = math.ceil(1.25 * auto)
    again = {**row, "name": row["name"] + "-x1.25", "flags": [*row["flags"][:-1], str(bigger)]}
    second = run_row(again, folder, timeout, keep=())
    said = ("ran out of memory, as predicted" if ran_out(second) else "trained: the estimate is conservative by at "
            "least 25% here" if second["rc"] == 0 else f"failed otherwise: {note(second)}")  # fmt: skip
    return {**record, "seconds": first["seconds"] + second["seconds"], "bigger_batch": bigger,
            "bigger_rc": second["rc"], "bigger_oom": ran_out(second), "note": said}  # fmt: skip


def ran_out(record: dict[str, Any]) -> bool:
    return record["rc"] == EXIT_OUT_OF_MEMORY or OOM in record.get("tail", "")


def mib(value: int | None) -> str:
    return f"{value / 2**20:.0f}" if value else "–"


def note(record: dict[str, Any]) -> str:
    """Why a row has no ratio: its failure (its last `error:` line, else the last exception the worker raised, else
    the last line it printed), or why it predicted nothing ("cannot predict: ..."); else nothing."""
    if record["rc"] == "skipped":
        return "skipped: past --budget"
    if record["rc"] != 0:
        lines = [line.strip() for line in record.get("tail", "").splitlines() if line.strip()]
        raised = [x for x in lines if re.match(r"[\w.]+(Error|Exception)\b", x) and "CalledProcessError" not in x]
        line = ([x for x in lines if x.startswith("error:")] or raised or lines or [""])[-1][:200]
        return f"rc {record['rc']}: " + line.replace("|", "/")
    reason = "" if record.get("predicted_peak_allocated_bytes") else record.get("peak_unpredicted") or "(no reason)"
    return reason if not reason or reason.startswith("cannot predict") else f"cannot predict: {reason}"


def table(records: list[dict[str, Any]]) -> str:
    """Markdown: the tuning rows, then the held-out ones, each group with its summary line."""
    out = []
    for title, held_out in (("tuning", False), ("held out", True)):
        group = [r for r in records if bool(r.get("held_out")) == held_out]
        out += [f"### {title} rows", "", "| row | held out | predicted MiB (source) | trace MiB | allocated MiB | "
                "reserved MiB | measured / predicted | note |", "|---|---|---:|---:|---:|---:|---:|---|"]  # fmt: skip
        for r in group:
            q = r.get("ratio")
            cells = [r["name"], "yes" if held_out else "", f"{mib(r.get('predicted_peak_allocated_bytes'))} "
                     f"({r.get('peak_source') or '–'})", mib(r.get("trace_peak_allocated_bytes")),
                     mib(r.get("peak_allocated_bytes")), mib(r.get("peak_reserved_bytes")), f"{q:.3f}" if q else "–",
                     note(r)]  # fmt: skip
            out.append("| " + " | ".join(cells) + " |")
        out += ["", summary(title, group), ""]
    return "\n".join(out)


def summary(title: str, group: list[dict[str, Any]]) -> str:
    """One line: rows, within 10%, under- and over-predicted by more than 10%, not predicted, failed, the worst."""
    ratios = {r["name"]: r["ratio"] for r in group if r.get("ratio")}
    worst = sorted(ratios.items(), key=lambda item: -abs(math.log(item[1])))[:3]
    ran = [r for r in group if r["rc"] == 0]
    return (f"**{title}**: {len(group)} rows, {len(ratios)} predicted, "
            f"{sum(abs(q - 1) <= 0.10 for q in ratios.values())} within 10%, "
            f"{sum(q > 1.10 for q in ratios.values())} under-predicted by more than 10% (measured / predicted > 1.10), "
            f"{sum(q < 0.90 for q in ratios.values())} over-predicted by more than 10%, "
            f"{sum(not r.get('predicted_peak_allocated_bytes') for r in ran)} not predicted, "
            f"{len(group) - len(ran)} failed or skipped; worst: "
            + (", ".join(f"{name} {q:.3f}" for name, q in worst) or "–"))  # fmt: skip


def capped_table(records: list[dict[str, Any]]) -> str:
    lines = ["| case | cap GiB | auto batch | auto run | predicted MiB | measured MiB | 1.25x batch | at 1.25x | "
             "note |", "|---|---:|---:|---|---:|---:|---:|---|---|"]  # fmt: skip
    for r in records:
        runs = [f"rc {r.get(k)}" + (", out of memory" if r.get(oom) else "") if k in r else "–"
                for k, oom in (("rc", "auto_oom"), ("bigger_rc", "bigger_oom"))]  # fmt: skip
        cells = [r["name"], str(r.get("cap_gib")), str(r.get("auto_batch") or "–"), runs[0],
                 mib(r.get("predicted_peak_allocated_bytes")), mib(r.get("peak_allocated_bytes")),
                 str(r.get("bigger_batch") or "–"), runs[1], r.get("note") or note(r)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = suite_parser("predicted against measured peak memory for other architectures", parallel=12)
    p.add_argument("--budget", type=float, default=None, help="seconds after which no row starts (skipped)")
    p.add_argument("--alloc-conf", default=None, help="PYTORCH_CUDA_ALLOC_CONF for every row's process")
    p.add_argument("--capped", action="store_true", help="the capped-allocator checks instead of the rows")
    p.add_argument("--merge", nargs="+", metavar="JSON", help="write one table from these family_suite.json files")
    args = p.parse_args(argv)
    out = Path(args.out).resolve()
    every = capped_rows(args.alloc_conf) if args.capped else rows(out, args.alloc_conf)
    chosen = [r for r in every if not args.only or re.search(args.only, r["name"])]
    out.mkdir(parents=True, exist_ok=True)
    name = "capped" if args.capped else "family_suite"
    if args.merge:  # the records of several calls (--only), in the suite's order, as one table
        order = {r["name"]: i for i, r in enumerate(every)}
        done = sorted((r for path in args.merge for r in json.loads(Path(path).read_text())["rows"]),
                      key=lambda r: order.get(r["name"], len(order)))  # fmt: skip
        (out / f"{name}.json").write_text(json.dumps({"rows": done}, indent=1) + "\n")
    else:
        write_configs(chosen)
        deadline = time.monotonic() + args.budget if args.budget else None
        done = run_rows(chosen, out / f"{name}.json", parallel=args.parallel, gib=args.gib, timeout=args.timeout,
                        deadline=deadline, run=run_capped if args.capped else
                        lambda row, folder, timeout: flatten(run_row(row, folder, timeout, keep=KEEP)))  # fmt: skip
    text = capped_table(done) if args.capped else table(done)
    conf = ", ".join(sorted({str(r.get("alloc_conf") or "(unset)") for r in done})) or "(unset)"
    (out / f"{name}.md").write_text(f"PYTORCH_CUDA_ALLOC_CONF: {conf}\n\n{text}\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
