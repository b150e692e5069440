"""The seed blog post's DeepSpeed MNIST script, minimally fixed so that it runs.

Source: "deepspeed pytorch多卡" (51CTO blog, 2024-10-30), kept at
shared/seed/deepspeed-pytorch-multi-gpu.md: a linear 784->10 model, Adam lr 3e-4,
DataLoader(batch_size=64, shuffle=True) over torchvision MNIST with ToTensor() only,
DeepSpeed {"train_batch_size": 64, "gradient_accumulation_steps": 1, "fp16": on,
ZeRO stage 2}, plain `deepspeed.initialize`, 5 epochs of `model.backward(loss); model.step()`.

Changes from the post (everything else is as written there):
  1. Inputs and labels are moved to the engine's device, and inputs are cast to the
     engine's dtype (fp16 weights want fp16 inputs); the post fed CPU fp32 tensors to a
     CUDA fp16 model, which fails at the first forward.
  2. Data: the IDX files are read from $ACCEL_MNIST_DATA_DIR (or --data-dir) with
     accel_mnist.data.catalog.load_split, and served by torchvision's own MNIST.__getitem__ (PIL
     image + transforms.ToTensor(), exactly the post's per-sample pipeline). Why not
     `datasets.MNIST(root, download=False)`: torchvision then insists on decompressed files
     under <root>/MNIST/raw/ and the shared copy is flat .gz files, while download=True
     needs the internet, which the benchmark machines do not have.
  3. fp16 is switched off when there is no CUDA device (DeepSpeed's fp16 does not run on
     CPU), so that the script can be smoke-tested on a CPU.
  4. The process group is initialised by the script when no launcher did it (a plain
     `python seed_fixed.py` is then a world of one: gloo on CPU, NCCL on GPU).
  5. Measurement only: per-epoch wall time (synchronised), samples/s, a final test-set
     accuracy, `--epochs` / `--max-steps` for short runs, and a JSON record (`--out`).
Not fixed, on purpose (it is the seed's behaviour): there is no DistributedSampler, so
with N processes every rank trains on all 60000 images each epoch, and the configured
train_batch_size 64 is the GLOBAL batch (DeepSpeed derives a micro batch of 64/N that the
DataLoader, at 64, does not follow).

Launch:  deepspeed --num_gpus 2 --module benchmarks.baselines.seed_fixed
         python -m benchmarks.baselines.seed_fixed --max-steps 20     (CPU smoke test)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
import torchvision.datasets as datasets
import torchvision.transforms as transforms
from torchvision.datasets.vision import VisionDataset

from accel_mnist.data.catalog import load_split
from benchmarks import benchlib


# 定义一个简单的模型 (the post's model, unchanged)
class SimpleModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 10)  # 假设输入为28x28的图像

    def forward(self, x):
        x = torch.flatten(x, start_dim=1)
        return self.fc(x)


class IDXMNIST(datasets.MNIST):
    """torchvision's MNIST (its __getitem__: PIL image, then the transform) over IDX files read
    by accel_mnist, which accepts the flat .gz layout and never downloads (change 2)."""

    def __init__(self, root: str, train: bool = True, transform=None):
        VisionDataset.__init__(self, root, transform=transform)
        self.train = train
        self.data, self.targets = load_split("mnist", root, train=train, download=False)


def init_distributed() -> None:
    """Change 4: a world of one when started without a launcher."""
    if dist.is_available() and dist.is_initialized():
        return
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                       ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29533")):  # fmt: skip
        os.environ.setdefault(key, value)
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")


def main() -> int:
    parser = argparse.ArgumentParser(description="the seed post's DeepSpeed MNIST script, fixed to run")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--max-steps", type=int, default=None, help="stop early (smoke tests)")
    parser.add_argument("--data-dir", default=None, help="default $ACCEL_MNIST_DATA_DIR")
    parser.add_argument("--out", default=None, help="also save the whole record as OUT/<bench>-<stamp>-<tag>.json")
    parser.add_argument("--metrics-out", default=None,
                        help="measurement only: test accuracy after each epoch (clock stopped), as JSON lines of "
                        "step, train_seconds, test_accuracy (accel_mnist's metrics.jsonl keys)")  # fmt: skip
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # deepspeed launcher
    args = parser.parse_args()
    root = args.data_dir or benchlib.data_dir()

    init_distributed()
    world, rank = dist.get_world_size(), dist.get_rank()
    cuda = torch.cuda.is_available()

    # 准备数据
    train_dataset = IDXMNIST(root=root, train=True, transform=transforms.ToTensor())
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=64, shuffle=True)

    # 初始化模型和优化器
    model = SimpleModel()
    optimizer = optim.Adam(model.parameters(), lr=3e-4)

    # DeepSpeed的配置
    ds_config = {
        "train_batch_size": 64,
        "gradient_accumulation_steps": 1,
        "fp16": {"enabled": cuda},  # change 3
        "zero_optimization": {"stage": 2},
    }

    # Initialize DeepSpeed
    model, optimizer, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer, model_parameters=model.parameters(), config=ds_config
    )
    device = model.device  # change 1
    dtype = next(model.parameters()).dtype

    def sync():
        if cuda:
            torch.cuda.synchronize()

    test_loader = torch.utils.data.DataLoader(IDXMNIST(root=root, train=False, transform=transforms.ToTensor()),
                                              batch_size=1000)  # fmt: skip

    def test_accuracy() -> float:
        # Change 5: test accuracy, every rank over the whole test set.
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for inputs, labels in test_loader:
                logits = model(inputs.to(device).to(dtype))
                correct += int((logits.argmax(1).cpu() == labels).sum())
                total += len(labels)
        model.train()
        return correct / total

    curve = []

    # 训练过程
    epoch_seconds, steps, samples = [], 0, 0
    done = False
    sync()
    start = time.perf_counter()
    for epoch in range(args.epochs):  # 5个epoch
        tick = time.perf_counter()
        for batch in train_loader:
            inputs, labels = batch
            inputs, labels = inputs.to(device).to(dtype), labels.to(device)  # change 1
            outputs = model(inputs)
            loss = nn.CrossEntropyLoss()(outputs, labels)

            model.backward(loss)
            model.step()  # 更新参数
            steps += 1
            samples += len(labels)
            if args.max_steps is not None and steps >= args.max_steps:
                done = True
                break
        sync()
        epoch_seconds.append(time.perf_counter() - tick)
        if rank == 0:
            print(f"epoch {epoch}: {epoch_seconds[-1]:.2f} s, loss {loss.item():.4f}", flush=True)
        if args.metrics_out:  # outside the epoch clock
            curve.append({"epoch": epoch + 1, "step": steps, "train_seconds": sum(epoch_seconds),
                          "test_accuracy": test_accuracy()})  # fmt: skip
        if done:
            break
    train_seconds = sum(epoch_seconds) if args.metrics_out else time.perf_counter() - start
    accuracy = curve[-1]["test_accuracy"] if curve else test_accuracy()
    if args.metrics_out and rank == 0:
        Path(args.metrics_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.metrics_out).write_text("".join(json.dumps(row) + "\n" for row in curve))

    if rank == 0:
        record = {
            "benchmark": "seed_fixed",
            "config": {"model": "linear", "batch_size": 64, "lr": 3e-4, "zero_stage": 2, "fp16": cuda,
                       "epochs": args.epochs, "max_steps": args.max_steps, "distributed_sampler": False},
            "world_size": world, "fp16": cuda, "epochs_run": len(epoch_seconds), "steps": steps,
            # per rank; without the sampler every rank sees the whole dataset
            "samples_per_second": samples / train_seconds,
            "samples_per_second_all_ranks": samples * world / train_seconds,
            "ms_per_step": train_seconds / max(steps, 1) * 1e3,
            "train_seconds": train_seconds, "epoch_seconds": epoch_seconds,
            "test_accuracy": accuracy, "final_loss": loss.item(),
        }  # fmt: skip
        benchlib.save_record("seed_fixed", f"w{world}-{'fp16' if cuda else 'fp32'}-s{steps}", record, args.out)
        print(
            f"seed_fixed: {steps} steps in {train_seconds:.2f} s ({record['samples_per_second']:.0f} samples/s "
            f"per rank), test_accuracy {accuracy:.4f}"
        )
    dist.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
