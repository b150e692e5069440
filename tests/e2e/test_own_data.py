"""Your own datasets in `train()`: a map-style torch Dataset or a datasets.Dataset trains exactly
as the same data through an `hf:` folder, on the device path and the torch path; mean/std from
the data unless given; other image shapes for models that take them; bad items in one line."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from torch import nn

from accel_mnist import DataError, TrainConfig, UsageError, train
from accel_mnist.data.tensor_dataset import pixel_mean_std
from tests.helpers import assert_one_line, metrics_rows
from tests.your_model_data import FloatImages, PairDataset, save_hf, splits

# Its module-scoped runs are made once: under `pytest -n` (make test) the module stays on one worker.
pytestmark = pytest.mark.xdist_group("e2e/test_own_data.py")

pytest.importorskip("datasets")


def config(tmp_path, name, **changes):
    base = dict(model="linear", max_steps=16, eval_every=8, batch_size=32, eval_batch_size=100, quiet=True,
                plots=False, output_dir=str(tmp_path / name))  # fmt: skip
    return TrainConfig(**{**base, **changes})


@pytest.fixture(scope="module")
def data():
    return splits(10, 700, 250)


@pytest.fixture(scope="module")
def hf_run(data, tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    results = train(config(root, "run", dataset=save_hf(root / "data", data)))
    return results, metrics_rows(root / "run")


class RandomDrawing(PairDataset):
    """Draws from the global RNG on every item, as a Dataset with random augmentations would."""

    def __getitem__(self, index):
        torch.rand(3)
        return super().__getitem__(index)


@pytest.mark.parametrize("loader", ["auto", "torch"])
def test_a_torch_dataset_trains_exactly_as_the_same_data_through_hf(data, hf_run, tmp_path, loader):
    hf_results, hf_rows = hf_run
    train_set, test_set = RandomDrawing(*data["train"]), PairDataset(*data["test"])
    results = train(config(tmp_path, "own", data_loader=loader), train_data=train_set, test_data=test_set)
    assert results["data_loader"] == ("device" if loader == "auto" else "torch")
    assert results["dataset"] == "own:RandomDrawing" and results["num_classes"] == 10
    assert metrics_rows(tmp_path / "own") == hf_rows
    for key in ("test_accuracy", "test_loss", "train_loss", "confusion_matrix"):
        assert results[key] == hf_results[key], key
    assert hf_results["test_accuracy"] > 0.6  # it learns (chance: 0.1)


def test_a_datasets_dataset_trains_as_its_hf_folder(data, hf_run, tmp_path):
    from datasets import Dataset, Features, Image, Value

    features = Features({"image": Image(), "label": Value("int64")})
    train_ds, test_ds = (Dataset.from_dict({"image": list(x), "label": y}, features=features)
                         for x, y in (data["train"], data["test"]))  # fmt: skip
    results = train(config(tmp_path, "own"), train_data=train_ds, test_data=test_ds)
    assert metrics_rows(tmp_path / "own") == hf_run[1] and results["dataset"] == "own:Dataset"


def test_mean_and_std_come_from_the_training_pixels_unless_given(data, tmp_path):
    train_set, test_set = PairDataset(*data["train"]), PairDataset(*data["test"])
    train(config(tmp_path, "own", max_steps=2), train_data=train_set, test_data=test_set)
    exported = json.loads((tmp_path / "own" / "model_config.json").read_text())
    assert (exported["mean"], exported["std"]) == pixel_mean_std(torch.from_numpy(data["train"][0]))
    train(config(tmp_path, "given", max_steps=2), train_data=train_set, test_data=test_set, mean=0.5, std=0.25)
    exported = json.loads((tmp_path / "given" / "model_config.json").read_text())
    assert (exported["mean"], exported["std"]) == (0.5, 0.25)
    with pytest.raises(UsageError) as e:
        train(config(tmp_path, "half"), train_data=train_set, test_data=test_set, mean=0.5)
    assert_one_line(e, "mean and std go together")
    with pytest.raises(UsageError) as e:
        train(config(tmp_path, "zero"), train_data=train_set, test_data=test_set, mean=0.5, std=0.0)
    assert_one_line(e, "std > 0", "std=0.0")


def test_classes_attribute_names_the_classes(data, tmp_path):
    names = [f"class {k}" for k in range(10)]
    train_set, test_set = PairDataset(*data["train"], classes=names), PairDataset(*data["test"])
    results = train(config(tmp_path, "own", max_steps=2), train_data=train_set, test_data=test_set)
    assert results["class_names"] == names
    assert json.loads((tmp_path / "own" / "model_config.json").read_text())["class_names"] == names


class ColourNet(nn.Module):
    """Takes 3x32x32 images and returns {"logits": ...}, as some models do."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=1)  # 16x16
        self.head = nn.Linear(8 * 16 * 16, num_classes)

    def forward(self, x):
        return {"logits": self.head(torch.relu(self.conv(x)).flatten(1))}


