"""One run, set up by training/start.py: `fit` trains it, `finish` exports it and writes its results.

`fit` is the loop: it asks the `Cadence` what is due after each optimizer step; what the strategy
changes lives in distributed/, not here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import torch
from accelerate import Accelerator
from torch import nn
from tqdm.auto import tqdm

from ..config import TrainConfig
from ..distributed.option_rules import eager_line
from ..errors import NonFiniteLossError, on_every_rank
from ..evaluation import evaluate, evaluation_stance
from ..memory.memory_watch import MemoryWatch
from ..optim import is_constant
from ..run import checkpoint as ckpt
from ..run.directory import RunDir
from .averaging import WeightAverage
from .cadence import Cadence
from .captured_step import GraphedStep, build_step
from .clock import TrainingClock
from .loaders import Loaders
from .loss_tally import LossTally
from .preemption import Preempted, StopSignals
from .profiling import StepProfiler
from .records import SetupFacts, metrics_row, results_record
from .resolved import ResolvedRun
from .state import Progress, RunDescription
from .state import saved as saved_state
from .step import EagerStep


def _nothing() -> None:
    return None


class _Bar(tqdm):
    """tqdm without its monitor thread, which starts with a bar and ends when the last one closes: a
    thread ending while the process forks (a DataLoader worker) can deadlock the child on CPython
    before python/cpython#112275's fix (data/order.py). The monitor only refreshes a bar that has not
    printed for 10 s; this one is updated every step."""

    monitor_interval = 0


@dataclass
class TrainingRun:
    """One run, set up: `fit` trains it, `finish` exports it and writes its results."""

    accelerator: Accelerator
    resolved: ResolvedRun  # the config as it runs, the strategy and the step's plan, settled by start_run
    stop: StopSignals
    run_dir: RunDir
    progress: Progress  # the loop's counters, saved with each checkpoint
    described: RunDescription  # what the run is, saved with each checkpoint too
    data: Loaders
    model: nn.Module
    optimizer: Any
    scheduler: Any
    cadence: Cadence
    steps_per_epoch: int
    facts: SetupFacts  # what results.json says about the setup
    memory: MemoryWatch  # model states held and predicted, and the peaks: counted at evaluations
    average: WeightAverage  # what evaluations and the export see where ema_decay asks (training/averaging.py)
    metrics: dict[str, Any] = field(default_factory=dict)  # the last evaluation's row
    confusion_matrix: list[list[int]] = field(default_factory=list)
    last_checkpoint: Path | None = None
    eval_seconds: float = 0.0  # this process's evaluations, off the training clock (results.json)
    step: EagerStep | GraphedStep = field(init=False)  # built as fit starts (_build_step)

    def __post_init__(self) -> None:
        self.batches = len(self.data)  # micro-batches per epoch on each process
        # The 'none' schedule's step only counts (Accelerate's wrapper and LambdaLR cost about 20 us a
        # step on a CPU, 4% of the seed model's step): left out, the learning rate is the same.
        self.step_schedule = _nothing if is_constant(self.scheduler) else self.scheduler.step
        # The train loss's sum and the non-finite steps, folded only where the loop syncs anyway.
        sums, rank = self.progress.loss_sums, self.accelerator.process_index
        self.losses = LossTally(self.accelerator.device, sums[rank] if sums else 0.0)
        self.clock = TrainingClock(self.progress, self.losses.fold)
        self.profiler = StepProfiler(self.accelerator, self.config.profile, self.config.output_dir, self.cadence,
                                     self.steps_per_epoch, self.progress.step)  # fmt: skip
        quiet = self.config.quiet or not self.accelerator.is_main_process
        self.released = False
        self.bar = _Bar(
            total=self.cadence.total_steps,
            initial=self.progress.step,
            unit="step",
            dynamic_ncols=True,
            disable=True if quiet else None,
        )

    @property
    def config(self) -> TrainConfig:
        """The config as the run trains it (ResolvedRun.config)."""
        return self.resolved.config

    def _build_step(self) -> None:
        """The run's step (captured_step.build_step): built after any checkpoint is loaded, since capture
        records the optimizer state tensors it finds; and after the run exists, so that running out of memory
        while capturing still reports this run's memory."""
        batch_shape = (self.config.batch_size, *self.described.input_shape)
        self.step = build_step(self.accelerator, self.config, self.model, self.optimizer, batch_shape,
                               self.resolved.step)  # fmt: skip

    def fit(self) -> None:
        """Train until out of steps or at the target accuracy; on a signal, checkpoint and raise Preempted."""
        state, cadence, stop = self.progress, self.cadence, self.stop
        self._build_step()
        self.check()  # nothing to find yet; its first collective and kernels are then not training time
        self.model.train()
        warming_up, samples_before = True, state.samples  # the first optimizer step of this process
        finished = cadence.out_of_steps(state.step)
        with self.profiler:  # --profile: a window of steps after the first (training/profiling.py)
            while not finished:
                self.clock.start()
                for inputs, labels in self.data.epoch(state.epoch, skip=state.batches_in_epoch):
                    loss = self.micro_batch(inputs, labels)
                    if not self.accelerator.sync_gradients:
                        continue
                    self.step_schedule()
                    self.average.update()
                    self.losses.end_step()
                    state.step += 1
                    self.profiler.step()
                    if warming_up:
                        warming_up = False
                        self.clock.time_warmup(loss, state.samples - samples_before)
                    state.skipped_steps += int(self.optimizer.step_was_skipped)
                    self.bar.update(1)
                    if cadence.check_due(state.step):
                        self.check()
                        if not self.bar.disable:
                            self.bar.set_postfix(loss=f"{loss.item():.4f}", refresh=False)
                    end_of_epoch = state.batches_in_epoch == self.batches
                    if end_of_epoch:
                        state.epoch, state.batches_in_epoch = state.epoch + 1, 0
                    finished = cadence.out_of_steps(state.step)
                    if cadence.evaluate_due(state.step, end_of_epoch):
                        with self.clock.paused():
                            self.evaluate()
                        # The accuracy was gathered, so every rank stops at the same step.
                        finished = cadence.finished(state.step, self.metrics["test_accuracy"])
                    # A signal: save this step, whatever the schedule.
                    if cadence.checkpoint_due(state.step, end_of_epoch, finished) or stop.agreed:
                        with self.clock.paused():
                            self.save()
                    if stop.agreed and not finished:
                        self.preempt()
                    if finished:
                        break
        self.bar.close()

    def micro_batch(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """One micro-batch through the run's step (training/step.py), and its bookkeeping."""
        state = self.progress
        loss = self.step(inputs, labels)
        self.losses.add(loss)
        state.loss_count += 1
        state.batches_in_epoch += 1
        state.samples += labels.shape[0]
        return loss

    def check(self) -> None:
        """Agree on every rank whether the loss stayed non-finite too long, or a signal arrived.

        Collective, so that every rank stops together rather than one waiting for the others.
        """
        self.losses.fold()
        flags = torch.tensor([[self.losses.worst, int(self.stop.received is not None)]], device=self.accelerator.device)
        worst, signalled = self.accelerator.gather(flags).amax(0).tolist()
        self.stop.agreed = self.stop.agreed or bool(signalled)
        if worst >= self.config.max_nonfinite:  # gathered: every rank raises it
            raise on_every_rank(NonFiniteLossError(
                f"loss was not finite for {self.config.max_nonfinite} optimizer steps in a row (at step "
                f"{self.progress.step}); the last good checkpoint is kept in "
                f"{ckpt.checkpoint_dir(self.config.output_dir)}"
            ))  # fmt: skip

    def evaluate(self) -> None:
        """Evaluate on the test set, log the metrics row, and start the next train-loss average."""
        accelerator, state = self.accelerator, self.progress
        start = time.perf_counter()
        self.memory.count(at_rest=True)  # between steps: before evaluating gathers ZeRO-3's parameters
        with evaluation_stance(self.config.compile_evaluation), self.average.swapped():
            evaluation = evaluate(
                self.model, self.data.test, accelerator, self.step.input_dtype, self.described.num_classes
            )
        self.confusion_matrix = evaluation.pop("confusion_matrix")
        loss_sum = accelerator.reduce(self.losses.total(), "sum").item()
        train_loss = loss_sum / max(state.loss_count * accelerator.num_processes, 1)
        self.memory.gather()  # a collective: where the evaluation syncs anyway
        self.metrics = metrics_row(
            state,
            evaluation,
            train_loss=train_loss,
            lr=float(self.scheduler.get_last_lr()[0]),  # a tensor where the step is captured
            steps_per_epoch=self.steps_per_epoch,
            num_processes=accelerator.num_processes,
        )
        self.metrics.update(self.memory.largest_peaks())
        self.eval_seconds += time.perf_counter() - start  # the gathers above waited for the device
        self.run_dir.log_metrics(self.metrics)
        # A tracker takes numbers only (MLflow warns about a None): a CPU's allocated peak is left out.
        accelerator.log({k: v for k, v in self.metrics.items() if v is not None}, step=state.step)
        # Printed under --quiet too, which turns off the bar only: the line is the run's result on stdout.
        accelerator.print(
            f"epoch {self.metrics['epoch']:.2f} step {state.step}: train_loss {train_loss:.4f} "
            f"test_loss {self.metrics['test_loss']:.4f} test_accuracy {self.metrics['test_accuracy']:.4f}"
        )
        self.losses.reset_sum()
        state.loss_count = 0

    def save(self) -> None:
        """Checkpoint this step on every rank."""
        self.check()  # never publish weights that a non-finite loss has already spoilt
        self.progress.loss_sums = self.accelerator.gather(self.losses.total().reshape(1)).tolist()
        self.last_checkpoint = self.run_dir.save_checkpoint(saved_state(self.progress, self.described))

    def preempt(self) -> NoReturn:
        """Stop after the checkpoint a signal asked for; `--resume-from auto` continues from it."""
        assert self.last_checkpoint is not None  # fit() saves before it preempts
        signal_name = self.stop.received or "a signal to another rank"
        self.release()
        self.run_dir.mark_preempted(signal_name, self.progress.step, self.last_checkpoint)
        raise Preempted(signal_name, self.progress.step, self.last_checkpoint)

    def finish(self, start: float, plots_in_background: bool) -> dict[str, Any]:
        """Export the weights, write results.json (and the PNGs), release the prepared objects."""
        accelerator, config = self.accelerator, self.config
        if config.export:
            from ..export.model_dir import export_prepared

            state = self.described
            extra: dict[str, Any] = {"mean": state.mean, "std": state.std, "step": self.progress.step,
                                     "num_classes": state.num_classes, "class_names": state.class_names,
                                     "input_shape": state.input_shape}  # fmt: skip
            if config.mlp_hidden is not None and state.model == "mlp":
                extra["mlp_hidden"] = config.mlp_hidden
            with self.average.swapped():  # the weights the run's accuracy was measured with
                export_prepared(accelerator, self.model, self.run_dir.dir, state.model, state.dataset, extra,
                                state.transformers_config)  # fmt: skip
        results = results_record(
            self.progress,
            self.metrics,
            self.confusion_matrix,
            steps_per_epoch=self.steps_per_epoch,
            facts={
                **self.facts.fields(),
                **self.step.facts,
                "changes": self.changes(),
                "eval_seconds": self.eval_seconds,
                "memory": self.memory.results(),
                **self.profiler.results(),
            },  # fmt: skip
            wall_seconds=time.perf_counter() - start,
        )
        self.run_dir.write_results(results)
        accelerator.print(self.memory.summary())  # the run's last line on stdout
        if config.plots and accelerator.is_main_process:
            from ..report import draw_in_background, write_report  # imports matplotlib only now

            (draw_in_background if plots_in_background else write_report)(self.run_dir.dir)
        accelerator.wait_for_everyone()
        self.release()
        return results

    def changes(self) -> list[str]:
        """Each way the run differs from what its config asked, in the words it printed."""
        reason = self.step.facts.get("eager_reason")
        return [*self.facts.changes, *([eager_line(reason)] if reason else [])]

    def release(self) -> None:
        """Free the prepared objects before end_training (once; also when the run stops with an error): a gloo
        worker still holding its DDP model at interpreter exit sometimes aborts ("terminate called without an
        active exception"). The data loaders' worker processes end here too (Loaders.close)."""
        if self.released:
            return
        self.released = True
        self.accelerator.free_memory(self.model, self.optimizer, self.scheduler, self.data.train, self.data.test)
        self.data.close()
