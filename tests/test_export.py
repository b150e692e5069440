"""Exported models: full fp32 weights under every strategy, atomic saving, safe loading, and
export from the checkpoints Accelerate and DeepSpeed write."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from accel_mnist import TrainConfig, train
from accel_mnist.data.catalog import load_split
from accel_mnist.errors import UsageError
from accel_mnist.run import checkpoint as ckpt

from accel_mnist.export.model_dir import (  # isort: skip (one line of names, kept by fmt: skip)
    CONFIG_FILE, WEIGHTS_FILE, _sha256, export_from_checkpoint, full_state_dict, load_model, save_exported,
)  # fmt: skip
from accel_mnist.distributed.strategy import build_accelerator
from accel_mnist.models import build_model
from tests.helpers import CONFIGS, MNIST_DIR, REPO


def assert_one_line(excinfo, *needles):
    message = str(excinfo.value)
    assert "\n" not in message, message
    for needle in needles:
        assert str(needle) in message, message


def assert_same_weights(a: dict, b: dict):
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype == torch.float32, key
        assert torch.equal(a[key], b[key]), key


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A linear model after 30 steps of `train`, which also checkpointed and exported it."""
    if not (MNIST_DIR / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"real MNIST files not found at {MNIST_DIR}")
    out = tmp_path_factory.mktemp("run")
    model = build_model("linear")  # passed in, so that the trained module stays in hand
    config = TrainConfig(model="linear", data_dir=str(MNIST_DIR), download=False, max_steps=30,
                         quiet=True, output_dir=str(out))  # fmt: skip
    results = train(config, model=model)
    return model, out, results


@pytest.fixture(scope="module")
def test_images():
    images, labels = load_split("mnist", MNIST_DIR, train=False, download=False)
    return ((images[:500].float() / 255 - 0.1307) / 0.3081).unsqueeze(1), labels[:500]


def test_live_export_round_trip_is_bit_exact(trained, test_images, tmp_path):
    model, _, _ = trained
    accelerator = build_accelerator(TrainConfig())
    prepared = accelerator.prepare(model)
    weights = full_state_dict(accelerator, prepared)
    assert weights.keys() == model.state_dict().keys()  # the user's keys, no wrapper prefix
    for key, value in model.state_dict().items():
        assert weights[key].device.type == "cpu" and torch.equal(weights[key], value)
        assert weights[key].data_ptr() != value.data_ptr()  # a snapshot, not the live tensor

    out = save_exported(weights, tmp_path / "export", model_name="linear", dataset="mnist", extra={"step": 30})
    config = json.loads((out / CONFIG_FILE).read_text())
    assert config == {
        "model": "linear", "dataset": "mnist", "num_classes": 10, "input_shape": [1, 28, 28],
        "mean": 0.1307, "std": 0.3081, "format_version": 1, "step": 30,
        "weights_sha256": _sha256(out / WEIGHTS_FILE),
    }  # fmt: skip
    loaded = load_model(out)
    assert not loaded.training and next(loaded.parameters()).device.type == "cpu"
    assert_same_weights(loaded.state_dict(), weights)
    x, _ = test_images
    with torch.no_grad():
        assert torch.equal(loaded(x), model.eval()(x))


def test_train_exports_and_its_checkpoint_exports_the_same(trained, tmp_path):
    model, out, _ = trained
    want = {k: v.float() for k, v in model.state_dict().items()}
    # train() exports at the end; a model passed in is recorded under its class name.
    assert json.loads((out / CONFIG_FILE).read_text())["model"] == "Linear"
    with pytest.raises(UsageError) as e:
        load_model(out)
    assert_one_line(e, CONFIG_FILE, "'Linear'", "model=")
    assert_same_weights(load_model(out, model=build_model("linear")).state_dict(), want)

    last = ckpt.list_checkpoints(out)[-1]
    exported = export_from_checkpoint(last, tmp_path / "from_checkpoint")
    config = json.loads((exported / CONFIG_FILE).read_text())
    # The checkpoint knows the model was the caller's own, as train()'s export does.
    assert config["model"] == "Linear" and config["dataset"] == "mnist" and config["step"] == 30
    assert_same_weights(load_model(exported, model=build_model("linear")).state_dict(), want)


