"""What more than one test file uses: paths, the real and the synthetic MNIST files, the commands
the tests run, and the pieces a test split over tiers shares between them.

Imported as `tests.helpers` (tests/ is a package, so that files of one name can live in several
tiers). Fixtures and hooks live in conftest.py. Heavy or optional modules are imported inside
the functions that need them: conftest.py imports this module in every session.
"""

from __future__ import annotations

import dataclasses
import gc
import gzip
import json
import os
import pickle
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from accel_mnist.run.checkpoint import STATE_FILE, checkpoint_dir

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "accelerate_configs"

# The real MNIST files beside the checkout; ACCEL_MNIST_DATA_DIR where they lie elsewhere (the
# GPU machine, where the checkout travels without ../shared).
MNIST_DIR = Path(os.environ.get("ACCEL_MNIST_DATA_DIR") or REPO.parent / "shared" / "data" / "mnist")


def real_mnist_present() -> bool:
    """Whether the real MNIST files are at MNIST_DIR: the folder alone is not enough (a run that
    tried to download into it leaves it empty)."""
    return (MNIST_DIR / "train-images-idx3-ubyte.gz").is_file()


# metrics.jsonl keys that measure time (and the memory peaks, which move alike from run to run):
# left out wherever two runs' metrics are compared.
TIMING_KEYS = frozenset(
    {"samples_per_second", "train_seconds", "warmup_seconds", "steady_samples_per_second", "peak_allocated_bytes",
     "peak_rss_bytes"}
)  # fmt: skip


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


def random_images(n: int, seed: int = 0):
    """`n` uniformly random uint8 28x28 image tensors and int64 labels 0..9 (torch tensors)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 28, 28), dtype=torch.uint8, generator=g)
    labels = torch.randint(0, 10, (n,), dtype=torch.int64, generator=g)
    return images, labels


def equal_to_image_tensor_dataset(device: str, normalise_once: bool, n: int = 50) -> None:
    """DeviceLoader on `device` gives, bit for bit, the samples of ImageTensorDataset on the CPU."""
    import torch

    from accel_mnist.data.catalog import DATASETS, ImageTensorDataset
    from accel_mnist.data.device_loader import DeviceLoader

    mean, std = DATASETS["mnist"].mean, DATASETS["mnist"].std
    images, labels = random_images(n)
    dataset = ImageTensorDataset(images, labels, mean, std)  # on the CPU, with Python scalars
    dl = DeviceLoader(images, labels, mean, std, 16, shuffle=False, device=device, normalise_once=normalise_once,
                      register_with_accelerate=False)  # fmt: skip
    x = torch.cat([x for x, _ in dl]).cpu()
    y = torch.cat([y for _, y in dl]).cpu()
    assert x.shape == (n, 1, 28, 28) and x.dtype == torch.float32
    for i in range(n):
        xi, yi = dataset[i]
        assert torch.equal(x[i], xi) and y[i] == yi  # bit for bit


# --------------------------------------------------------------------------- commands


def console_script(name: str) -> str:
    """A console script (deepspeed, torchrun, accelerate) of this interpreter's environment, else the one
    on PATH: a GPU machine may have the package installed to another prefix than the interpreter's."""
    beside = Path(sys.executable).with_name(name)
    return str(beside) if beside.exists() else shutil.which(name) or str(beside)


def run_command(
    cmd: list[str], *, env: dict | None = None, timeout: int = 600, unset: Sequence[str] = ()
) -> subprocess.CompletedProcess:
    """Run `cmd` from the repo root with the real MNIST files and one thread per process (`unset`: variables
    of this process's environment left out of the command's)."""
    full_env = {**os.environ, "ACCEL_MNIST_DATA_DIR": str(MNIST_DIR), "OMP_NUM_THREADS": "1", **(env or {})}
    full_env = {name: value for name, value in full_env.items() if name not in unset}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=REPO)


def launch_prefix(launch: list[str]) -> list[str]:
    """`accelerate launch LAUNCH`, on a port the OS picks unless LAUNCH names one: launches that run side by
    side (make test's two workers) would otherwise both take 29500, which accelerate's DeepSpeed path does
    not check before torchrun binds it."""
    port = [] if "--main_process_port" in launch else ["--main_process_port", "0"]
    return [str(Path(sys.executable).with_name("accelerate")), "launch", *launch, *port]


def run_accel_mnist(*args: str, launch: list[str] | None = None, env: dict | None = None, timeout: int = 600):
    """`python -m accel_mnist ARGS`, or `accelerate launch LAUNCH -m accel_mnist ARGS`, as run_command runs it."""
    prefix = launch_prefix(launch) if launch else [sys.executable]
    return run_command([*prefix, "-m", "accel_mnist", *args], env=env, timeout=timeout)


