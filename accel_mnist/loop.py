"""The training loop: one loop for every strategy, because Accelerate hides the strategy."""

from __future__ import annotations

import math
import time
from typing import Any

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn
from tqdm.auto import tqdm

from .config import TrainConfig
from .data import load_datasets
from .loaders import build_dataloaders, batches_per_process
from .models import build_model, num_parameters
from .optim import build_optimizer, build_scheduler
from .outputs import RunOutputs
from .runtime import build_accelerator, describe
from .versions import versions


def train(config: TrainConfig, model: nn.Module | None = None) -> dict[str, Any]:
    """Train `model` (default: the registry's `config.model`) and return results.json's fields.

    Runs unchanged on CPU, one or several GPUs and DeepSpeed ZeRO 1-3: the strategy comes from
    the accelerate config of the launch (`accelerate launch --config_file ...`).
    """
    start = time.perf_counter()
    accelerator = build_accelerator(config)
    outputs = RunOutputs(accelerator, config)
    set_seed(config.seed)
    with accelerator.main_process_first():  # the main process downloads, the others then read
        train_set, test_set = load_datasets(config.dataset, config.data_dir, download=config.download)
    model_name = config.model if model is None else type(model).__name__
    model = build_model(config.model) if model is None else model
    n_params = num_parameters(model)
    train_loader, test_loader = build_dataloaders(train_set, test_set, config)

    batches = batches_per_process(len(train_set), config.batch_size, accelerator.num_processes)
    steps_per_epoch = math.ceil(batches / config.grad_accum)
    total_steps = steps_per_epoch * config.epochs
    if config.max_steps is not None:
        total_steps = min(total_steps, config.max_steps)
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config, total_steps, steps_per_epoch)
    model, optimizer, train_loader, test_loader, scheduler = accelerator.prepare(
        model, optimizer, train_loader, test_loader, scheduler
    )
    assert len(train_loader) == batches, (len(train_loader), batches)
    # Under DeepSpeed fp16/bf16 the weights themselves are half precision and want inputs to
    # match; elsewhere they stay fp32 and autocast (if any) does the casting.
    input_dtype = next(model.parameters()).dtype

    bar = tqdm(
        total=total_steps, unit="step", dynamic_ncols=True,
        disable=True if config.quiet or not accelerator.is_main_process else None,
    )  # fmt: skip
    step, samples, train_seconds = 0, 0, 0.0
    loss_sum = torch.zeros((), device=accelerator.device)
    loss_count = 0
    metrics: dict[str, Any] = {}
    confusion_matrix: list[list[int]] = []

    def run_eval(epoch: float, tick: float) -> None:
        """Evaluate, log a metrics row, and stop the training clock that started at `tick`."""
        nonlocal loss_sum, loss_count, metrics, train_seconds, confusion_matrix
        # .item() waits for the device, so the clock stops when the queued steps are done.
        train_loss = accelerator.reduce(loss_sum, "sum").item() / max(loss_count * accelerator.num_processes, 1)
        train_seconds += time.perf_counter() - tick
        evaluation = evaluate(model, test_loader, accelerator, input_dtype)
        confusion_matrix = evaluation.pop("confusion_matrix")
        metrics = {
            "epoch": round(epoch, 4), "step": step, "train_loss": train_loss, **evaluation,
            "lr": scheduler.get_last_lr()[0],
            "samples_per_second": samples * accelerator.num_processes / max(train_seconds, 1e-9),
        }  # fmt: skip
        test_loss, test_accuracy = evaluation["test_loss"], evaluation["test_accuracy"]
        outputs.log_metrics(metrics)
        if accelerator.is_main_process and not config.quiet:
            tqdm.write(
                f"epoch {epoch:.2f} step {step}: train_loss {train_loss:.4f} "
                f"test_loss {test_loss:.4f} test_accuracy {test_accuracy:.4f}"
            )
        loss_sum, loss_count = torch.zeros((), device=accelerator.device), 0

    model.train()
    done = False
    for epoch in range(config.epochs):
        tick = time.perf_counter()
        for inputs, labels in train_loader:
            with accelerator.accumulate(model):
                logits = model(inputs.to(input_dtype))
                loss = F.cross_entropy(logits.float(), labels)
                accelerator.backward(loss)
                if config.max_grad_norm is not None and accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad()
            loss_sum += loss.detach()
            loss_count += 1
            samples += labels.shape[0]
            if not accelerator.sync_gradients:
                continue
            scheduler.step()
            step += 1
            bar.update(1)
            if step % config.log_every == 0 and not bar.disable:
                bar.set_postfix(loss=f"{loss.item():.4f}", refresh=False)
            done = step >= total_steps
            if done or (config.eval_every and step % config.eval_every == 0):
                run_eval(step / steps_per_epoch, tick)
                tick = time.perf_counter()
            if done:
                break
        if done:
            break
        if not (config.eval_every and step % config.eval_every == 0):
            run_eval(step / steps_per_epoch, tick)
    bar.close()

    results = {
        **metrics,
        "epochs": round(step / steps_per_epoch, 4),
        "steps": step,
        "train_seconds": train_seconds,
        "wall_seconds": time.perf_counter() - start,
        "model": model_name,
        "dataset": config.dataset,
        "num_parameters": n_params,
        "global_batch_size": config.batch_size * config.grad_accum * accelerator.num_processes,
        **describe(accelerator),
        "confusion_matrix": confusion_matrix,
        "versions": versions(),
    }
    results.pop("epoch", None)
    results.pop("step", None)
    outputs.write_results(results)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return results


@torch.no_grad()
def evaluate(
    model: nn.Module, loader: Any, accelerator: Accelerator, input_dtype: torch.dtype = torch.float32
) -> dict[str, Any]:
    """test_loss, test_accuracy, test_samples and a 10x10 confusion matrix (rows: true class),
    over the whole test set.

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
