"""DataLoader workers end with the run that started them, and the run starts no thread that ends on
its own while it may fork: on CPython before python/cpython#112275's fix a fork while another thread
ends can deadlock the child, which a later run in the same process (a sweep, a notebook, the option
matrix's cells) would meet when it forks its own workers."""

from __future__ import annotations

import multiprocessing
import threading

import pytest
from torch import nn

from accel_mnist import TrainConfig, train
from accel_mnist.models import build_model


def _config(data_dir, tmp_path, **changes):
    return TrainConfig(model="linear", data_dir=str(data_dir), download=False, output_dir=str(tmp_path / "run"),
                       max_steps=4, eval_every=2, export=False, plots=False, save_checkpoints=False,
                       data_loader="torch", num_workers=1, **changes)  # fmt: skip


def _children() -> set[int | None]:
    """This process's live child processes (other tests in this process may have left their own)."""
    return {p.pid for p in multiprocessing.active_children()}


def test_a_finished_run_leaves_no_workers_and_started_no_monitor(synthetic_mnist, tmp_path):
    threads, children = set(threading.enumerate()), _children()
    train(_config(synthetic_mnist, tmp_path))  # not quiet: the progress bar is shown
    assert _children() <= children  # the workers were joined before train() returned
    started = set(threading.enumerate()) - threads
    assert not any("tqdm" in t.name for t in started), started
    # Ended before train() returned, not on their own a moment later (data/worker_threads.py).
    assert not [t.name for t in started if "QueueFeeder" in t.name and t.is_alive()]


class _FailsAtStep3(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = build_model("linear")
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.training and self.calls == 3:
            raise RuntimeError("the user's model failed")
        return self.inner(x)


def test_a_run_stopped_by_an_error_ends_its_workers(synthetic_mnist, tmp_path):
    """Also while its traceback (and so the run's frames) is still held, as a notebook holds the last one."""
    children = _children()
    with pytest.raises(RuntimeError, match="the user's model failed") as stopped:
        train(_config(synthetic_mnist, tmp_path, quiet=True), model=_FailsAtStep3())
    assert stopped.tb is not None and _children() <= children
