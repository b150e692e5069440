"""Images of another shape: 3x32x32 colour images (CIFAR's shape) in a plain `TensorDataset`,
for a model of your own that takes them and returns `{"logits": ...}`.

    python examples/colour_images.py --max-steps 100
    accelerate launch --config_file accelerate_configs/multi_cpu.yaml examples/colour_images.py

Images may be (H, W) or (C, H, W) of any size, uint8 or floats in 0..1 (as torchvision's
ToTensor gives them), the same for every item; the model gets (batch, C, H, W) batches. The
built-in models take 1x28x28 only and say so in one line before anything starts. From an
`hf:` folder, colour stays colour where the image column says so
(`ds.cast_column("img", datasets.Image(mode="RGB"))`); other columns are read as grayscale.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn
from torch.utils.data import TensorDataset

from accel_mnist import TrainConfig, UsageError, train

COLOURS = torch.tensor([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0], [1, 0, 1],
                        [0, 1, 1], [1, 1, 1], [1, .5, 0], [.5, 0, 1], [0, .5, .5]])  # fmt: skip


def coloured_squares(n: int, seed: int) -> TensorDataset:
    """n float (3, 32, 32) images in 0..1: a square whose colour is the class, anywhere, over noise."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, len(COLOURS), (n,), generator=g)
    images = torch.rand(n, 3, 32, 32, generator=g) * 0.3
    corners = torch.randint(0, 24, (n, 2), generator=g)
    for i, (y, x) in enumerate(corners.tolist()):
        images[i, :, y : y + 8, x : x + 8] = COLOURS[labels[i]].view(3, 1, 1)
    return TensorDataset(images, labels)


class SmallCNN(nn.Module):
    """Two strided convolutions for 3x32x32 images; returns a dict, as some models do."""

    def __init__(self, num_classes: int = len(COLOURS)) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),  # 16x16
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),  # 8x8
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )  # fmt: skip
        self.head = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": self.head(self.features(x))}


def main() -> None:
    parser = argparse.ArgumentParser(description="Train a model of your own on 3x32x32 colour images.")
    parser.add_argument("--max-steps", type=int, default=int(os.environ.get("EXAMPLE_MAX_STEPS", 150)))
    parser.add_argument("--output-dir", default="outputs/colour_images")
    args = parser.parse_args()

    train_set, test_set = coloured_squares(4000, seed=0), coloured_squares(1000, seed=1)
    config = TrainConfig(max_steps=args.max_steps, epochs=100, eval_every=args.max_steps, lr=3e-3,
                         output_dir=args.output_dir, overwrite=True, quiet=True)  # fmt: skip
    rank0 = int(os.environ.get("RANK", "0")) == 0
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:  # (a launch's processes train once: its group ends with it)
        try:
            train(config.replace(model="cnn"), train_data=train_set, test_data=test_set)
        except UsageError as e:  # the built-in CNN takes 1x28x28 images
            print(f"built-in cnn: {e}")
    torch.manual_seed(config.seed)
    results = train(config, model=SmallCNN(), train_data=train_set, test_data=test_set)
    if rank0:
        print(f"SmallCNN on {'x'.join(map(str, results['input_shape']))} images, {results['data_loader']} path: "
              f"test accuracy {results['test_accuracy']:.4f} after {results['steps']} steps")  # fmt: skip


if __name__ == "__main__":
    main()
