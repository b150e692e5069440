"""The helpers that exist once: the boolean parser, the normaliser, the JSON reader and atomic write."""

from __future__ import annotations

import json
import os

import pytest
import torch

from accel_mnist.config import coerce, parse_bool
from accel_mnist.data.device_loader import DeviceLoader
from accel_mnist.data.tensor_dataset import ImageTensorDataset, Normaliser
from accel_mnist.errors import UsageError, one_line
from accel_mnist.files import read_json_if_valid, read_json_object, write_json_atomic
from accel_mnist.launch.settings import env_flag


@pytest.mark.parametrize("text", ["1", "true", "True", " YES ", "y", "t", "on", "ON"])
def test_true_spellings(text):
    assert parse_bool(text) is True


@pytest.mark.parametrize("text", ["0", "false", "No", "n", "f", "off", " OFF"])
def test_false_spellings(text):
    assert parse_bool(text) is False


@pytest.mark.parametrize("text", ["", "2", "maybe", "tru", "none"])
def test_anything_else_is_not_a_boolean(text):
    assert parse_bool(text) is None


def test_flags_config_files_and_launcher_variables_read_booleans_alike(monkeypatch):
    for text in ("on", "yes", "1", "true"):
        monkeypatch.setenv("ACCELERATE_SOMETHING", text)
        assert coerce("--quiet", text, bool) is True
        assert env_flag("ACCELERATE_SOMETHING") is True
    monkeypatch.delenv("ACCELERATE_SOMETHING")
    assert env_flag("ACCELERATE_SOMETHING") is False
    with pytest.raises(UsageError):
        coerce("--quiet", "maybe", bool)


def test_training_the_device_loader_and_predict_share_one_normalisation():
    pixels = torch.randint(0, 256, (5, 28, 28), dtype=torch.uint8)
    labels = torch.arange(5)
    expected = (pixels.double() / 255 - 0.1307) / 0.3081
    normalise = Normaliser(0.1307, 0.3081)
    torch.testing.assert_close(normalise(pixels).double(), expected, rtol=0, atol=1e-6)
    dataset = ImageTensorDataset(pixels, labels, 0.1307, 0.3081)
    assert torch.equal(torch.stack([dataset[i][0] for i in range(5)]), normalise(pixels).unsqueeze(1))
    for once in (True, False):
        loader = DeviceLoader(
            pixels,
            labels,
            0.1307,
            0.3081,
            batch_size=5,
            shuffle=False,
            register_with_accelerate=False,
            normalise_once=once,
        )
        (batch, _), *_ = list(loader)
        assert torch.equal(batch, normalise(pixels).unsqueeze(1))


def test_bounded_json_reader(tmp_path):
    good = tmp_path / "good.json"
    write_json_atomic(good, {"a": 1})
    assert read_json_object(good) == {"a": 1}
    assert good.read_text() == json.dumps({"a": 1}, indent=2, sort_keys=True) + "\n"
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"x": "y" * 100}))
    with pytest.raises(UsageError, match="larger than 50 bytes"):
        read_json_object(big, max_bytes=50)
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(UsageError, match="expected a JSON object, got list"):
        read_json_object(tmp_path / "list.json")
    assert read_json_if_valid(tmp_path / "missing.json") is None
    assert read_json_if_valid(tmp_path / "list.json") is None
    assert read_json_if_valid(good) == {"a": 1}


def test_atomic_write_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "x.json"
    write_json_atomic(target, {"b": 2})
    write_json_atomic(target, {"b": 3})
    assert os.listdir(tmp_path) == ["x.json"]
    assert read_json_object(target) == {"b": 3}


def test_one_line_keeps_only_the_reason_of_torchs_unpickler():
    text = (
        "Weights only load failed.\nWeightsUnpickler error: Unsupported global: GLOBAL os.system\n\n"
        "Check the documentation of torch.load"
    )
    assert one_line(text) == "Unsupported global: GLOBAL os.system"
    assert one_line("a\n  b") == "a b"
    assert one_line(ValueError()) == "ValueError"
