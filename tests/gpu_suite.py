"""The GPU tier as cells that share one GPU: `make test-gpu` (the quick suite, one command within a
530 s budget, meant to be green in nine minutes on one H100 or H200) and `make test-gpu SHARD=k/n`
(the rest, in n shards).

    python -m tests.gpu_suite --out DIR [--shard k/n] [--parallel N] [--budget SECONDS]

A cell is one subprocess: a recipe launched as a user types it, a group of the pair or option
matrix (one launch that runs every cell of the table, tests/matrix_worker.py), or a pytest file of
tests/gpu. Cells that take the most of the card's memory-time (GiB x seconds) start first, as many at once as
`--parallel` allows and the GPU memory each may hold fits in CARD_SHARE of the card (the
billion-parameter recipe holds 8-45 GiB, HEAVY_GIB); the launches
are start-up bound (imports, process groups, DeepSpeed's engine), so sharing the card costs the
cells little time and the tier its minutes. Every cell ends as passed or failed with one line of
detail; the table is printed and written to DIR/gpu_suite.md and DIR/gpu_suite.json, and the
command exits 1 when any cell failed or did not start within the budget.

The quick suite: every shipped recipe under every strategy that runs on one GPU; the pair
matrix's covering array (tests/pairs.py, the generator the CPU runs) under QUICK_PAIR_GROUPS, one
group per way a GPU sets up the step; the captured step; the probed peak, the auto batch and the
out-of-memory line at a capped allocator on two model families; SIGTERM and resume under FSDP2.
The rest: the other pair groups, the option matrix's GPU groups and the other GPU test files.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from tests.card_watch import CardWatch
from tests.helpers import REPO, console_script, error_lines
from tests.process_tree import signal_tree

# One group for each way a GPU sets up the step: one process in fp32, bf16 autocast and fp16 with
# a GradScaler; DDP; dynamo (inductor); ZeRO-2 in fp16 (the seed's setup) and with the optimizer
# on the host; ZeRO-3 in bf16 and offloaded in fp16; FSDP1 and FSDP2; a DeepSpeed JSON with its
# own optimizer and schedule.
QUICK_PAIR_GROUPS = (
    ("single_gpu", "no"), ("single_gpu", "bf16"), ("single_gpu", "fp16"), ("multi_gpu", "bf16"),
    ("dynamo", "bf16"), ("zero2", "fp16"), ("zero2_offload", "bf16"), ("zero3", "bf16"),
    ("zero3_offload", "fp16"), ("fsdp", "bf16"), ("fsdp2", "bf16"), ("zero_file_optim_sched", "fp16"),
)  # fmt: skip
QUICK_TESTS = (
    "tests/gpu/test_cuda_graph.py",
    "tests/gpu/test_peak.py",
    "tests/gpu/test_fsdp.py::test_sigterm_under_fsdp2_saves_and_resumes_exactly",
)
# Their cells run above (recipes, pairs, the option matrix): not again as pytest files.
RUN_AS_CELLS = ("test_recipes.py", "test_pairs.py", "test_matrix.py")
# The billion-parameter recipe holds ~17 GiB of GPU memory (fp32 Adam) or ~20 GiB of host memory.
HEAVY = {"zero3_offload_1b.yaml"}


@dataclass
class Cell:
    """One subprocess of the tier and how to read its end: `judge(proc, out)` -> (passed, detail)."""

    name: str
    out: Path  # the cell's folder: its outputs and log.txt
    command: list[str]
    judge: Callable[[subprocess.CompletedProcess, Path], tuple[bool, str]]
    gib: float = 3.0  # GPU memory it may hold at once
    seconds: float = 60.0  # expected time, for the order and the shards
    env: dict[str, str] = field(default_factory=dict)


def cell_dir(root: Path, name: str) -> Path:
    """The folder of the cell called `name` under the suite's output folder."""
    return root / "cells" / re.sub(r"[^\w.-]+", "_", name).strip("_")


