"""Where training stands and what the run is, saved together with each checkpoint.

`Progress` holds the loop's counters (steps, position in the epoch, samples, seconds, the loss
sums since the last evaluation); `RunDescription` what the run is (its length, strategy, config,
model and data), written once as the run starts. A checkpoint's trainer_state.json is the two
as one flat JSON object (`saved`), as it always was, so checkpoints of earlier versions resume;
`read` splits it again and refuses, in one line, a field neither knows. `check_compatible`
refuses a checkpoint that this run would continue as something else.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..caller import setting
from ..distributed.strategy import Strategy
from ..errors import UsageError
from ..run.checkpoint import MUST_MATCH, STATE_FILE


@dataclass
class Progress:
    """The loop's counters: enough to continue at the exact next batch."""

    step: int = 0  # optimizer steps taken
    epoch: int = 0  # epoch in progress (0-based)
    batches_in_epoch: int = 0  # micro-batches of that epoch already consumed on each process
    samples: int = 0  # training samples seen by each process
    train_seconds: float = 0.0
    # The first optimizer step of each process start (compilation, optimizer state), included
    # in train_seconds and timed apart, so that a steady rate can leave it out.
    warmup_seconds: float = 0.0
    warmup_samples: int = 0
    loss_sums: list[float] = field(default_factory=list)  # per rank, since the last evaluation
    loss_count: int = 0
    skipped_steps: int = 0


@dataclass
class RunDescription:
    """What the run is: its length, strategy and config, and what `accel-mnist export` needs to
    rebuild the model (the registry name or the class name of a user's module, the normalisation,
    the data it was trained with, and a transformers model's config.json)."""

    total_steps: int = 0  # what onecycle/cosine were sized for
    strategy: dict[str, Any] = field(default_factory=dict)  # Strategy.fields()
    config: dict[str, Any] = field(default_factory=dict)
    model: str = ""
    mean: float = 0.0
    std: float = 1.0
    dataset: str = ""  # the config's, or a label for data passed to train()
    num_classes: int = 10
    class_names: list[str] | None = None
    input_shape: list[int] = field(default_factory=lambda: [1, 28, 28])
    train_samples: int = 0  # 0: not recorded (older checkpoints)
    transformers_config: dict[str, Any] | None = None


def saved(progress: Progress, run: RunDescription) -> dict[str, Any]:
    """trainer_state.json's object: both, flat."""
    return {**asdict(progress), **asdict(run)}


def read(state: dict[str, Any], path: Path) -> tuple[Progress, RunDescription]:
    """Split a checkpoint's trainer_state.json object (from checkpoint folder `path`) again."""
    known = {f.name for cls in (Progress, RunDescription) for f in fields(cls)}
    unknown = sorted(set(state) - known)
    if unknown:
        raise UsageError(f"{path / STATE_FILE}: unreadable checkpoint state (unknown fields {', '.join(unknown)})")
    try:
        return tuple(  # type: ignore[return-value]
            cls(**{f.name: state[f.name] for f in fields(cls) if f.name in state}) for cls in (Progress, RunDescription)
        )
    except TypeError as e:
        raise UsageError(f"{path / STATE_FILE}: unreadable checkpoint state ({e})") from None


def check_compatible(
    progress: Progress, was: RunDescription, strategy: Strategy, config: dict[str, Any], path: Path,
    total_steps: int, data: dict[str, Any] | None = None,
) -> None:  # fmt: skip
    """Refuse to resume, at `progress` of a run described by `was`, into a run that would silently
    mean something else (`data`: this run's RunDescription fields of its data: num_classes,
    class_names, input_shape, train_samples)."""
    if progress.step >= total_steps:
        raise UsageError(f"{path} is already at step {progress.step} of {total_steps}: nothing left to train")
    if config.get("scheduler") in ("onecycle", "cosine") and was.total_steps not in (0, total_steps):
        raise UsageError(
            f"{path} was saved with a {config['scheduler']} schedule over {was.total_steps} steps but this run "
            f"has {total_steps}; keep {setting('epochs')}/{setting('max_steps')} as they were "
            f"(or use {setting('scheduler', 'none')} or step)"
        )
    strategy.check_resume(Strategy.from_fields(was.strategy), path, was.config, config)
    for key in MUST_MATCH:
        if was.config.get(key) != config.get(key):
            raise UsageError(
                f"{path} was saved with {key}={was.config.get(key)!r} but this run has {key}={config.get(key)!r}"
            )
    for key, now in (data or {}).items():
        before = getattr(was, key)
        unrecorded = (key == "train_samples" and not before) or (key == "class_names" and before is None)
        if not unrecorded and before != now:
            raise UsageError(f"{path} was trained on data with {key}={before!r} but this run's data has {now!r}")


def rescale_loss_sums(progress: Progress, num_processes: int) -> list[float]:
    """Per-rank loss sums of the checkpoint for `num_processes` ranks.

    Each rank sums its batches' mean losses and the train loss divides the total by the
    number of ranks, so the total scales with the number of ranks; rank 0 carries it.
    """
    sums = progress.loss_sums
    if not sums or len(sums) == num_processes:
        return sums or [0.0] * num_processes
    total = sum(sums) * num_processes / len(sums)
    return [total] + [0.0] * (num_processes - 1)
