"""The core idea in one page: an Accelerator prepares model, optimizer and data; one loop runs
under every strategy, and the strategy comes from the launch alone.

    accelerate launch --config_file accelerate_configs/cpu.yaml examples/core_loop.py
    accelerate launch --config_file accelerate_configs/zero2.yaml --mixed_precision no examples/core_loop.py  # CPU
    accelerate launch --config_file accelerate_configs/fsdp2.yaml --num_processes 1 examples/core_loop.py     # GPU

accel_mnist's own loop (accel_mnist/training/) is this one grown up: checkpoints, resume,
evaluation cadence, memory plan, export. docs/architecture.md says where each part lives.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs, set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from accel_mnist.data.catalog import load_split  # MNIST IDX files -> uint8 tensors (downloads if missing)


def mnist(data_dir: str | None, train: bool) -> TensorDataset:
    images, labels = load_split("mnist", data_dir, train=train)
    return TensorDataset(((images.float() / 255 - 0.1307) / 0.3081).unsqueeze(1), labels)


def processes_without_a_gpu() -> dict:
    """Accelerate 1.16 joins several processes on a machine without a GPU into no group: each would
    train alone. Join them over gloo under DeepSpeed, else as Accelerate's CPU DDP (MULTI_CPU)."""
    if int(os.environ.get("WORLD_SIZE", "1")) == 1 or torch.cuda.is_available():
        return {}
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":  # as Accelerate reads it
        return {"kwargs_handlers": [InitProcessGroupKwargs(backend="gloo")]}
    return {"cpu": True}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=64, help="per process")
    parser.add_argument("--data-dir", default=None, help="default: $ACCEL_MNIST_DATA_DIR, else ./data")
    args = parser.parse_args()

    # Reads the launch's accelerate config: DDP, FSDP, or DeepSpeed (Accelerate builds the
    # DeepSpeedPlugin from the YAML's deepspeed_config itself), mixed precision, accumulation.
    accelerator = Accelerator(**processes_without_a_gpu())
    set_seed(0)  # the same initial weights in every process
    with accelerator.main_process_first():  # one process downloads, the others then read
        train_data, test_data = mnist(args.data_dir, True), mnist(args.data_dir, False)
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 10),
    )  # fmt: skip
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train_loader = DataLoader(train_data, batch_size=args.batch_size, shuffle=True)
    test_loader = DataLoader(test_data, batch_size=256)
    # One call for all four, as Accelerate's own examples do: it moves the model to the device and
    # wraps it (DDP; a DeepSpeed engine, which takes its batch size from train_loader where the
    # config says auto; FSDP2 shards it in place, and so needs the optimizer in the same call to
    # point it at the sharded parameters), and gives each process its own shard of every loader.
    model, optimizer, train_loader, test_loader = accelerator.prepare(model, optimizer, train_loader, test_loader)

    step = 0
    model.train()
    while step < args.max_steps:
        for images, labels in train_loader:
            # Counts micro-batches; until a step's last one, DDP and FSDP keep gradients local (no sync).
            with accelerator.accumulate(model):
                # Under DeepSpeed fp16/bf16 the weights themselves are 16-bit (elsewhere fp32, autocast
                # casts): inputs to match. The loss in fp32.
                loss = F.cross_entropy(model(images.to(next(model.parameters()).dtype)).float(), labels)
                # Scales the loss for accumulation (and fp16); under DeepSpeed the engine runs
                # backward and its own optimizer step here.
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    # Unscales fp16 gradients first, and takes FSDP's norm over every shard. DeepSpeed
                    # clips inside its step, at gradient_clipping (1.0 where the config says auto).
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()  # skipped until a step's last micro-batch; a no-op under DeepSpeed
                optimizer.zero_grad()
            step += accelerator.sync_gradients
            if step >= args.max_steps:
                break

    model.eval()
    correct = total = 0
    with torch.no_grad():
        for images, labels in test_loader:
            predicted = model(images.to(next(model.parameters()).dtype)).argmax(-1)
            # Every process's predictions, less the samples Accelerate repeated to even the last batch.
            predicted, labels = accelerator.gather_for_metrics((predicted, labels))
            correct += (predicted == labels).sum().item()
            total += labels.numel()
    # Printed by the main process only.
    setup = f"{accelerator.distributed_type.value} on {accelerator.num_processes} process(es)"
    accelerator.print(f"{setup}: steps {step} test_accuracy {correct / total:.4f}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
