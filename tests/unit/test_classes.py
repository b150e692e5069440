"""Classes and shapes from the data, in the pieces that carry them: the built-in models sized to
the classes, ImageTensorDataset and the device path with (C, H, W) and float images, hf: splits'
class names, the confusion plot of many named classes, predict's pictures of the model's shape."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from accel_mnist import DataError
from accel_mnist.data.device_loader import DeviceLoader
from accel_mnist.data.tensor_dataset import ImageTensorDataset, pixel_mean_std
from accel_mnist.models import MODELS, build_model
from tests.helpers import assert_one_line
from tests.your_model_data import BALANCED, class_images


@pytest.mark.parametrize("name", list(MODELS))
def test_built_in_models_are_sized_to_the_classes(name):
    for n in (2, 26, 47):
        assert build_model(name, num_classes=n)(torch.zeros(3, 1, 28, 28)).shape == (3, n)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_device_batches_equal_the_datasets_items_for_colour_and_float_images(dtype):
    images = torch.from_numpy(class_images(37, 10, 0, shape=(3, 32, 32))[0])
    images = images if dtype == torch.uint8 else images.float() / 255
    labels = torch.arange(37) % 10
    mean, std = pixel_mean_std(images)
    dataset = ImageTensorDataset(images, labels, mean, std)
    assert dataset.input_shape == (3, 32, 32) and dataset.num_classes == 10
    before = images.clone()
    for once in (True, False):
        loader = DeviceLoader(images, labels, mean, std, batch_size=8, shuffle=False, register_with_accelerate=False,
                              normalise_once=once)  # fmt: skip
        x = torch.cat([batch for batch, _ in loader])
        assert x.shape == (37, 3, 32, 32)
        assert torch.equal(x, torch.stack([dataset[i][0] for i in range(37)]))  # bit for bit
    assert torch.equal(images, before)  # the caller's tensor is left alone, float or not


def test_float_pixels_are_taken_as_they_are():
    pixels = torch.tensor([[0.0, 0.5], [1.0, 0.25]])
    mean, std = pixel_mean_std(pixels)
    assert (mean, std) == (round(pixels.double().mean().item(), 4), round(pixels.double().std(correction=0).item(), 4))
    counts = torch.tensor([[0, 127], [255, 64]], dtype=torch.uint8)  # uint8: divided by 255 first
    assert pixel_mean_std(counts) == pixel_mean_std(counts.float() / 255)
    assert pixel_mean_std(torch.full((2, 2), 255, dtype=torch.uint8)) == (1.0, 1.0)  # no spread: std 1


def test_hf_splits_take_the_class_label_names_and_check_the_test_split():
    pytest.importorskip("datasets")
    from datasets import ClassLabel, Dataset, Features, Image

    from accel_mnist.data.hf import read_hf_splits
    from accel_mnist.data.tensor_dataset import build_datasets

    def hf_splits(train, test, where):
        return build_datasets(read_hf_splits(train, test, where))

    images, labels = class_images(20, 47, 0)

    def split(names, values=labels):
        features = Features({"image": Image(), "label": ClassLabel(names=names)})
        return Dataset.from_dict({"image": list(images), "label": values}, features=features)

    train, test = hf_splits(split(BALANCED), split(BALANCED), "hf:x")
    assert train.class_names == test.class_names == tuple(BALANCED) and train.num_classes == 47
    assert train.input_shape == (1, 28, 28)
    with pytest.raises(DataError) as e:
        hf_splits(split(BALANCED), split(BALANCED[:46] + ["other"]), "hf:x")
    assert_one_line(e, "hf:x", "name different classes")


def test_confusion_plot_of_many_named_classes(tmp_path):
    from accel_mnist.report import plot_confusion_matrix

    matrix = np.diag(np.arange(1, 48))
    out = plot_confusion_matrix(matrix.tolist(), BALANCED, tmp_path / "c.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32), (1, 20, 24)])
def test_predicts_pictures_in_the_models_shape(tmp_path, shape):
    from PIL import Image

    from accel_mnist.export.predict import _image_tensor

    picture = Image.fromarray(np.random.default_rng(0).integers(0, 255, (50, 70, 3), dtype=np.uint8))
    assert tuple(_image_tensor(picture, 0.5, 0.25, shape).shape) == shape
