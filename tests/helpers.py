"""What several test files share: paths, the real and the synthetic MNIST files, and the launchers'
wrappers.

Imported as `tests.helpers` (tests/ is a package, so that files of the same name can live in
different tiers). Fixtures and hooks live in conftest.py; everything else shared lives here.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import signal
import struct
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "accelerate_configs"

# The real MNIST files beside the checkout; ACCEL_MNIST_DATA_DIR where they lie elsewhere (the
# GPU machine, where the checkout travels without ../shared).
MNIST_DIR = Path(os.environ.get("ACCEL_MNIST_DATA_DIR") or REPO.parent / "shared" / "data" / "mnist")

# metrics.jsonl keys that measure time: left out wherever two runs' metrics are compared.
TIMING_KEYS = frozenset({"samples_per_second", "train_seconds", "warmup_seconds", "steady_samples_per_second"})


def write_idx(path, array, *, gz: bool = False, code: int = 0x08, tail: bytes = b"", cut: int = 0) -> Path:
    """Write `array` as an IDX file (big-endian); `tail` appends bytes, `cut` drops trailing ones."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    array = np.asarray(array)
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.astype(array.dtype.newbyteorder(">")).tobytes() + tail
    payload = payload[: len(payload) - cut]
    path.write_bytes(gzip.compress(payload) if gz else payload)
    return path


# --------------------------------------------------------------------------- synthetic MNIST

# 100 batches of 64: the in-process runs that use these files instead of the real ones (up to 100
# steps) stay within their first epoch, as they did on the real files. 128 test images keep
# their evaluations quick.
SYNTHETIC_TRAIN, SYNTHETIC_TEST = 6400, 128