def run_example(script: str, *args: str, timeout: int = 300) -> str:
    """Run examples/SCRIPT as a user would; returns its stdout."""
    proc = run_command([sys.executable, str(REPO / "examples" / script), *args], timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def accelerate_launch_cmd(launch_args: list[str], train_args: list[str], output_dir) -> list[str]:
    """`accelerate launch <launch_args> -m accel_mnist train <train_args> --output-dir OUTPUT_DIR --quiet`."""
    return [*launch_prefix(launch_args), "-m", "accel_mnist", "train",
            *train_args, "--output-dir", str(output_dir), "--quiet"]  # fmt: skip


def accelerate_launch(launch_args, train_args, output_dir, *, env=None, timeout=600):
    """Run `accelerate launch <launch_args> -m accel_mnist train <train_args>` in a subprocess.

    Returns (CompletedProcess, results dict or None). On CPU the DeepSpeed configs need
    `--mixed_precision no` among launch_args (fp16 does not run on CPU).
    """
    cmd = accelerate_launch_cmd(launch_args, train_args, output_dir)
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


def freeze_imported_heap() -> None:
    """Move every object alive now out of the cyclic collector's reach (gc.freeze), after one last
    collection. Each train() ends with Accelerator.free_memory's full gc.collect, which otherwise walks
    the whole heap of torch, DeepSpeed and their imports again: 0.26 s a run here. Called once the heavy
    imports are done; what later runs leave is still collected."""
    gc.collect()
    gc.freeze()


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


class Planted:
    """Unpickling this creates `marker`: what a hostile file could do instead, and the proof that
    a loader executed the pickle."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def plant(file: Path, marker: Path, *, bare: bool = False) -> None:
    """Replace `file` by a planted pickle: torch.save's zip format, or a bare pickle."""
    import torch

    file.unlink(missing_ok=True)
    if bare:
        file.write_bytes(pickle.dumps({"state": Planted(marker)}, protocol=2))
    else:
        torch.save({"state": Planted(marker)}, file)


def snapshot(out: Path) -> dict[str, bytes]:
    """Every file of the output directory and its bytes: a refused resume may change none."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------- assertions


def assert_one_line(excinfo, *needles):
    """The raised error's message is one line and holds every needle."""
    message = str(excinfo.value)
    assert "\n" not in message, message
    for needle in needles:
        assert str(needle) in message, message


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


def assert_same_weights(a: dict, b: dict):
    """Same keys, every tensor fp32 and equal bit for bit."""
    import torch

    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype == torch.float32, key
        assert torch.equal(a[key], b[key]), key


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


# --------------------------------------------------------------------------- DeepSpeed JSONs with their own sections

DS_BASE = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "zero_optimization": {"stage": 2},
}
# torch_adam: DeepSpeed's FusedAdam would be JIT-compiled on first use (minutes on a CPU).
DS_ADAM = {"type": "Adam", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto",
                                      "torch_adam": True}}  # fmt: skip
DS_SGD = {"type": "SGD", "params": {"lr": 0.05, "momentum": "auto", "weight_decay": "auto"}}
DS_DECAY = {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
            "warmup_num_steps": 8, "warmup_type": "linear", "total_num_steps": "auto"}}  # fmt: skip


def write_ds_config(tmp_path: Path, name: str, num_processes: int, **sections) -> Path:
    """A DeepSpeed JSON (DS_BASE + sections) and a zero_file-style YAML pointing at it."""
    ds_json = tmp_path / f"{name}.json"
    ds_json.write_text(json.dumps({**DS_BASE, **sections}))
    text = (CONFIGS / "zero_file.yaml").read_text()
    text = text.replace("accelerate_configs/deepspeed_config.json", str(ds_json))
    text = text.replace("num_processes: 2", f"num_processes: {num_processes}")
    yaml_file = tmp_path / f"{name}.yaml"
    yaml_file.write_text(text)
    return yaml_file


def warmup_decay_lr(step: int, peak: float, warmup: int, total: int) -> float:
    """DeepSpeed's WarmupDecayLR (linear warmup from 0) after `step` optimizer steps, written out
    independently: the engine has stepped it `step` times from iteration -1."""
    it = step - 1
    if it < warmup:
        return peak * it / warmup
    return peak * max(0.0, (total - it) / max(1, total - warmup))


# --------------------------------------------------------------------------- launches

