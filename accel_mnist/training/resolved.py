"""What a run settles once: a frozen value that every stage after the Accelerator and the memory plan
reads, so that nothing after them writes a config or works the strategy out again.

The stages that settle it, in order (training/loop.py, training/start.py): the launch's accumulation
(`with_launch`, right after the Accelerator exists, before the output directory is read), the step's
plan (`StepPlan.of`: captured or eager, and why), then the memory plan's batch (`batch_size: auto`)
and accumulation (`global_batch_size`: the strategy's `grad_accum` is taken again after it).
`ResolvedRun.config` is what config.json records: run again with `--config`, it trains the same run.
"""

from __future__ import annotations

from dataclasses import dataclass

from accelerate import Accelerator

from ..config import TrainConfig
from ..distributed.option_rules import capture_refusal
from ..distributed.strategy import Strategy
from ..optim import optimizer_class_name


def with_launch(accelerator: Accelerator, config: TrainConfig) -> TrainConfig:
    """`config` with the accumulation the launch settled (the training config's `grad_accum`, else the
    launcher's, else 1: distributed/accelerator.py), as checkpoints and config.json record it."""
    return config.replace(grad_accum=int(accelerator.gradient_accumulation_steps))


@dataclass(frozen=True)
class StepPlan:
    """Whether the step is captured as a CUDA graph (training/captured_step.py), decided once from the strategy
    and the config: `why_eager` says why not where `cuda_graph` asked for it."""

    captured: bool = False
    why_eager: str | None = None
    # The captured model is torch.compile'd (the launch's dynamo_backend): a batch of another shape then runs
    # eager kernels rather than compile again (captured_step.GraphedStep).
    compiled: bool = False

    @classmethod
    def of(cls, strategy: Strategy, config: TrainConfig) -> StepPlan:
        """The plan of a run of `config` under `strategy` (the rule: option_rules.capture_refusal)."""
        if not config.cuda_graph:
            return cls()
        why = capture_refusal(strategy, config, optimizer_class_name(config))
        return cls(captured=why is None, why_eager=why, compiled=why is None and strategy.dynamo != "no")


@dataclass(frozen=True)
class ResolvedRun:
    """The run as it will train: the config with accumulation and batch settled, the strategy the launch
    set up, and the step's plan."""

    config: TrainConfig
    strategy: Strategy
    step: StepPlan

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step over every process."""
        return self.config.batch_size * self.strategy.grad_accum * self.strategy.num_processes