def test_export_from_checkpoint_written_by_save_state(tmp_path):
    torch.manual_seed(0)
    accelerator = build_accelerator(TrainConfig())
    model = build_model("mlp")
    model, _ = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    accelerator.save_state(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "model.safetensors").is_file()  # accelerate 1.15's name
    config = TrainConfig(model="mlp", dataset="fashion_mnist").to_dict()
    (tmp_path / "ckpt" / "trainer_state.json").write_text(json.dumps({"config": config, "step": 7}))
    out = export_from_checkpoint(tmp_path / "ckpt", tmp_path / "export")
    exported = json.loads((out / CONFIG_FILE).read_text())
    assert (exported["model"], exported["mean"], exported["std"], exported["step"]) == ("mlp", 0.286, 0.353, 7)
    assert_same_weights(load_model(out).state_dict(), full_state_dict(accelerator, model))


@pytest.fixture
def checkpoint(tmp_path):
    """A complete non-DeepSpeed checkpoint of a linear model."""
    accelerator = build_accelerator(TrainConfig())
    accelerator.prepare(build_model("linear"))
    accelerator.save_state(tmp_path / "ckpt")
    state = {"config": TrainConfig(model="linear").to_dict(), "step": 1}
    (tmp_path / "ckpt" / "trainer_state.json").write_text(json.dumps(state))
    return tmp_path / "ckpt"


@pytest.mark.parametrize(
    "damage, needles",
    [
        (lambda c: shutil.rmtree(c), ["no such checkpoint directory"]),
        (lambda c: (c / "trainer_state.json").unlink(), ["trainer_state.json", "missing"]),
        (lambda c: (c / "trainer_state.json").write_text("{"), ["trainer_state.json", "not valid JSON"]),
        (lambda c: (c / "trainer_state.json").write_text('{"step": 1}'), ["trainer_state.json", "config"]),
        (lambda c: (c / "model.safetensors").unlink(), ["incomplete checkpoint", "model.safetensors"]),
        (lambda c: (c / "model.safetensors").write_bytes(b"\x00" * 64), ["model.safetensors", "safetensors"]),
        (lambda c: (c / "pytorch_model").mkdir(), ["pytorch_model", "_model_states.pt"]),
    ],
    ids=["no-dir", "no-state", "bad-json", "no-config", "no-weights", "garbage-weights", "empty-deepspeed-dir"],
)
def test_export_from_checkpoint_errors(checkpoint, tmp_path, damage, needles):
    damage(checkpoint)
    with pytest.raises(UsageError) as e:
        export_from_checkpoint(checkpoint, tmp_path / "export")
    assert_one_line(e, *needles)
    assert not (tmp_path / "export").exists()


def test_export_from_checkpoint_checks_the_model_name_against_the_weights(checkpoint, tmp_path):
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    state["config"]["model"] = "cnn"
    (checkpoint / "trainer_state.json").write_text(json.dumps(state))
    with pytest.raises(UsageError) as e:
        export_from_checkpoint(checkpoint, tmp_path / "export")
    assert_one_line(e, "'cnn'", "fc.weight")
    # A user-defined model is recorded by its class name at the top level; weights still export.
    state["model"] = "MyNet"
    (checkpoint / "trainer_state.json").write_text(json.dumps(state))
    out = export_from_checkpoint(checkpoint, tmp_path / "export")
    assert json.loads((out / CONFIG_FILE).read_text())["model"] == "MyNet"
    assert load_model(out, model=build_model("linear"))


def linear_weights():
    return {k: v.clone() for k, v in build_model("linear").state_dict().items()}


def test_save_exported_constants_for_hf_datasets(tmp_path):
    out = save_exported(linear_weights(), tmp_path / "a", model_name="linear", dataset="hf:ylecun/mnist")
    config = json.loads((out / CONFIG_FILE).read_text())
    assert (config["mean"], config["std"]) == (0.1307, 0.3081)
    extra = {"mean": 0.5, "std": 0.25}
    out = save_exported(linear_weights(), tmp_path / "b", model_name="linear", dataset="hf:x", extra=extra)
    config = json.loads((out / CONFIG_FILE).read_text())
    assert (config["mean"], config["std"]) == (0.5, 0.25)
    with pytest.raises(UsageError) as e:
        save_exported(linear_weights(), tmp_path / "c", model_name="linear", dataset="cifar")
    assert_one_line(e, "cifar")