def recipe_strategies() -> list:
    """Each strategy of the option matrix that runs on one CUDA GPU, once."""
    from tests.matrix import groups

    seen: dict[str, object] = {}
    for strategy, _precision, processes in groups("cuda"):
        if processes == 1:
            seen.setdefault(strategy.name, strategy)
    return list(seen.values())


def recipe_command(strategy, recipe: Path, out: Path) -> list[str]:
    """The launch a user types for `recipe` under `strategy`, at the config's own precision."""
    from tests.matrix import launch_args

    train = ["-m", "accel_mnist", "train", "--config", str(recipe), "--output-dir", str(out), "--no-plots"]
    if strategy.launch == ("python",):
        return [sys.executable, *train, *strategy.train_args]
    launch = launch_args(strategy, "cuda", None, 1)
    return [console_script("accelerate"), "launch", *launch, "--main_process_port", "0", *train]


def recipe_outcome(proc: subprocess.CompletedProcess, out: Path) -> dict:
    """trains (with steps and accuracy), refuses (its one line) or crashes (the output's tail)."""
    results = out / "results.json"
    if proc.returncode == 0 and results.is_file():
        data = json.loads(results.read_text())
        return {"kind": "trains", "steps": data.get("steps"), "test_accuracy": data.get("test_accuracy"),
                "changes": data.get("changes", [])}  # fmt: skip
    errors = error_lines(proc)
    # Under `accelerate launch` the launcher exits 1 and prints a traceback of its own after the
    # worker's line (docs/reliability.md, exit codes): only a frame of the package's is the run's.
    ours = re.search(r'File ".*accel_mnist[/\\]', proc.stderr)
    if proc.returncode in (1, 2) and len(errors) == 1 and not ours:
        return {"kind": "refuses", "line": errors[0]}
    return {"kind": "crashes", "rc": proc.returncode, "tail": (proc.stdout + proc.stderr)[-3000:]}


def judge_recipe(proc: subprocess.CompletedProcess, out: Path) -> tuple[bool, str]:
    """Trained and learned (MNIST's chance is 0.1; the billion-parameter recipe stops after 10
    steps at 0.44-0.49, the fast recipes at 0.99 or their step limit), or refused in one line."""
    got = recipe_outcome(proc, out / "run")
    if got["kind"] == "trains":
        return (got["test_accuracy"] or 0) > 0.3, f"trains: {got['steps']} steps, accuracy {got['test_accuracy']}"
    if got["kind"] == "refuses":
        return True, f"refuses: {got['line']}"
    return False, f"crashes (rc {got['rc']}): {got['tail'][-1500:]}"


def recipe_cells(root: Path) -> list[Cell]:
    """Every shipped recipe under every strategy that runs on one GPU."""
    cells = []
    for recipe in sorted((REPO / "recipes").glob("*.yaml")):
        for strategy in recipe_strategies():
            name = f"recipe {recipe.stem} {strategy.name}"
            out = cell_dir(root, name)
            heavy, offload = recipe.name in HEAVY, "offload" in strategy.name
            # Seen on one H100 with twelve cells at once: 40-60 s a launch; the heavy recipe's
            # offloads 180-290 s (the host's Adam over a billion parameters), holding ~8 GiB of GPU.
            seconds = (240.0 if offload else 60.0) if heavy else 80.0 if strategy.dynamo else 45.0
            gib = cell_gib(strategy, heavy)
            cells.append(Cell(name, out, recipe_command(strategy, recipe, out / "run"), judge_recipe, gib, seconds))
    return cells