# The strategies' parity runs (CPU processes in tests/launch, GPUs in tests/gpu): accumulation,
# clipping and a schedule are on, so that a strategy which ignored any of them (DeepSpeed keeps
# its own copies of all three) would not match. mlp, because ZeRO-3 keeps parameters under 1e5
# elements whole on every rank (its persistence threshold): mlp's 784x512 layer is really
# partitioned, lenet5's layers are not.
PARITY_TRAIN_ARGS = [
    "--model", "mlp", "--batch-size", "32", "--grad-accum", "2", "--max-grad-norm", "0.5",
    "--scheduler", "onecycle", "--lr", "2e-3", "--max-steps", "30", "--eval-every", "15",
    "--eval-batch-size", "333", "--no-download", "--no-export", "--no-save-checkpoints",
]  # fmt: skip

# Launcher settings: a run short enough that only the settings matter.
QUICK_TRAIN_ARGS = ["--model", "linear", "--max-steps", "2", "--eval-every", "0", "--no-download", "--no-export",
                    "--no-save-checkpoints", "--eval-batch-size", "5000"]  # fmt: skip


def run_module(env: dict[str, str], out: Path, *args: str) -> subprocess.CompletedProcess:
    """`python -m accel_mnist train` (one process, no launcher) with ACCELERATE_* set as a launcher would."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    cmd = [sys.executable, "-m", "accel_mnist", "train", *QUICK_TRAIN_ARGS, "--output-dir", str(out), "--quiet", *args]
    full_env = {**clean, "ACCEL_MNIST_DATA_DIR": str(MNIST_DIR), "OMP_NUM_THREADS": "1", **env}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=full_env, cwd=REPO)


# What `accelerate config` writes for "multi-CPU", 2 processes, no mpirun: the simple launcher
# starts one process for it.
WIZARD_MULTI_CPU = """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: MULTI_CPU
downcast_bf16: 'no'
enable_cpu_affinity: false
machine_rank: 0
main_training_function: main
mixed_precision: 'no'
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: true
"""

MULTINODE = {
    "ddp": ["--config_file", str(CONFIGS / "multinode_ddp.yaml"), "--mixed_precision", "no"],
    "zero2": ["--config_file", str(CONFIGS / "multinode_zero2.yaml"), "--mixed_precision", "no"],
}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def machine_args(rank: int, port: int) -> list[str]:
    """`accelerate launch` arguments of machine `rank` of two "machines" on localhost, one process each."""
    return ["--num_machines", "2", "--machine_rank", str(rank), "--num_processes", "2",
            "--main_process_ip", "127.0.0.1", "--main_process_port", str(port)]  # fmt: skip


# --------------------------------------------------------------------------- packaging


def shipped_files() -> list[Path]:
    """The accelerate configs and recipes the package ships."""
    recipes = REPO / "recipes"
    files = sorted(p for p in CONFIGS.iterdir() if p.suffix in (".yaml", ".json"))
    if recipes.is_dir():
        files += sorted(p for p in recipes.iterdir() if p.suffix in (".yaml", ".yml"))
    return files


# --------------------------------------------------------------------------- exported models


def digit_picture(image):
    """An MNIST digit (a uint8 tensor) as people draw it: black on white, 100x80 pixels, in colour."""
    from PIL import Image

    return Image.fromarray(255 - image.numpy()).resize((100, 80), Image.Resampling.BICUBIC).convert("RGB")


def train_and_export(root: Path) -> tuple[Path, dict]:
    """(export dir, training results) of a linear model trained for 200 steps on the real MNIST files."""
    from accel_mnist import TrainConfig, train
    from accel_mnist.distributed.accelerator import build_accelerator
    from accel_mnist.export.model_dir import full_state_dict, save_exported
    from accel_mnist.models import build_model

    model = build_model("linear")
    config = TrainConfig(model="linear", data_dir=str(MNIST_DIR), download=False, max_steps=200, quiet=True,
                         output_dir=str(root / "run"), save_checkpoints=False, export=False)  # fmt: skip
    results = train(config, model=model)
    accelerator = build_accelerator(TrainConfig())
    weights = full_state_dict(accelerator, accelerator.prepare(model))
    return save_exported(weights, root / "export", model_name="linear", dataset="mnist"), results


def assert_summary(stdout: str, results) -> None:
    """`test_accuracy A test_loss L samples 10000`, A and L with 4 decimals and those of training."""
    import re

    import pytest

    found = re.fullmatch(r"test_accuracy (\d\.\d{4}) test_loss (\d+\.\d{4}) samples 10000\n", stdout)
    assert found, stdout
    # Other batch sizes may round differently in the last bit; the printed digits may follow.
    assert float(found[1]) == pytest.approx(results["test_accuracy"], abs=2e-4)
    assert float(found[2]) == pytest.approx(results["test_loss"], abs=2e-4)


ARGS = ["--model", "linear", "--max-steps", "120", "--checkpoint-every", "20", "--log-every", "5",
        "--eval-every", "60", "--no-download", "--quiet", "--no-export"]  # fmt: skip
DDP = ["--config_file", str(CONFIGS / "multi_cpu.yaml")]
ZERO2 = ["--config_file", str(CONFIGS / "zero2.yaml"), "--mixed_precision", "no"]
ENV = {**os.environ, "ACCEL_MNIST_DATA_DIR": str(MNIST_DIR), "OMP_NUM_THREADS": "1"}


# The fault tests' run: 120 linear steps, a checkpoint every 20, under a launch or `python -m`.
def command(launch: list[str] | None, out: Path, *extra: str) -> list[str]:
    train_args = ["train", *ARGS, "--output-dir", str(out), *extra]
    if launch is None:
        return [sys.executable, "-m", "accel_mnist", *train_args]
    return [*launch_prefix(launch), "-m", "accel_mnist", *train_args]


def run(cmd: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV, cwd=REPO)


def start_and_wait_for(cmd: list[str], out: Path, step: int) -> tuple[subprocess.Popen, Path]:
    """Start `cmd` in a session of its own; return once checkpoint `step` is complete."""
    log = out.with_name(out.name + ".stderr")
    with open(log, "w") as stderr:
        proc = subprocess.Popen(cmd, env=ENV, cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL,
                                stderr=stderr)  # fmt: skip
    marker = checkpoint_dir(out) / f"step_{step}" / STATE_FILE
    deadline = time.monotonic() + 300
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            kill_tree(proc.pid)
            raise AssertionError(f"no checkpoint {step}:\n{log.read_text()[-3000:]}")
        time.sleep(0.02)
    return proc, log


def same_weights(a: Path, b: Path) -> None:
    import torch

    wa, wb = final_weights(a), final_weights(b)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def launcher_exit_on(sig: signal.Signals) -> int:
    """What `accelerate launch` exits with once its workers have ended on `sig` (they exit 75).

    torchrun's agent re-raises the signal as a SignalException; accelerate 1.16 turns it into
    exit code 128 + signal, as a shell reports a signalled process, and so does its one-process
    launcher, which passes SIGTERM on to its worker; earlier versions let the SignalException end
    the launcher with a traceback and exit code 1.
    """
    import accelerate
    from packaging.version import Version

    return 128 + sig if Version(accelerate.__version__) >= Version("1.16") else 1


def preempt_and_resume(launch: list[str] | None, tmp_path: Path, sig: signal.Signals, *extra: str,
                       steps: int = 120, weights: bool = True, whole: Path | None = None) -> None:  # fmt: skip
    """The fault tests' run (`command`, `steps` steps, a checkpoint every 20) once whole (or `whole`, the
    output folder of the same command run before, as tests/shared_runs.py keeps them); again, sent
    `sig` once checkpoint 20 is complete (to the launcher, as Kubernetes does): it saves the current
    step, writes the preempted marker and exits 75 (the launcher: `launcher_exit_on`); then the same
    command with --resume-from auto ends with the whole run's metrics and (`weights`) weights."""
    from accel_mnist.run import checkpoint as ckpt
    from accel_mnist.run.outputs import PREEMPTED_FILE
    from accel_mnist.training.preemption import EXIT_PREEMPTED

    broken = tmp_path / "broken"
    if whole is None:
        whole = tmp_path / "whole"
        proc = run(command(launch, whole, *extra))
        assert proc.returncode == 0, proc.stderr[-3000:]
    proc, log = start_and_wait_for(command(launch, broken, *extra, "--resume-from", "auto"), broken, 20)
    os.kill(proc.pid, sig)
    try:
        code = proc.wait(timeout=60)
    finally:
        kill_tree(proc.pid)
    marker = json.loads((broken / PREEMPTED_FILE).read_text())
    assert 20 < marker["step"] < steps and marker["signal"] == sig.name, marker
    assert ckpt.list_checkpoints(broken)[-1].name == f"step_{marker['step']}"
    err = log.read_text()
    assert f"preempted by {sig.name} at step {marker['step']}" in err, err[-3000:]
    assert code == (EXIT_PREEMPTED if launch is None else launcher_exit_on(sig)), err[-3000:]
    proc = run(command(launch, broken, *extra, "--resume-from", "auto"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resumed from {broken / 'checkpoints' / ('step_' + str(marker['step']))}" in proc.stdout
    assert not (broken / PREEMPTED_FILE).exists()
    assert metrics_rows(broken) == metrics_rows(whole)
    if weights:
        same_weights(whole, broken)
