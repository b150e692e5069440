"""A DeepSpeed JSON with its own optimizer and scheduler sections (DeepSpeedExamples style).

DeepSpeed must build and step the JSON's optimizer and schedule (Accelerate's DummyOptim /
DummyScheduler), their "auto" values come from the training config, and checkpoint + resume
stays exact with them.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch

from accel_mnist import TrainConfig
from accel_mnist.errors import UsageError
from accel_mnist.optim import check_deepspeed_optim
from accel_mnist.run import checkpoint as ckpt
from tests.helpers import CONFIGS, MNIST_DIR, TIMING_KEYS, accelerate_launch

BASE = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "zero_optimization": {"stage": 2},
}
# torch_adam: DeepSpeed's FusedAdam would be JIT-compiled on first use (minutes on a CPU).
ADAM = {"type": "Adam", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto",
                                   "torch_adam": True}}  # fmt: skip
SGD = {"type": "SGD", "params": {"lr": 0.05, "momentum": "auto", "weight_decay": "auto"}}
DECAY = {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
         "warmup_num_steps": 8, "warmup_type": "linear", "total_num_steps": "auto"}}  # fmt: skip
TRAIN = ["--model", "mlp", "--max-steps", "24", "--eval-every", "6", "--no-download", "--no-export",
         "--no-save-checkpoints", "--data-loader", "device"]  # fmt: skip


def write_ds_config(tmp_path: Path, name: str, num_processes: int, **sections) -> Path:
    """A DeepSpeed JSON (BASE + sections) and a zero_file-style YAML pointing at it."""
    ds_json = tmp_path / f"{name}.json"
    ds_json.write_text(json.dumps({**BASE, **sections}))
    text = (CONFIGS / "zero_file.yaml").read_text()
    text = text.replace("accelerate_configs/deepspeed_config.json", str(ds_json))
    text = text.replace("num_processes: 2", f"num_processes: {num_processes}")
    yaml_file = tmp_path / f"{name}.yaml"
    yaml_file.write_text(text)
    return yaml_file


def rows(out: Path) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING_KEYS} for line in lines]


def warmup_decay_lr(step: int, peak: float, warmup: int, total: int) -> float:
    """DeepSpeed's WarmupDecayLR (linear warmup from 0) after `step` optimizer steps, written out
    independently: the engine has stepped it `step` times from iteration -1."""
    it = step - 1
    if it < warmup:
        return peak * it / warmup
    return peak * max(0.0, (total - it) / max(1, total - warmup))


# ----------------------------------------------------------------------------- no launch


def test_auto_values_are_filled_from_the_training_config():
    config = TrainConfig(lr=3e-3, weight_decay=0.01, momentum=0.8, optimizer="sgd", scheduler="cosine")
    ds = copy.deepcopy({**BASE, "optimizer": ADAM, "scheduler": DECAY})
    notes = check_deepspeed_optim(ds, config)
    assert ds["optimizer"]["params"] == {"lr": 3e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01,
                                         "torch_adam": True}  # fmt: skip
    sched = ds["scheduler"]["params"]
    assert (sched["warmup_min_lr"], sched["warmup_max_lr"], sched["warmup_num_steps"]) == (0.0, 3e-3, 8)
    assert sched["total_num_steps"] == "auto"  # the run's length is known only at prepare
    assert len(notes) == 1 and "optimizer Adam (training config: sgd)" in notes[0]
    assert "scheduler WarmupDecayLR (training config: cosine)" in notes[0]

    ds = copy.deepcopy({**BASE, "optimizer": SGD})
    notes = check_deepspeed_optim(ds, TrainConfig())
    assert ds["optimizer"]["params"]["momentum"] == 0.9 and ds["zero_allow_untested_optimizer"] is True
    assert "lr 0.05 (training config: 0.001)" in notes[0]
    # The same optimizer and lr as the training config: nothing to say.
    assert check_deepspeed_optim(copy.deepcopy({**BASE, "optimizer": ADAM}), TrainConfig()) == []


@pytest.mark.parametrize(
    "sections, match",
    [
        ({"optimizer": {"type": "Adamm", "params": {}}}, "optimizer type 'Adamm'"),
        ({"optimizer": {"type": "Adam", "params": {"amsgrad": "auto"}}}, r"optimizer.params.amsgrad is \"auto\""),
        ({"scheduler": {"type": "Warmup", "params": {}}}, "scheduler type 'Warmup'"),
        ({"scheduler": {"type": "OneCycle", "params": {"cycle_max_lr": "auto"}}}, "scheduler.params.cycle_max_lr"),
        ({"optimizer": {"params": {"lr": 0.1}}}, 'needs a "type"'),
    ],
)
def test_sections_deepspeed_would_reject_are_refused(sections, match):
    with pytest.raises(UsageError, match=match):
        check_deepspeed_optim({**BASE, **copy.deepcopy(sections)}, TrainConfig())


def test_shipped_example_json_is_complete():
    """accelerate_configs/deepspeed_optim_sched.json: every "auto" is one accel_mnist fills."""
    ds = json.loads((CONFIGS / "deepspeed_optim_sched.json").read_text())
    assert ds["optimizer"]["type"] == "Adam" and ds["scheduler"]["type"] == "WarmupDecayLR"
    check_deepspeed_optim(ds, TrainConfig())
    assert ds["optimizer"]["params"]["lr"] == 1e-3 and ds["scheduler"]["params"]["warmup_max_lr"] == 1e-3
    yaml_text = (CONFIGS / "zero_file_optim_sched.yaml").read_text()
    assert "deepspeed_config_file: accelerate_configs/deepspeed_optim_sched.json" in yaml_text


# ----------------------------------------------------------------------------- launches


@pytest.fixture
def data():
    if not (MNIST_DIR / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"real MNIST files not found at {MNIST_DIR}")


@pytest.mark.slow
def test_json_sgd_is_the_optimizer_that_trains(tmp_path, data):
    """The JSON's SGD (lr 0.05, momentum auto = 0.9) trains exactly like the training config's SGD."""
    json_yaml = write_ds_config(tmp_path, "sgd", 1, optimizer=SGD)
    proc, _ = accelerate_launch(["--config_file", str(json_yaml), "--mixed_precision", "no"], TRAIN, tmp_path / "a")
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Said once, on stderr: the JSON's optimizer and lr win over the config's (default adam, 1e-3).
    assert proc.stderr.count("DeepSpeed JSON's own settings win") == 1, proc.stderr[-3000:]
    plain = ["--config_file", str(CONFIGS / "zero2.yaml"), "--mixed_precision", "no", "--num_processes", "1"]
    proc, _ = accelerate_launch(plain, [*TRAIN, "--optimizer", "sgd", "--lr", "0.05"], tmp_path / "b")
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc, _ = accelerate_launch(plain, TRAIN, tmp_path / "adam")  # the config's default: Adam, 1e-3
    assert proc.returncode == 0, proc.stderr[-3000:]
    json_sgd, torch_sgd, adam = rows(tmp_path / "a"), rows(tmp_path / "b"), rows(tmp_path / "adam")
    assert [r["lr"] for r in json_sgd] == [0.05] * 4
    for a, b in zip(json_sgd, torch_sgd, strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-6)
        assert a["test_loss"] == pytest.approx(b["test_loss"], rel=1e-6)
    assert all(abs(a["test_loss"] - b["test_loss"]) > 1e-3 for a, b in zip(json_sgd, adam, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("num_processes", [1, 2])
def test_json_schedule_sets_the_lr(tmp_path, data, num_processes):
    yaml_file = write_ds_config(tmp_path, "decay", num_processes, optimizer=ADAM, scheduler=DECAY)
    launch = ["--config_file", str(yaml_file), "--mixed_precision", "no"]
    proc, results = accelerate_launch(launch, [*TRAIN, "--lr", "2e-3"], tmp_path / "out")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert results["num_processes"] == num_processes and results["zero_stage"] == 2
    got = rows(tmp_path / "out")
    assert [r["step"] for r in got] == [6, 12, 18, 24]
    # total_num_steps "auto" = the run's 24 optimizer steps; warmup_max_lr "auto" = --lr.
    want = [warmup_decay_lr(r["step"], 2e-3, 8, 24) for r in got]
    assert [r["lr"] for r in got] == pytest.approx(want, rel=1e-9)
    assert got[-1]["test_accuracy"] > 0.5


@pytest.mark.slow
def test_resume_with_json_optimizer_and_schedule_is_exact(tmp_path, data):
    """Two processes, the JSON's Adam + WarmupDecayLR: resuming from the step-12 checkpoint gives
    the metrics and weights of the run that never stopped."""
    yaml_file = write_ds_config(tmp_path, "decay", 2, optimizer=ADAM, scheduler=DECAY)
    launch = ["--config_file", str(yaml_file), "--mixed_precision", "no"]
    args = [a for a in TRAIN if a != "--no-save-checkpoints"] + ["--checkpoint-every", "12", "--keep-checkpoints", "3"]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    proc, _ = accelerate_launch(launch, args, whole)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [p.name for p in ckpt.list_checkpoints(whole)] == ["step_12", "step_24"]
    # The state a run killed right after its step-12 checkpoint leaves behind.
    shutil.copytree(whole, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_24")
    (resumed / "results.json").unlink()
    proc, _ = accelerate_launch(launch, [*args, "--resume-from", "latest"], resumed)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed from" in proc.stdout
    assert rows(resumed) == rows(whole)
    a, b = (_model_states(d / "checkpoints" / "step_24") for d in (whole, resumed))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _model_states(checkpoint: Path) -> dict[str, torch.Tensor]:
    files = sorted(checkpoint.glob("**/*model_states.pt"))
    assert files, f"no DeepSpeed model states in {checkpoint}"
    # A checkpoint this test just wrote; DeepSpeed stores its own objects beside the weights.
    return torch.load(files[0], map_location="cpu", weights_only=False)["module"]


@pytest.mark.gpu
@pytest.mark.parametrize("torch_adam", [True, False])
def test_shipped_json_on_one_gpu(tmp_path, data, torch_adam):
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
    got = rows(tmp_path / "out")
    assert [r["lr"] for r in got] == pytest.approx([warmup_decay_lr(s, 1e-3, 100, 150) for s in (50, 100, 150)])
    assert results["test_accuracy"] > 0.8  # a trained CNN; an untrained one scores about 0.1
