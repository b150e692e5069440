"""Runs with `ema_decay` in one process (synthetic MNIST): evaluated, resumed and exported as the average."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from accel_mnist import TrainConfig, train
from accel_mnist.errors import UsageError
from accel_mnist.export.model_dir import export_from_checkpoint


def _config(data_dir, out, **more):
    return TrainConfig(model="lenet5", data_dir=str(data_dir), download=False, quiet=True, output_dir=str(out),
                       max_steps=30, checkpoint_every=10, eval_every=10, lr=0.01, scheduler="onecycle",
                       batch_size=32, ema_decay=0.8, plots=False, **more)  # fmt: skip


def _rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_resumed_run_continues_the_average_and_exports_it(synthetic_mnist, tmp_path):
    first = tmp_path / "first"
    results = train(_config(synthetic_mnist, first))
    step_20 = first / "checkpoints" / "step_20"
    resumed = tmp_path / "resumed"
    train(_config(synthetic_mnist, resumed, resume_from=str(step_20)))
    keys = ("step", "test_accuracy", "test_loss", "train_loss")
    assert [{k: r[k] for k in keys} for r in _rows(resumed)][-1] == [{k: r[k] for k in keys} for r in _rows(first)][-1]
    # The export is the average that the evaluations saw, not the parameters as trained; a checkpoint's
    # export is the same average.
    exported = load_file(first / "model.safetensors")
    trained = load_file(first / "checkpoints" / "step_30" / "model.safetensors")
    assert any(not torch.equal(exported[k], trained[k].float()) for k in exported)
    again = export_from_checkpoint(first / "checkpoints" / "step_30", tmp_path / "export")
    from_checkpoint = load_file(again / "model.safetensors")
    assert all(torch.equal(exported[k], from_checkpoint[k]) for k in exported)
    assert results["test_accuracy"] == _rows(first)[-1]["test_accuracy"]
    assert results["ema_decay"] == 0.8  # results.json says whose accuracy it is


def test_a_resume_that_adds_or_drops_the_average_is_refused(synthetic_mnist, tmp_path):
    first = tmp_path / "first"
    train(_config(synthetic_mnist, first, export=False))
    step_20 = first / "checkpoints" / "step_20"
    with pytest.raises(UsageError, match="ema_decay=0.8 but this run has ema_decay=None"):
        train(_config(synthetic_mnist, tmp_path / "other", resume_from=str(step_20)).replace(ema_decay=None))


class _Payload:
    def __reduce__(self):
        return (print, ("unpickled",))


def test_a_checkpoint_s_average_is_read_as_tensors_only(synthetic_mnist, tmp_path, capsys):
    import pickle
    import shutil

    first = tmp_path / "first"
    train(_config(synthetic_mnist, first, export=False).replace(max_steps=10))
    saved = first / "checkpoints" / "step_10"
    for name, content, message in (
        ("pickled", {"updates": 1, "average": {"0.weight": _Payload()}}, "objects other than tensors"),
        ("plain_pickle", pickle.dumps({"updates": 1, "average": {}}), "unreadable averaged weights"),
        ("garbage", b"not a torch file", "unreadable averaged weights"),
        ("missing", None, "holds no custom_checkpoint_0.pkl"),
    ):
        ckpt = tmp_path / name
        shutil.copytree(saved, ckpt)
        if content is None:
            (ckpt / "custom_checkpoint_0.pkl").unlink()
        elif isinstance(content, dict):
            torch.save(content, ckpt / "custom_checkpoint_0.pkl")
        else:
            (ckpt / "custom_checkpoint_0.pkl").write_bytes(content)
        with pytest.raises(UsageError, match=message):
            export_from_checkpoint(ckpt, tmp_path / f"export_{name}")
    resumed = _config(synthetic_mnist, tmp_path / "resumed", export=False).replace(
        resume_from=str(tmp_path / "pickled")
    )
    with pytest.raises(UsageError, match="custom_checkpoint_0.pkl"):
        train(resumed)  # every pickle of a checkpoint is checked before anything loads
    assert "unpickled" not in capsys.readouterr().out
