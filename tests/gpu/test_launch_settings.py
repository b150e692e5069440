"""fp8 on a GPU: converted layers are named, or the run is refused."""

from __future__ import annotations

import pytest

from tests.helpers import run_module


@pytest.mark.gpu
def test_fp8_reports_converted_layers_or_refuses(tmp_path, mnist_dir):
    """On a GPU with an fp8 backend: mlp's middle Linear (512->256) is converted and named; the
    linear model has no layer torchao converts (its only Linear is first and last) and is refused."""
    import torch
    from accelerate.utils import is_fp8_available

    if not torch.cuda.is_available() or not is_fp8_available():
        pytest.skip("needs a CUDA GPU and torchao, transformer_engine or msamp")
    env = {"ACCELERATE_MIXED_PRECISION": "fp8"}
    proc = run_module(env, tmp_path / "mlp", "--model", "mlp", "--max-steps", "20")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "fp8 (" in proc.stderr and "layers: net.3" in proc.stderr, proc.stderr[-3000:]
    proc = run_module(env, tmp_path / "linear", "--model", "linear")
    assert proc.returncode == 2 and "converts no layer" in proc.stderr.strip().splitlines()[-1], proc.stderr[-3000:]
    assert not (tmp_path / "linear").exists()  # refused before the output directory
