"""Runs cells of the option matrix (tests/matrix.py), or of the pair matrix (tests/pairs.py,
with --pairs), one after another in one launched process group, and writes what each did to a
JSON file (rank 0).

    accelerate launch LAUNCH_ARGS -m tests.matrix_worker OUT.json STRATEGY PRECISION DEVICE [--pairs] [CELL ...]

One launch per strategy, precision and process count keeps the launch tier's time in check: the
cells share the interpreter, the imports and the process group (train() leaves the group to the
process's exit, so that it can run again in the same process).
Each cell records "trains", "changes" (results.json's `changes` lines), "refuses" (the UsageError's
one line) or "crashes" (the traceback): the last is always a failure. A pair cell may hold several of
the ways of running that are not options (your own model and data, a resume): they compose.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from accel_mnist import train
from accel_mnist.errors import UsageError, one_line
from tests.matrix import EXTRA_CELLS, option_cells

STEPS = 2


def tiny_data():
    """Your own data: 256 training and 64 test images as a torch TensorDataset of (image, label)."""
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (320, 1, 28, 28), dtype=torch.uint8, generator=g)
    labels = torch.randint(0, 10, (320,), generator=g)
    dataset = torch.utils.data.TensorDataset(images, labels)
    return torch.utils.data.Subset(dataset, range(256)), torch.utils.data.Subset(dataset, range(256, 320))


class OwnModel(torch.nn.Module):
    """A model of the caller's: a convolution and a linear head, returning logits."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 8, 3, stride=2)
        self.head = torch.nn.Linear(8 * 13 * 13, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.conv(x)).flatten(1))


def extras(cell) -> frozenset[str]:
    """The EXTRA_CELLS a cell holds: a pair cell names them, an option cell is one or none."""
    return getattr(cell, "extras", frozenset({cell.name}) & frozenset(EXTRA_CELLS))


def run_cell(cell, base: dict, out: Path) -> dict:
    """Train one cell (with your own model, your own data, resumed: as many as it holds); its outcome."""
    config = cell.config(**base, output_dir=str(out))
    ways = extras(cell)

    def run(config):
        model = OwnModel() if "own_model" in ways else None
        train_data, test_data = tiny_data() if "own_data" in ways else (None, None)
        return train(config, model, train_data=train_data, test_data=test_data)

    if "resume" in ways:
        first = run(config.replace(checkpoint_every=1, save_checkpoints=True, keep_checkpoints=2))
        step_1 = out / "checkpoints" / "step_1"
        results = run(config.replace(resume_from=str(step_1), checkpoint_every=1, save_checkpoints=True))
        if results["steps"] != first["steps"]:
            raise AssertionError(f"resumed run ended at step {results['steps']}, not {first['steps']}")
    else:
        results = run(config)
    if results.get("steps") != STEPS:
        raise AssertionError(f"trained {results.get('steps')} steps, not {STEPS}")
    changes = list(results.get("changes", []))
    return {"kind": "changes" if changes else "trains", "lines": changes}


def small_mnist(folder: Path) -> str:
    """Synthetic MNIST files of 640 training and 32 test images, read as `mnist` in this process
    (its record counts expected): the cells test what runs, not what is learnt."""
    from accel_mnist.data.catalog import DATASETS
    from tests.helpers import write_synthetic_mnist

    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        write_synthetic_mnist(folder, n_train=640, n_test=32)
    DATASETS["mnist"] = dataclasses.replace(DATASETS["mnist"], train_records=640, test_records=32)
    return str(folder)


def cells_of(table: str) -> list:
    """The cells of a table: "matrix" (one option at a time) or "pairs" (tests/pairs.py)."""
    if table == "pairs":
        from tests.pairs import pair_cells

        return list(pair_cells())
    return option_cells()


def expect_of(table: str) -> Callable[..., Any]:
    """The expectation function of a table: (strategy, precision, device, processes, cell) -> Outcome."""
    from tests import matrix, pairs

    return pairs.expect if table == "pairs" else matrix.expect


