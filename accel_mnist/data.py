"""MNIST-family datasets: IDX file reading, validation, lookup, download and torch Datasets."""

from __future__ import annotations

import contextlib
import gzip
import math
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .errors import DataError, one_line
from .tensor_dataset import ImageTensorDataset, check_label_range

__all__ = [
    "DATASETS",
    "DatasetSpec",
    "ImageTensorDataset",
    "download",
    "find_split_files",
    "load_datasets",
    "load_split",
    "read_idx",
    "resolve_data_dir",
]


@dataclass(frozen=True)
class DatasetSpec:
    """Static facts about one dataset: names, normalisation constants, classes, sizes."""

    name: str
    torchvision_name: str
    mean: float
    std: float
    classes: tuple[str, ...]
    train_records: int = 60000
    test_records: int = 10000


DATASETS: dict[str, DatasetSpec] = {
    "mnist": DatasetSpec("mnist", "MNIST", 0.1307, 0.3081, tuple(str(d) for d in range(10))),
    "fashion_mnist": DatasetSpec(
        "fashion_mnist",
        "FashionMNIST",
        0.2860,
        0.3530,
        ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"),
    ),
    "kmnist": DatasetSpec(
        "kmnist",
        "KMNIST",
        0.1918,
        0.3483,
        ("o", "ki", "su", "tsu", "na", "ha", "ma", "ya", "re", "wo"),
    ),
}

SPLIT_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}

# IDX type code -> big-endian numpy dtype.
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_GZIP_MAGIC = b"\x1f\x8b"
# The largest array an IDX file may declare: MNIST's training images are 47 MB. What a header
# declares is allocated only as the data arrives, never on the header's word alone.
MAX_IDX_BYTES = 128 * 2**20
MAX_TRAILING = 2**16  # bytes read past the declared data to refuse it (a bomb may hold GBs)
_CHUNK = 2**20


def _spec(name: str) -> DatasetSpec:
    try:
        return DATASETS[name]
    except KeyError:
        raise DataError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}") from None


def resolve_data_dir(data_dir: str | os.PathLike | None) -> Path:
    """Return `data_dir` if given, else $ACCEL_MNIST_DATA_DIR if set and non-empty, else ./data."""
    if data_dir is not None:
        return Path(data_dir)
    return Path(os.environ.get("ACCEL_MNIST_DATA_DIR") or "data")


def read_idx(
    path: str | os.PathLike, max_bytes: int = MAX_IDX_BYTES, shape: tuple[int | None, ...] | None = None
) -> np.ndarray:
    """Read one IDX file (gzipped or raw) into a writable native-endian array; DataError if invalid.

    Streamed, so that a small file cannot make it allocate much: the header is read first, and
    its shape must match `shape` (None: any size) and declare at most `max_bytes`; then exactly
    that many bytes are read, and at most `MAX_TRAILING` more to refuse data past the end.
    """
    path = Path(path)
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise DataError(f"{path}: cannot read file ({one_line(exc.strerror or exc)})") from None
    with f:
        gz = f.read(2) == _GZIP_MAGIC
        f.seek(0)
        try:
            with gzip.GzipFile(fileobj=f) if gz else contextlib.nullcontext(f) as stream:
                return _read_idx_stream(stream, path, max_bytes, shape)
        except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
            if gz:
                raise DataError(f"{path}: corrupt gzip stream ({one_line(exc)})") from None
            raise DataError(f"{path}: cannot read file ({one_line(exc)})") from None


def _read_idx_stream(stream: Any, path: Path, max_bytes: int, shape: tuple[int | None, ...] | None) -> np.ndarray:
    head = stream.read(4)
    if len(head) < 4:
        raise DataError(f"{path}: too short for an IDX header ({len(head)} bytes)")
    (magic,) = struct.unpack(">I", head)
    code, ndim = head[2], head[3]
    if head[0] != 0 or head[1] != 0 or not 1 <= ndim <= 4:
        raise DataError(f"{path}: bad magic number 0x{magic:08x} (expected an IDX file, 0x00000801 or 0x00000803)")
    if code not in _IDX_DTYPES:
        supported = ", ".join(f"0x{c:02x}" for c in _IDX_DTYPES)
        raise DataError(f"{path}: unsupported IDX data type code 0x{code:02x} (supported: {supported})")
    raw_dims = stream.read(4 * ndim)
    if len(raw_dims) < 4 * ndim:
        raise DataError(f"{path}: truncated header: expected {4 + 4 * ndim} bytes, found {4 + len(raw_dims)}")
    dims = struct.unpack(f">{ndim}I", raw_dims)
    if shape is not None and (len(shape) != ndim or any(w not in (None, d) for w, d in zip(shape, dims, strict=False))):
        wanted = "(" + ", ".join("N" if w is None else str(w) for w in shape) + ")"
        raise DataError(f"{path}: expected IDX records of shape {wanted}, the header declares {dims}")
    dtype = np.dtype(_IDX_DTYPES[code])
    expected = math.prod(dims) * dtype.itemsize
    if expected > max_bytes:
        raise DataError(
            f"{path}: the header declares shape {dims}, {expected} bytes, over the limit of {max_bytes}; not read"
        )
    data = bytearray()  # grows with what arrives: a header's claim alone allocates nothing
    while len(data) < expected:
        chunk = stream.read(min(_CHUNK, expected - len(data)))
        if not chunk:
            raise DataError(f"{path}: truncated: expected {expected} bytes of data, found {len(data)}")
        data += chunk
    trailing = 0
    while trailing <= MAX_TRAILING and (chunk := stream.read(min(_CHUNK, MAX_TRAILING + 1 - trailing))):
        trailing += len(chunk)
    if trailing:
        count = str(trailing) if trailing <= MAX_TRAILING else f"more than {MAX_TRAILING}"
        raise DataError(f"{path}: {count} trailing bytes after the {expected} bytes of data for shape {dims}")
    # Reinterpreted in place rather than copied: big-endian bytes, swapped to native order.
    arr = np.frombuffer(data, dtype=dtype.newbyteorder("=")).reshape(dims)
    if not dtype.isnative:
        arr.byteswap(inplace=True)
    return arr


