"""Using an exported model: predictions for image and IDX files, test-set evaluation, and the
`export`, `evaluate` and `predict` subcommands."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageFile

from accel_mnist import TrainConfig, train
from accel_mnist.data.catalog import load_split
from accel_mnist.distributed.strategy import build_accelerator
from accel_mnist.errors import UsageError
from accel_mnist.export.model_dir import full_state_dict, load_model, save_exported
from accel_mnist.export.predict import evaluate_exported, predict_files
from accel_mnist.models import build_model
from tests.helpers import CONFIGS, MNIST_DIR, REPO

MEAN, STD = 0.1307, 0.3081


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(export dir, training results) of a linear model trained for 200 steps."""
    if not (MNIST_DIR / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"real MNIST files not found at {MNIST_DIR}")
    root = tmp_path_factory.mktemp("predict")
    model = build_model("linear")
    config = TrainConfig(model="linear", data_dir=str(MNIST_DIR), download=False, max_steps=200, quiet=True,
                         output_dir=str(root / "run"), save_checkpoints=False, export=False)  # fmt: skip
    results = train(config, model=model)
    accelerator = build_accelerator(TrainConfig())
    weights = full_state_dict(accelerator, accelerator.prepare(model))
    return save_exported(weights, root / "export", model_name="linear", dataset="mnist"), results


@pytest.fixture(scope="module")
def model(exported):
    return load_model(exported[0])


@pytest.fixture(scope="module")
def test_split():
    return load_split("mnist", MNIST_DIR, train=False, download=False)


def direct_predictions(model, images):
    with torch.no_grad():
        return model(((images.float() / 255 - MEAN) / STD).unsqueeze(1)).softmax(1).max(1)


def digit_picture(image: torch.Tensor) -> Image.Image:
    """An MNIST digit as people draw it: black on white, 100x80 pixels, in colour."""
    return Image.fromarray(255 - image.numpy()).resize((100, 80), Image.Resampling.BICUBIC).convert("RGB")


def assert_one_line(excinfo, *needles):
    message = str(excinfo.value)
    assert "\n" not in message, message
    for needle in needles:
        assert str(needle) in message, message


@pytest.mark.parametrize("suffix, options", [(".png", {}), (".jpg", {"quality": 90})])
def test_picture_of_a_digit(model, test_split, tmp_path, suffix, options):
    images, labels = test_split
    path = tmp_path / f"digit{suffix}"
    digit_picture(images[0]).save(path, **options)
    [(name, digit, probability)] = predict_files(model, [path], MEAN, STD)
    assert (name, digit) == (str(path), int(labels[0]))
    assert probability > 0.5  # the 28x28 original's: 0.98


def test_sixteen_bit_picture(model, test_split, tmp_path):
    """Scaled to 8 bits, not clipped (Pillow's own conversion would clip: all but black turns white)."""
    picture = Image.fromarray(255 - test_split[0][0].numpy())
    picture.save(tmp_path / "8.png")
    Image.fromarray(np.asarray(picture).astype(np.uint16) * 257).save(tmp_path / "16.png")
    assert Image.open(tmp_path / "16.png").mode == "I;16"
    eight, sixteen = predict_files(model, [tmp_path / "8.png", tmp_path / "16.png"], MEAN, STD)
    assert sixteen[1:] == pytest.approx(eight[1:], abs=1e-6)


def test_transparent_background(model, test_split, tmp_path):
    images, labels = test_split
    ink = Image.fromarray(images[0].numpy()).resize((56, 56), Image.Resampling.BICUBIC)
    picture = Image.new("RGBA", ink.size, (0, 0, 0, 0))
    picture.putalpha(ink)  # black ink, opaque where the digit is, transparent elsewhere
    picture.save(tmp_path / "digit.png")
    [(_, digit, _)] = predict_files(model, [tmp_path / "digit.png"], MEAN, STD)
    assert digit == int(labels[0])


@pytest.mark.parametrize("gz", [False, True])
def test_idx_file(model, test_split, tmp_path, write_idx, gz):
    images, _ = test_split
    path = write_idx(tmp_path / "some-images-idx3-ubyte", images[:1234].numpy(), gz=gz)
    results = predict_files(model, [path], MEAN, STD)
    best, digits = direct_predictions(model, images[:1234])
    assert [r[0] for r in results] == [f"{path}[{i}]" for i in range(1234)]
    assert [r[1] for r in results] == digits.tolist()
    assert [r[2] for r in results] == pytest.approx(best.tolist(), abs=1e-6)


def test_images_and_idx_together_keep_the_order(model, test_split, tmp_path, write_idx):
    images, _ = test_split
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


def test_truncated_image(model, test_split, tmp_path):
    path = tmp_path / "cut.png"
    digit_picture(test_split[0][0]).save(path)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(UsageError) as e:
        predict_files(model, [path], MEAN, STD)
    assert_one_line(e, path, "cannot decode")


def test_evaluate_exported_matches_training(exported):
    path, results = exported
    metrics = evaluate_exported(path, data_dir=MNIST_DIR)
    assert metrics["test_samples"] == 10000
    assert metrics["test_accuracy"] == pytest.approx(results["test_accuracy"], abs=1e-4)
    assert metrics["test_loss"] == pytest.approx(results["test_loss"], rel=1e-5)


# The command line: `accel-mnist export|evaluate|predict`, which cli.py adds through predict.register.