# What the billion-parameter recipe held on the card under each strategy (nvidia-smi, the CUDA context
# and the allocator's cache included; one H100, 2026-12-06, tests/card_watch.py), 5% added: far above the
# 20.5-25.5 GiB `accel-mnist estimate` predicts as allocated for the states on the GPU (FSDP1 45.1 GiB).
HEAVY_GIB = {
    "fsdp": 47.4, "fsdp2": 27.6, "single_gpu": 23.2, "multi_gpu": 23.8, "multinode_ddp": 23.8, "dynamo": 24.3,
    "zero1": 31.8, "zero2": 31.8, "multinode_zero2": 31.8, "zero3": 35.1, "zero_file": 36.1,
    "zero_file_optim_sched": 36.1, "--deepspeed_config deepspeed_config": 36.1,
    "--deepspeed_config deepspeed_optim_sched": 36.1, "zero2_offload": 8.5, "zero3_offload": 10.4,
}  # fmt: skip
HEAVY_UNSEEN = 48.0  # a strategy added since: the most any held
# The cells' declared peaks are measured ones, context and cache included, and they seldom coincide (the run
# above: 66.2 GiB on the card at its peak), so they may add up to 95% of it; the rest is the runner's slack.
CARD_SHARE = 0.95


def cell_gib(strategy, heavy: bool, precision: str | None = None) -> float:
    """GPU memory a cell may hold under `strategy`: the billion-parameter recipe's as measured, else what the
    small recipes held (3.8-4.0 GiB under DeepSpeed, at most 2.5 otherwise, same run); a table group at
    `precision` (None: a recipe's cell) under ZeRO-3 in fp32 held 5.7-6.0 GiB (results/h100-2026-12-06-gpu-c)."""
    if heavy:
        return HEAVY_GIB.get(strategy.name, HEAVY_UNSEEN)
    if strategy.zero_stage == 3 and precision == "no":
        return 6.3
    return 4.2 if strategy.kind == "DEEPSPEED" else 3.0


def group_cells(table: str, root: Path, keep: Callable[[str, str], bool]) -> list[Cell]:
    """One launch per group of the pair ("pairs") or option ("matrix") table on CUDA whose
    (strategy, precision) `keep` accepts; each cell of the group is compared with the table."""
    from tests import matrix, pairs
    from tests.matrix_worker import group_command, mismatches

    cells = []
    for group in (pairs if table == "pairs" else matrix).groups("cuda"):
        strategy, precision, processes = group
        if not keep(strategy.name, precision):
            continue
        name = f"{table} {strategy.name} {precision}"
        out = cell_dir(root, name)
        command, env = group_command(strategy, precision, "cuda", processes, out, table)

        def judge(proc, _out, group=group, out=out) -> tuple[bool, str]:
            result = out / "outcomes.json"
            if not result.is_file():
                return False, f"wrote no outcomes (rc {proc.returncode}): {proc.stderr[-1500:]}"
            outcomes = json.loads(result.read_text())
            wrong = mismatches(table, group, "cuda", outcomes)
            kinds = sorted({o["kind"] for o in outcomes.values()})
            tally = ", ".join(f"{sum(o['kind'] == k for o in outcomes.values())} {k}" for k in kinds)
            return not wrong, f"{len(outcomes)} cells: {tally}" + (f"; {len(wrong)} wrong: {wrong[0]}" if wrong else "")

        # One H100, 2026-12-06, twelve cells at once: pair groups 110 s, those offloading 226-242 s.
        seconds = (240.0 if "offload" in strategy.name else 130.0) if table == "pairs" else 90.0
        cells.append(Cell(name, out, command, judge, cell_gib(strategy, False, precision), seconds, env))
    return cells


def pytest_cell(root: Path, target: str, seconds: float = 120.0, extra: list[str] | None = None) -> Cell:
    """A pytest file (or test) of tests/gpu in a process of its own."""

    def judge(proc, _out) -> tuple[bool, str]:
        lines = [line for line in proc.stdout.splitlines() if line.strip()]
        last = lines[-1] if lines else proc.stderr[-300:]
        failures = [line for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR", "E ", "/"))]
        return proc.returncode == 0, "; ".join([last, *failures])[:1500]

    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "--tb=line", "-p", "no:cacheprovider", "-o", "addopts="]
    cmd.append(target)
    name = f"pytest {target.removeprefix('tests/gpu/')}"
    out = cell_dir(root, name)
    # A wide terminal: pytest cuts its short summary, the failure's message with it, to the width.
    return Cell(name, out, [*cmd, *(extra or []), "--basetemp", str(out / "tmp")], judge, 4.0, seconds,
                {"COLUMNS": "400"})  # fmt: skip


