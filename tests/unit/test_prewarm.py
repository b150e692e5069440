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


def test_a_background_import_lands_in_sys_modules_and_a_failing_one_is_silent():
    import sys

    from accel_mnist.training.prewarm import import_in_background

    sys.modules.pop("this", None)  # a module nothing else imports, so the thread does the work
    import_in_background("this").join(timeout=60)
    assert "this" in sys.modules
    missing = import_in_background("accel_mnist_no_such_module")
    missing.join(timeout=60)
    assert not missing.is_alive() and "accel_mnist_no_such_module" not in sys.modules