def run_cli(*args: str, launch: list[str] | None = None) -> subprocess.CompletedProcess:
    target = ["-m", "accel_mnist"]
    prefix = [str(Path(sys.executable).with_name("accelerate")), "launch", *launch] if launch else [sys.executable]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([*prefix, *target, *args], capture_output=True, text=True, timeout=600, env=env,
                          cwd=REPO)  # fmt: skip


def assert_summary(stdout: str, results) -> None:
    """`test_accuracy A test_loss L samples 10000`, A and L with 4 decimals and those of training."""
    found = re.fullmatch(r"test_accuracy (\d\.\d{4}) test_loss (\d+\.\d{4}) samples 10000\n", stdout)
    assert found, stdout
    # Other batch sizes may round differently in the last bit; the printed digits may follow.
    assert float(found[1]) == pytest.approx(results["test_accuracy"], abs=2e-4)
    assert float(found[2]) == pytest.approx(results["test_loss"], abs=2e-4)


def assert_cli_error(proc, *needles):
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for needle in needles:
        assert str(needle) in lines[0]


def test_cli_predict(exported, test_split, tmp_path):
    images, labels = test_split
    digit_picture(images[0]).save(tmp_path / "digit.png")
    proc = run_cli("predict", "--model-path", str(exported[0]), str(tmp_path / "digit.png"))
    assert proc.returncode == 0, proc.stderr
    name, digit, probability = proc.stdout.strip().split("\t")
    assert (name, int(digit)) == (str(tmp_path / "digit.png"), int(labels[0]))
    assert len(probability.split(".")[1]) == 4 and 0.5 < float(probability) <= 1


def test_cli_predict_error(exported, tmp_path):
    (tmp_path / "notes.txt").write_text("hello\n")
    proc = run_cli("predict", "--model-path", str(exported[0]), str(tmp_path / "notes.txt"))
    assert_cli_error(proc, tmp_path / "notes.txt", "not an image")
    assert_cli_error(run_cli("predict", "--model-path", str(tmp_path / "nothing"), "x.png"), "nothing")


def test_cli_evaluate_and_export(exported, tmp_path):
    path, results = exported
    proc = run_cli("evaluate", "--model-path", str(path), "--data-dir", str(MNIST_DIR), "--batch-size", "3000")
    assert proc.returncode == 0, proc.stderr
    assert_summary(proc.stdout, results)

    accelerator = build_accelerator(TrainConfig())
    accelerator.prepare(load_model(path))
    accelerator.save_state(tmp_path / "ckpt")
    state = {"config": TrainConfig(model="linear").to_dict(), "step": 200}
    (tmp_path / "ckpt" / "trainer_state.json").write_text(json.dumps(state))
    proc = run_cli("export", "--checkpoint", str(tmp_path / "ckpt"), "--output", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"exported linear (mnist, step 200) to {tmp_path / 'out'}\n"
    assert_cli_error(run_cli("export", "--checkpoint", str(tmp_path / "none"), "--output", str(tmp_path / "o")), "none")


@pytest.mark.slow
def test_cli_evaluate_on_two_processes(exported):
    path, results = exported
    launch = ["--config_file", str(CONFIGS / "multi_cpu.yaml")]
    # 10000 / (2 * 3333) is not whole: even sharding pads, and the padding is not counted.
    proc = run_cli("evaluate", "--model-path", str(path), "--data-dir", str(MNIST_DIR), "--batch-size", "3333",
                   launch=launch)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert_summary(proc.stdout, results)


# The CLI in a child process that reports its own peak resident memory (kB) on stdout's last line.
PEAK_RSS_SCRIPT = """
import resource, sys
from accel_mnist.cli import main
code = main(sys.argv[1:])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
sys.exit(code)
"""


def predict_peak_rss(export: Path, path: Path) -> tuple[subprocess.CompletedProcess, int]:
    cmd = [sys.executable, "-c", PEAK_RSS_SCRIPT, "predict", "--model-path", str(export), str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    return proc, int(proc.stdout.strip().splitlines()[-1])


def test_predict_on_gzip_bombs_stays_within_memory(exported, tmp_path, write_idx):
    from tests.helpers import gzip_bomb

    small = write_idx(tmp_path / "ten-idx3-ubyte.gz", np.zeros((10, 28, 28), np.uint8), gz=True)
    proc, baseline = predict_peak_rss(exported[0], small)
    assert proc.returncode == 0 and proc.stdout.count("\t") == 20, proc.stderr[-2000:]
    # Ten records and then 2 GiB of zeros, from a 2 MB file.
    inflating = gzip_bomb(tmp_path / "inflating.gz", (10, 28, 28), 10 * 784, 2)
    proc, peak = predict_peak_rss(exported[0], inflating)
    assert_cli_error(proc, inflating, "trailing bytes")
    assert peak < baseline + 64 * 1024, f"{peak} kB against {baseline} kB for ten records"
    # A header that declares 2**31 records of 28x28 in a few dozen bytes.
    declaring = gzip_bomb(tmp_path / "declaring.gz", (2**31 - 1, 28, 28), 0, 0)
    proc, peak = predict_peak_rss(exported[0], declaring)
    assert_cli_error(proc, declaring, "over the limit")
    assert peak < baseline + 64 * 1024, f"{peak} kB against {baseline} kB for ten records"
