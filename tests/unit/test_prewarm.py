"""The warm-up step runs on a copy: the model and the RNG are left as they were."""

from __future__ import annotations

import torch

from accel_mnist import TrainConfig
from accel_mnist.training.prewarm import prewarm


def test_prewarm_leaves_model_and_rng_alone():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Dropout(0.5), torch.nn.Linear(784, 10))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    seconds = prewarm(model, TrainConfig(batch_size=8, eval_batch_size=4), torch.device("cpu"), 13)
    assert seconds > 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert torch.equal(rng, torch.get_rng_state())  # the copy's dropout drew from a forked stream