def _locate(spec: DatasetSpec, root: Path) -> dict[str, Path | None]:
    found: dict[str, Path | None] = {}
    for key, base in SPLIT_FILES.items():
        candidates = []
        for folder in (root, root / spec.torchvision_name / "raw"):
            candidates += [folder / base, folder / f"{base}.gz"]
        found[key] = next((p for p in candidates if p.is_file()), None)
    return found


def find_split_files(name: str, data_dir: str | os.PathLike | None) -> dict[str, Path] | None:
    """Locate the four IDX files of `name` (flat or torchvision layout, raw or .gz); None if any is missing."""
    found = _locate(_spec(name), resolve_data_dir(data_dir))
    if any(p is None for p in found.values()):
        return None
    return found  # type: ignore[return-value]


def download(name: str, data_dir: str | os.PathLike | None) -> None:
    """Download both splits of `name` into `data_dir/<torchvision_name>/raw/` with torchvision."""
    spec = _spec(name)
    root = resolve_data_dir(data_dir)
    try:
        # Imported here: torchvision takes seconds to import and the normal path never needs it.
        from torchvision import datasets as tv_datasets

        cls = getattr(tv_datasets, spec.torchvision_name)
        for train in (True, False):
            cls(root=str(root), train=train, download=True)
    except Exception as exc:  # noqa: BLE001 - any failure here means "no data", reported as such
        reason = one_line(exc)
        raise DataError(
            f"could not download {name} into {root}: {reason}; "
            "put the four IDX files there (see README) or pass --data-dir"
        ) from None


def _fetch(name: str, root: Path) -> None:
    # load_split's `download` parameter shadows the function; resolve the module global at call
    # time so tests (and callers) can monkeypatch accel_mnist.data.download.
    download(name, root)


def load_split(
    name: str, data_dir: str | os.PathLike | None, train: bool, download: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Load one split: uint8 images (N, 28, 28) and int64 labels (N,), validated."""
    spec = _spec(name)
    root = resolve_data_dir(data_dir)
    split = "train" if train else "test"
    keys = (f"{split}_images", f"{split}_labels")
    found = _locate(spec, root)
    if download and any(found[k] is None for k in keys):
        _fetch(name, root)
        found = _locate(spec, root)
    missing = [SPLIT_FILES[k] for k in keys if found[k] is None]
    if missing:
        raise DataError(
            f"{name} {split} data not found in {root}: missing {', '.join(missing)} "
            f"(looked for <file>[.gz] there and in {spec.torchvision_name}/raw/)"
            + ("" if download else "; downloading is off")
        )
    img_path, lbl_path = found[keys[0]], found[keys[1]]
    assert img_path is not None and lbl_path is not None  # nothing is missing (checked above)
    images, labels = read_idx(img_path), read_idx(lbl_path)

    if images.ndim != 3 or images.shape[1:] != (28, 28):
        raise DataError(f"{img_path}: expected images of shape (N, 28, 28), found {images.shape}")
    if images.dtype != np.uint8:
        raise DataError(f"{img_path}: expected uint8 pixels, found {images.dtype}")
    if labels.ndim != 1:
        raise DataError(f"{lbl_path}: expected labels of shape (N,), found {labels.shape}")
    if labels.dtype.kind not in "iu":
        raise DataError(f"{lbl_path}: expected integer labels, found {labels.dtype}")
    if len(images) != len(labels):
        raise DataError(f"{img_path} has {len(images)} images but {lbl_path} has {len(labels)} labels")
    expected = spec.train_records if train else spec.test_records
    if len(images) != expected:
        raise DataError(f"{img_path}: expected {expected} records, found {len(images)} ({name} {split} split)")
    check_label_range(labels, len(spec.classes), str(lbl_path))
    return torch.from_numpy(images), torch.from_numpy(labels.astype(np.int64))


def load_datasets(
    name: str, data_dir: str | os.PathLike | None, download: bool = True
) -> tuple[ImageTensorDataset, ImageTensorDataset]:
    """Load (train, test) ImageTensorDatasets for `name`, normalised with the spec's mean/std."""
    if name.startswith("hf:"):  # Hugging Face datasets (hf_data.py); imported only when asked for
        from .hf_data import load_hf_datasets

        return load_hf_datasets(name, data_dir, download)
    spec = _spec(name)
    train = load_split(name, data_dir, train=True, download=download)
    test = load_split(name, data_dir, train=False, download=download)
    return (
        ImageTensorDataset(*train, mean=spec.mean, std=spec.std),
        ImageTensorDataset(*test, mean=spec.mean, std=spec.std),
    )
