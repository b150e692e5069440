"""Train your own model with accel_mnist's loop, from another project.

    python examples/custom_model.py --max-steps 200                     # one process
    accelerate launch --config_file accelerate_configs/zero2.yaml examples/custom_model.py
    accelerate launch --config_file accelerate_configs/multi_cpu.yaml examples/custom_model.py

`train(config, model=...)` takes any nn.Module that maps a (B, 1, 28, 28) float batch to
(B, 10) logits (other shapes and classes: colour_images.py, many_classes.py). Everything else --
data, optimizer, schedule, DDP/DeepSpeed from the accelerate config, metrics.jsonl/results.json --
is the same as for the built-in models. `config.model` is not used when a model is passed;
results.json records the model's class name.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn

from accel_mnist import TrainConfig, train


class MyNet(nn.Module):
    """One 3x3 convolution, max-pooling, and a linear classifier."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))  # 14x14
        self.head = nn.Linear(width * 14 * 14, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def main() -> None:
    parser = argparse.ArgumentParser(description="Train MyNet with accel_mnist's loop.")
    parser.add_argument("--max-steps", type=int, default=int(os.environ.get("EXAMPLE_MAX_STEPS", 300)))
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--output-dir", default="outputs/custom_model")
    parser.add_argument("--data-dir", default=None, help="IDX files (default: $ACCEL_MNIST_DATA_DIR, else ./data)")
    args = parser.parse_args()

    config = TrainConfig(
        max_steps=args.max_steps, eval_every=max(args.max_steps // 2, 1),
        data_dir=args.data_dir, output_dir=args.output_dir, overwrite=True, quiet=True,
    )  # fmt: skip
    # The seed is set inside train(), after the model exists: seed here too for the same weights.
    torch.manual_seed(config.seed)
    results = train(config, model=MyNet(args.width))
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"{results['model']} ({results['num_parameters']} parameters), {results['distributed_type']} "
              f"x{results['num_processes']}: test accuracy {results['test_accuracy']:.4f} "
              f"after {results['steps']} steps")  # fmt: skip


if __name__ == "__main__":
    main()
