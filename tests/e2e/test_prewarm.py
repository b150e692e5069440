"""The warm-up step runs on a copy: the trained weights and metrics are the same without it."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from accel_mnist import TrainConfig, train


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="bit equality needs deterministic kernels: on an H200 two runs without prewarm already ended 1.4e-4 "
    "apart (with prewarm 4.1e-6 from the first)",
)
def test_training_with_prewarm_gives_the_same_weights(synthetic_mnist, tmp_path):
    # bncnn: BatchNorm running statistics would differ if the warm-up touched the real model.
    base = TrainConfig(model="bncnn", max_steps=6, batch_size=32, eval_batch_size=2000, data_dir=str(synthetic_mnist),
                       data_loader="device", quiet=True, save_checkpoints=False)  # fmt: skip
    runs = {}
    for warm in (False, True):
        out = tmp_path / f"warm_{warm}"
        results = train(base.replace(prewarm=warm, output_dir=str(out)))
        assert (results["prewarm_seconds"] > 0) is warm
        runs[warm] = (load_file(out / "model.safetensors"), json.loads((out / "metrics.jsonl").read_text()))
    (cold_w, cold_m), (warm_w, warm_m) = runs[False], runs[True]
    assert cold_w.keys() == warm_w.keys() and all(torch.equal(cold_w[k], warm_w[k]) for k in cold_w)
    for key in ("train_loss", "test_loss", "test_accuracy"):
        assert cold_m[key] == pytest.approx(warm_m[key], rel=0, abs=0)
