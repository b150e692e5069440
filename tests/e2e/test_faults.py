"""--resume-from auto, which makes one command serve all starts of a run a scheduler restarts
(in process, on the synthetic MNIST files)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from accel_mnist import TrainConfig, train
from accel_mnist.errors import UsageError


@pytest.fixture
def config(synthetic_mnist, tmp_path):
    return TrainConfig(model="linear", data_dir=str(synthetic_mnist), download=False, quiet=True, export=False,
                       output_dir=str(tmp_path / "run"), max_steps=20, eval_every=20)  # fmt: skip


def test_resume_auto_starts_fresh_continues_and_returns_a_finished_run(config):
    with pytest.raises(UsageError, match='resume_from="latest": no complete checkpoint'):
        train(config.replace(resume_from="latest"))  # latest is unchanged: it must find one
    auto = config.replace(resume_from="auto")
    first = train(auto)  # nothing there: a fresh start
    results = Path(config.output_dir) / "results.json"
    written = results.read_text()
    assert train(auto) == json.loads(written)  # finished: returned as it is, nothing retrained
    assert results.read_text() == written
    (results).unlink()  # as if killed after its last checkpoint: auto resumes it
    more = train(auto.replace(max_steps=40))
    assert (first["steps"], more["steps"]) == (20, 40)


def test_a_finished_run_with_other_settings_is_not_returned(config):
    train(config.replace(resume_from="auto"))
    # Another model: neither the finished run nor its checkpoint may be taken for this one.
    with pytest.raises(UsageError, match="model='linear' but this run has model='mlp'"):
        train(config.replace(resume_from="auto", model="mlp", max_steps=40))