def quick(root: Path) -> list[Cell]:
    """The quick suite: `make test-gpu`."""
    pair_groups = group_cells("pairs", root, lambda s, p: (s, p) in QUICK_PAIR_GROUPS)
    seconds = {"tests/gpu/test_cuda_graph.py": 150.0, "tests/gpu/test_peak.py": 90.0}
    return [*recipe_cells(root), *pair_groups, *(pytest_cell(root, t, seconds.get(t, 120.0)) for t in QUICK_TESTS)]


# Files seen to take longer than 90 s among the other cells (one H200, 2026-12-05: test_distributed.py and
# test_ds_json.py past 120 s when their shard's budget ended).
EXPECTED_SECONDS = {"test_distributed.py": 180.0, "test_ds_json.py": 180.0}
# Files run as one cell per test, in parallel: test_fsdp.py's twelve launches took past 500 s one after
# another and 124 s side by side (one H100, 2026-12-06; each 29-103 s).
SPLIT = {"test_fsdp.py": 110.0}


def collected_tests(target: str) -> list[str]:
    """The node ids of the tests in `target` (a file of tests/gpu), as pytest collects them."""
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-o", "addopts=", target]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300).stdout
    return [line.strip() for line in out.splitlines() if line.startswith(target + "::")]


def rest(root: Path) -> list[Cell]:
    """Everything of the GPU tier the quick suite leaves out: `make test-gpu SHARD=k/n`."""
    tests = []
    for path in sorted((REPO / "tests" / "gpu").glob("test_*.py")):
        target = str(path.relative_to(REPO))
        if path.name in RUN_AS_CELLS or target in QUICK_TESTS:
            continue
        if path.name in SPLIT:
            tests += [pytest_cell(root, t, SPLIT[path.name]) for t in collected_tests(target) if t not in QUICK_TESTS]
            continue
        # A file one of whose tests the quick suite runs: the others here.
        ran = [t.split("::")[1] for t in QUICK_TESTS if t.startswith(target + "::")]
        extra = ["-k", " and ".join(f"not {name}" for name in ran)] if ran else []
        tests.append(pytest_cell(root, target, EXPECTED_SECONDS.get(path.name, 90.0), extra))
    return [
        *group_cells("pairs", root, lambda s, p: (s, p) not in QUICK_PAIR_GROUPS),
        *group_cells("matrix", root, lambda s, p: True),
        *tests,
    ]


def shard(cells: list[Cell], k: int, n: int) -> list[Cell]:
    """Shard k of n (1-based): the longest cells first, each to the shard with the least time so far."""
    loads = [0.0] * n
    mine = []
    for cell in sorted(cells, key=lambda c: (-c.seconds, c.name)):
        least = loads.index(min(loads))
        loads[least] += cell.seconds
        if least == k - 1:
            mine.append(cell)
    return mine


def card_gib() -> float:
    """This GPU's memory in GiB (torch in the runner alone: the cells start their own processes)."""
    import torch

    return torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else 0.0


