"""The warm-up step runs on a copy: the trained weights and metrics are the same without it."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from safetensors.torch import load_file

from accel_mnist import TrainConfig, train
from tests.helpers import REPO, accelerate_launch, run_command


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
        # Each run evaluates once (its last step): its own seconds, inside the call's, outside the training clock.
        assert 0 < results["eval_seconds"] < results["wall_seconds"] - results["train_seconds"]
        runs[warm] = (load_file(out / "model.safetensors"), json.loads((out / "metrics.jsonl").read_text()))
    (cold_w, cold_m), (warm_w, warm_m) = runs[False], runs[True]
    assert cold_w.keys() == warm_w.keys() and all(torch.equal(cold_w[k], warm_w[k]) for k in cold_w)
    for key in ("train_loss", "test_loss", "test_accuracy"):
        assert cold_m[key] == pytest.approx(warm_m[key], rel=0, abs=0)


# Run in a process of its own: Accelerate's state is a per-process singleton, and an earlier
# test's Accelerator would keep this one at fp32 whatever ACCELERATE_MIXED_PRECISION says.
RECORDING_RUN = """
import json, sys, torch
from accel_mnist import TrainConfig, train

seen = []  # per forward: (tracks gradients, under autocast); prewarm's copy appends here too

class Recorder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(784, 10)

    def forward(self, x):
        seen.append((torch.is_grad_enabled(), torch.is_autocast_enabled(x.device.type)))
        return self.head(x.flatten(1))

config = TrainConfig(max_steps=1, batch_size=32, eval_batch_size=2000, data_dir=sys.argv[1], data_loader="device",
                     quiet=True, save_checkpoints=False, export=False, prewarm=True, output_dir=sys.argv[2])
results = train(config, Recorder())
print(json.dumps({"mixed_precision": results["mixed_precision"], "seen": seen}))
"""


def test_prewarm_runs_under_the_launchs_mixed_precision(mnist_dir, tmp_path):
    proc = run_command([sys.executable, "-c", RECORDING_RUN, str(mnist_dir), str(tmp_path / "run")],
                       env={"ACCELERATE_MIXED_PRECISION": "bf16"}, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["mixed_precision"] == "bf16"
    # The training forwards: prewarm's on its copy, then the run's one step; both in bf16.
    assert [autocast for grad, autocast in out["seen"] if grad] == [True, True], out["seen"]


def test_deepspeed_prewarm_steps_a_throwaway_engine_and_changes_no_weight(mnist_dir, tmp_path):
    # ZeRO-2 on CPU (fp32): the throwaway engine's setup and step are collectives and kernels of
    # the run's own engine kind; the run's weights must come out bit for bit the same.
    launch = ["--config_file", str(REPO / "accelerate_configs" / "zero2.yaml"), "--num_processes", "1",
              "--mixed_precision", "no"]  # fmt: skip
    runs = {}
    for flag in ("--prewarm", "--no-prewarm"):
        out = tmp_path / flag.strip("-")
        proc, results = accelerate_launch(launch, ["--model", "linear", "--max-steps", "8", "--no-save-checkpoints",
                                                   flag], out, timeout=300)  # fmt: skip
        assert proc.returncode == 0 and results is not None, proc.stderr[-3000:]
        assert results["distributed_type"] == "DEEPSPEED"
        runs[flag] = (results, load_file(out / "model.safetensors"))
    (warm, warm_w), (cold, cold_w) = runs["--prewarm"], runs["--no-prewarm"]
    assert 0 < warm["prewarm_engine_seconds"] < warm["prewarm_seconds"] and cold["prewarm_seconds"] == 0
    assert "prewarm_engine_seconds" not in cold
    assert warm_w.keys() == cold_w.keys() and all(torch.equal(warm_w[k], cold_w[k]) for k in warm_w)
