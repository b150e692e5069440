"""DeepSpeed's own Adam (FusedAdam, compiled when first used) under ZeRO-2 on a GPU, with
TORCH_CUDA_ARCH_LIST unset: on an H200 DeepSpeed 0.19.8's op builder stopped at `9.0a`
("invalid literal for int() with base 10: '0a'") until the variable was set by hand."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import accelerate_launch, write_ds_config


@pytest.mark.gpu
def test_fused_adam_builds_and_trains_with_the_arch_list_unset(tmp_path, mnist_dir, monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME is None:
        pytest.skip("no CUDA toolkit (nvcc) to compile FusedAdam with")
    # No torch_adam: DeepSpeed builds and uses its FusedAdam. ZeRO-2 (test_ds_json.BASE).
    adam = {"type": "Adam", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}}
    yaml_file = write_ds_config(tmp_path, "adam_zero2", 1, optimizer=adam, bf16={"enabled": "auto"})
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    extensions = tmp_path / "torch_extensions"  # a build of its own, not one an earlier run cached
    launch = ["--config_file", str(yaml_file), "--mixed_precision", "bf16"]
    train = ["--model", "cnn", "--max-steps", "150", "--eval-every", "50", "--no-download", "--no-export",
             "--no-save-checkpoints"]  # fmt: skip
    proc, results = accelerate_launch(
        launch, train, tmp_path / "out", env={"TORCH_EXTENSIONS_DIR": str(extensions)}, timeout=1500
    )
    print(proc.stderr[-4000:])  # for the record: the note and DeepSpeed's build lines (pytest -s)
    assert proc.returncode == 0, proc.stderr[-4000:]
    capabilities = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    wanted = ";".join(f"{major}.{minor}" for major, minor in capabilities)
    assert proc.stderr.count(f"TORCH_CUDA_ARCH_LIST was unset: set to {wanted} ") == 1, proc.stderr[-4000:]
    assert any(extensions.glob("**/fused_adam*.so")), f"FusedAdam was not built in {extensions}"
    assert results["test_accuracy"] > 0.8  # a trained CNN; an untrained one scores about 0.1