def synthetic_digits(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """`n` learnable 28x28 uint8 images and their uint8 labels: dim noise and a bright block
    whose place is the label."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n).astype(np.uint8)
    images = rng.integers(0, 40, (n, 28, 28), dtype=np.uint8)
    for image, label in zip(images, labels, strict=True):
        row, col = divmod(int(label), 5)
        image[4 + 10 * row : 12 + 10 * row, 1 + 5 * col : 5 + 5 * col] = 250
    return images, labels


def write_synthetic_mnist(folder: Path, n_train: int = SYNTHETIC_TRAIN, n_test: int = SYNTHETIC_TEST) -> Path:
    """MNIST's four gzipped IDX files, under the real files' names, holding synthetic_digits."""
    for split, n, seed in (("train", n_train, 0), ("t10k", n_test, 1)):
        images, labels = synthetic_digits(n, seed)
        write_idx(folder / f"{split}-images-idx3-ubyte.gz", images, gz=True)
        write_idx(folder / f"{split}-labels-idx1-ubyte.gz", labels, gz=True)
    return folder


@contextmanager
def synthetic_counts(n_train: int = SYNTHETIC_TRAIN, n_test: int = SYNTHETIC_TEST) -> Iterator[None]:
    """While it lasts, `mnist` expects the synthetic files' record counts: load_split checks a
    named dataset's counts (60000 / 10000 for MNIST). In this process only: a subprocess still
    expects the real counts, so tests that start one give it the real files."""
    import pytest

    from accel_mnist.data.catalog import DATASETS

    spec = dataclasses.replace(DATASETS["mnist"], train_records=n_train, test_records=n_test)
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(DATASETS, "mnist", spec)
        yield


def accelerate_launch(launch_args, train_args, output_dir, *, env=None, timeout=600):
    """Run `accelerate launch <launch_args> -m accel_mnist train <train_args>` in a subprocess.

    Returns (CompletedProcess, results dict or None). On CPU the DeepSpeed configs need
    `--mixed_precision no` among launch_args (fp16 does not run on CPU).
    """
    accelerate = Path(sys.executable).with_name("accelerate")
    cmd = [str(accelerate), "launch", *launch_args, "-m", "accel_mnist", "train",
           *train_args, "--output-dir", str(output_dir), "--quiet"]  # fmt: skip
    full_env = {**os.environ, "ACCEL_MNIST_DATA_DIR": str(MNIST_DIR), "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=REPO)
    results_file = Path(output_dir) / "results.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else None
    return proc, results


def metrics_rows(out: Path) -> list[dict]:
    """A run's metrics.jsonl rows without the timing keys."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows]


def final_weights(out: Path) -> dict:
    """The model weights of a run's last checkpoint (Accelerate's safetensors or DeepSpeed's model states)."""
    import torch
    from safetensors.torch import load_file

    from accel_mnist.run import checkpoint as ckpt

    last = ckpt.list_checkpoints(out)[-1]
    files = sorted(last.glob("**/*.safetensors")) or sorted(last.glob("**/*model_states.pt"))
    assert files, f"no model weights in {last}"
    if files[0].suffix == ".safetensors":
        return load_file(files[0])
    # DeepSpeed's model-states file holds the module's weights beside DeepSpeed's own objects.
    return torch.load(files[0], map_location="cpu", weights_only=False)["module"]


# --------------------------------------------------------------------------- processes


def kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants at once, as a job scheduler's kill would.

    torchrun starts each worker in a session of its own, so killing the launcher's process
    group would leave the workers running.
    """
    parents = {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        parents[int(p)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, frontier = {pid}, [pid]
    while frontier:
        children = [c for c, parent in parents.items() if parent == frontier[-1]]
        frontier.pop()
        tree.update(children)
        frontier.extend(children)
    for p in tree:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def find_rank(launcher_pid: int, rank: int) -> int:
    """The pid of the launcher's worker with RANK=`rank` (workers have sessions of their own)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) != launcher_pid:
                continue
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except (OSError, ProcessLookupError):
            continue
        if f"RANK={rank}".encode() in environ and b"LOCAL_RANK=" + str(rank).encode() in environ:
            return int(pid)
    raise AssertionError(f"no worker with RANK={rank}")


# --------------------------------------------------------------------------- hostile inputs


def gzip_bomb(path, header_dims, data_bytes, inflated_gib):
    """A gzip of an IDX header (uint8, `header_dims`) and `data_bytes` zeros, followed by
    members of zeros that inflate to `inflated_gib` GiB (gzip readers join members)."""
    header = bytes([0, 0, 0x08, len(header_dims)]) + b"".join(d.to_bytes(4, "big") for d in header_dims)
    member = gzip.compress(bytes(64 << 20), compresslevel=9)  # 64 MiB -> 65 KB
    with open(path, "wb") as f:
        f.write(gzip.compress(header + bytes(data_bytes)))
        for _ in range(inflated_gib * 16):
            f.write(member)
    return path


# --------------------------------------------------------------------------- the `accelerate config` wizard

DOWN, ENTER = "\x1b[B", "\r"
HIDE_CURSOR = "\x1b[?25l"


def run_wizard(answers: list[tuple[str, str]], config_file: Path) -> str:
    """Answer the real wizard's questions in order (through a pseudo-terminal); returns its transcript.

    Callers skip without pexpect (pytest.importorskip) before calling this.
    """
    import re

    import pexpect

    accelerate = str(Path(sys.executable).with_name("accelerate"))
    child = pexpect.spawn(accelerate, ["config", "--config_file", str(config_file)],
                          encoding="utf-8", timeout=60, dimensions=(50, 200))  # fmt: skip
    transcript = []
    try:
        for question, answer in answers:
            try:
                child.expect(re.escape(question))
            except (pexpect.TIMEOUT, pexpect.EOF) as exc:
                raise AssertionError(
                    f"the wizard did not ask {question!r} next ({type(exc).__name__}); its last output:\n"
                    f"{(child.before or '')[-1500:]}"
                ) from None
            transcript.append(child.before + child.after)
            if answer.endswith(ENTER):
                # A menu: it hides the cursor right before it starts reading keys in raw mode.
                child.expect_exact(HIDE_CURSOR)
            child.send(answer)
        child.expect(pexpect.EOF)
        transcript.append(child.before)
    finally:
        child.close(force=True)
    text = "".join(transcript)
    assert child.exitstatus == 0, f"wizard exited {child.exitstatus}:\n{text[-1500:]}"
    assert f"accelerate configuration saved at {config_file}" in text
    return text
