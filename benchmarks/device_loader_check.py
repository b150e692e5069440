"""Check that a DeviceLoader works outside `accelerator.prepare`, under any accelerate config.

    accelerate launch --config_file accelerate_configs/zero2.yaml --mixed_precision no \
        -m benchmarks.device_loader_check [--steps 6] [--grad-accum 2] [--eval-batch-size 333]

`prepare(model, optimizer, scheduler)` without a dataloader (DeepSpeed gets its micro
batch size from distributed.strategy.build_accelerator, which sets train_micro_batch_size_per_gpu), a
few training steps from the DeviceLoader with gradient accumulation (checking that
Accelerate syncs at the end of an epoch whose batch count is not a multiple of it), then
evaluation with `gather_for_metrics` over the padded shards, which must count the test set
exactly once. Prints one JSON line
from the main process and exits non-zero on a failed check.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F

from accel_mnist.config import TrainConfig
from accel_mnist.data.catalog import DATASETS, load_split
from accel_mnist.data.device_loader import DeviceLoader
from accel_mnist.distributed.strategy import build_accelerator, strategy_fields
from accel_mnist.models import build_model
from accel_mnist.optim import build_optimizer, build_scheduler


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="linear")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--grad-accum", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--eval-batch-size", type=int, default=333)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument(
        "--no-register",
        action="store_true",
        help="leave the loaders out of Accelerate's GradientState (shows what goes wrong)",
    )
    args = parser.parse_args()

    config = TrainConfig(model=args.model, batch_size=args.batch_size, grad_accum=args.grad_accum,
                         data_dir=args.data_dir, download=False, lr=1e-3)  # fmt: skip
    accelerator = build_accelerator(config)
    spec = DATASETS["mnist"]
    train_images, train_labels = load_split("mnist", config.data_dir, train=True, download=False)
    test_images, test_labels = load_split("mnist", config.data_dir, train=False, download=False)
    common = dict(mean=spec.mean, std=spec.std, device=accelerator.device,
                  num_processes=accelerator.num_processes, process_index=accelerator.process_index,
                  register_with_accelerate=not args.no_register)  # fmt: skip
    train_loader = DeviceLoader(train_images, train_labels, batch_size=config.batch_size, shuffle=True,
                                seed=config.seed, **common)  # fmt: skip
    test_loader = DeviceLoader(test_images, test_labels, batch_size=args.eval_batch_size, shuffle=False, **common)

    model = build_model(config.model)
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config, total_steps=100, steps_per_epoch=100)
    # No dataloader here: the DeviceLoader is already sharded and must not be re-sharded.
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    input_dtype = next(model.parameters()).dtype
    checks: dict[str, bool] = {}

    # Training steps from the DeviceLoader.
    losses = []
    model.train()
    for i, (x, y) in enumerate(train_loader):
        with accelerator.accumulate(model):
            loss = F.cross_entropy(model(x.to(input_dtype)).float(), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        losses.append(loss.item())
        if i + 1 >= args.steps * args.grad_accum:
            break
    checks["training_steps_ran"] = len(losses) == args.steps * args.grad_accum and all(
        torch.isfinite(torch.tensor(losses))
    )

    # An epoch whose batch count is odd: with grad_accum=2 the last micro-batch must still
    # sync (Accelerate does this only for loaders registered in its GradientState).
    small = DeviceLoader(train_images[:5 * args.batch_size * accelerator.num_processes],
                         train_labels[:5 * args.batch_size * accelerator.num_processes],
                         batch_size=args.batch_size, shuffle=True, seed=1, **common)  # fmt: skip
    syncs = []
    for x, y in small:
        with accelerator.accumulate(model):
            loss = F.cross_entropy(model(x.to(input_dtype)).float(), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        syncs.append(accelerator.sync_gradients)
    checks["syncs_at_epoch_end"] = syncs[-1] is True and len(syncs) == 5

    # Evaluation: padded shards + gather_for_metrics (duplicates dropped).
    model.eval()
    with torch.no_grad():
        count = 0
        correct = 0
        for x, y in test_loader:
            logits = model(x.to(input_dtype)).float()
            logits, y = accelerator.gather_for_metrics((logits, y))
            count += len(y)
            correct += int((logits.argmax(1) == y).sum())
    checks["gather_for_metrics_counts_10000"] = count == 10000

    if accelerator.is_main_process:
        print(json.dumps({
            **strategy_fields(accelerator), "micro_batch": args.batch_size, "steps": args.steps,
            "first_loss": losses[0], "last_loss": losses[-1], "gather_count": count,
            "accuracy": correct / count, "checks": checks,
        }))  # fmt: skip
    accelerator.wait_for_everyone()
    # Drop the prepared objects before exit, as the loop does: a gloo worker that still holds
    # them at interpreter exit sometimes aborts ("terminate called without an active exception").
    model, optimizer, scheduler = accelerator.free_memory(model, optimizer, scheduler)
    accelerator.end_training()
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
