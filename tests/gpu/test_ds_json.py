"""The shipped DeepSpeed JSON with its own optimizer and scheduler sections, on one GPU."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers import CONFIGS, accelerate_launch, metrics_rows, warmup_decay_lr, write_ds_config


@pytest.mark.gpu
@pytest.mark.parametrize("torch_adam", [True, False])
def test_shipped_json_on_one_gpu(tmp_path, mnist_dir, torch_adam):
    """The shipped example on a GPU, bf16: WarmupDecayLR (100 warmup steps) over the run's 150 steps;
    torch_adam false uses DeepSpeed's FusedAdam (JIT-compiled on first use)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    ds = json.loads((CONFIGS / "deepspeed_optim_sched.json").read_text())
    ds["optimizer"]["params"]["torch_adam"] = torch_adam
    yaml_file = write_ds_config(tmp_path, "shipped", 1, **{k: ds[k] for k in ("optimizer", "scheduler", "bf16")})
    launch = ["--config_file", str(yaml_file), "--mixed_precision", "bf16"]
    train = ["--model", "cnn", "--max-steps", "150", "--eval-every", "50", "--no-download", "--no-export",
             "--no-save-checkpoints"]  # fmt: skip
    proc, results = accelerate_launch(launch, train, tmp_path / "out", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = metrics_rows(tmp_path / "out")
    assert [r["lr"] for r in got] == pytest.approx([warmup_decay_lr(s, 1e-3, 100, 150) for s in (50, 100, 150)])
    assert results["test_accuracy"] > 0.8  # a trained CNN; an untrained one scores about 0.1
