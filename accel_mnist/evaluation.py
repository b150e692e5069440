"""Test-set evaluation, shared by the training loop and the `evaluate` command of exported models."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch import nn

from .model_output import logits_of


def evaluation_stance(compiled: bool) -> AbstractContextManager[object]:
    """Where an evaluation runs a compiled model (the launch's dynamo_backend): compiled (`compiled`), or
    its eager kernels under dynamo's `force_eager` stance, so that the model's evaluation-mode graph
    (BatchNorm's running statistics, the evaluation batch's shape) is never compiled. Without a
    compiled model both are the same eager evaluation."""
    return nullcontext() if compiled else torch.compiler.set_stance("force_eager")


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: Any,
    accelerator: Accelerator,
    input_dtype: torch.dtype = torch.float32,
    num_classes: int | None = None,
) -> dict[str, Any]:
    """test_loss, test_accuracy, test_samples and an N x N confusion matrix (rows: true class),
    N = `num_classes` (default: the width of the model's logits).

    `gather_for_metrics` drops the samples that even sharding duplicated, so exactly the
    dataset's images are counted at any world size.
    """
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros((), device=accelerator.device, dtype=torch.float64)
    confusion: torch.Tensor | None = None
    n = num_classes or 0
    for inputs, labels in loader:
        logits = logits_of(model(inputs.to(input_dtype))).float()
        logits, labels = accelerator.gather_for_metrics((logits, labels))
        loss_sum += F.cross_entropy(logits, labels, reduction="sum").double()
        if confusion is None:
            n = n or logits.shape[1]
            confusion = torch.zeros(n * n, device=accelerator.device, dtype=torch.int64)
        confusion += torch.bincount(labels * n + logits.argmax(dim=1), minlength=n * n)
    model.train(was_training)
    confusion_matrix = (confusion if confusion is not None else torch.zeros(n * n, dtype=torch.int64)).view(n, n).cpu()
    count = int(confusion_matrix.sum())
    return {
        "test_loss": loss_sum.item() / count,
        "test_accuracy": confusion_matrix.diagonal().sum().item() / count,
        "test_samples": count,
        "confusion_matrix": confusion_matrix.tolist(),
    }
