"""A Hugging Face transformers model in accel_mnist's loop: a small ViT built from a ViTConfig
(nothing is downloaded), trained on MNIST and exported as a folder that transformers loads.

    python examples/transformers_model.py --max-steps 200
    accelerate launch --config_file accelerate_configs/multi_cpu.yaml examples/transformers_model.py
    accelerate launch --config_file accelerate_configs/zero2.yaml --mixed_precision no examples/transformers_model.py

The model returns an `ImageClassifierOutput`; the loop reads its `logits` (a tensor, a mapping or
object with `logits`, or a tuple whose first element is the logits all work). At the end,
`<output-dir>/hf/` is a `save_pretrained` folder (config.json + model.safetensors, the run's own
weights file): `AutoModelForImageClassification.from_pretrained` loads it, and
`accel-mnist evaluate --model-path` / `predict --model-path` read it, or the run directory.
Run the same command with `--resume-from auto` after an interruption to continue from the last
checkpoint.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from transformers import AutoModelForImageClassification, ViTConfig, ViTForImageClassification

from accel_mnist import TrainConfig, load_model, train


def small_vit(num_labels: int = 10) -> ViTForImageClassification:
    """A one-layer ViT for 1x28x28 images: 16 patches of 7x7 pixels, 11k parameters."""
    config = ViTConfig(image_size=28, patch_size=7, num_channels=1, hidden_size=32, num_hidden_layers=1,
                       num_attention_heads=2, intermediate_size=64, num_labels=num_labels)  # fmt: skip
    return ViTForImageClassification(config)


def main() -> None:
    parser = argparse.ArgumentParser(description="Train a small transformers ViT with accel_mnist's loop.")
    parser.add_argument("--max-steps", type=int, default=int(os.environ.get("EXAMPLE_MAX_STEPS", 300)))
    parser.add_argument("--checkpoint-every", type=int, default=0)
    parser.add_argument("--resume-from", default=None, help="auto, latest or a checkpoint folder")
    parser.add_argument("--output-dir", default="outputs/transformers_model")
    parser.add_argument("--data-dir", default=None, help="IDX files (default: $ACCEL_MNIST_DATA_DIR, else ./data)")
    args = parser.parse_args()

    config = TrainConfig(
        max_steps=args.max_steps, eval_every=max(args.max_steps // 2, 1), lr=3e-3, batch_size=64,
        checkpoint_every=args.checkpoint_every, resume_from=args.resume_from, keep_checkpoints=5,
        data_dir=args.data_dir, output_dir=args.output_dir, overwrite=args.resume_from is None, quiet=True,
    )  # fmt: skip
    torch.manual_seed(config.seed)  # train() seeds after the model exists: seed here for the same weights
    results = train(config, model=small_vit())
    if int(os.environ.get("RANK", "0")) != 0:
        return
    print(f"{results['model']} ({results['num_parameters']} parameters), {results['distributed_type']} "
          f"x{results['num_processes']}: test accuracy {results['test_accuracy']:.4f} "
          f"after {results['steps']} steps")  # fmt: skip
    folder = Path(args.output_dir) / "hf"
    loaded = AutoModelForImageClassification.from_pretrained(folder).eval()
    x = torch.randn(8, 1, 28, 28)
    with torch.no_grad():
        same = torch.equal(loaded(x).logits, load_model(args.output_dir)(x).logits)
    print(f"AutoModelForImageClassification.from_pretrained({folder}): {type(loaded).__name__}, same logits: {same}")


if __name__ == "__main__":
    main()
