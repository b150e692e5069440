"""Packaging: the whole chain at the installed versions, and a wheel used outside the clone.

`test_end_to_end_at_the_installed_versions` is also the CI floor job's test (`make test-floors`
runs it with every dependency at its pyproject.toml lower bound): single process, DDP and
ZeRO-2 on two processes with an accumulation left over at the epoch end, an `hf:` dataset,
export from a checkpoint, and predict.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file

from tests.helpers import CONFIGS, REPO, accelerate_launch, shipped_files

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _synthetic_hf_dataset(root: Path, n_train: int, n_test: int) -> Path:
    """A learnable 10-class set of 28x28 images (a bright block whose place is the label), saved
    with save_to_disk as 2-D int lists: the `hf:` path, including datasets' list feature."""
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    rng = np.random.default_rng(0)

    def split(n):
        labels = rng.integers(0, 10, n)
        images = rng.integers(0, 40, (n, 28, 28), dtype=np.uint8)
        for image, label in zip(images, labels, strict=True):
            row, col = divmod(int(label), 5)
            image[4 + 10 * row : 12 + 10 * row, 1 + 5 * col : 5 + 5 * col] = 250
        return {"pixels": list(images), "label": labels.tolist()}, images, labels

    train, _, _ = split(n_train)
    test, test_images, test_labels = split(n_test)
    path = root / "synthetic"
    splits = {"train": datasets.Dataset.from_dict(train), "test": datasets.Dataset.from_dict(test)}
    datasets.DatasetDict(splits).save_to_disk(str(path))
    np.save(root / "test_images.npy", test_images)
    np.save(root / "test_labels.npy", test_labels)
    return path


def _free_port() -> int:
    # Others' launches on this machine may hold accelerate's default port 29500.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cli(*args, cwd=REPO, env=ENV, python=sys.executable):
    return subprocess.run([python, "-m", "accel_mnist", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=600)  # fmt: skip


@pytest.mark.slow
def test_end_to_end_at_the_installed_versions(tmp_path, write_idx):
    # 704 images, 16 per batch, 2 processes: 22 batches per process, accumulation 4, so the
    # epoch ends with a flushed partial accumulation (6 optimizer steps), the step that
    # DeepSpeed must take too (accelerate < 1.8 never told it the boundary).
    data = _synthetic_hf_dataset(tmp_path, 704, 200)
    common = ["--dataset", f"hf:{data}", "--model", "mlp", "--batch-size", "16", "--epochs", "1", "--seed", "3"]

    single = _cli("train", *common, "--grad-accum", "2", "--output-dir", str(tmp_path / "single"), "--quiet")
    assert single.returncode == 0, single.stderr[-3000:]
    results = json.loads((tmp_path / "single" / "results.json").read_text())
    assert results["steps"] == 22 and results["num_processes"] == 1
    assert results["test_accuracy"] > 0.9  # an untrained model scores about 0.1

    runs = {}
    for name, launch in {
        "ddp": ["--config_file", str(CONFIGS / "multi_cpu.yaml")],
        "zero2": ["--config_file", str(CONFIGS / "zero2.yaml"), "--mixed_precision", "no"],
    }.items():
        launch += ["--main_process_port", str(_free_port())]
        proc, results = accelerate_launch(launch, [*common, "--grad-accum", "4"], tmp_path / name)
        assert proc.returncode == 0, f"{name}:\n{proc.stderr[-4000:]}"
        assert results["steps"] == 6 and results["num_processes"] == 2
        runs[name] = load_file(tmp_path / name / "model.safetensors")
    assert results["zero_stage"] == 2 and results["distributed_type"] == "DEEPSPEED"
    # Same data, order and seed: ZeRO-2 and DDP differ only in how they reduce. A step that
    # one of them skipped would move every weight by about lr (1e-3).
    for key, ddp in runs["ddp"].items():
        assert np.allclose(runs["zero2"][key].numpy(), ddp.numpy(), atol=2e-5), key

    checkpoints = sorted((tmp_path / "zero2" / "checkpoints").iterdir())
    export = _cli("export", "--checkpoint", str(checkpoints[-1]), "--output", str(tmp_path / "exported"))
    assert export.returncode == 0, export.stderr[-3000:]
    exported = load_file(tmp_path / "exported" / "model.safetensors")
    assert all(np.array_equal(exported[k].numpy(), v.numpy()) for k, v in runs["zero2"].items())

    images, labels = np.load(tmp_path / "test_images.npy")[:50], np.load(tmp_path / "test_labels.npy")[:50]
    idx = write_idx(tmp_path / "images-idx3-ubyte", images)
    predict = _cli("predict", "--model-path", str(tmp_path / "exported"), str(idx))
    assert predict.returncode == 0, predict.stderr[-3000:]
    digits = [int(line.split("\t")[1]) for line in predict.stdout.splitlines()]
    assert len(digits) == 50 and np.mean(np.array(digits) == labels) > 0.9


def _build_wheel(tmp_path: Path) -> Path:
    # From a copy of the sources, as a clean clone has them: building writes build/ and
    # *.egg-info next to setup.py.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("accel_mnist", "accelerate_configs", "recipes"):
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist"), str(src)], check=True, capture_output=True, timeout=600)  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("accel_mnist-*.whl")
    return wheel


@pytest.mark.slow
def test_wheel_carries_the_configs_and_recipes_outside_the_clone(tmp_path):
    wheel = _build_wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    for file in shipped_files():
        assert f"accel_mnist/{file.parent.name}/{file.name}" in names, file
    # Installed on top of this environment's dependencies, into a folder of its own; run from
    # a directory that is not the clone, with the clone off the path.
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=600)  # fmt: skip
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {**ENV, "PYTHONPATH": str(target)}
    where = subprocess.run([sys.executable, "-c", "import accel_mnist; print(accel_mnist.__file__)"],
                           capture_output=True, text=True, cwd=work, env=env, check=True)  # fmt: skip
    assert Path(where.stdout.strip()).is_relative_to(target)

    listing = _cli("configs", cwd=work, env=env)
    assert listing.returncode == 0, listing.stderr
    assert all(file.stem in listing.stdout for file in shipped_files())
    written = _cli("configs", "cpu", cwd=work, env=env)
    assert written.stdout == (CONFIGS / "cpu.yaml").read_text()
    (work / "cpu.yaml").write_text(written.stdout)

    data = _synthetic_hf_dataset(tmp_path, 256, 64)
    accelerate = Path(sys.executable).with_name("accelerate")
    cmd = [str(accelerate), "launch", "--config_file", "cpu.yaml", "-m", "accel_mnist", "train", "--quiet",
           "--dataset", f"hf:{data}", "--model", "linear", "--max-steps", "3", "--output-dir", "run"]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=work, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((work / "run" / "results.json").read_text())
    assert results["steps"] == 3 and results["num_processes"] == 1 and results["distributed_type"] == "NO"
