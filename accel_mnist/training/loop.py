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

from ..config import TrainConfig
from ..data.catalog import load_datasets
from ..distributed import consensus
from ..distributed.step import MicroStep
from ..distributed.strategy import build_accelerator, check_model, describe, prepare
from ..errors import NonFiniteLossError
from ..evaluation import evaluate
from ..models import build_model, num_parameters
from ..run import checkpoint as ckpt
from ..run.directory import RunDir
from ..versions import versions
from .loaders import Loaders
from .loss_tally import LossTally
from .preemption import Preempted, StopSignals
from .prewarm import prewarm


def train(config: TrainConfig, model: nn.Module | None = None, *, plots_in_background: bool = False) -> dict[str, Any]:
    """Train `model` (default: the registry's `config.model`) and return results.json's fields.

    Runs unchanged on CPU, one or several GPUs and DeepSpeed ZeRO 1-3: the strategy comes from
    the accelerate config of the launch (`accelerate launch --config_file ...`). With
    `config.plots` the PNGs are drawn before this returns, or, with `plots_in_background` (the
    CLI's choice, so that a command does not wait 1-1.5 s for matplotlib), by a process of their own.
    """
    start = time.perf_counter()
    accelerator = build_accelerator(config)
    try:
        with StopSignals() as stop:
            return _train(accelerator, config, model, start, stop, plots_in_background)
    finally:
        # Also on failure: trackers close their runs and the process group is torn down.
        accelerator.end_training()


