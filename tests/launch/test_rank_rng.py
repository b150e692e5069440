"""Randomness across ranks: dropout masks differ per rank while weights and data order do not."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from accel_mnist import TrainConfig
from tests.helpers import CONFIGS, REPO, launch_prefix

# Run by `accelerate launch`: records, per rank, the weights the library builds (before any
# wrapper broadcasts them) and the first training batches' dropout masks, through a global
# forward hook (torch's public API for it), since train() builds the model itself.
MASK_SCRIPT = """
import json, sys
import torch
from torch import nn
from accelerate import PartialState
import accel_mnist.training.inputs as inputs  # where the run builds its model
from accel_mnist import TrainConfig, train

config = TrainConfig.from_dict(json.loads(sys.argv[1]))
record = {"masks": [], "known": []}
real_build = inputs.build_model
def build(*args, **kwargs):
    model = real_build(*args, **kwargs)
    record["weights"] = [p.detach().double().sum().item() for p in model.parameters()]
    return model
inputs.build_model = build

def hook(module, inputs, output):
    if isinstance(module, nn.Dropout) and module.training and len(record["masks"]) < 2:
        record["known"].append((inputs[0] != 0).flatten().tolist())  # where a drop can be seen
        record["masks"].append((output != 0).flatten().tolist())
torch.nn.modules.module.register_module_forward_hook(hook)
train(config)
rank = PartialState().process_index
with open(f"{config.output_dir}/rng_{rank}.json", "w") as f:
    json.dump(record, f)
"""


@pytest.mark.slow
def test_dropout_masks_differ_across_ranks_but_weights_do_not(tmp_path, mnist_dir):
    out = tmp_path / "run"
    script = tmp_path / "masks.py"
    script.write_text(MASK_SCRIPT)
    config = TrainConfig(model="mlp", data_dir=str(mnist_dir), download=False, quiet=True, export=False,
                         output_dir=str(out), max_steps=2, save_checkpoints=False, eval_batch_size=5000)  # fmt: skip
    cmd = [
        *launch_prefix(["--config_file", str(CONFIGS / "multi_cpu.yaml")]),
        str(script),
        json.dumps(config.to_dict()),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = (json.loads((out / f"rng_{rank}.json").read_text()) for rank in (0, 1))
    assert r0["weights"] == r1["weights"]  # built from the common seed, before DDP's broadcast
    for m0, m1, k0, k1 in zip(r0["masks"], r1["masks"], r0["known"], r1["known"], strict=True):
        # Where both inputs are non-zero, a zero output is a drop: the same RNG would drop alike.
        seen = [a != b for a, b, x, y in zip(m0, m1, k0, k1, strict=True) if x and y]
        assert len(seen) > 1000
        assert 0.1 < sum(seen) / len(seen) < 0.9  # masks drawn independently: about p(1-p)*2