def test_colour_images_of_another_size_for_a_model_that_takes_them(tmp_path):
    data = splits(10, 500, 200, shape=(3, 32, 32))
    train_set, test_set = FloatImages(*data["train"]), FloatImages(*data["test"])
    results = {}
    for loader in ("auto", "torch"):
        torch.manual_seed(0)
        results[loader] = train(config(tmp_path, loader, data_loader=loader, lr=3e-3), model=ColourNet(),
                                train_data=train_set, test_data=test_set)  # fmt: skip
        assert results[loader]["input_shape"] == [3, 32, 32]
    assert results["auto"]["data_loader"] == "device" and results["torch"]["data_loader"] == "torch"
    assert metrics_rows(tmp_path / "auto") == metrics_rows(tmp_path / "torch")
    assert results["auto"]["test_accuracy"] > 0.5
    exported = json.loads((tmp_path / "auto" / "model_config.json").read_text())
    assert exported["input_shape"] == [3, 32, 32]
    # A built-in model takes 1x28x28 only, and says so before anything is written.
    with pytest.raises(UsageError) as e:
        train(config(tmp_path, "builtin", model="cnn"), train_data=train_set, test_data=test_set)
    assert_one_line(e, "'cnn' takes 1x28x28 images", "own:FloatImages has 3x32x32")
    assert not (tmp_path / "builtin").exists()


def test_exact_resume_on_the_torch_path(data, tmp_path):
    train_set, test_set = PairDataset(*data["train"]), PairDataset(*data["test"])
    common = dict(data_loader="torch", max_steps=30, eval_every=10, checkpoint_every=10, keep_checkpoints=5)
    whole = train(config(tmp_path, "whole", **common), train_data=train_set, test_data=test_set)
    (tmp_path / "resumed" / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "whole" / "checkpoints" / "step_10", tmp_path / "resumed" / "checkpoints" / "step_10")
    resumed = train(config(tmp_path, "resumed", resume_from="latest", **common), train_data=train_set,
                    test_data=test_set)  # fmt: skip
    assert metrics_rows(tmp_path / "resumed")[-2:] == metrics_rows(tmp_path / "whole")[-2:]
    assert resumed["test_loss"] == whole["test_loss"] and resumed["train_loss"] == whole["train_loss"]
    # Other data behind the same checkpoint is refused in one line.
    fewer = PairDataset(data["train"][0][:600], data["train"][1][:600])
    checkpoint = str(tmp_path / "whole" / "checkpoints" / "step_10")
    with pytest.raises(UsageError) as e:
        train(config(tmp_path, "other", resume_from=checkpoint, **common), train_data=fewer, test_data=test_set)
    assert_one_line(e, "train_samples=700", "600")


class Items(torch.utils.data.Dataset):
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        return self.items[index]


GOOD = (torch.zeros(28, 28, dtype=torch.uint8), 1)


@pytest.mark.parametrize(
    "items, needles",
    [
        ([GOOD, torch.zeros(28, 28)], ["train_data[1]", "expected an (image, label) pair"]),
        ([(torch.zeros(28, 28, 3), 1)], ["train_data[0]", "looks channel-last", "permute(2, 0, 1)"]),
        ([GOOD, (torch.zeros(27, 28, dtype=torch.uint8), 0)], ["train_data[1]", "(27, 28)", "(28, 28)"]),
        ([GOOD, (torch.zeros(28, 28), 0)], ["train_data[1]", "float image", "uint8"]),
        ([GOOD, (torch.zeros(28, 28, dtype=torch.uint8), 0.5)], ["train_data[1]", "label is 0.5"]),
        ([GOOD, (torch.full((28, 28), 300), 0)], ["train_data[1]", "pixel values 300..300"]),
        ([("a picture", 1)], ["train_data[0]", "the image is a str"]),
        ([], ["train_data is empty"]),
    ],
    ids=["not-a-pair", "channel-last", "other-shape", "other-kind", "float-label", "beyond-255", "str", "empty"],
)
def test_bad_items_are_one_line_naming_the_item(tmp_path, items, needles):
    with pytest.raises(DataError) as e:
        train(config(tmp_path, "run"), train_data=Items(items), test_data=Items([GOOD]))
    assert_one_line(e, *needles)
    assert not (tmp_path / "run").exists()


def test_what_is_not_a_pair_of_map_style_datasets_is_refused(tmp_path):
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield GOOD

    for kwargs, needles in [
        ({"train_data": Items([GOOD])}, ["train_data and test_data go together"]),
        ({"train_data": Stream(), "test_data": Items([GOOD])}, ["train_data: a Stream", "map-style"]),
        ({"train_data": [GOOD], "test_data": (item for item in [GOOD])}, ["test_data: a generator", "map-style"]),
        ({"train_data": _dataset_dict(), "test_data": Items([GOOD])}, ["a DatasetDict", "train_data=dd['train']"]),
    ]:
        with pytest.raises(UsageError) as e:
            train(config(tmp_path, "run"), **kwargs)
        assert_one_line(e, *needles)


def _dataset_dict():
    from datasets import Dataset, DatasetDict

    return DatasetDict(train=Dataset.from_dict({"x": [1]}))
