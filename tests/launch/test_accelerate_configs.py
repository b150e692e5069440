"""The accelerate configs in accelerate_configs/ launch the way the README claims (accelerate 1.15
semantics): multi_cpu.yaml starts two CPU processes, and the caveats that shaped it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.helpers import CONFIGS, REPO


def _accelerate_bin() -> str:
    exe = Path(sys.executable).with_name("accelerate")
    return str(exe) if exe.exists() else (shutil.which("accelerate") or "accelerate")


def _launch_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    env.update(extra)
    return env


RANK_SCRIPT = textwrap.dedent(
    """
    import os, sys, torch
    from accelerate import Accelerator
    use_cpu_arg = sys.argv[2] == "cpu"
    acc = Accelerator(cpu=True) if use_cpu_arg else Accelerator()
    rank, world = acc.process_index, acc.num_processes
    out = os.path.join(sys.argv[1], f"pid{os.getpid()}.txt")
    with open(out, "w") as f:
        f.write(f"{rank} {world} {acc.distributed_type.value}")
    """
)


def _launch_rank_script(tmp_path: Path, config: Path, mode: str, env: dict[str, str]) -> list[str]:
    script = tmp_path / "ranks.py"
    script.write_text(RANK_SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    cmd = [
        _accelerate_bin(),
        "launch",
        "--config_file",
        str(config),
        "--main_process_port",
        "0",
        str(script),
        str(out),
        mode,
    ]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return sorted(p.read_text() for p in out.glob("pid*.txt"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode,extra_env",
    [("cpu", {}), ("plain", {"ACCELERATE_USE_CPU": "true"})],
    ids=["script-passes-cpu=True", "env-ACCELERATE_USE_CPU"],
)
def test_multi_cpu_yaml_starts_two_cpu_processes(tmp_path, mode, extra_env):
    results = _launch_rank_script(tmp_path, CONFIGS / "multi_cpu.yaml", mode, _launch_env(**extra_env))
    assert results == ["0 2 MULTI_CPU", "1 2 MULTI_CPU"]


@pytest.mark.slow
def test_multi_cpu_yaml_caveats(tmp_path):
    """Pins the accelerate 1.15 behaviour that shaped multi_cpu.yaml (see its header comment).
    If this fails after an accelerate upgrade, re-check the comment and the README."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("caveats are about CPU-only machines")
    env = _launch_env()
    # 1. A plain Accelerator() under the torchrun path, without ACCELERATE_USE_CPU: two processes
    #    start, but each falls back to a non-distributed world of size 1.
    (tmp_path / "a").mkdir()
    results = _launch_rank_script(tmp_path / "a", CONFIGS / "multi_cpu.yaml", "plain", env)
    assert results == ["0 1 NO", "0 1 NO"]
    # 2. The "obvious" MULTI_CPU shape starts only one process (no mpirun hostfile configured).
    obvious = tmp_path / "obvious_multi_cpu.yaml"
    raw = yaml.safe_load((CONFIGS / "multi_cpu.yaml").read_text())
    raw["distributed_type"] = "MULTI_CPU"
    obvious.write_text(yaml.safe_dump(raw))
    (tmp_path / "b").mkdir()
    results = _launch_rank_script(tmp_path / "b", obvious, "cpu", env)
    assert results == ["0 1 NO"]