def main() -> int:
    out_file, names = Path(sys.argv[1]), sys.argv[5:]
    table = "pairs" if names[:1] == ["--pairs"] else "matrix"
    names = names[1:] if table == "pairs" else names
    root = out_file.parent / "runs"
    # Small batches: a cell checks what runs. The evaluation's batches are filled to the eval batch
    # size on every process (even batches, as Accelerate's DataLoader shards them), so an eval batch
    # of 500 cost each DDP cell a 1000-image forward for 32 test images.
    base = dict(max_steps=STEPS, batch_size=8, eval_batch_size=16, quiet=True, plots=False, log_level="warning",
                download=False, save_checkpoints=False, data_dir=small_mnist(out_file.parent / "mnist"))  # fmt: skip
    if os.environ.get("MATRIX_TRAIN_ARGS"):  # --deepspeed_config strategies: a TrainConfig field
        key, value = os.environ["MATRIX_TRAIN_ARGS"].split("=", 1)
        base[key] = value
    cells = [c for c in cells_of(table) if not names or c.name in names]
    outcomes = {}
    for index, cell in enumerate(cells):
        start = time.perf_counter()
        try:
            outcomes[cell.name] = run_cell(cell, base, root / f"cell_{index}")
        except UsageError as e:
            outcomes[cell.name] = {"kind": "refuses", "lines": [one_line(e)]}
        except Exception:  # a crash: what the matrix exists to find
            outcomes[cell.name] = {"kind": "crashes", "lines": [traceback.format_exc()]}
        outcomes[cell.name]["seconds"] = round(time.perf_counter() - start, 2)
        if index == 0:  # the first cell has imported everything: a DeepSpeed group 24.5 s -> 16.7 s here
            from tests.helpers import freeze_imported_heap

            freeze_imported_heap()
        if int(os.environ.get("RANK", "0")) == 0:
            out_file.write_text(json.dumps(outcomes, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def group_command(strategy, precision: str, device: str, processes: int, out: Path, table: str = "matrix"):
    """The launch of one group of cells writing out/outcomes.json, and the environment it adds: (command, env)."""
    from tests.matrix import launch_args

    env = {"OMP_NUM_THREADS": "1"}
    worker = ["-m", "tests.matrix_worker", str(out / "outcomes.json"), strategy.name, precision, device]
    worker += ["--pairs"] if table == "pairs" else []
    bin_dir = Path(sys.executable).parent
    if strategy.launch == ("python",):
        env["MATRIX_TRAIN_ARGS"] = "=".join(strategy.train_args).lstrip("-")
        if processes == 1:
            return [sys.executable, *worker], env
        return [str(bin_dir / "torchrun"), "--nproc_per_node", str(processes), "--master_port", "0", *worker], env
    cmd = [str(bin_dir / "accelerate"), "launch", *launch_args(strategy, device, precision, processes),
           "--main_process_port", "0", *worker]  # fmt: skip
    return cmd, env


def run_group(
    strategy, precision: str, device: str, processes: int, out: Path, timeout: int = 900, table: str = "matrix"
) -> dict:
    """Launch one group of cells (every cell of the table) and return {cell name: outcome}, or
    raise AssertionError with the launch's output where it wrote no outcomes."""
    import shutil
    import subprocess

    from tests.helpers import REPO, kill_tree

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    result = out / "outcomes.json"
    cmd, added = group_command(strategy, precision, device, processes, out, table)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}, **added}
    log = out / "log.txt"
    with open(log, "w") as sink:  # a file, not a pipe: a leftover process holding a pipe would block the read
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            # The whole tree: killing the launcher alone left a DataLoader worker hung inside fork
            # (python/cpython#112275) alive, and the suite waiting on it, in CI on 2026-12-06.
            kill_tree(proc.pid)
            proc.wait()
            raise
    if not result.is_file():
        raise AssertionError(f"{' '.join(cmd)} wrote no outcomes (rc {proc.returncode}):\n{log.read_text()[-3000:]}")
    return json.loads(result.read_text())


def matches(want, got: dict) -> bool:
    """Whether a cell did what was expected: the kind and the lines alike, or for a known failure
    (tests/pairs.py KNOWN_FAILURES) a crash whose traceback ends with the expected line."""
    if want.kind == "crashes":
        return got["kind"] == "crashes" and got["lines"][0].rstrip().endswith(want.lines[0])
    return got["kind"] == want.kind and tuple(got["lines"]) == want.lines


def mismatches(table: str, group, device: str, outcomes: dict) -> list[str]:
    """Each cell of `table` whose outcome in one group's `outcomes` is not what the table expects, as a line."""
    strategy, precision, processes = group
    expect = expect_of(table)
    wrong = []
    for cell in cells_of(table):
        want = expect(strategy, precision, device, processes, cell)
        got = outcomes.get(cell.name, {"kind": "missing", "lines": []})
        if not matches(want, got):
            wrong.append(f"{cell.name}: expected {want.kind} {list(want.lines)}, got {got['kind']} "
                         f"{[line[-2000:] for line in got['lines']]}")  # fmt: skip
    return wrong


def check_groups(
    groups,
    device: str,
    root: Path,
    parallel: int = 1,
    record: Path | None = None,
    table: str = "matrix",
    timeout: int = 900,
) -> tuple[dict, list[str]]:
    """Run every group (in `parallel` launches at a time, each within `timeout` seconds) and compare
    each cell with the table's expectation; ({"strategy precision Np": {cell: outcome}}, the
    mismatches as lines)."""
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    def one(group):
        strategy, precision, processes = group
        label = f"{strategy.name} {precision} {processes}p"
        folder = root / label.replace(" ", "_").replace("--", "")
        try:
            return label, group, run_group(strategy, precision, device, processes, folder, timeout, table)
        except (AssertionError, OSError) as e:  # no outcomes at all: a launch that failed
            return label, group, {"launch": {"kind": "crashes", "lines": [str(e)]}}
        except subprocess.TimeoutExpired:  # one group's mismatch, not the whole test's error
            return label, group, {"launch": {"kind": "crashes", "lines": [f"the launch ran past {timeout} s"]}}

    seen, wrong = {}, []
    with ThreadPoolExecutor(parallel) as pool:
        for label, group, outcomes in pool.map(one, groups):
            seen[label] = outcomes
            if "launch" in outcomes:  # why every cell is missing: the launch's own failure, first
                wrong.append(f"{label} launch: {outcomes['launch']['lines'][0][-2000:]}")
            wrong += [f"{label} {line}" for line in mismatches(table, group, device, outcomes)]
            if record is not None:  # as each group ends: a run cut short keeps what it saw
                record.write_text(json.dumps({"seen": seen, "wrong": wrong}, indent=1))
    return seen, wrong
