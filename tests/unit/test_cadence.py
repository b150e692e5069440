"""Cadence: when the loop checks, evaluates, checkpoints and stops (plain logic, no torch)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from accel_mnist.training import cadence as cadence_module
from accel_mnist.training.cadence import Cadence


def test_cadence_module_imports_nothing_but_the_standard_library():
    """Plain logic: its imports (read from the source, so that torch loaded by other tests does not
    hide one) are standard-library modules only."""
    tree = ast.parse(Path(cadence_module.__file__).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


def test_evaluates_at_epoch_ends_the_last_step_and_every_n():
    cadence = Cadence(total_steps=10, eval_every=4)
    due = [s for s in range(1, 11) if cadence.evaluate_due(s, end_of_epoch=s == 5)]
    assert due == [4, 5, 8, 10]


def test_eval_every_zero_means_epoch_ends_and_the_end_only():
    cadence = Cadence(total_steps=7)
    assert [s for s in range(1, 8) if cadence.evaluate_due(s, end_of_epoch=s % 3 == 0)] == [3, 6, 7]


def test_checks_every_log_every_steps():
    assert [s for s in range(1, 11) if Cadence(total_steps=10, log_every=3).check_due(s)] == [3, 6, 9]


@pytest.mark.parametrize(
    ("step", "accuracy", "target", "finished"),
    [
        (9, None, None, False),
        (10, None, None, True),
        (12, None, None, True),
        (3, 0.98, 0.99, False),
        (3, 0.99, 0.99, True),
        (3, 0.995, None, False),
    ],
)
def test_finished_when_out_of_steps_or_at_the_target_accuracy(step, accuracy, target, finished):
    assert Cadence(total_steps=10, stop_at_accuracy=target).finished(step, accuracy) is finished


def test_checkpoints_at_epoch_ends_the_end_and_every_n_only_when_saving():
    cadence = Cadence(total_steps=10, checkpoint_every=3)
    due = [s for s in range(1, 11) if cadence.checkpoint_due(s, end_of_epoch=s == 5, finished=s == 10)]
    assert due == [3, 5, 6, 9, 10]
    off = Cadence(total_steps=10, checkpoint_every=3, save_checkpoints=False)
    assert not any(off.checkpoint_due(s, end_of_epoch=True, finished=True) for s in range(1, 11))


def test_an_early_stop_is_checkpointed_like_the_end():
    cadence = Cadence(total_steps=100, stop_at_accuracy=0.9)
    finished = cadence.finished(7, 0.95)
    assert finished and cadence.checkpoint_due(7, end_of_epoch=False, finished=finished)


def test_of_reads_a_train_config():
    config = SimpleNamespace(
        log_every=2,
        eval_every=5,
        checkpoint_every=0,
        save_checkpoints=True,
        stop_at_accuracy=0.99,
        epochs=3,
        max_steps=0,
    )
    assert Cadence.of(config, 40) == Cadence(120, 2, 5, 0, True, 0.99)  # 3 epochs of 40 steps
    config.max_steps = 100  # cuts the run short
    assert Cadence.of(config, 40).total_steps == 100
    config.max_steps = 500  # a run no longer than its epochs
    assert Cadence.of(config, 40).total_steps == 120
