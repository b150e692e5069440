"""A transformers model (a small ViTForImageClassification from a ViTConfig, no download) trains,
resumes exactly and exports like a built-in one, and its export is a Hugging Face folder that
`AutoModelForImageClassification.from_pretrained` loads and `accel-mnist evaluate/predict` read."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from accel_mnist import TrainConfig, UsageError, load_model, train
from accel_mnist.cli import main
from accel_mnist.export.model_dir import export_from_checkpoint
from accel_mnist.run import checkpoint as ckpt
from tests.helpers import metrics_rows
from tests.your_model_data import save_hf, splits

# Its module-scoped runs are made once: under `pytest -n` (make test) the module stays on one worker.
pytestmark = pytest.mark.xdist_group("e2e/test_transformers_model.py")

transformers = pytest.importorskip("transformers")
NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def vit(num_labels=10):
    torch.manual_seed(0)
    config = transformers.ViTConfig(image_size=28, patch_size=7, num_channels=1, hidden_size=32, num_hidden_layers=1,
                                    num_attention_heads=2, intermediate_size=64, num_labels=num_labels)  # fmt: skip
    return transformers.ViTForImageClassification(config)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A 20-step run checkpointed at 10, and the same run resumed from that checkpoint."""
    root = tmp_path_factory.mktemp("vit")
    spec = save_hf(root / "data", splits(10, 640, 200), NAMES)
    common = dict(dataset=spec, max_steps=20, eval_every=10, checkpoint_every=10, batch_size=32, lr=3e-3, quiet=True,
                  plots=False)  # fmt: skip
    whole = train(TrainConfig(output_dir=str(root / "whole"), **common), model=vit())
    step_10 = root / "whole" / "checkpoints" / "step_10"
    # Resumed into a model of other weights: the checkpoint must bring back every one of them.
    other = vit()
    for param in other.parameters():
        param.data.normal_()
    resumed = train(TrainConfig(output_dir=str(root / "resumed"), resume_from=str(step_10), **common), model=other)
    return root, whole, resumed


def test_trains_and_resumes_exactly(runs):
    root, whole, resumed = runs
    assert whole["model"] == "ViTForImageClassification" and whole["steps"] == resumed["steps"] == 20
    assert whole["test_accuracy"] > 0.3  # chance is 0.1
    assert metrics_rows(root / "resumed") == metrics_rows(root / "whole")[1:]
    for key in ("train_loss", "test_loss", "test_accuracy", "confusion_matrix"):
        assert resumed[key] == whole[key], key
    a, b = load_model(root / "whole"), load_model(root / "resumed")
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key]), key


def test_the_export_is_a_hugging_face_folder(runs):
    root, _, _ = runs
    run = root / "whole"
    folder = run / "hf"  # the run's own config.json is the training config, so the folder is hf/
    assert sorted(os.listdir(folder)) == ["config.json", "model.safetensors", "model_config.json"]
    assert json.loads((run / "config.json").read_text())["max_steps"] == 20  # the training config, kept
    # One weights file for both: hf/ holds a hard link to the run's export.
    assert os.path.samefile(folder / "model.safetensors", run / "model.safetensors")
    hf = transformers.AutoModelForImageClassification.from_pretrained(folder).eval()
    assert type(hf).__name__ == "ViTForImageClassification"
    assert hf.config.id2label == dict(enumerate(NAMES))  # the data's class names
    ours = load_model(run)
    x = torch.randn(4, 1, 28, 28)
    with torch.no_grad():
        assert torch.equal(hf(x).logits, ours(x).logits)
        assert torch.equal(load_model(folder)(x).logits, ours(x).logits)


def test_evaluate_and_predict_read_the_export(runs, tmp_path, capsys):
    from PIL import Image

    root, whole, _ = runs
    for path in (root / "whole", root / "whole" / "hf"):
        assert main(["evaluate", "--model-path", str(path)]) == 0
        assert f"test_accuracy {whole['test_accuracy']:.4f}" in capsys.readouterr().out
    images, _ = splits(10, 3, 3)["test"]
    Image.fromarray(images[0]).save(tmp_path / "a.png")
    assert main(["predict", "--model-path", str(root / "whole" / "hf"), str(tmp_path / "a.png")]) == 0
    name, label, probability = capsys.readouterr().out.strip().split("\t")
    assert name == str(tmp_path / "a.png") and label in NAMES and 0 < float(probability) <= 1


def test_export_from_a_checkpoint_is_a_hugging_face_folder_too(runs, tmp_path):
    root, _, _ = runs
    last = ckpt.list_checkpoints(root / "whole")[-1]
    out = export_from_checkpoint(last, tmp_path / "export")
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors", "model_config.json"]
    hf = transformers.AutoModelForImageClassification.from_pretrained(out)
    ours = load_model(root / "whole")
    for key, value in ours.state_dict().items():
        assert torch.equal(hf.state_dict()[key], value), key
    # Into a run directory (a copy): hf/ is replaced whole, and the training config stays.
    run = shutil.copytree(root / "whole", tmp_path / "run", copy_function=shutil.copy)
    export_from_checkpoint(ckpt.list_checkpoints(run)[0], run)
    assert json.loads((run / "config.json").read_text())["max_steps"] == 20
    assert json.loads((run / "hf" / "model_config.json").read_text())["step"] == 10
    assert os.path.samefile(run / "hf" / "model.safetensors", run / "model.safetensors")
    assert sorted(os.listdir(run / "hf")) == ["config.json", "model.safetensors", "model_config.json"]


def test_a_transformers_model_of_another_width_is_refused_naming_num_labels(tmp_path):
    spec = save_hf(tmp_path / "data", splits(26, 100, 30))
    with pytest.raises(UsageError) as e:
        train(TrainConfig(dataset=spec, max_steps=2, quiet=True, output_dir=str(tmp_path / "run")), model=vit(10))
    assert "\n" not in str(e.value) and "num_labels=26" in str(e.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "edit, needles",
    [
        (lambda c: c.update(architectures=["os.system"]), ["'os.system'", "never run"]),
        (lambda c: c.update(architectures=["AutoConfig"]), ["'AutoConfig'", "not a model class"]),
        (lambda c: c.update(model_type="no-such-model"), ["'no-such-model'"]),
    ],
)
def test_loading_runs_no_code_the_folder_names(runs, tmp_path, edit, needles):
    root, _, _ = runs
    folder = tmp_path / "hf"
    shutil.copytree(root / "whole" / "hf", folder)
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UsageError) as e:
        load_model(folder)
    for needle in needles:
        assert needle in str(e.value) and "\n" not in str(e.value)


def test_model_config_names_only_its_own_places_for_the_hf_config(runs, tmp_path):
    root, _, _ = runs
    folder = tmp_path / "hf"
    shutil.copytree(root / "whole" / "hf", folder)
    config = json.loads((folder / "model_config.json").read_text())
    config["transformers_config"] = "../../elsewhere/config.json"
    (folder / "model_config.json").write_text(json.dumps(config))
    with pytest.raises(UsageError) as e:
        load_model(folder)
    assert "'transformers_config' must be one of config.json, hf/config.json" in str(e.value)
