"""Exported models of a run: train()'s own export and its checkpoint's, bit exact, and a run
without DeepSpeed that never imports it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from accel_mnist import TrainConfig, train
from accel_mnist.data.catalog import load_split
from accel_mnist.errors import UsageError
from accel_mnist.run import checkpoint as ckpt

from accel_mnist.export.model_dir import (  # isort: skip (one line of names, kept by fmt: skip)
    CONFIG_FILE, WEIGHTS_FILE, _sha256, export_from_checkpoint, full_state_dict, load_model, save_exported,
)  # fmt: skip
from accel_mnist.distributed.accelerator import build_accelerator
from accel_mnist.models import build_model
from tests.helpers import assert_one_line, assert_same_weights, synthetic_counts

# Its module-scoped runs are made once: under `pytest -n` (make test) the module stays on one worker.
pytestmark = pytest.mark.xdist_group("e2e/test_export.py")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, synthetic_mnist_files):
    """A linear model after 30 steps of `train` on the synthetic MNIST files, which also
    checkpointed and exported it."""
    out = tmp_path_factory.mktemp("run")
    model = build_model("linear")  # passed in, so that the trained module stays in hand
    config = TrainConfig(model="linear", data_dir=str(synthetic_mnist_files), download=False, max_steps=30,
                         quiet=True, output_dir=str(out))  # fmt: skip
    with synthetic_counts():
        results = train(config, model=model)
    return model, out, results


@pytest.fixture(scope="module")
def test_images(synthetic_mnist_files):
    with synthetic_counts():
        images, labels = load_split("mnist", synthetic_mnist_files, train=False, download=False)
    return ((images[:500].float() / 255 - 0.1307) / 0.3081).unsqueeze(1), labels[:500]


def test_live_export_round_trip_is_bit_exact(trained, test_images, tmp_path):
    model, _, _ = trained
    accelerator = build_accelerator(TrainConfig())
    prepared = accelerator.prepare(model)
    weights = full_state_dict(accelerator, prepared)
    assert weights.keys() == model.state_dict().keys()  # the user's keys, no wrapper prefix
    for key, value in model.state_dict().items():
        assert weights[key].device.type == "cpu" and torch.equal(weights[key], value)
        assert weights[key].data_ptr() != value.data_ptr()  # a snapshot, not the live tensor

    out = save_exported(weights, tmp_path / "export", model_name="linear", dataset="mnist", extra={"step": 30})
    config = json.loads((out / CONFIG_FILE).read_text())
    assert config == {
        "model": "linear", "dataset": "mnist", "num_classes": 10, "input_shape": [1, 28, 28],
        "mean": 0.1307, "std": 0.3081, "format_version": 1, "step": 30,
        "weights_sha256": _sha256(out / WEIGHTS_FILE),
    }  # fmt: skip
    loaded = load_model(out)
    assert not loaded.training and next(loaded.parameters()).device.type == "cpu"
    assert_same_weights(loaded.state_dict(), weights)
    x, _ = test_images
    with torch.no_grad():
        assert torch.equal(loaded(x), model.eval()(x))


def test_train_exports_and_its_checkpoint_exports_the_same(trained, tmp_path):
    model, out, _ = trained
    want = {k: v.float() for k, v in model.state_dict().items()}
    # train() exports at the end; a model passed in is recorded under its class name.
    assert json.loads((out / CONFIG_FILE).read_text())["model"] == "Linear"
    with pytest.raises(UsageError) as e:
        load_model(out)
    assert_one_line(e, CONFIG_FILE, "'Linear'", "model=")
    assert_same_weights(load_model(out, model=build_model("linear")).state_dict(), want)

    last = ckpt.list_checkpoints(out)[-1]
    exported = export_from_checkpoint(last, tmp_path / "from_checkpoint")
    config = json.loads((exported / CONFIG_FILE).read_text())
    # The checkpoint knows the model was the caller's own, as train()'s export does.
    assert config["model"] == "Linear" and config["dataset"] == "mnist" and config["step"] == 30
    assert_same_weights(load_model(exported, model=build_model("linear")).state_dict(), want)


def test_a_run_without_deepspeed_does_not_import_it(mnist_dir, tmp_path):
    """accelerate's unwrap_model imports deepspeed (about 1 s) wherever it is installed; the
    export of a one-process run gets its module without it."""
    code = (
        "import sys; from accel_mnist import TrainConfig, train; "
        f"train(TrainConfig(model='linear', max_steps=2, data_dir={str(mnist_dir)!r}, output_dir={str(tmp_path)!r}, "
        "quiet=True, plots=False)); print('deepspeed' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split()[-1] == "False" and (tmp_path / "model.safetensors").is_file()
