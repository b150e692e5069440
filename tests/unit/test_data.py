"""Tests for accel_mnist.data.catalog: IDX parsing, validation, lookup, download fallback, datasets."""

from __future__ import annotations

import dataclasses
import gzip
import sys
import types
import urllib.error

import numpy as np
import pytest
import torch

from accel_mnist.data import catalog as data
from accel_mnist.data import idx
from accel_mnist.data.catalog import (
    DATASETS,
    DataError,
    ImageTensorDataset,
    find_split_files,
    load_datasets,
    load_split,
    resolve_data_dir,
)
from accel_mnist.data.idx import read_idx
from accel_mnist.data.tensor_dataset import Split, Splits, build_datasets, pixel_mean_std
from accel_mnist.errors import UsageError
from tests.helpers import gzip_bomb

N_TRAIN, N_TEST = 6, 4


@pytest.fixture
def small_mnist(monkeypatch):
    """Shrink the expected record counts so synthetic files stay tiny."""
    spec = dataclasses.replace(DATASETS["mnist"], train_records=N_TRAIN, test_records=N_TEST)
    monkeypatch.setitem(DATASETS, "mnist", spec)
    return spec


def write_split_files(write_idx, folder, *, gz=False, n_train=N_TRAIN, n_test=N_TEST, seed=0):
    rng = np.random.default_rng(seed)
    ext = ".gz" if gz else ""
    for split, n in (("train", n_train), ("t10k", n_test)):
        write_idx(folder / f"{split}-images-idx3-ubyte{ext}", rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), gz=gz)
        write_idx(folder / f"{split}-labels-idx1-ubyte{ext}", np.arange(n, dtype=np.uint8) % 10, gz=gz)


def assert_data_error(excinfo, *words):
    msg = str(excinfo.value)
    assert "\n" not in msg
    for word in words:
        assert str(word) in msg, f"{word!r} not in {msg!r}"


# --- read_idx ---------------------------------------------------------------------------------


@pytest.mark.parametrize("gz", [False, True])
def test_read_idx_roundtrip(tmp_path, write_idx, gz):
    arr = np.arange(2 * 28 * 28, dtype=np.uint8).reshape(2, 28, 28)
    out = read_idx(write_idx(tmp_path / "x-idx3-ubyte", arr, gz=gz))
    assert out.dtype == np.uint8 and out.shape == (2, 28, 28) and out.flags.writeable
    np.testing.assert_array_equal(out, arr)


def test_read_idx_gzip_detected_by_magic_not_suffix(tmp_path, write_idx):
    path = write_idx(tmp_path / "labels.bin", np.array([1, 2, 3], dtype=np.uint8), gz=True)
    np.testing.assert_array_equal(read_idx(path), [1, 2, 3])


def test_read_idx_big_endian_int16(tmp_path, write_idx):
    arr = np.array([[1, -2], [300, -4000]], dtype=np.int16)
    out = read_idx(write_idx(tmp_path / "x", arr, code=0x0B))
    assert out.dtype == np.int16 and out.dtype.isnative
    np.testing.assert_array_equal(out, arr)


LABELS = np.arange(10, dtype=np.uint8)


def _bad_magic(p, w):
    p.write_bytes(b"\x12\x34\x08\x01" + b"\0" * 20)


def _bad_ndim(p, w):
    p.write_bytes(b"\x00\x00\x08\x07" + b"\0" * 40)


def _bad_code(p, w):
    w(p, LABELS, code=0x0A)


def _truncated(p, w):
    w(p, LABELS, cut=3)


def _trailing(p, w):
    w(p, LABELS, tail=b"xyz")


