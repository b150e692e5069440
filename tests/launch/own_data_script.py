"""Train a linear model on synthetic data, handed to train() as a torch Dataset or read from an
`hf:` folder of the same arrays; run under `accelerate launch` by test_own_data_processes.py.

    own_data_script.py OUTPUT_DIR [--hf hf:PATH] [--data-loader auto|torch]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for the tests package

from accel_mnist import TrainConfig, train  # noqa: E402
from tests.your_model_data import PairDataset, splits  # noqa: E402

TRAIN, TEST = 700, 250  # 250 test images: 2 processes x 64 do not divide them, so the last shards pad


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir")
    parser.add_argument("--hf", help="read this hf: folder instead of the torch Dataset")
    parser.add_argument("--data-loader", default="auto")
    args = parser.parse_args()
    config = TrainConfig(model="linear", dataset=args.hf or "mnist", max_steps=16, eval_every=8, batch_size=16,
                         eval_batch_size=64, data_loader=args.data_loader, quiet=True, plots=False,
                         output_dir=args.output_dir)  # fmt: skip
    if args.hf:
        train(config)
    else:
        data = splits(10, TRAIN, TEST)
        train(config, train_data=PairDataset(*data["train"]), test_data=PairDataset(*data["test"]))


if __name__ == "__main__":
    main()