def run_cells(cells: list[Cell], out: Path, parallel: int, budget: float, watch: CardWatch) -> list[dict]:
    """Run every cell, at most `parallel` at once and within the card's memory; one row per cell, in
    the order the cells finish.

    The next cell to start is the first in the queue (by GiB times expected seconds, largest first)
    whose memory fits what the running cells leave: a large cell waits for room without
    holding a slot, and the small ones run meanwhile.
    """
    free = max(CARD_SHARE * card_gib(), max(c.gib for c in cells))
    queue = sorted(cells, key=lambda c: -c.gib * c.seconds)  # the most memory-time first: it bounds the tail
    deadline = time.monotonic() + budget
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    rows: list[dict] = []

    def one(cell: Cell) -> dict:
        left = deadline - time.monotonic()
        if left < 10:
            return {"cell": cell.name, "passed": False, "seconds": 0.0, "detail": "not started: budget spent"}
        cell.out.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        proc = subprocess.Popen(cell.command, cwd=REPO, env={**env, "OMP_NUM_THREADS": "1", **cell.env},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        watch.track(cell.name, proc.pid)
        try:
            stdout, stderr = proc.communicate(timeout=left)
            (cell.out / "log.txt").write_text(stdout + stderr)
            passed, detail = cell.judge(
                subprocess.CompletedProcess(cell.command, proc.returncode, stdout, stderr), cell.out
            )
        except subprocess.TimeoutExpired:
            signal_tree(proc.pid, signal.SIGKILL)  # a launch's workers too, which a kill of its first process leaves
            stdout, stderr = proc.communicate()
            (cell.out / "log.txt").write_text(f"{stdout}{stderr}\n[cut after {left:.0f} s: the suite's budget]\n")
            passed, detail = False, f"ran past the budget ({budget:.0f} s)"
        finally:
            watch.untrack(cell.name)
        return {"cell": cell.name, "passed": passed, "seconds": round(time.monotonic() - start, 1),
                "gib": watch.peak_gib(cell.name), "declared_gib": cell.gib, "detail": detail}  # fmt: skip

    running: dict[Future, Cell] = {}
    with ThreadPoolExecutor(parallel) as pool:
        while queue or running:
            for cell in list(queue):
                if len(running) < parallel and cell.gib <= free:
                    queue.remove(cell)
                    free -= cell.gib
                    running[pool.submit(one, cell)] = cell
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                free += running.pop(future).gib
                row = future.result()
                rows.append(row)
                print(f"{'passed' if row['passed'] else 'FAILED'} {row['seconds']:6.1f} s  {row['cell']}", flush=True)
    return rows


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table, by cell name."""
    lines = ["| cell | outcome | seconds | GPU GiB held (declared) | detail |", "| --- | --- | --- | --- | --- |"]
    for row in sorted(rows, key=lambda r: r["cell"]):
        detail = row["detail"].replace("|", "\\|").replace("\n", " ")[:300]
        held = f"{row.get('gib') if row.get('gib') is not None else '-'} ({row.get('declared_gib', '-')})"
        outcome = "passed" if row["passed"] else "FAILED"
        lines.append(f"| {row['cell']} | {outcome} | {row['seconds']} | {held} | {detail} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.gpu_suite", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the table and each cell's log")
    parser.add_argument("--shard", help="k/n: shard k of n of the rest of the GPU tier (default: the quick suite)")
    parser.add_argument("--parallel", type=int, default=12, help="cells at once (default 12)")
    parser.add_argument("--budget", type=float, default=530, help="seconds for the whole suite (default 530)")
    parser.add_argument("--list", action="store_true", help="print the cells and their expected seconds, run none")
    args = parser.parse_args(argv)
    if args.shard:
        k, _, n = args.shard.partition("/")
        if not (k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
            parser.error(f"--shard {args.shard}: expected k/n with 1 <= k <= n")
        cells = shard(rest(args.out), int(k), int(n))
    else:
        cells = quick(args.out)
    if args.list:
        print("\n".join(f"{c.seconds:6.0f} s  {c.gib:4.0f} GiB  {c.name}" for c in cells))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("error: the GPU tier needs a CUDA GPU, and torch sees none", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with CardWatch() as watch:
        rows = run_cells(cells, args.out, args.parallel, args.budget, watch)
    failed = [r for r in rows if not r["passed"]]
    summary = f"{len(rows) - len(failed)} passed, {len(failed)} failed in {time.monotonic() - start:.0f} s"
    if watch.available:  # what the scheduler's declarations came to on the card itself
        mib, then = watch.card_peak
        summary += f"; the card's peak: {mib / 1024:.1f} GiB of {card_gib():.1f}, while {', '.join(then)} ran"
    print(table(rows), summary, sep="\n\n")
    (args.out / "gpu_suite.md").write_text(f"{table(rows)}\n\n{summary}\n")
    (args.out / "gpu_suite.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
