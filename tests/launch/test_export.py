"""Exported models of two-process runs: full fp32 weights under DDP and ZeRO-2/3, the same from
the live model and from DeepSpeed's checkpoint, and safe loading of its shards."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from accel_mnist.errors import UsageError
from accel_mnist.export.model_dir import WEIGHTS_FILE, export_from_checkpoint, load_model
from accel_mnist.models import build_model
from tests.helpers import CONFIGS, REPO, Planted, assert_one_line, assert_same_weights, launch_prefix

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
from accel_mnist.distributed.accelerator import build_accelerator

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
    cmd = launch_prefix(
        ["--config_file", str(CONFIGS / config), *(["--mixed_precision", precision] if precision else [])]
    )
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
    planted["extra"] = Planted(marker)
    torch.save(planted, shards[0])
    with pytest.raises(UsageError) as e:
        export_from_checkpoint(tmp_path / "ckpt", tmp_path / "export2")
    assert_one_line(e, "pytorch_model", "io.open", "trust_checkpoint=True")  # a Python caller: the argument
    assert not marker.exists() and not (tmp_path / "export2").exists()
    # A shard missing: DeepSpeed's loader counts them, and the error stays one line.
    shards[0].write_bytes(original)
    shards[1].unlink()
    with pytest.raises(UsageError) as e:
        export_from_checkpoint(tmp_path / "ckpt", tmp_path / "export2")
    assert_one_line(e, "pytorch_model", "incomplete")
