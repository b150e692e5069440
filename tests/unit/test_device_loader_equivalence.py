"""A DeviceLoader outside `accelerator.prepare` trains and evaluates as a prepared DataLoader does.

The loop never hands its DeviceLoader to `prepare` (it is sharded already), so what Accelerate
does for its own loaders must still happen: `accumulate` syncs on the last micro-batch of an
epoch whose batch count is not a multiple of the accumulation, and `gather_for_metrics` counts
every test sample once, dropping the padding of the last shards. Here on CPU, on a few hundred
synthetic images, against the same data through a torch DataLoader that Accelerate prepared:
the same syncs, bitwise the same weights, the same evaluation. A loader left out of
Accelerate's GradientState (`register_with_accelerate=False`) is the failure this must catch.

The same checks under a launcher (2 processes, DeepSpeed ZeRO-2) run this file as the script:

    accelerate launch --config_file accelerate_configs/zero2.yaml --num_processes 2 \
        --mixed_precision no tests/unit/test_device_loader_equivalence.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from accelerate.state import GradientState
from torch.utils.data import DataLoader

from accel_mnist.config import TrainConfig
from accel_mnist.data.catalog import DATASETS, ImageTensorDataset
from accel_mnist.data.device_loader import DeviceLoader
from accel_mnist.distributed.accelerator import build_accelerator
from accel_mnist.models import build_model
from accel_mnist.optim import build_optimizer, torch_scheduler

MEAN, STD = DATASETS["mnist"].mean, DATASETS["mnist"].std
BATCH, ACCUM, BATCHES = 16, 2, 5  # 5 micro-batches an epoch: the last one closes an accumulation of 1
EVAL_BATCH, TEST = 64, 250  # 250 is no multiple of 64 (nor of 2 x 64): the last shards are padded
REPO = Path(__file__).resolve().parents[2]


def synthetic(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 28, 28), dtype=torch.uint8, generator=g), torch.randint(0, 10, (n,), generator=g)


def config() -> TrainConfig:
    return TrainConfig(model="linear", batch_size=BATCH, grad_accum=ACCUM, lr=1e-3, download=False)


def device_loaders(accelerator: Any, register: bool = True) -> tuple[DeviceLoader, DeviceLoader]:
    """Train and test DeviceLoaders sharded for this process, as the loop builds them."""
    common = dict(device=accelerator.device, num_processes=accelerator.num_processes,
                  process_index=accelerator.process_index, register_with_accelerate=register)  # fmt: skip
    n = BATCHES * BATCH * accelerator.num_processes
    train = DeviceLoader(*synthetic(n, 0), MEAN, STD, BATCH, shuffle=False, **common)
    test = DeviceLoader(*synthetic(TEST, 1), MEAN, STD, EVAL_BATCH, shuffle=False, **common)
    return train, test


def prepared_loaders(accelerator: Any) -> tuple[Any, Any]:
    """The same data through torch DataLoaders that Accelerate prepares (and shards)."""
    n = BATCHES * BATCH * accelerator.num_processes
    train = DataLoader(ImageTensorDataset(*synthetic(n, 0), MEAN, STD), batch_size=BATCH)
    test = DataLoader(ImageTensorDataset(*synthetic(TEST, 1), MEAN, STD), batch_size=EVAL_BATCH)
    return accelerator.prepare(train, test)


def train_and_evaluate(accelerator: Any, train: Any, test: Any) -> dict[str, Any]:
    """One epoch with accumulation, model/optimizer/scheduler prepared without a loader, then evaluation."""
    cfg = config()
    torch.manual_seed(0)
    model = build_model(cfg.model)
    optimizer = build_optimizer(model, cfg)
    scheduler = torch_scheduler(optimizer, cfg, total_steps=100, steps_per_epoch=100)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    input_dtype = next(model.parameters()).dtype
    syncs, losses = [], []
    model.train()
    for x, y in train:
        with accelerator.accumulate(model):
            loss = F.cross_entropy(model(x.to(input_dtype)).float(), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        syncs.append(accelerator.sync_gradients)
        losses.append(loss.item())
    model.eval()
    count = correct = 0
    with torch.no_grad():
        for x, y in test:
            logits, y = accelerator.gather_for_metrics((model(x.to(input_dtype)).float(), y))
            count += len(y)
            correct += int((logits.argmax(1) == y).sum())
    weights = {k: v.detach().float().cpu().clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}
    accelerator.free_memory(model, optimizer, scheduler)
    return {"syncs": syncs, "losses": losses, "count": count, "correct": correct, "weights": weights}


# What an epoch of 5 micro-batches with accumulation 2 must sync: steps 2 and 4, and the epoch's end.
SYNCS = [False, True, False, True, True]


@pytest.fixture
def accelerator():
    """An Accelerator built as the loop builds it (CPU, accumulation 2); its GradientState reset after."""
    yield build_accelerator(config(), cpu=True)
    GradientState._reset_state()  # the unregistered run leaves sync_gradients False for later tests


def test_device_loader_outside_prepare_trains_and_evaluates_as_a_prepared_loader(accelerator):
    ours = train_and_evaluate(accelerator, *device_loaders(accelerator))
    theirs = train_and_evaluate(accelerator, *prepared_loaders(accelerator))
    assert ours["syncs"] == theirs["syncs"] == SYNCS
    assert ours["losses"] == theirs["losses"] and all(torch.isfinite(torch.tensor(ours["losses"])))
    assert ours["weights"].keys() == theirs["weights"].keys()
    for name, value in ours["weights"].items():
        assert torch.equal(value, theirs["weights"][name]), name
    assert ours["count"] == theirs["count"] == TEST  # every test sample once
    assert ours["correct"] == theirs["correct"]


def test_an_unregistered_loader_misses_the_epoch_end_sync(accelerator):
    """The failure the comparison above catches: outside GradientState the last micro-batch never syncs."""
    ours = train_and_evaluate(accelerator, *device_loaders(accelerator, register=False))
    theirs = train_and_evaluate(accelerator, *prepared_loaders(accelerator))
    assert ours["syncs"] == [False, True, False, True, False] != theirs["syncs"]
    assert any(not torch.equal(v, theirs["weights"][k]) for k, v in ours["weights"].items())


def main() -> int:
    """Under a launcher: train and evaluate from DeviceLoaders; print what the slow test reads."""
    accelerator = build_accelerator(config())
    result = train_and_evaluate(accelerator, *device_loaders(accelerator))
    if accelerator.is_main_process:
        print(json.dumps({"distributed_type": accelerator.distributed_type.value,
                          "num_processes": accelerator.num_processes, "syncs": result["syncs"],
                          "count": result["count"], "losses": result["losses"]}))  # fmt: skip
    accelerator.wait_for_everyone()
    accelerator.end_training()
    ok = result["syncs"] == SYNCS and result["count"] == TEST
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
