"""Randomness across epochs: on the torch data path with workers an epoch's order depends on
seed and epoch alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from accel_mnist import TrainConfig, train
from accel_mnist.run import checkpoint as ckpt


@pytest.mark.slow  # DataLoader worker processes, three runs
def test_torch_loader_epoch_order_is_independent_of_its_history(tmp_path, mnist_dir):
    """--num-workers 2: stopped mid-epoch 2 and resumed, the weights equal an uninterrupted run's."""
    base = TrainConfig(model="linear", data_dir=str(mnist_dir), download=False, quiet=True, export=False,
                       data_loader="torch", num_workers=2, batch_size=2000, eval_batch_size=5000, epochs=3,
                       max_steps=75, checkpoint_every=15, keep_checkpoints=10)  # fmt: skip
    whole = base.replace(output_dir=str(tmp_path / "whole"))
    train(whole)
    # 30 steps an epoch: the run stops at step 45, in the middle of its second epoch, as a
    # killed one would (a shorter --max-steps), and is resumed from that checkpoint.
    broken = base.replace(output_dir=str(tmp_path / "broken"), max_steps=45)
    train(broken)
    (Path(broken.output_dir) / "results.json").unlink()
    train(broken.replace(max_steps=75, resume_from="latest"))
    for step in (60, 75):  # in epoch 2 after the resume, and in epoch 3
        a = load_file(ckpt.checkpoint_dir(whole.output_dir) / f"step_{step}" / "model.safetensors")
        b = load_file(ckpt.checkpoint_dir(broken.output_dir) / f"step_{step}" / "model.safetensors")
        assert all(torch.equal(a[k], b[k]) for k in a), f"weights differ at step {step}"
