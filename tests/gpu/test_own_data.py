"""On a GPU: your own torch Dataset takes the device path (the whole split held on the GPU, batches
cut there) and trains exactly as the same data through an `hf:` folder, and as itself through
the torch DataLoader path; float 3x32x32 images too."""

from __future__ import annotations

import pytest
import torch

from accel_mnist import TrainConfig, train
from tests.helpers import metrics_rows
from tests.your_model_data import FloatImages, PairDataset, save_hf, splits


def config(tmp_path, name, **changes):
    base = dict(model="mlp", max_steps=40, eval_every=20, batch_size=64, eval_batch_size=300, quiet=True,
                plots=False, output_dir=str(tmp_path / name))  # fmt: skip
    return TrainConfig(**{**base, **changes})


def test_a_torch_dataset_on_the_gpu_device_path_matches_hf_and_the_torch_path(tmp_path):
    pytest.importorskip("datasets")
    data = splits(10, 3000, 1000)
    hf = train(config(tmp_path, "hf", dataset=save_hf(tmp_path / "data", data)))
    own = {}
    for loader in ("auto", "torch"):
        own[loader] = train(config(tmp_path, loader, data_loader=loader), train_data=PairDataset(*data["train"]),
                            test_data=PairDataset(*data["test"]))  # fmt: skip
    assert (hf["device"], hf["data_loader"], own["auto"]["data_loader"]) == ("cuda", "device", "device")
    assert own["torch"]["data_loader"] == "torch"
    # The same bytes in the same order: the same numbers (to cuBLAS's run-to-run rounding, which
    # PyTorch does not promise bit for bit; the print says whether they were equal).
    for name, run in (("torch path", own["torch"]), ("hf", hf)):
        for key in ("train_loss", "test_loss", "test_accuracy"):
            assert run[key] == pytest.approx(own["auto"][key], rel=1e-5), (name, key)
        gaps = {k: abs(run[k] - own["auto"][k]) for k in ("train_loss", "test_loss", "test_accuracy")}
        same = run["confusion_matrix"] == own["auto"]["confusion_matrix"]
        print(f"gpu own data, device path against {name}: gaps {gaps}, confusion matrices equal: {same}")
    assert [r["test_samples"] for r in metrics_rows(tmp_path / "auto")] == [1000, 1000]
    assert own["auto"]["test_accuracy"] > 0.9


def test_float_colour_images_on_the_gpu_device_path(tmp_path):
    data = splits(10, 3000, 1000, shape=(3, 32, 32))
    train_set, test_set = FloatImages(*data["train"]), FloatImages(*data["test"])
    results = {}
    for loader in ("auto", "torch"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.ReLU(),
                                    torch.nn.Flatten(), torch.nn.Linear(8 * 16 * 16, 10))  # fmt: skip
        results[loader] = train(config(tmp_path, loader, data_loader=loader), model=model, train_data=train_set,
                                test_data=test_set)  # fmt: skip
    assert results["auto"]["data_loader"] == "device" and results["auto"]["input_shape"] == [3, 32, 32]
    assert results["auto"]["test_accuracy"] > 0.9
    # cuDNN may pick other convolution algorithms between runs: close, not necessarily equal.
    for key in ("train_loss", "test_loss"):
        assert results["torch"][key] == pytest.approx(results["auto"][key], rel=1e-3), key