def _truncated_gz(p, w):
    # A valid header, so that the stream (read as it inflates) breaks off inside the data.
    header = bytes([0, 0, 0x08, 1]) + (1000).to_bytes(4, "big")
    full = gzip.compress(header + np.random.default_rng(0).bytes(1000))
    p.write_bytes(full[: len(full) // 2])


def _garbage_gz(p, w):
    p.write_bytes(gzip.compress(b"")[:10] + b"this is not deflate data" * 4)


def _short_header(p, w):
    p.write_bytes(b"\x00\x00\x08\x03\x00\x00\x00\x02")


def _empty(p, w):
    p.write_bytes(b"")


@pytest.mark.parametrize(
    "make, words",
    [
        (_bad_magic, ["bad magic number 0x12340801"]),
        (_bad_ndim, ["bad magic number 0x00000807"]),
        (_bad_code, ["unsupported IDX data type code 0x0a"]),
        (_truncated, ["truncated: expected 10 bytes of data, found 7"]),
        (_trailing, ["3 trailing bytes"]),
        (_truncated_gz, ["corrupt gzip stream"]),
        (_garbage_gz, ["corrupt gzip stream"]),
        (_short_header, ["truncated header"]),
        (_empty, ["too short"]),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_read_idx_rejects_corrupt_files(tmp_path, write_idx, make, words):
    path = tmp_path / "train-labels-idx1-ubyte.gz"
    make(path, write_idx)
    with pytest.raises(DataError) as excinfo:
        read_idx(path)
    assert_data_error(excinfo, path, *words)


def test_read_idx_refuses_a_header_over_the_cap_before_reading(tmp_path):
    # 2**31 x 28 x 28 uint8 declared in a file of a few dozen bytes.
    path = gzip_bomb(tmp_path / "bomb.gz", (2**31 - 1, 28, 28), 0, 0)
    with pytest.raises(DataError) as excinfo:
        read_idx(path)
    assert_data_error(excinfo, path, "over the limit of", str(idx.MAX_IDX_BYTES), "not read")


def test_read_idx_cap_is_a_parameter(tmp_path, write_idx):
    path = write_idx(tmp_path / "x", np.zeros((4, 28, 28), np.uint8), gz=True)
    assert read_idx(path, max_bytes=4 * 784).shape == (4, 28, 28)
    with pytest.raises(DataError, match="over the limit of 3135"):
        read_idx(path, max_bytes=4 * 784 - 1)


def test_read_idx_refuses_a_wrong_shape_from_the_header(tmp_path, write_idx):
    path = write_idx(tmp_path / "x", np.zeros((2, 3), np.uint8))
    with pytest.raises(DataError, match=r"expected IDX records of shape \(N, 28, 28\), the header declares \(2, 3\)"):
        read_idx(path, shape=(None, 28, 28))


def test_read_idx_of_a_gzip_bomb_stays_small(tmp_path):
    """A 2 MB file inflating to 2 GiB: the declared 10 records are read, then at most
    MAX_TRAILING bytes more; the peak of Python allocations stays a few MB."""
    import tracemalloc

    path = gzip_bomb(tmp_path / "bomb.gz", (10, 28, 28), 10 * 784, 2)
    assert path.stat().st_size < 3 << 20
    tracemalloc.start()
    try:
        with pytest.raises(DataError) as excinfo:
            read_idx(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert_data_error(excinfo, path, f"more than {idx.MAX_TRAILING} trailing bytes")
    assert peak < 16 << 20, f"peak {peak} bytes"


def test_read_idx_missing_file(tmp_path):
    with pytest.raises(DataError) as excinfo:
        read_idx(tmp_path / "nope")
    assert_data_error(excinfo, tmp_path / "nope", "cannot read")


# --- lookup -----------------------------------------------------------------------------------


def test_resolve_data_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("ACCEL_MNIST_DATA_DIR", str(tmp_path / "env"))
    assert resolve_data_dir(tmp_path / "arg") == tmp_path / "arg"
    assert resolve_data_dir(None) == tmp_path / "env"
    monkeypatch.setenv("ACCEL_MNIST_DATA_DIR", "")
    assert resolve_data_dir(None) == data.Path("data")
    monkeypatch.delenv("ACCEL_MNIST_DATA_DIR")
    assert resolve_data_dir(None) == data.Path("data")


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("sub", ["", "MNIST/raw"])
def test_find_and_load_both_layouts(tmp_path, write_idx, small_mnist, gz, sub):
    folder = tmp_path / sub if sub else tmp_path
    write_split_files(write_idx, folder, gz=gz)
    files = find_split_files("mnist", tmp_path)
    ext = ".gz" if gz else ""
    assert files["train_images"] == folder / f"train-images-idx3-ubyte{ext}"
    assert files["test_labels"] == folder / f"t10k-labels-idx1-ubyte{ext}"
    images, labels = load_split("mnist", tmp_path, train=True, download=False)
    assert images.dtype == torch.uint8 and images.shape == (N_TRAIN, 28, 28)
    assert labels.dtype == torch.int64 and labels.shape == (N_TRAIN,)


def test_find_prefers_uncompressed_and_reports_missing(tmp_path, write_idx):
    write_split_files(write_idx, tmp_path, gz=True)
    write_idx(tmp_path / "train-labels-idx1-ubyte", LABELS)
    files = find_split_files("mnist", tmp_path)
    assert files["train_labels"] == tmp_path / "train-labels-idx1-ubyte"
    assert files["train_images"] == tmp_path / "train-images-idx3-ubyte.gz"
    (tmp_path / "t10k-images-idx3-ubyte.gz").unlink()
    assert find_split_files("mnist", tmp_path) is None


# --- load_split validation --------------------------------------------------------------------


def test_unknown_dataset(tmp_path):
    with pytest.raises(DataError) as excinfo:
        load_split("cifar10", tmp_path, train=True)
    assert_data_error(excinfo, "cifar10", "mnist", "fashion_mnist", "kmnist")


def test_missing_files_named(tmp_path, write_idx, small_mnist):
    write_split_files(write_idx, tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DataError) as excinfo:
        load_split("mnist", tmp_path, train=False, download=False)
    assert_data_error(excinfo, tmp_path, "t10k-labels-idx1-ubyte", "not found")
    assert "t10k-images" not in str(excinfo.value)


def test_wrong_image_shape(tmp_path, write_idx, small_mnist):
    write_split_files(write_idx, tmp_path)
    path = write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((N_TRAIN, 27, 28), np.uint8))
    with pytest.raises(DataError) as excinfo:
        load_split("mnist", tmp_path, train=True, download=False)
    assert_data_error(excinfo, path, "expected images of shape (N, 28, 28)", "(6, 27, 28)")


def test_count_mismatch(tmp_path, write_idx, small_mnist):
    write_split_files(write_idx, tmp_path)
    lbl = write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(N_TRAIN - 1, np.uint8))
    with pytest.raises(DataError) as excinfo:
        load_split("mnist", tmp_path, train=True, download=False)
    assert_data_error(excinfo, tmp_path / "train-images-idx3-ubyte", lbl, N_TRAIN, N_TRAIN - 1)


def test_label_out_of_range(tmp_path, write_idx, small_mnist):
    write_split_files(write_idx, tmp_path)
    lbl = write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.array([0, 1, 10, 2], np.uint8))
    with pytest.raises(DataError) as excinfo:
        load_split("mnist", tmp_path, train=False, download=False)
    assert_data_error(excinfo, lbl, "label value 10", "0..9")


def test_wrong_record_count(tmp_path, write_idx):
    # Real expected counts (60000/10000); a tiny file must be rejected.
    write_split_files(write_idx, tmp_path)
    with pytest.raises(DataError) as excinfo:
        load_split("mnist", tmp_path, train=True, download=False)
    assert_data_error(excinfo, tmp_path / "train-images-idx3-ubyte", f"expected 60000 records, found {N_TRAIN}")


# --- download fallback ------------------------------------------------------------------------


def test_download_called_when_missing(tmp_path, write_idx, small_mnist, monkeypatch):
    calls = []

    def fake_download(name, data_dir):
        calls.append((name, data_dir))
        write_split_files(write_idx, data_dir / "MNIST" / "raw", gz=True)

    monkeypatch.setattr(data, "download", fake_download)
    train, test = load_datasets("mnist", tmp_path)
    assert calls == [("mnist", tmp_path)]  # second split found the files already there
    assert (len(train), len(test)) == (N_TRAIN, N_TEST)


def test_download_not_called_when_present_or_disabled(tmp_path, write_idx, small_mnist, monkeypatch):
    monkeypatch.setattr(data, "download", lambda *a: pytest.fail("download() called"))
    write_split_files(write_idx, tmp_path)
    load_split("mnist", tmp_path, train=True)
    with pytest.raises(DataError):
        load_split("mnist", tmp_path / "empty", train=True, download=False)


def test_download_that_leaves_files_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "download", lambda *a: None)
    with pytest.raises(DataError) as excinfo:
        load_split("mnist", tmp_path, train=True)
    assert_data_error(excinfo, tmp_path, "train-images-idx3-ubyte", "train-labels-idx1-ubyte")


def _fake_torchvision(monkeypatch, cls):
    module = types.ModuleType("torchvision")
    module.datasets = types.SimpleNamespace(MNIST=cls)
    monkeypatch.setitem(sys.modules, "torchvision", module)


def test_download_uses_torchvision_layout(tmp_path, write_idx, small_mnist, monkeypatch):
    seen = []

    class FakeMNIST:
        def __init__(self, root, train, download):
            seen.append((root, train, download))
            write_split_files(write_idx, data.Path(root) / "MNIST" / "raw", gz=True)

    _fake_torchvision(monkeypatch, FakeMNIST)
    images, _ = load_split("mnist", tmp_path, train=False)
    assert seen == [(str(tmp_path), True, True), (str(tmp_path), False, True)]
    assert images.shape == (N_TEST, 28, 28)


def test_download_failure_is_one_line(tmp_path, monkeypatch):
    class FailingMNIST:
        def __init__(self, root, train, download):
            raise RuntimeError(
                "Error downloading x.gz:\nTried https://a, got:\n" + repr(urllib.error.URLError("no network"))
            )

    _fake_torchvision(monkeypatch, FailingMNIST)
    with pytest.raises(DataError) as excinfo:
        load_split("mnist", tmp_path, train=True)
    assert_data_error(excinfo, f"could not download mnist into {tmp_path}", "no network", "pass data_dir")


# --- datasets ---------------------------------------------------------------------------------


def test_image_tensor_dataset():
    images = torch.tensor([[[0, 255] * 14] * 28, [[51] * 28] * 28], dtype=torch.uint8)
    ds = ImageTensorDataset(images, torch.tensor([3, 7]), mean=0.5, std=0.25)
    assert len(ds) == 2
    x, y = ds[0]
    assert x.dtype == torch.float32 and x.shape == (1, 28, 28)
    assert y.dtype == torch.int64 and y.shape == () and int(y) == 3
    assert x[0, 0, 0].item() == pytest.approx(-2.0) and x[0, 0, 1].item() == pytest.approx(2.0)
    assert torch.allclose(ds[1][0], torch.full((1, 28, 28), (0.2 - 0.5) / 0.25))


def test_load_datasets_uses_spec_normalisation(tmp_path, write_idx, small_mnist):
    write_split_files(write_idx, tmp_path)
    train, test = load_datasets("mnist", tmp_path, download=False)
    assert (train.mean, train.std) == (0.1307, 0.3081)
    x, _ = test[0]
    expected = (test.images[0].float() / 255 - 0.1307) / 0.3081
    assert torch.allclose(x[0], expected)


def test_load_datasets_checks_the_labels_of_both_splits(tmp_path, write_idx, small_mnist):
    write_split_files(write_idx, tmp_path)
    lbl = write_idx(tmp_path / "train-labels-idx1-ubyte", np.array([0, 1, 2, 3, 11, 4], np.uint8))
    with pytest.raises(DataError) as excinfo:
        load_datasets("mnist", tmp_path, download=False)
    assert_data_error(excinfo, lbl, "label value 11", "0..9")


def _splits(train_labels, test_labels, **kwargs):
    images = torch.arange(2 * 4 * 4, dtype=torch.uint8).reshape(2, 4, 4)
    train = Split(images[: len(train_labels)], torch.tensor(train_labels), "train at")
    test = Split(images[: len(test_labels)], torch.tensor(test_labels), "test at")
    return Splits(train, test, **kwargs)


def test_build_datasets_settles_classes_and_normalisation():
    train, test = build_datasets(_splits([0, 2], [1]))  # classes from the labels, mean/std from the pixels
    assert train.num_classes == test.num_classes == 3 and train.class_names is None
    assert (train.mean, train.std) == (test.mean, test.std) == pixel_mean_std(train.images)
    train, _ = build_datasets(_splits([0, 1], [1], class_names=("a", "b", "c"), mean=0.5, std=0.25))
    assert train.num_classes == 3 and train.class_names == ("a", "b", "c") and (train.mean, train.std) == (0.5, 0.25)
    train, _ = build_datasets(_splits([0, 1], [1], mean=0.5, std=0.25), mean=0.1, std=0.2)  # the caller's first
    assert (train.mean, train.std) == (0.1, 0.2)


def test_build_datasets_refuses_labels_beyond_the_classes():
    with pytest.raises(DataError) as excinfo:
        build_datasets(_splits([0, 1], [2], class_names=("a", "b"), note=lambda count: f" ({count} named)"))
    assert_data_error(excinfo, "test at: label value 2 out of range 0..1 (2 named)")
    with pytest.raises(DataError) as excinfo:
        build_datasets(_splits([0, -1], [0]))
    assert_data_error(excinfo, "train at: label value -1 out of range 0..0")


@pytest.mark.parametrize(("mean", "std", "words"), [(0.5, None, "go together"), (0.5, 0.0, "std > 0")])
def test_build_datasets_refuses_a_bad_mean_and_std(mean, std, words):
    with pytest.raises(UsageError, match=words):
        build_datasets(_splits([0], [0]), mean=mean, std=std)


def test_specs():
    assert set(DATASETS) == {"mnist", "fashion_mnist", "kmnist"}
    assert [s.torchvision_name for s in DATASETS.values()] == ["MNIST", "FashionMNIST", "KMNIST"]
    assert all(len(s.classes) == 10 for s in DATASETS.values())
