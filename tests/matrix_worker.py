"""Runs cells of the option matrix (accel_mnist/distributed/matrix.py) one after another in one
launched process group, and writes what each did to a JSON file (rank 0).

    accelerate launch LAUNCH_ARGS -m tests.matrix_worker OUT.json STRATEGY PRECISION DEVICE [CELL ...]

One launch per strategy, precision and process count keeps the launch tier's time in check: the
cells share the interpreter, the imports and the process group. train() ends by tearing the
process group down (Accelerate's end_training), so between cells the worker joins a new default
group on the launcher's store under a fresh key prefix, which Accelerate and DeepSpeed then use.
Each cell records "trains", "changes" (results.json's `changes` lines), "refuses" (the UsageError's
one line) or "crashes" (the traceback): the last is always a failure.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from accel_mnist import train
from accel_mnist.distributed.matrix import option_cells
from accel_mnist.errors import UsageError, one_line

STEPS = 2


def rejoin(index: int) -> None:
    """A new default process group for the next cell, where the last one was destroyed."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size < 2 or dist.is_initialized():
        return
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False,
                          timeout=timedelta(minutes=5))  # fmt: skip
    backend = "cuda:nccl,cpu:gloo" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, store=dist.PrefixStore(f"matrix/cell_{index}", store),
                            rank=int(os.environ["RANK"]), world_size=world_size)  # fmt: skip


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


def run_cell(cell, base: dict, out: Path) -> dict:
    """Train one cell; its outcome."""
    config = cell.config(**base, output_dir=str(out))
    if cell.name == "own_model":
        results = train(config, OwnModel())
    elif cell.name == "own_data":
        train_data, test_data = tiny_data()
        results = train(config, train_data=train_data, test_data=test_data)
    elif cell.name == "resume":
        first = train(config.replace(checkpoint_every=1, save_checkpoints=True, keep_checkpoints=2))
        rejoin(10_000)
        step_1 = out / "checkpoints" / "step_1"
        results = train(config.replace(resume_from=str(step_1), checkpoint_every=1, save_checkpoints=True))
        if results["steps"] != first["steps"]:
            raise AssertionError(f"resumed run ended at step {results['steps']}, not {first['steps']}")
    else:
        results = train(config)
    if results.get("steps") != STEPS:
        raise AssertionError(f"trained {results.get('steps')} steps, not {STEPS}")
    changes = list(results.get("changes", []))
    return {"kind": "changes" if changes else "trains", "lines": changes}


def small_mnist(folder: Path) -> str:
    """Synthetic MNIST files of 640 training and 128 test images, read as `mnist` in this process
    (its record counts expected): the cells test what runs, not what is learnt."""
    from accel_mnist.data.catalog import DATASETS
    from tests.helpers import write_synthetic_mnist

    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        write_synthetic_mnist(folder, n_train=640, n_test=128)
    DATASETS["mnist"] = dataclasses.replace(DATASETS["mnist"], train_records=640, test_records=128)
    return str(folder)


def main() -> int:
    out_file, names = Path(sys.argv[1]), sys.argv[5:]
    root = out_file.parent / "runs"
    base = dict(max_steps=STEPS, batch_size=32, eval_batch_size=500, quiet=True, plots=False, log_level="warning",
                download=False, save_checkpoints=False, data_dir=small_mnist(out_file.parent / "mnist"))  # fmt: skip
    if os.environ.get("MATRIX_TRAIN_ARGS"):  # --deepspeed_config strategies: a TrainConfig field
        key, value = os.environ["MATRIX_TRAIN_ARGS"].split("=", 1)
        base[key] = value
    cells = [c for c in option_cells() if not names or c.name in names]
    outcomes = {}
    for index, cell in enumerate(cells):
        rejoin(index)
        try:
            outcomes[cell.name] = run_cell(cell, base, root / f"cell_{index}")
        except UsageError as e:
            outcomes[cell.name] = {"kind": "refuses", "lines": [one_line(e)]}
        except Exception:  # a crash: what the matrix exists to find
            outcomes[cell.name] = {"kind": "crashes", "lines": [traceback.format_exc()]}
        if int(os.environ.get("RANK", "0")) == 0:
            out_file.write_text(json.dumps(outcomes, indent=1))
    return 0


if __name__ == "__main__":

    raise SystemExit(main())
