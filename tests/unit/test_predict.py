"""Using an exported model: predictions for image and IDX files, and the files refused."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
import torch
from PIL import Image, ImageFile

from accel_mnist.data.catalog import load_split
from accel_mnist.errors import UsageError
from accel_mnist.export.model_dir import load_model, save_exported
from accel_mnist.export.predict import predict_files
from accel_mnist.models import build_model
from tests.helpers import assert_one_line, digit_picture, synthetic_counts

# Its module-scoped runs are made once: under `pytest -n` (make test) the module stays on one worker.
pytestmark = pytest.mark.xdist_group("unit/test_predict.py")

MEAN, STD = 0.1307, 0.3081


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """An exported linear model, untrained: these tests are about reading the files, and compare
    predictions only with each other."""
    torch.manual_seed(0)
    weights = {k: v.clone() for k, v in build_model("linear").state_dict().items()}
    root = tmp_path_factory.mktemp("predict")
    return load_model(save_exported(weights, root / "export", model_name="linear", dataset="mnist"))


@pytest.fixture(scope="module")
def digits(synthetic_mnist_files):
    """Images and labels of the synthetic MNIST files (their training split: 1234 images are wanted)."""
    with synthetic_counts():
        return load_split("mnist", synthetic_mnist_files, train=True, download=False)


def direct_predictions(model, images):
    with torch.no_grad():
        return model(((images.float() / 255 - MEAN) / STD).unsqueeze(1)).softmax(1).max(1)


def test_sixteen_bit_picture(model, digits, tmp_path):
    """Scaled to 8 bits, not clipped (Pillow's own conversion would clip: all but black turns white)."""
    picture = Image.fromarray(255 - digits[0][0].numpy())
    picture.save(tmp_path / "8.png")
    Image.fromarray(np.asarray(picture).astype(np.uint16) * 257).save(tmp_path / "16.png")
    assert Image.open(tmp_path / "16.png").mode == "I;16"
    eight, sixteen = predict_files(model, [tmp_path / "8.png", tmp_path / "16.png"], MEAN, STD)
    assert sixteen[1:] == pytest.approx(eight[1:], abs=1e-6)


@pytest.mark.parametrize("gz", [False, True])
def test_idx_file(model, digits, tmp_path, write_idx, gz):
    images, _ = digits
    path = write_idx(tmp_path / "some-images-idx3-ubyte", images[:1234].numpy(), gz=gz)
    results = predict_files(model, [path], MEAN, STD)
    best, digits = direct_predictions(model, images[:1234])
    assert [r[0] for r in results] == [f"{path}[{i}]" for i in range(1234)]
    assert [r[1] for r in results] == digits.tolist()
    assert [r[2] for r in results] == pytest.approx(best.tolist(), abs=1e-6)


def test_images_and_idx_together_keep_the_order(model, digits, tmp_path, write_idx):
    images, _ = digits
    digit_picture(images[0]).save(tmp_path / "a.png")
    idx = write_idx(tmp_path / "b-idx3-ubyte", images[1:3].numpy())
    names = [r[0] for r in predict_files(model, [tmp_path / "a.png", idx, tmp_path / "a.png"], MEAN, STD)]
    assert names == [str(tmp_path / "a.png"), f"{idx}[0]", f"{idx}[1]", str(tmp_path / "a.png")]


def png_header(width: int, height: int) -> bytes:
    """A small PNG file whose header claims width x height pixels."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit grayscale
    idat = zlib.compress(b"\x00" * 4096)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


@pytest.mark.parametrize("width, height", [(50000, 50000), (10000, 10000), (5000, 4000)])
def test_oversized_image_is_refused_before_decoding(model, tmp_path, monkeypatch, width, height):
    # Beyond 2x PIL's limit it raises, beyond 1x it warns, and beyond ours (4096^2) we refuse.
    def no_decoding(self):
        raise AssertionError("the image was decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", no_decoding)
    path = tmp_path / "bomb.png"
    path.write_bytes(png_header(width, height))
    assert path.stat().st_size < 200
    with pytest.raises(UsageError) as e:
        predict_files(model, [path], MEAN, STD)
    assert_one_line(e, path, "too large" if width * height > Image.MAX_IMAGE_PIXELS else "over the limit")


@pytest.mark.parametrize(
    "content, needles",
    [
        (b"just some text\n", ["not an image", "IDX"]),
        (b"", ["not an image"]),
        (b"\x00\x00\x08\x03\x00\x00\x00\x05", ["truncated"]),  # an IDX header and too little data
        (b"\x1f\x8bnot gzip", ["gzip"]),
        (None, ["no such file"]),
    ],
    ids=["text", "empty", "truncated-idx", "bad-gzip", "missing"],
)
def test_unusable_files(model, tmp_path, content, needles):
    path = tmp_path / "input.png"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(UsageError) as e:
        predict_files(model, [path], MEAN, STD)
    assert_one_line(e, path, *needles)


def test_idx_labels_are_not_images(model, tmp_path, write_idx):
    path = write_idx(tmp_path / "labels-idx1-ubyte", np.arange(10, dtype=np.uint8))
    with pytest.raises(UsageError) as e:
        predict_files(model, [path], MEAN, STD)
    assert_one_line(e, path, "(N, 28, 28)")


def test_truncated_image(model, digits, tmp_path):
    path = tmp_path / "cut.png"
    digit_picture(digits[0][0]).save(path)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(UsageError) as e:
        predict_files(model, [path], MEAN, STD)
    assert_one_line(e, path, "cannot decode")
