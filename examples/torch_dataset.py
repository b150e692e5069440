"""Your own torch Dataset, handed to `train()` as it is: here one that reads PNG files from a
folder per class (torchvision's ImageFolder layout; this script first writes such a folder of
noisy bars), with a `classes` attribute that names them.

    python examples/torch_dataset.py                    # read once, held as tensors: the device path
    python examples/torch_dataset.py --augment          # a random shift per item: data_loader torch
    accelerate launch --config_file accelerate_configs/multi_cpu.yaml examples/torch_dataset.py

`train(config, model=..., train_data=..., test_data=...)` takes any map-style Dataset of
(image, label) pairs (images (H, W) or (C, H, W), uint8 or floats in 0..1) or a datasets.Dataset.
It reads every item once at the start: the labels give the classes (the `classes` attribute
names them), the training pixels the mean and std (unless `mean=`/`std=` are given). Where the
data fits in memory it is kept as tensors and trains like the built-in sets; a Dataset that
draws random augmentations must run with `data_loader="torch"`, which reads every item each
time through a torch DataLoader (the same sharding, resume and evaluation either way).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

CLASSES = [f"bar {k}" for k in range(10)]


class PNGFolder(Dataset):
    """root/<class>/<n>.png, classes in sorted folder order; yields (uint8 (28, 28) tensor, int)."""

    def __init__(self, root: Path, augment: bool = False) -> None:
        self.classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        self.files = [(f, k) for k, name in enumerate(self.classes) for f in sorted((root / name).glob("*.png"))]
        self.augment = augment

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        path, label = self.files[index]
        image = torch.from_numpy(np.asarray(Image.open(path).convert("L"), dtype=np.uint8).copy())
        if self.augment:  # one pixel left or right, drawn anew every time the item is read
            image = torch.roll(image, int(torch.randint(-1, 2, ())), dims=1)
        return image, label


def write_folder(root: Path, n: int, seed: int) -> None:
    """n noisy 28x28 pictures of a vertical bar whose column is the class."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for i, k in enumerate(rng.integers(0, 10, size=n)):
        image = rng.integers(0, 80, size=(28, 28), dtype=np.uint8)
        image[:, 2 + int(k * 2.5) + rng.integers(0, 2)] = 255
        (root / CLASSES[k]).mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(root / CLASSES[k] / f"{i}.png")


def main() -> None:
    parser = argparse.ArgumentParser(description="Train on a torch Dataset of your own.")
    parser.add_argument("--data", default="data/bars", help="where the PNG folders are written and read")
    parser.add_argument("--train-size", type=int, default=3000)
    parser.add_argument("--test-size", type=int, default=500)
    parser.add_argument("--augment", action="store_true", help="shift each training image at random")
    parser.add_argument("--max-steps", type=int, default=int(os.environ.get("EXAMPLE_MAX_STEPS", 100)))
    parser.add_argument("--output-dir", default="outputs/torch_dataset")
    args = parser.parse_args()

    root, rank = Path(args.data), int(os.environ.get("RANK", "0"))
    if not root.exists():
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # every process would write it at once
            raise SystemExit(f"{root} does not exist yet: run this script once without a launcher first")
        write_folder(root / "train", args.train_size, seed=0)
        write_folder(root / "test", args.test_size, seed=1)

    from accel_mnist import TrainConfig, train

    config = TrainConfig(model="linear", max_steps=args.max_steps, epochs=100, eval_every=args.max_steps,
                         data_loader="torch" if args.augment else "auto", output_dir=args.output_dir,
                         overwrite=True, quiet=True)  # fmt: skip
    results = train(config, train_data=PNGFolder(root / "train", args.augment), test_data=PNGFolder(root / "test"))
    if rank == 0:
        print(f"{results['dataset']} ({results['num_classes']} classes: {', '.join(results['class_names'][:3])}, ...) "
              f"through the {results['data_loader']} path: test accuracy {results['test_accuracy']:.4f} "
              f"after {results['steps']} steps")  # fmt: skip


if __name__ == "__main__":
    main()
