"""Bring your own data: any uint8 (N, 28, 28) images with labels (here 0..9; any number of
classes works, see many_classes.py) become a Hugging Face dataset on disk, which every
accel_mnist entry point reads as `hf:PATH`. A torch Dataset can also go to train() directly:
torch_dataset.py.

    python examples/custom_dataset.py                       # build data/stripes, train on it
    # then, with any strategy:
    accelerate launch --config_file accelerate_configs/multi_cpu.yaml \\
        -m accel_mnist train --dataset hf:data/stripes --model linear --max-steps 200

Build the folder once, before launching several processes (not inside each of them).
`datasets.Image()` columns are stored as PNG, like the Hub's MNIST: 60000 images take about
6 s to write and 5 s to decode again in every training process. A raw 2-D array column,
`datasets.Array2D((28, 28), "uint8")`, skips the PNG step (about 3 s to write, 2 s to read);
plain nested lists work too. accel_mnist normalises with the mean/std of your training
pixels (rounded to 4 decimals).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

CLASSES = [f"bar at column {2 + int(k * 2.5)}" for k in range(10)]


def my_data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Stand-in for your own arrays: a noisy vertical bar whose column is the class."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, size=n)
    images = rng.integers(0, 80, size=(n, 28, 28), dtype=np.uint8)
    cols = 2 + (labels * 2.5).astype(int) + rng.integers(0, 2, size=n)  # jitter by one pixel
    rows = np.arange(28)
    images[np.arange(n)[:, None], rows[None, :], cols[:, None]] = 255
    return images, labels


def build(path: Path, n_train: int, n_test: int) -> None:
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Image

    features = Features({"image": Image(), "label": ClassLabel(names=CLASSES)})
    splits = {}
    for split, n, seed in (("train", n_train, 0), ("test", n_test, 1)):
        images, labels = my_data(n, seed)
        # A list of (28, 28) uint8 arrays: datasets encodes each as a grayscale PNG.
        splits[split] = Dataset.from_dict({"image": list(images), "label": labels}, features=features)
    DatasetDict(splits).save_to_disk(str(path))


def main() -> None:
    parser = argparse.ArgumentParser(description="Build a dataset from your own arrays and train on it.")
    parser.add_argument("--out", default="data/stripes", help="where the dataset folder is written")
    parser.add_argument("--train-size", type=int, default=6000)
    parser.add_argument("--test-size", type=int, default=1000)
    parser.add_argument("--max-steps", type=int, default=int(os.environ.get("EXAMPLE_MAX_STEPS", 100)))
    parser.add_argument("--output-dir", default="outputs/custom_dataset")
    args = parser.parse_args()

    path = Path(args.out)
    if not path.exists():
        build(path, args.train_size, args.test_size)
        print(f"wrote {path}")

    from accel_mnist import TrainConfig, train

    results = train(TrainConfig(model="linear", dataset=f"hf:{path}", max_steps=args.max_steps, epochs=100,
                                output_dir=args.output_dir, overwrite=True, quiet=True))  # fmt: skip
    print(f"hf:{path}: test accuracy {results['test_accuracy']:.4f} after {results['steps']} steps")


if __name__ == "__main__":
    main()
