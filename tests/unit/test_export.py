"""Exported models: atomic saving, safe loading, and export from the checkpoints Accelerate writes."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

from accel_mnist import TrainConfig
from accel_mnist.errors import UsageError

from accel_mnist.export.model_dir import (  # isort: skip (one line of names, kept by fmt: skip)
    CONFIG_FILE, WEIGHTS_FILE, _sha256, export_from_checkpoint, full_state_dict, load_model, save_exported,
)  # fmt: skip
from accel_mnist.distributed.accelerator import build_accelerator
from accel_mnist.models import build_model
from tests.helpers import Planted, assert_one_line, assert_same_weights


def test_export_from_checkpoint_written_by_save_state(tmp_path):
    torch.manual_seed(0)
    accelerator = build_accelerator(TrainConfig())
    model = build_model("mlp")
    model, _ = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    accelerator.save_state(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "model.safetensors").is_file()  # accelerate 1.15's name
    config = TrainConfig(model="mlp", dataset="fashion_mnist").to_dict()
    (tmp_path / "ckpt" / "trainer_state.json").write_text(json.dumps({"config": config, "step": 7}))
    out = export_from_checkpoint(tmp_path / "ckpt", tmp_path / "export")
    exported = json.loads((out / CONFIG_FILE).read_text())
    assert (exported["model"], exported["mean"], exported["std"], exported["step"]) == ("mlp", 0.286, 0.353, 7)
    assert_same_weights(load_model(out).state_dict(), full_state_dict(accelerator, model))


@pytest.fixture
def checkpoint(tmp_path):
    """A complete non-DeepSpeed checkpoint of a linear model."""
    accelerator = build_accelerator(TrainConfig())
    accelerator.prepare(build_model("linear"))
    accelerator.save_state(tmp_path / "ckpt")
    state = {"config": TrainConfig(model="linear").to_dict(), "step": 1}
    (tmp_path / "ckpt" / "trainer_state.json").write_text(json.dumps(state))
    return tmp_path / "ckpt"


@pytest.mark.parametrize(
    "damage, needles",
    [
        (lambda c: shutil.rmtree(c), ["no such checkpoint directory"]),
        (lambda c: (c / "trainer_state.json").unlink(), ["trainer_state.json", "missing"]),
        (lambda c: (c / "trainer_state.json").write_text("{"), ["trainer_state.json", "not valid JSON"]),
        (lambda c: (c / "trainer_state.json").write_text('{"step": 1}'), ["trainer_state.json", "config"]),
        (lambda c: (c / "model.safetensors").unlink(), ["incomplete checkpoint", "model.safetensors"]),
        (lambda c: (c / "model.safetensors").write_bytes(b"\x00" * 64), ["model.safetensors", "safetensors"]),
        (lambda c: (c / "pytorch_model").mkdir(), ["pytorch_model", "_model_states.pt"]),
    ],
    ids=["no-dir", "no-state", "bad-json", "no-config", "no-weights", "garbage-weights", "empty-deepspeed-dir"],
)
def test_export_from_checkpoint_errors(checkpoint, tmp_path, damage, needles):
    damage(checkpoint)
    with pytest.raises(UsageError) as e:
        export_from_checkpoint(checkpoint, tmp_path / "export")
    assert_one_line(e, *needles)
    assert not (tmp_path / "export").exists()


def test_export_from_checkpoint_checks_the_model_name_against_the_weights(checkpoint, tmp_path):
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    state["config"]["model"] = "cnn"
    (checkpoint / "trainer_state.json").write_text(json.dumps(state))
    with pytest.raises(UsageError) as e:
        export_from_checkpoint(checkpoint, tmp_path / "export")
    assert_one_line(e, "'cnn'", "fc.weight")
    # A user-defined model is recorded by its class name at the top level; weights still export.
    state["model"] = "MyNet"
    (checkpoint / "trainer_state.json").write_text(json.dumps(state))
    out = export_from_checkpoint(checkpoint, tmp_path / "export")
    assert json.loads((out / CONFIG_FILE).read_text())["model"] == "MyNet"
    assert load_model(out, model=build_model("linear"))


def linear_weights():
    return {k: v.clone() for k, v in build_model("linear").state_dict().items()}


def test_save_exported_constants_for_hf_datasets(tmp_path):
    out = save_exported(linear_weights(), tmp_path / "a", model_name="linear", dataset="hf:ylecun/mnist")
    config = json.loads((out / CONFIG_FILE).read_text())
    assert (config["mean"], config["std"]) == (0.1307, 0.3081)
    extra = {"mean": 0.5, "std": 0.25}
    out = save_exported(linear_weights(), tmp_path / "b", model_name="linear", dataset="hf:x", extra=extra)
    config = json.loads((out / CONFIG_FILE).read_text())
    assert (config["mean"], config["std"]) == (0.5, 0.25)
    with pytest.raises(UsageError) as e:
        save_exported(linear_weights(), tmp_path / "c", model_name="linear", dataset="cifar")
    assert_one_line(e, "cifar")


@pytest.mark.parametrize("existing", [False, True], ids=["new", "over-an-export"])
def test_save_exported_is_atomic(tmp_path, monkeypatch, existing):
    """A crash while the files are written leaves no export, or the old one whole, and no temporary directory."""
    from accel_mnist.export import model_dir

    old = linear_weights()
    if existing:
        save_exported(old, tmp_path / "export", model_name="linear", dataset="mnist")

    def crash(path):
        if path.name == CONFIG_FILE:  # the weights are written by then
            raise RuntimeError("disk on fire")

    monkeypatch.setattr(model_dir, "fsync_file", crash)
    with pytest.raises(RuntimeError, match="disk on fire"):
        save_exported(linear_weights(), tmp_path / "export", model_name="linear", dataset="mnist")
    assert [p.name for p in tmp_path.iterdir()] == (["export"] if existing else [])
    if existing:
        assert_same_weights(load_model(tmp_path / "export").state_dict(), old)


HF_CONFIG = {"model_type": "vit", "architectures": ["ViTForImageClassification"]}


def test_a_transformers_export_is_a_hugging_face_folder_too(tmp_path):
    out = save_exported(linear_weights(), tmp_path / "export", model_name="linear", dataset="mnist",
                        transformers_config=HF_CONFIG)  # fmt: skip
    assert sorted(os.listdir(out)) == ["config.json", WEIGHTS_FILE, CONFIG_FILE]
    assert json.loads((out / "config.json").read_text()) == HF_CONFIG
    assert json.loads((out / CONFIG_FILE).read_text())["transformers_config"] == "config.json"


@pytest.mark.parametrize("hard_links", [True, False], ids=["hard-link", "copy"])
def test_beside_a_training_config_the_hugging_face_folder_is_hf(tmp_path, monkeypatch, hard_links):
    def no_link(*args):
        raise OSError(1, "Operation not permitted")

    if not hard_links:
        monkeypatch.setattr(os, "link", no_link)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"max_steps": 20}')
    for _ in range(2):  # the second replaces the first's hf/ whole
        save_exported(linear_weights(), run, model_name="linear", dataset="mnist", transformers_config=HF_CONFIG)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert sorted(os.listdir(run)) == ["config.json", "hf", WEIGHTS_FILE, CONFIG_FILE]
    assert json.loads((run / "config.json").read_text()) == {"max_steps": 20}  # the training config, kept
    config = json.loads((run / CONFIG_FILE).read_text())
    assert config["transformers_config"] == "hf/config.json"
    hf = run / "hf"
    assert sorted(os.listdir(hf)) == ["config.json", WEIGHTS_FILE, CONFIG_FILE]
    assert json.loads((hf / "config.json").read_text()) == HF_CONFIG
    assert json.loads((hf / CONFIG_FILE).read_text()) == {**config, "transformers_config": "config.json"}
    assert os.path.samefile(hf / WEIGHTS_FILE, run / WEIGHTS_FILE) is hard_links
    assert (hf / WEIGHTS_FILE).read_bytes() == (run / WEIGHTS_FILE).read_bytes()
    assert_same_weights(load_model(hf, model=build_model("linear")).state_dict(), load_model(run).state_dict())


def test_save_exported_into_a_used_directory_replaces_only_its_files(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.json").write_text("{}")
    first, second = linear_weights(), linear_weights()
    save_exported(first, out, model_name="linear", dataset="mnist")
    save_exported(second, out, model_name="linear", dataset="mnist")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert sorted(p.name for p in out.iterdir()) == [WEIGHTS_FILE, CONFIG_FILE, "results.json"]
    assert_same_weights(load_model(out).state_dict(), second)


def test_load_model_refuses_weights_from_another_export(tmp_path):
    """What a crash between replacing the two files of an existing export would leave."""
    a = save_exported(linear_weights(), tmp_path / "a", model_name="linear", dataset="mnist")
    b = save_exported(linear_weights(), tmp_path / "b", model_name="linear", dataset="mnist")
    shutil.copy(b / WEIGHTS_FILE, a / WEIGHTS_FILE)
    with pytest.raises(UsageError) as e:
        load_model(a)
    assert_one_line(e, WEIGHTS_FILE, "sha256")


def _set_weights_file(export: Path, data: bytes) -> None:
    # Re-vouch for the planted file, so that it reaches the safetensors parser.
    (export / WEIGHTS_FILE).write_bytes(data)
    config = json.loads((export / CONFIG_FILE).read_text())
    config["weights_sha256"] = _sha256(export / WEIGHTS_FILE)
    (export / CONFIG_FILE).write_text(json.dumps(config))


def _edit_config(export: Path, **changes) -> None:
    config = json.loads((export / CONFIG_FILE).read_text())
    config.update(changes)
    (export / CONFIG_FILE).write_text(json.dumps(config))


@pytest.mark.parametrize(
    "damage, needles",
    [
        (lambda e: shutil.rmtree(e), ["no such exported model directory"]),
        (lambda e: (e / CONFIG_FILE).unlink(), [CONFIG_FILE, "missing"]),
        (lambda e: (e / CONFIG_FILE).write_text("{not json"), [CONFIG_FILE, "not valid JSON"]),
        (lambda e: (e / CONFIG_FILE).write_text("[1, 2]"), [CONFIG_FILE, "JSON object"]),
        (lambda e: _edit_config(e, format_version=2), [CONFIG_FILE, "format_version"]),
        (lambda e: _edit_config(e, model="resnet"), [CONFIG_FILE, "'resnet'", "registry"]),
        (lambda e: _edit_config(e, model="mlp"), [WEIGHTS_FILE, "'mlp'", "net.0.weight"]),
        (lambda e: (e / WEIGHTS_FILE).unlink(), [WEIGHTS_FILE, "missing"]),
        (lambda e: _set_weights_file(e, os.urandom(256)), [WEIGHTS_FILE, "not a valid safetensors"]),
        (lambda e: _set_weights_file(e, b""), [WEIGHTS_FILE, "not a valid safetensors"]),
    ],
    ids=["no-dir", "no-config", "bad-json", "not-object", "version", "unknown-model", "wrong-model",
         "no-weights", "garbage", "empty"],
)  # fmt: skip
def test_load_model_errors(tmp_path, damage, needles):
    export = save_exported(linear_weights(), tmp_path / "export", model_name="linear", dataset="mnist")
    damage(export)
    with pytest.raises(UsageError) as e:
        load_model(export)
    assert_one_line(e, *needles)


@pytest.mark.parametrize("save", [pickle.dumps, lambda obj: _torch_save_bytes(obj)], ids=["pickle", "torch.save"])
def test_load_model_never_unpickles(tmp_path, save):
    export = save_exported(linear_weights(), tmp_path / "export", model_name="linear", dataset="mnist")
    marker = tmp_path / "executed"
    _set_weights_file(export, save({"fc.weight": Planted(marker)}))
    with pytest.raises(UsageError) as e:
        load_model(export)
    assert_one_line(e, WEIGHTS_FILE, "not a valid safetensors")
    assert not marker.exists()


def _torch_save_bytes(obj) -> bytes:
    import io

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


class TiedNet(nn.Module):
    """Tied weights and a buffer: the keys of state_dict() that an export must keep."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.b.weight = self.a.weight
        self.register_buffer("count", torch.tensor(3))
        self.register_buffer("scratch", torch.zeros(2), persistent=False)


def test_tied_weights_and_buffers(tmp_path):
    accelerator = build_accelerator(TrainConfig())
    weights = full_state_dict(accelerator, accelerator.prepare(TiedNet()))
    assert weights.keys() == TiedNet().state_dict().keys() and weights["count"].dtype == torch.int64
    out = save_exported(weights, tmp_path / "tied", model_name="TiedNet", dataset="mnist")
    loaded = load_model(out, model=TiedNet())
    assert loaded.b.weight is loaded.a.weight and torch.equal(loaded.a.weight, weights["a.weight"])


@pytest.mark.parametrize(
    "content, message",
    [(b" " * (1 << 20) + b"{}", "larger than 1048576 bytes"), (b"{", "not valid JSON"),
     (b"\xff\xfe", "not valid JSON"), (b"[1]", "expected a JSON object, got list")],
)  # fmt: skip
def test_json_from_others_is_bounded_and_checked(tmp_path, content, message):
    from accel_mnist.errors import UsageError
    from accel_mnist.files import read_json_object

    (tmp_path / "config.json").write_bytes(content)
    with pytest.raises(UsageError, match=f"^x: {message}"):
        read_json_object(tmp_path / "config.json", "x")