def test_save_exported_is_atomic(tmp_path, monkeypatch):
    import safetensors.torch

    def crash(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(safetensors.torch, "save_file", crash)
    with pytest.raises(RuntimeError):
        save_exported(linear_weights(), tmp_path / "export", model_name="linear", dataset="mnist")
    assert list(tmp_path.iterdir()) == []  # neither the export nor a temporary directory


def test_save_exported_into_a_used_directory_replaces_only_its_files(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.json").write_text("{}")
    first, second = linear_weights(), linear_weights()
    save_exported(first, out, model_name="linear", dataset="mnist")
    save_exported(second, out, model_name="linear", dataset="mnist")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert sorted(p.name for p in out.iterdir()) == [WEIGHTS_FILE, CONFIG_FILE, "results.json"]
    assert_same_weights(load_model(out).state_dict(), second)


def test_load_model_refuses_weights_from_another_export(tmp_path):
    """What a crash between replacing the two files of an existing export would leave."""
    a = save_exported(linear_weights(), tmp_path / "a", model_name="linear", dataset="mnist")
    b = save_exported(linear_weights(), tmp_path / "b", model_name="linear", dataset="mnist")
    shutil.copy(b / WEIGHTS_FILE, a / WEIGHTS_FILE)
    with pytest.raises(UsageError) as e:
        load_model(a)
    assert_one_line(e, WEIGHTS_FILE, "sha256")


class _Marker:
    """Unpickling this creates a file: proof that a loader executed the pickle."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _set_weights_file(export: Path, data: bytes) -> None:
    # Re-vouch for the planted file, so that it reaches the safetensors parser.
    (export / WEIGHTS_FILE).write_bytes(data)
    config = json.loads((export / CONFIG_FILE).read_text())
    config["weights_sha256"] = _sha256(export / WEIGHTS_FILE)
    (export / CONFIG_FILE).write_text(json.dumps(config))


def _edit_config(export: Path, **changes) -> None:
    config = json.loads((export / CONFIG_FILE).read_text())
    config.update(changes)
    (export / CONFIG_FILE).write_text(json.dumps(config))


@pytest.mark.parametrize(
    "damage, needles",
    [
        (lambda e: shutil.rmtree(e), ["no such exported model directory"]),
        (lambda e: (e / CONFIG_FILE).unlink(), [CONFIG_FILE, "missing"]),
        (lambda e: (e / CONFIG_FILE).write_text("{not json"), [CONFIG_FILE, "not valid JSON"]),
        (lambda e: (e / CONFIG_FILE).write_text("[1, 2]"), [CONFIG_FILE, "JSON object"]),
        (lambda e: _edit_config(e, format_version=2), [CONFIG_FILE, "format_version"]),
        (lambda e: _edit_config(e, model="resnet"), [CONFIG_FILE, "'resnet'", "registry"]),
        (lambda e: _edit_config(e, model="mlp"), [WEIGHTS_FILE, "'mlp'", "net.0.weight"]),
        (lambda e: (e / WEIGHTS_FILE).unlink(), [WEIGHTS_FILE, "missing"]),
        (lambda e: _set_weights_file(e, os.urandom(256)), [WEIGHTS_FILE, "not a valid safetensors"]),
        (lambda e: _set_weights_file(e, b""), [WEIGHTS_FILE, "not a valid safetensors"]),
    ],
    ids=["no-dir", "no-config", "bad-json", "not-object", "version", "unknown-model", "wrong-model",
         "no-weights", "garbage", "empty"],
)  # fmt: skip
def test_load_model_errors(tmp_path, damage, needles):
    export = save_exported(linear_weights(), tmp_path / "export", model_name="linear", dataset="mnist")
    damage(export)
    with pytest.raises(UsageError) as e:
        load_model(export)
    assert_one_line(e, *needles)


@pytest.mark.parametrize("save", [pickle.dumps, lambda obj: _torch_save_bytes(obj)], ids=["pickle", "torch.save"])
def test_load_model_never_unpickles(tmp_path, save):
    export = save_exported(linear_weights(), tmp_path / "export", model_name="linear", dataset="mnist")
    marker = tmp_path / "executed"
    _set_weights_file(export, save({"fc.weight": _Marker(marker)}))
    with pytest.raises(UsageError) as e:
        load_model(export)
    assert_one_line(e, WEIGHTS_FILE, "not a valid safetensors")
    assert not marker.exists()


def _torch_save_bytes(obj) -> bytes:
    import io

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


class TiedNet(nn.Module):
    """Tied weights and a buffer: the keys of state_dict() that an export must keep."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.b.weight = self.a.weight
        self.register_buffer("count", torch.tensor(3))
        self.register_buffer("scratch", torch.zeros(2), persistent=False)


def test_tied_weights_and_buffers(tmp_path):
    accelerator = build_accelerator(TrainConfig())
    weights = full_state_dict(accelerator, accelerator.prepare(TiedNet()))
    assert weights.keys() == TiedNet().state_dict().keys() and weights["count"].dtype == torch.int64
    out = save_exported(weights, tmp_path / "tied", model_name="TiedNet", dataset="mnist")
    loaded = load_model(out, model=TiedNet())
    assert loaded.b.weight is loaded.a.weight and torch.equal(loaded.a.weight, weights["a.weight"])


# A 2-process launch: train two steps, save_state, and export the live weights. On CPU,
# build_accelerator puts the processes in one gloo group. A persistence threshold of 0 makes
# ZeRO-3 partition even this small model's parameters (by default it keeps them whole).
LAUNCH_SCRIPT = """
import json, sys
from pathlib import Path
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from accel_mnist.config import TrainConfig
from accel_mnist.export.model_dir import full_state_dict, save_exported
from accel_mnist.models import build_model
from accel_mnist.distributed.strategy import build_accelerator

out = Path(sys.argv[1])
config = TrainConfig(model="linear", batch_size=8, output_dir=str(out))
accelerator = build_accelerator(config)
plugin = accelerator.state.deepspeed_plugin
if plugin is not None:
    plugin.deepspeed_config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
torch.manual_seed(0)
model = build_model("linear")
if "--extras" in sys.argv:  # a buffer and a frozen parameter, which the ZeRO optimizer does not hold
    model.register_buffer("scale", torch.full((3,), 2.0))
    model.fc.bias.requires_grad_(False)
optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(64, 1, 28, 28, generator=g), torch.randint(0, 10, (64,), generator=g))
model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=8))
dtype = next(model.parameters()).dtype
for _, (x, y) in zip(range(2), loader):
    accelerator.backward(F.cross_entropy(model(x.to(dtype)).float(), y))
    optimizer.step()
    optimizer.zero_grad()
accelerator.save_state(out / "ckpt")
weights = full_state_dict(accelerator, model)
if accelerator.is_main_process:
    state = {"config": config.to_dict(), "step": 2, "model": "LinearWithExtras" if "--extras" in sys.argv else "linear"}
    (out / "ckpt" / "trainer_state.json").write_text(json.dumps(state))
    save_exported(weights, out / "live", model_name="linear", dataset="mnist")
    local = [p.data.numel() for p in accelerator.unwrap_model(model).parameters()]
    (out / "info.json").write_text(json.dumps({"dtype": str(dtype), "local_numel": local}))
accelerator.wait_for_everyone()
model, optimizer, loader = accelerator.free_memory(model, optimizer, loader)  # see loop.py: gloo exit abort
accelerator.end_training()
"""


def linear_with_extras() -> nn.Module:
    model = build_model("linear")
    model.register_buffer("scale", torch.full((3,), 2.0))
    return model


@pytest.mark.slow
@pytest.mark.parametrize(
    "config, precision, extras",
    [("zero3.yaml", "no", False), ("zero3.yaml", "bf16", True), ("zero2.yaml", "bf16", True),
     ("multi_cpu.yaml", None, False)],
    ids=["zero3", "zero3-bf16-frozen-buffer", "zero2-bf16-frozen-buffer", "ddp"],
)  # fmt: skip
def test_two_process_export_matches_checkpoint_export(tmp_path, config, precision, extras):
    script = tmp_path / "run.py"
    script.write_text(LAUNCH_SCRIPT)
    accelerate = Path(sys.executable).with_name("accelerate")
    cmd = [str(accelerate), "launch", "--config_file", str(CONFIGS / config)]
    cmd += ["--mixed_precision", precision] if precision else []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = [str(script), str(tmp_path)] + (["--extras"] if extras else [])
    proc = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    info = json.loads((tmp_path / "info.json").read_text())
    if config == "zero3.yaml":
        assert info["local_numel"] == [0, 0]  # the parameters really were partitioned
    assert info["dtype"] == {"no": "torch.float32", "bf16": "torch.bfloat16", None: "torch.float32"}[precision]

    live = load_file(tmp_path / "live" / WEIGHTS_FILE)
    out = export_from_checkpoint(tmp_path / "ckpt", tmp_path / "export")
    assert_same_weights(load_file(out / WEIGHTS_FILE), live)
    if precision == "bf16":
        # The fp32 master weights, not the bf16 copies the engine computes with.
        assert (live["fc.weight"] != live["fc.weight"].bfloat16().float()).any()
    if extras:
        assert torch.equal(live["scale"], torch.full((3,), 2.0))
        torch.manual_seed(0)  # the script's initialisation: the frozen bias kept its value, rounded to bf16
        assert torch.equal(live["fc.bias"], build_model("linear").fc.bias.detach().bfloat16().float())
    # In this plain process (no DeepSpeed engine, no process group) the export loads.
    model = load_model(out, model=linear_with_extras()) if extras else load_model(out)
    assert not torch.distributed.is_initialized()
    assert_same_weights(model.state_dict(), live)

    if config == "multi_cpu.yaml":
        return
    shards = sorted((tmp_path / "ckpt" / "pytorch_model").glob("*_optim_states.pt"))
    assert len(shards) == 2
    # A shard that would run code when unpickled: refused unless the checkpoint is trusted.
    marker, original = tmp_path / "executed", shards[0].read_bytes()
    planted = torch.load(shards[0], map_location="cpu", weights_only=False)
    planted["extra"] = _Marker(marker)
    torch.save(planted, shards[0])
    with pytest.raises(UsageError) as e:
        export_from_checkpoint(tmp_path / "ckpt", tmp_path / "export2")
    assert_one_line(e, "pytorch_model", "io.open", "--trust-checkpoint")
    assert not marker.exists() and not (tmp_path / "export2").exists()
    # A shard missing: DeepSpeed's loader counts them, and the error stays one line.
    shards[0].write_bytes(original)
    shards[1].unlink()
    with pytest.raises(UsageError) as e:
        export_from_checkpoint(tmp_path / "ckpt", tmp_path / "export2")
    assert_one_line(e, "pytorch_model", "incomplete")


@pytest.mark.parametrize(
    "content, message",
    [(b" " * (1 << 20) + b"{}", "larger than 1048576 bytes"), (b"{", "not valid JSON"),
     (b"\xff\xfe", "not valid JSON"), (b"[1]", "expected a JSON object, got list")],
)  # fmt: skip
def test_json_from_others_is_bounded_and_checked(tmp_path, content, message):
    from accel_mnist.errors import UsageError
    from accel_mnist.files import read_json_object

    (tmp_path / "config.json").write_bytes(content)
    with pytest.raises(UsageError, match=f"^x: {message}"):
        read_json_object(tmp_path / "config.json", "x")


def test_a_run_without_deepspeed_does_not_import_it(mnist_dir, tmp_path):
    """accelerate's unwrap_model imports deepspeed (about 1 s) wherever it is installed; the
    export of a one-process run gets its module without it."""
    import subprocess
    import sys

    code = (
        "import sys; from accel_mnist import TrainConfig, train; "
        f"train(TrainConfig(model='linear', max_steps=2, data_dir={str(mnist_dir)!r}, output_dir={str(tmp_path)!r}, "
        "quiet=True, plots=False)); print('deepspeed' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split()[-1] == "False" and (tmp_path / "model.safetensors").is_file()
