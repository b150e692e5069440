"""A write the storage refuses, on a real small file system (a tmpfs this test mounts): one
StorageError naming what, where and the space left, exit code 74, and nothing half-written."""

from __future__ import annotations

import errno
import json

import pytest
import torch
from safetensors.torch import save_file

from accel_mnist.errors import EXIT_STORAGE, StorageError
from accel_mnist.export.model_dir import save_exported
from accel_mnist.files import storage_errno, write_json_atomic, writing
from accel_mnist.run.lock import RunLock
from accel_mnist.run.outputs import append_metrics
from tests.small_fs import fill, small_fs


@pytest.fixture
def fs(tmp_path):
    with small_fs(tmp_path / "mnt") as mounts:
        yield mounts


def test_a_full_disk_keeps_the_old_file_and_says_what_where_and_how_much_is_free(fs):
    disk = fs.mount(size="256k")
    results = disk / "results.json"
    write_json_atomic(results, {"steps": 1})
    fill(disk)
    with pytest.raises(StorageError) as caught:
        write_json_atomic(results, {"steps": 2, "padding": "x" * 10000})
    message = str(caught.value)
    assert message.startswith(f"cannot write results.json ({results}): No space left on device, ")
    assert message.endswith(" B free on that file system"), message
    assert caught.value.exit_code == EXIT_STORAGE == 74
    assert json.loads(results.read_text()) == {"steps": 1}  # the old file, whole
    assert sorted(p.name for p in disk.iterdir()) == ["filler", "results.json"]  # no temporary left


def test_metrics_rows_on_a_full_disk(fs):
    disk = fs.mount(size="256k")
    append_metrics(disk, {"step": 1})
    fill(disk)
    with pytest.raises(StorageError, match=r"cannot write metrics.jsonl .*: No space left on device"):
        append_metrics(disk, {"step": 2, "padding": "x" * 20000})


@pytest.mark.parametrize("library", ["torch.save", "safetensors"])
def test_library_errors_without_an_errno_are_recognised(fs, library):
    """torch.save raises a RuntimeError without an errno on a full disk, safetensors keeps it in
    its message: both are the storage's refusal, named as such."""
    disk = fs.mount(size="256k")
    fill(disk, leave=16 << 10)
    tensor = torch.zeros(1 << 16)  # 256 kB: more than is left
    with pytest.raises(StorageError, match=r"cannot write the weights .*: No space left on device"):
        with writing("the weights", disk / "w"):
            torch.save(tensor, disk / "w") if library == "torch.save" else save_file({"t": tensor}, disk / "w")


def test_an_export_on_a_full_disk_leaves_no_partial_export(fs):
    disk = fs.mount(size="256k")
    fill(disk, leave=16 << 10)
    weights = {"fc.weight": torch.zeros(10, 784), "fc.bias": torch.zeros(10)}  # 31 kB
    with pytest.raises(StorageError, match=r"cannot write the export .*No space left on device"):
        save_exported(weights, disk / "model", model_name="linear", dataset="mnist")
    assert sorted(p.name for p in disk.iterdir()) == ["filler"]


def test_a_read_only_file_system(fs):
    disk = fs.mount(size="256k")
    (disk / "out").mkdir()
    fs.read_only(disk)
    with pytest.raises(StorageError, match=r"cannot write config.json .*: Read-only file system"):
        write_json_atomic(disk / "out" / "config.json", {})
    # The run's first write is its lock: an output directory that cannot be written stops it there.
    with pytest.raises(StorageError, match=r"cannot write the lock file .*: Read-only file system"):
        RunLock(disk / "out").acquire()
    with pytest.raises(StorageError, match=r"cannot write the output directory .*: Read-only file system"):
        RunLock(disk / "new").acquire()
    fs.read_only(disk, False)


def test_other_errors_are_not_taken_for_the_storage(tmp_path):
    assert storage_errno(FileNotFoundError(errno.ENOENT, "gone"), tmp_path) is None
    assert storage_errno(OSError(errno.ENOSPC, "full"), tmp_path) == errno.ENOSPC
    assert storage_errno(RuntimeError("Error while serializing: I/O error: (os error 122)"), tmp_path) == errno.EDQUOT
    assert storage_errno(RuntimeError("some bug"), tmp_path) is None  # tmp_path is neither full nor read-only
    assert storage_errno(ValueError("bad value"), tmp_path) is None
    with pytest.raises(FileNotFoundError):  # passed on unchanged
        with writing("a file", tmp_path / "x"):
            open(tmp_path / "missing" / "x", "rb")
