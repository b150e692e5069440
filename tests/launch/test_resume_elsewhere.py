"""Resume on another number of processes with the same global batch: ZeRO-1/2/3 through
DeepSpeed's universal checkpoints, DDP and one process directly; against the run that went on
uninterrupted from the same checkpoint.

Tolerance: fp32 gives equal weights up to the rounding of the gradient's mean: two processes
average two means of 32 samples where one takes the mean of 64 (measured: 7.5e-9 after 20
steps). linear has no dropout: with dropout each process draws its own masks, so runs on other
numbers of processes differ by design.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers import CONFIGS, command, metrics_rows, run

ARGS = ["--model", "linear", "--max-steps", "40", "--checkpoint-every", "20", "--eval-every", "20", "--export"]


def launch(strategy: str, processes: int) -> list[str] | None:
    if strategy == "ddp":
        return None if processes == 1 else ["--config_file", str(CONFIGS / "multi_cpu.yaml")]
    return ["--config_file", str(CONFIGS / f"{strategy}.yaml"), "--num_processes", str(processes),
            "--mixed_precision", "no"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("strategy, was, now", [("zero1", 2, 1), ("zero2", 2, 1), ("zero2", 1, 2), ("zero3", 2, 1),
                                                ("zero3", 1, 2), ("ddp", 1, 2)])  # fmt: skip
def test_resume_on_another_number_of_processes(strategy, was, now, tmp_path, mnist_dir):
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    proc = run(command(launch(strategy, was), whole, *ARGS, "--batch-size", str(64 // was)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # As if the run had stopped after its checkpoint of step 20.
    later, above = {"step_40", "results.json", "model.safetensors", "model_config.json"}, {whole, whole / "checkpoints"}
    shutil.copytree(whole, resumed, ignore=lambda top, names: [n for n in names if n in later and Path(top) in above])
    proc = run(command(launch(strategy, now), resumed, *ARGS, "--batch-size", str(64 // now), "--resume-from", "auto"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resumed from {resumed / 'checkpoints' / 'step_20'} at step 20" in proc.stdout
    assert not list((resumed / "checkpoints").glob(".universal_*"))  # the conversion is removed once loaded
    a, b = load_file(whole / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert a.keys() == b.keys()
    print(f"{strategy} {was} -> {now}: weights within {max((a[k] - b[k]).abs().max().item() for k in a):.2g}")
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-6)
    rows, ref = metrics_rows(resumed), metrics_rows(whole)
    assert [r["step"] for r in rows] == [r["step"] for r in ref] == [20, 40]
    assert rows[0] == ref[0]  # kept from the checkpoint's run
    assert rows[1]["test_loss"] == pytest.approx(ref[1]["test_loss"], rel=1e-5)
    assert rows[1]["train_loss"] == pytest.approx(ref[1]["train_loss"], rel=1e-5)
    assert ref[1]["test_loss"] < ref[0]["test_loss"] - 0.1  # the 20 resumed steps trained
