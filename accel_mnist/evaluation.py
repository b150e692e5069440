"""Test-set evaluation, shared by the training loop and the `evaluate` command of exported models."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch import nn


@torch.no_grad()
def evaluate(
    model: nn.Module, loader: Any, accelerator: Accelerator, input_dtype: torch.dtype = torch.float32
) -> dict[str, Any]:
    """test_loss, test_accuracy, test_samples and a 10x10 confusion matrix (rows: true class).

    `gather_for_metrics` drops the samples that even sharding duplicated, so exactly the
    dataset's images are counted at any world size.
    """
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros((), device=accelerator.device, dtype=torch.float64)
    confusion = torch.zeros(100, device=accelerator.device, dtype=torch.int64)
    for inputs, labels in loader:
        logits = model(inputs.to(input_dtype)).float()
        logits, labels = accelerator.gather_for_metrics((logits, labels))
        loss_sum += F.cross_entropy(logits, labels, reduction="sum").double()
        confusion += torch.bincount(labels * 10 + logits.argmax(dim=1), minlength=100)
    model.train(was_training)
    confusion_matrix = confusion.view(10, 10).cpu()
    count = int(confusion_matrix.sum())
    return {
        "test_loss": loss_sum.item() / count,
        "test_accuracy": confusion_matrix.diagonal().sum().item() / count,
        "test_samples": count,
        "confusion_matrix": confusion_matrix.tolist(),
    }
