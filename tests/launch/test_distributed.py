"""Two CPU processes: DDP and DeepSpeed ZeRO-1/2/3 through `accelerate launch`, and their parity
(FSDP 1 and 2 against DDP and ZeRO-3 on GPUs: tests/gpu/test_distributed.py).

With the same seed and data order, fp32, the strategies differ only in how they reduce and
shard, so after the same steps they must agree on loss and accuracy to float rounding."""

from __future__ import annotations

import json

import pytest

from tests.helpers import CONFIGS, PARITY_TRAIN_ARGS, TIMING_KEYS, accelerate_launch_cmd, real_mnist_present
from tests.shared_runs import OUT

# Its module-scoped runs are made once: under `pytest -n` (make test) the module stays on one worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("launch/test_distributed.py")]
STRATEGIES = {
    "ddp": ["--config_file", str(CONFIGS / "multi_cpu.yaml")],
    "ddp_torch_loader": ["--config_file", str(CONFIGS / "multi_cpu.yaml")],
    "zero1": ["--config_file", str(CONFIGS / "zero1.yaml"), "--mixed_precision", "no"],
    "zero2": ["--config_file", str(CONFIGS / "zero2.yaml"), "--mixed_precision", "no"],
    "zero3": ["--config_file", str(CONFIGS / "zero3.yaml"), "--mixed_precision", "no"],
}


@pytest.fixture(scope="module")
def runs(shared_run):
    """Each strategy's run, made once a session: test_other_launchers.py compares other launchers with
    the DDP and ZeRO-2 ones (tests/shared_runs.py)."""
    if not real_mnist_present():
        pytest.skip("real MNIST files not found at ../shared/data/mnist")
    out = {}
    for name, launch_args in STRATEGIES.items():
        extra = ["--data-loader", "torch"] if name.endswith("torch_loader") else ["--data-loader", "device"]
        run = shared_run(accelerate_launch_cmd(launch_args, PARITY_TRAIN_ARGS + extra, OUT))
        assert run.returncode == 0, f"{name} failed:\n{run.stderr[-4000:]}"
        rows = [json.loads(line) for line in (run.out / "metrics.jsonl").read_text().splitlines()]
        out[name] = (run.results, rows)
    return out


@pytest.mark.parametrize("name, stage", [("ddp", 0), ("zero1", 1), ("zero2", 2), ("zero3", 3)])
def test_each_strategy_runs_on_two_processes(runs, name, stage):
    results, rows = runs[name]
    assert results["num_processes"] == 2 and results["zero_stage"] == stage
    assert results["distributed_type"] == ("MULTI_CPU" if stage == 0 else "DEEPSPEED")
    assert results["steps"] == 30 and results["global_batch_size"] == 32 * 2 * 2
    # 10000 / (333 * 2) is not whole: even sharding pads, and gather_for_metrics drops the padding.
    assert [r["test_samples"] for r in rows] == [10000, 10000]
    assert results["test_accuracy"] > 0.7  # 0.76 measured; an untrained model scores about 0.1


@pytest.mark.parametrize("name", ["zero1", "zero2", "zero3"])
def test_zero_matches_ddp(runs, name):
    _, ddp_rows = runs["ddp"]
    _, rows = runs[name]
    for ddp_row, row in zip(ddp_rows, rows, strict=True):
        assert row["step"] == ddp_row["step"]
        assert row["lr"] == pytest.approx(ddp_row["lr"], rel=1e-6)
        for key in ("train_loss", "test_loss"):
            # Rounding differs (DDP's bucketed all-reduce vs DeepSpeed's reductions) and training
            # amplifies it: ZeRO-1/2/3 agree with each other to 1e-8, with DDP to 7e-5 here.
            assert row[key] == pytest.approx(ddp_row[key], rel=2e-4), key
        assert row["test_accuracy"] == pytest.approx(ddp_row["test_accuracy"], abs=1e-3)


def test_device_path_matches_the_torch_dataloader_on_two_processes(runs):
    # The device path shards exactly as Accelerate shards a DataLoader (even_batches, wrap-around).
    (device, device_rows), (torch_, torch_rows) = runs["ddp"], runs["ddp_torch_loader"]
    assert (device["data_loader"], torch_["data_loader"]) == ("device", "torch")
    drop = TIMING_KEYS
    assert [{k: v for k, v in r.items() if k not in drop} for r in device_rows] == [
        {k: v for k, v in r.items() if k not in drop} for r in torch_rows
    ]
