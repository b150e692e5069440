"""Launcher and accelerate-config settings are honoured or refused, never dropped in silence;
every refusal comes before the output directory exists. Here: one process (no launcher) with the
environment a launcher would give it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import run_module


def json_file(tmp_path: Path, **extra) -> str:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 2}, **extra}))
    return str(path)


REFUSALS = {
    "fp16_on_cpu": ({"ACCELERATE_MIXED_PRECISION": "fp16"}, "fp16 needs a GPU"),
    "fp8_without_backend": ({"ACCELERATE_MIXED_PRECISION": "fp8"}, "fp8 needs one of torchao, transformer_engine"),
    "deepspeed_with_cpu": ({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_USE_CPU": "true"}, "leave out --cpu"),
    "megatron": ({"ACCELERATE_USE_MEGATRON_LM": "true"}, "Megatron-LM"),
    "bad_env_grad_accum": ({"ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "two"}, "ACCELERATE_GRADIENT_ACCUMULATION"),
    "missing_ds_json": ({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_CONFIG_FILE": "nope.json"},
                        "nope.json does not exist"),
    "yaml_field_next_to_ds_json": ({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_CONFIG_FILE": "{json}",
                                    "ACCELERATE_CONFIG_DS_FIELDS": "deepspeed_config_file,zero_stage"},
                                   "sets zero_stage next to deepspeed_config_file"),
    "ds_json_auto_nobody_fills": ({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_CONFIG_FILE": "{json}"},
                                  'optimizer.params.amsgrad is "auto"'),
}  # fmt: skip


@pytest.mark.parametrize("name", list(REFUSALS))
def test_refusal_is_one_line_and_leaves_no_output_dir(name, tmp_path, mnist_dir):
    env, message = REFUSALS[name]
    bad_json = json_file(tmp_path, optimizer={"type": "Adam", "params": {"amsgrad": "auto"}})
    env = {k: v.replace("{json}", bad_json) for k, v in env.items()}
    out = tmp_path / "never" / "run"
    proc = run_module(env, out)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and message in lines[-1], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "never").exists(), "a refusal must not create the output directory"


def test_env_grad_accum_is_honoured_when_the_config_leaves_it_unset(tmp_path, mnist_dir):
    proc = run_module({"ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "3"}, tmp_path / "run")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["global_batch_size"] == 64 * 3
    assert json.loads((tmp_path / "run" / "config.json").read_text())["grad_accum"] == 3  # stored resolved
