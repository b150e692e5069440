"""Any number of classes: 26 letters (like EMNIST letters) or 47 characters (like EMNIST
balanced), drawn here with Pillow's font as a stand-in for the real sets, saved as an `hf:`
folder with a `ClassLabel` of their names, trained with a built-in model, and predicted by name.

    python examples/many_classes.py                      # 26 letters
    python examples/many_classes.py --classes balanced   # 47 classes
    accel-mnist predict --model-path outputs/many_classes letter.png   # prints the class name

The number of classes comes from the data (the ClassLabel's names, else the largest training
label + 1): the built-in models are sized to it, results.json holds an N x N confusion matrix
and the class names, confusion_matrix.png shows them, and the export records both, so that
`accel-mnist predict` prints names. EMNIST itself, as a Hugging Face dataset or a folder of
your own, goes the same way: `--dataset hf:NAME_OR_PATH`.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

LETTERS = [chr(ord("A") + i) for i in range(26)]
CLASSES = {"letters": LETTERS, "balanced": [str(d) for d in range(10)] + LETTERS + list("abdefghnqrt")}


def draw(chars: list[str], n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """n 28x28 uint8 images of random characters (white on black, as MNIST), and their labels."""
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)
    fonts = [ImageFont.load_default(size=size) for size in (16, 18, 20)]
    labels = rng.integers(0, len(chars), size=n)
    images = np.empty((n, 28, 28), dtype=np.uint8)
    for i, k in enumerate(labels):
        picture = Image.new("L", (28, 28))
        x, y = rng.integers(4, 10), rng.integers(0, 5)
        ImageDraw.Draw(picture).text((x, y), chars[k], fill=255, font=fonts[rng.integers(len(fonts))])
        picture = picture.rotate(rng.uniform(-12, 12), resample=Image.Resampling.BILINEAR)
        noise = rng.integers(0, 40, size=(28, 28))
        images[i] = np.maximum(np.asarray(picture), noise).astype(np.uint8)
    return images, labels


def build(path: Path, chars: list[str], n_train: int, n_test: int) -> None:
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Image

    features = Features({"image": Image(), "label": ClassLabel(names=chars)})
    splits = {}
    for split, n, seed in (("train", n_train, 0), ("test", n_test, 1)):
        images, labels = draw(chars, n, seed)
        splits[split] = Dataset.from_dict({"image": list(images), "label": labels}, features=features)
    DatasetDict(splits).save_to_disk(str(path))


def main() -> None:
    parser = argparse.ArgumentParser(description="Train on 26 or 47 named classes.")
    parser.add_argument("--classes", choices=list(CLASSES), default="letters")
    parser.add_argument("--out", default=None, help="the dataset folder (default: data/<classes>)")
    parser.add_argument("--train-size", type=int, default=6000)
    parser.add_argument("--test-size", type=int, default=1000)
    parser.add_argument("--max-steps", type=int, default=int(os.environ.get("EXAMPLE_MAX_STEPS", 300)))
    parser.add_argument("--output-dir", default="outputs/many_classes")
    args = parser.parse_args()

    chars = CLASSES[args.classes]
    path = Path(args.out or f"data/{args.classes}")
    if not path.exists():
        build(path, chars, args.train_size, args.test_size)
        print(f"wrote {path} ({len(chars)} classes)")

    from PIL import Image

    from accel_mnist import TrainConfig, train
    from accel_mnist.cli import main as accel_mnist

    config = TrainConfig(model="lenet5", dataset=f"hf:{path}", max_steps=args.max_steps, epochs=100, lr=3e-3,
                         eval_every=args.max_steps, output_dir=args.output_dir, overwrite=True, quiet=True)  # fmt: skip
    results = train(config)
    print(f"{len(results['class_names'])} classes: test accuracy {results['test_accuracy']:.4f} "
          f"after {results['steps']} steps; confusion matrix {len(results['confusion_matrix'])}x"
          f"{len(results['confusion_matrix'][0])}")  # fmt: skip
    # `accel-mnist predict` on three new pictures: it prints each one's class by name.
    images, labels = draw(chars, 3, seed=2)
    files = []
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        files.append(str(Path(args.output_dir) / f"sample_{i}_{chars[label]}.png"))
        Image.fromarray(image).save(files[-1])
    accel_mnist(["predict", "--model-path", args.output_dir, *files])


if __name__ == "__main__":
    main()