def _train(
    accelerator: Accelerator,
    config: TrainConfig,
    model: nn.Module | None,
    start: float,
    stop: StopSignals,
    plots_in_background: bool,
) -> dict[str, Any]:
    strategy = describe(accelerator)
    run_dir = RunDir(accelerator, config)
    plan = run_dir.plan()  # agreed by every rank: what --resume-from means here
    if plan.finished is not None:
        accelerator.print(f"{config.output_dir} holds a finished run (results.json): nothing to train")
        return plan.finished
    resume = plan.resume
    state = plan.state or ckpt.TrainState()
    # Every pickle of the checkpoint is checked before anything is loaded or written.
    rng_states = ckpt.verify_checkpoint(accelerator, resume, config.trust_checkpoint) if resume else {}

    set_seed(config.seed)
    with run_dir.data_first():  # one process per copy of the data directory downloads, then the others read
        train_set, test_set = load_datasets(config.dataset, config.data_dir, download=config.download)
    model_name = config.model if model is None else type(model).__name__
    model = build_model(config.model) if model is None else model
    if accelerator.process_index:  # dropout masks of its own; rank 0 keeps the stream of one process
        set_seed(config.seed, device_specific=True)
    n_params = num_parameters(model)
    state.model, state.mean, state.std = model_name, train_set.mean, train_set.std
    data = Loaders(train_set, test_set, config, accelerator)
    batches = len(data)
    steps_per_epoch = math.ceil(batches / accelerator.gradient_accumulation_steps)
    total_steps = steps_per_epoch * config.epochs
    if config.max_steps:
        total_steps = min(total_steps, config.max_steps)
    if resume:
        saved_state, where = state, resume
        consensus.agree(
            accelerator, lambda: ckpt.check_compatible(saved_state, strategy, config.to_dict(), where, total_steps)
        )
        state.loss_sums = ckpt.rescale_loss_sums(state, accelerator.num_processes)
    state.strategy, state.config, state.total_steps = strategy, config.to_dict(), total_steps
    check_model(accelerator, model)
    # Only now, with every check passed on every rank, is anything in the output directory touched.
    run_dir.open(plan)
    if config.report_to != "none":
        hparams = {k: "none" if v is None else v for k, v in config.to_dict().items()}
        accelerator.init_trackers("accel_mnist", config=hparams)
    per_process = len(train_set) // accelerator.num_processes
    rehearsals = (data.rehearse, lambda: LossTally.rehearse(accelerator.device))
    prewarm_seconds = prewarm(model, config, accelerator.device, per_process, rehearsals) if config.prewarm else 0.0
    model, optimizer, scheduler = prepare(accelerator, config, model, total_steps, steps_per_epoch, bool(resume))
    if resume:
        ckpt.load_checkpoint(accelerator, resume, rng_states, config.trust_checkpoint)
        accelerator.print(f"resumed from {resume} at step {state.step}")
    # Under DeepSpeed fp16/bf16 the weights themselves are half precision and want inputs to
    # match; elsewhere they stay fp32 and autocast (if any) does the casting.
    input_dtype = next(model.parameters()).dtype
    micro = MicroStep(accelerator, model)
    # The train loss's sum and the non-finite steps, folded only where the loop syncs anyway.
    losses = LossTally(accelerator.device, state.loss_sums[accelerator.process_index] if state.loss_sums else 0.0)
    metrics: dict[str, Any] = {}
    confusion_matrix: list[list[int]] = []
    bar = tqdm(total=total_steps, initial=state.step, unit="step", dynamic_ncols=True,
               disable=True if config.quiet or not accelerator.is_main_process else None)  # fmt: skip

    def check_finite() -> None:
        # Collective, so that every rank stops together rather than one waiting for the others;
        # the same gather tells every rank whether any of them was asked to stop by a signal.
        losses.fold()
        flags = torch.tensor([[losses.worst, int(stop.received is not None)]], device=accelerator.device)
        worst, signalled = accelerator.gather(flags).amax(0).tolist()
        stop.agreed = stop.agreed or bool(signalled)
        if worst >= config.max_nonfinite:
            raise NonFiniteLossError(
                f"loss was not finite for {config.max_nonfinite} optimizer steps in a row (at step "
                f"{state.step}); the last good checkpoint is kept in {ckpt.checkpoint_dir(config.output_dir)}"
            )

    def run_eval() -> None:
        nonlocal metrics, confusion_matrix
        evaluation = evaluate(model, data.test, accelerator, input_dtype)
        confusion_matrix = evaluation.pop("confusion_matrix")
        loss_sum = accelerator.reduce(losses.total(), "sum").item()
        train_loss = loss_sum / max(state.loss_count * accelerator.num_processes, 1)
        metrics = {
            "epoch": round(state.step / steps_per_epoch, 4), "step": state.step, "train_loss": train_loss,
            **evaluation, "lr": scheduler.get_last_lr()[0],
            "samples_per_second": state.samples * accelerator.num_processes / max(state.train_seconds, 1e-9),
            "train_seconds": state.train_seconds, "warmup_seconds": state.warmup_seconds,
            "steady_samples_per_second": (state.samples - state.warmup_samples) * accelerator.num_processes
            / max(state.train_seconds - state.warmup_seconds, 1e-9),
        }  # fmt: skip
        run_dir.log_metrics(metrics)
        accelerator.log(metrics, step=state.step)
        if not config.quiet:
            accelerator.print(
                f"epoch {metrics['epoch']:.2f} step {state.step}: train_loss {train_loss:.4f} "
                f"test_loss {metrics['test_loss']:.4f} test_accuracy {metrics['test_accuracy']:.4f}"
            )
        losses.reset_sum()
        state.loss_count = 0

    def save() -> None:
        check_finite()  # never publish weights that a non-finite loss has already spoilt
        state.loss_sums = accelerator.gather(losses.total().reshape(1)).tolist()
        saved.append(run_dir.save_checkpoint(state))

    saved: list[Any] = []

    def pause_clock(tick: float, then: Any) -> float:
        """Stop the training clock around evaluation and checkpointing, which it must not count."""
        losses.fold()  # waits for the device, so the clock sees the queued steps finish
        state.train_seconds += time.perf_counter() - tick
        then()
        return time.perf_counter()

    check_finite()  # nothing to find yet; its first collective and kernels are then not training time
    model.train()
    finished = state.step >= total_steps
    warming_up, samples_before = True, state.samples  # the first optimizer step of this process
    while not finished:
        tick = time.perf_counter()
        for inputs, labels in data.epoch(state.epoch, skip=state.batches_in_epoch):
            with micro.accumulate():
                logits = model(inputs.to(input_dtype))
                loss = F.cross_entropy(logits.float(), labels)
                micro.backward(loss)
                if config.max_grad_norm is not None and accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad()
            losses.add(loss)
            state.loss_count += 1
            state.batches_in_epoch += 1
            state.samples += labels.shape[0]
            if not accelerator.sync_gradients:
                continue
            scheduler.step()
            losses.end_step()
            state.step += 1
            if warming_up:  # timed apart: torch.compile compiles here, optimizers allocate state
                warming_up = False
                loss.item()  # waits for the device, so that the step is timed whole
                state.warmup_seconds += time.perf_counter() - tick
                state.warmup_samples += state.samples - samples_before
            state.skipped_steps += int(optimizer.step_was_skipped)
            bar.update(1)
            if state.step % config.log_every == 0:
                check_finite()
                if not bar.disable:
                    bar.set_postfix(loss=f"{loss.item():.4f}", refresh=False)
            end_of_epoch = state.batches_in_epoch == batches
            if end_of_epoch:
                state.epoch, state.batches_in_epoch = state.epoch + 1, 0
            finished = state.step >= total_steps
            if finished or end_of_epoch or _every(state.step, config.eval_every):
                tick = pause_clock(tick, run_eval)
                # The accuracy was gathered, so every rank stops at the same step.
                finished = finished or metrics["test_accuracy"] >= (config.stop_at_accuracy or math.inf)
            due = finished or end_of_epoch or _every(state.step, config.checkpoint_every)
            if (config.save_checkpoints and due) or stop.agreed:  # a signal: save this step, whatever the schedule
                tick = pause_clock(tick, save)
            if stop.agreed and not finished:
                signal_name = stop.received or "a signal to another rank"
                # Free the prepared objects first, as at a normal end (see below).
                accelerator.free_memory(model, optimizer, scheduler, data.train, data.test)
                run_dir.mark_preempted(signal_name, state.step, saved[-1])
                raise Preempted(signal_name, state.step, saved[-1])
            if finished:
                break
    bar.close()
    if config.export:
        from ..export.model_dir import full_state_dict, save_exported

        weights = full_state_dict(accelerator, model)  # all ranks: ZeRO-3 gathers the shards
        if accelerator.is_main_process:
            save_exported(weights, run_dir.dir, model_name=model_name, dataset=config.dataset,
                          extra={"mean": state.mean, "std": state.std, "step": state.step})  # fmt: skip

    results = {
        **{k: v for k, v in metrics.items() if k not in ("epoch", "step")},
        "epochs": round(state.step / steps_per_epoch, 4), "steps": state.step,
        "train_seconds": state.train_seconds, "prewarm_seconds": prewarm_seconds,
        "wall_seconds": time.perf_counter() - start,
        "skipped_steps": state.skipped_steps, "model": model_name, "dataset": config.dataset,
        "num_parameters": n_params,
        "global_batch_size": config.batch_size * accelerator.gradient_accumulation_steps * accelerator.num_processes,
        **strategy, "data_loader": data.kind, "confusion_matrix": confusion_matrix, "versions": versions(),
    }  # fmt: skip
    run_dir.write_results(results)
    if config.plots and accelerator.is_main_process:
        from ..report import draw_in_background, write_report  # imports matplotlib only now

        if plots_in_background:
            draw_in_background(run_dir.dir)
        else:
            write_report(run_dir.dir)
    accelerator.wait_for_everyone()
    # Release the prepared objects before end_training: a gloo worker still holding its DDP
    # model at interpreter exit sometimes aborts ("terminate called without an active exception").
    accelerator.free_memory(model, optimizer, scheduler, data.train, data.test)
    return results


def _every(step: int, n: int) -> bool:
    return n > 0 and step % n == 0
