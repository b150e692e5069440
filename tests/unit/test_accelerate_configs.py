"""The accelerate configs in accelerate_configs/ parse, mean what their names say, and resolve
the way the README claims (accelerate 1.15 semantics), without launching anything."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
from accelerate.utils import DeepSpeedPlugin, DistributedType

from tests.helpers import CONFIGS, REPO

DS_JSON = CONFIGS / "deepspeed_config.json"


def _zero(stage: int, offload_optimizer: str = "none", offload_param: str = "none") -> dict:
    """What a shipped ZeRO YAML holds: 2 processes, fp16, GPU, the stage and its offload devices."""
    return dict(
        distributed_type=DistributedType.DEEPSPEED,
        num_processes=2,
        mixed_precision="fp16",
        use_cpu=False,
        zero_stage=stage,
        offload_optimizer_device=offload_optimizer,
        offload_param_device=offload_param,
    )


def _zero_file(json_name):
    return dict(distributed_type=DistributedType.DEEPSPEED, num_processes=2, mixed_precision=None, use_cpu=False,
                deepspeed_config_file=f"accelerate_configs/{json_name}")  # fmt: skip


# What each file must mean once accelerate has parsed it.
# zero_stage / offload are only checked for DeepSpeed files.
EXPECTED: dict[str, dict] = {
    "cpu.yaml": dict(distributed_type=DistributedType.NO, num_processes=1, mixed_precision="no", use_cpu=True),
    # MULTI_GPU on purpose: the torchrun launcher is the one that starts 2 processes (see the file's comment).
    "multi_cpu.yaml": dict(
        distributed_type=DistributedType.MULTI_GPU, num_processes=2, mixed_precision="no", use_cpu=True
    ),
    "single_gpu.yaml": dict(
        distributed_type=DistributedType.NO, num_processes=1, mixed_precision="bf16", use_cpu=False, gpu_ids="0"
    ),
    "multi_gpu.yaml": dict(
        distributed_type=DistributedType.MULTI_GPU,
        num_processes=2,
        mixed_precision="bf16",
        use_cpu=False,
        gpu_ids="all",
    ),
    "zero1.yaml": _zero(1),
    "zero2.yaml": _zero(2),
    "zero3.yaml": _zero(3),
    "zero2_offload.yaml": _zero(2, offload_optimizer="cpu"),
    "zero3_offload.yaml": _zero(3, offload_optimizer="cpu", offload_param="cpu"),
    # Precision and ZeRO settings live in the JSON; accelerate forbids them in the YAML.
    "zero_file.yaml": _zero_file("deepspeed_config.json"),
    # The same, with a JSON that has its own optimizer and scheduler sections.
    "zero_file_optim_sched.yaml": _zero_file("deepspeed_optim_sched.json"),
    # Two machines x 8 GPUs; num_processes is the total over all machines.
    "multinode_ddp.yaml": dict(
        distributed_type=DistributedType.MULTI_GPU,
        num_processes=16,
        num_machines=2,
        mixed_precision="bf16",
        use_cpu=False,
        gpu_ids="all",
    ),
    "multinode_zero2.yaml": dict(
        distributed_type=DistributedType.DEEPSPEED,
        num_processes=16,
        num_machines=2,
        mixed_precision="bf16",
        use_cpu=False,
        zero_stage=2,
        offload_optimizer_device="none",
        offload_param_device="none",
    ),
}

# FSDP: the wizard's answers for a model without transformer blocks (NO_WRAP: one FSDP unit).
for _name, _version in (("fsdp.yaml", 1), ("fsdp2.yaml", 2)):
    EXPECTED[_name] = dict(
        distributed_type=DistributedType.FSDP,
        num_processes=2,
        mixed_precision="bf16",
        use_cpu=False,
        fsdp_version=_version,
    )

# Keys `accelerate config` writes for every LOCAL_MACHINE file.
WIZARD_KEYS = {
    "compute_environment",
    "debug",
    "distributed_type",
    "downcast_bf16",
    "enable_cpu_affinity",
    "machine_rank",
    "main_training_function",
    "num_machines",
    "num_processes",
    "rdzv_backend",
    "same_network",
    "tpu_env",
    "tpu_use_cluster",
    "tpu_use_sudo",
    "use_cpu",
}

# deepspeed_config keys that accelerate rejects next to deepspeed_config_file
# (DeepSpeedPlugin._deepspeed_config_checks), plus the top-level mixed_precision.
FORBIDDEN_WITH_DS_FILE = {
    "gradient_accumulation_steps",
    "gradient_clipping",
    "zero_stage",
    "offload_optimizer_device",
    "offload_param_device",
    "offload_param_nvme_path",
    "offload_optimizer_nvme_path",
    "zero3_save_16bit_model",
}

YAML_FILES = sorted(CONFIGS.glob("*.yaml"))


@pytest.fixture
def clean_accelerate_env(monkeypatch):
    """Drop inherited ACCELERATE_* variables: DeepSpeedPlugin and the launcher read them."""
    for key in list(os.environ):
        if key.startswith("ACCELERATE_"):
            monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(REPO)  # config paths inside the YAMLs are relative to the repo root
    return monkeypatch


def test_every_expected_config_is_present():
    found = {p.name for p in YAML_FILES}
    missing = set(EXPECTED) - found
    assert not missing, f"missing accelerate configs: {sorted(missing)}"
    assert DS_JSON.is_file(), "missing accelerate_configs/deepspeed_config.json"
    assert (CONFIGS / "README.md").is_file()


@pytest.mark.parametrize("path", YAML_FILES, ids=[p.name for p in YAML_FILES])
def test_config_parses_and_matches_its_name(path: Path):
    assert path.name in EXPECTED, f"{path.name} has no expectations in this test; add it to EXPECTED"
    exp = EXPECTED[path.name]

    cfg = load_config_from_file(str(path))
    assert isinstance(cfg, ClusterConfig)
    assert cfg.distributed_type == exp["distributed_type"]
    assert cfg.num_processes == exp["num_processes"]
    assert cfg.mixed_precision == exp["mixed_precision"]
    assert cfg.use_cpu is exp["use_cpu"]
    assert cfg.num_machines == exp.get("num_machines", 1)
    assert cfg.machine_rank == 0
    if "gpu_ids" in exp:
        assert str(cfg.gpu_ids) == exp["gpu_ids"]

    # Cross-check against the file name itself, not only against the table above.
    stem = path.stem
    assert ("multinode" in stem) == (cfg.num_machines > 1)
    if "zero" in stem and not stem.startswith("zero_file"):
        assert cfg.distributed_type == DistributedType.DEEPSPEED
        ds = cfg.deepspeed_config
        assert ds["zero_stage"] == int(stem.split("zero")[1][0]) == exp["zero_stage"]
        assert ds["offload_optimizer_device"] == exp["offload_optimizer_device"]
        assert ds["offload_param_device"] == exp["offload_param_device"]
        assert (ds["offload_optimizer_device"] == "cpu") == ("offload" in stem)
        assert ds["gradient_accumulation_steps"] == 1
        # Clipping is the training config's (--max-grad-norm); a value here would be overridden.
        assert "gradient_clipping" not in ds
        assert ds["zero3_init_flag"] is False
        if ds["zero_stage"] == 3:
            assert ds["zero3_save_16bit_model"] is True
    elif stem.startswith("zero_file"):
        ds = cfg.deepspeed_config
        assert ds["deepspeed_config_file"] == exp["deepspeed_config_file"]
        assert (REPO / ds["deepspeed_config_file"]).is_file()
        assert not FORBIDDEN_WITH_DS_FILE & set(ds), "accelerate raises on these next to deepspeed_config_file"
    else:
        assert cfg.deepspeed_config == {}
        assert cfg.use_cpu == ("cpu" in stem)  # cpu / multi_cpu run on CPU, the rest on GPUs
    assert (cfg.distributed_type == DistributedType.FSDP) == stem.startswith("fsdp")
    if stem.startswith("fsdp"):
        fsdp = cfg.fsdp_config
        assert fsdp["fsdp_version"] == exp["fsdp_version"] == (2 if stem == "fsdp2" else 1)
        assert fsdp["fsdp_state_dict_type"] == "SHARDED_STATE_DICT"
        assert fsdp["fsdp_auto_wrap_policy"] == "NO_WRAP"
        assert fsdp["fsdp_offload_params"] is False
        # FSDP1-only questions are not asked (nor written) for FSDP2.
        assert ("fsdp_use_orig_params" in fsdp) == (fsdp["fsdp_version"] == 1)
    else:
        assert cfg.fsdp_config == {}


@pytest.mark.parametrize("path", YAML_FILES, ids=[p.name for p in YAML_FILES])
def test_config_is_in_wizard_shape(path: Path):
    """Exactly what ClusterConfig.to_yaml_file (i.e. `accelerate config`) would write back."""
    raw = yaml.safe_load(path.read_text())
    assert WIZARD_KEYS <= set(raw), f"missing wizard keys: {sorted(WIZARD_KEYS - set(raw))}"
    assert raw["compute_environment"] == "LOCAL_MACHINE"
    assert load_config_from_file(str(path)).to_dict() == raw


def _resolve_launch_args(config: Path, *extra: str):
    """What `accelerate launch --config_file CONFIG [extra] script.py` resolves, without launching."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    args = launch_command_parser().parse_args(["--config_file", str(config), *extra, "script.py"])
    return _validate_launch_command(args)


@pytest.mark.parametrize("path", YAML_FILES, ids=[p.name for p in YAML_FILES])
def test_launcher_reads_config(path: Path, clean_accelerate_env):
    exp = EXPECTED[path.name]
    args, _, _ = _resolve_launch_args(path)
    assert args.num_processes == exp["num_processes"]
    assert args.num_machines == exp.get("num_machines", 1)
    assert args.mixed_precision == (exp["mixed_precision"] or "no")
    assert args.use_deepspeed == (exp["distributed_type"] == DistributedType.DEEPSPEED)
    assert args.use_fsdp == (exp["distributed_type"] == DistributedType.FSDP)
    # MULTI_GPU (incl. multi_cpu.yaml) and DEEPSPEED go through torchrun; NO through the simple launcher.
    assert args.multi_gpu == (exp["distributed_type"] == DistributedType.MULTI_GPU)


@pytest.mark.parametrize("name", ["zero2.yaml", "zero3_offload.yaml", "multi_gpu.yaml", "multi_cpu.yaml"])
def test_command_line_overrides_config(name: str, clean_accelerate_env):
    """--mixed_precision / --num_processes on the command line win over the YAML (the CPU recipe)."""
    args, _, mp_from_config = _resolve_launch_args(CONFIGS / name, "--mixed_precision", "no", "--num_processes", "1")
    assert args.mixed_precision == "no"
    assert args.num_processes == 1
    assert mp_from_config is False
    # Without the flags the YAML values are used.
    args, _, mp_from_config = _resolve_launch_args(CONFIGS / name)
    assert args.num_processes == EXPECTED[name]["num_processes"]
    assert args.mixed_precision == EXPECTED[name]["mixed_precision"]
    assert mp_from_config is True


@pytest.mark.parametrize(
    "name, version, extra",
    [
        ("fsdp.yaml", 1, []),
        ("fsdp2.yaml", 2, []),
        ("fsdp.yaml", 1, ["--fsdp_use_orig_params", "false", "--fsdp_state_dict_type", "FULL_STATE_DICT"]),
        ("fsdp2.yaml", 2, ["--fsdp_offload_params", "true", "--fsdp_state_dict_type", "FULL_STATE_DICT"]),
    ],
)
def test_fsdp_yaml_reaches_the_workers_plugin(name, version, extra, clean_accelerate_env):
    """Replay what a worker sees: the launcher's environment, read back by FullyShardedDataParallelPlugin."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env
    from torch.distributed.fsdp import StateDictType

    args, _, _ = _resolve_launch_args(CONFIGS / name, *extra)
    env = prepare_multi_gpu_env(args)
    assert env["ACCELERATE_USE_FSDP"] == "true"
    for key, value in env.items():
        if key.startswith(("ACCELERATE_", "FSDP_")):
            clean_accelerate_env.setenv(key, value)
    # The launcher exports sync_module_states=true (the YAML's answer for FSDP1, its default for
    # FSDP2), and with it the plugin asks for the current GPU: there is none on this machine.
    clean_accelerate_env.setenv("FSDP_SYNC_MODULE_STATES", "false")
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == version
    full = "FULL_STATE_DICT" in extra
    assert plugin.state_dict_type == (StateDictType.FULL_STATE_DICT if full else StateDictType.SHARDED_STATE_DICT)
    assert plugin.auto_wrap_policy is None  # NO_WRAP: the root module is the one FSDP unit
    if version == 1:
        assert plugin.use_orig_params is ("false" not in extra)
    policy = plugin.cpu_offload  # FSDP1: CPUOffload(offload_params); FSDP2: CPUOffloadPolicy or OffloadPolicy
    offloads = policy.offload_params if version == 1 else type(policy).__name__ == "CPUOffloadPolicy"
    assert offloads is ("--fsdp_offload_params" in extra)


def test_deepspeed_json_template():
    cfg = json.loads(DS_JSON.read_text())
    for key in (
        "train_micro_batch_size_per_gpu",
        "train_batch_size",
        "gradient_accumulation_steps",
        "gradient_clipping",
    ):
        assert cfg[key] == "auto", key
    assert cfg["fp16"]["enabled"] == "auto"
    assert cfg["bf16"]["enabled"] == "auto"
    zero = cfg["zero_optimization"]
    assert zero["stage"] == 2
    assert zero["reduce_bucket_size"] > 0 and zero["allgather_bucket_size"] > 0


@pytest.mark.parametrize("mixed_precision", ["no", "fp16", "bf16"])
def test_deepspeed_plugin_accepts_json_template(mixed_precision: str, clean_accelerate_env):
    plugin = DeepSpeedPlugin(hf_ds_config=str(DS_JSON))
    assert plugin.zero_stage == 2
    assert plugin.hf_ds_config.is_zero2()
    assert plugin.offload_optimizer_device in (None, "none")
    plugin.set_mixed_precision(mixed_precision)  # fills the "auto" precision flags
    assert plugin.deepspeed_config["fp16"]["enabled"] is (mixed_precision == "fp16")
    assert plugin.deepspeed_config["bf16"]["enabled"] is (mixed_precision == "bf16")


def test_zero_file_yaml_is_accepted_by_deepspeed_plugin(clean_accelerate_env):
    """Replay what a launched process does with zero_file.yaml: the launcher exports the YAML's
    deepspeed_config keys (and mixed_precision if the YAML set it) as ACCELERATE_CONFIG_DS_FIELDS,
    and DeepSpeedPlugin raises if any of them conflicts with deepspeed_config_file."""
    args, defaults, mp_from_config = _resolve_launch_args(CONFIGS / "zero_file.yaml")
    fields = list(defaults.deepspeed_config) + (["mixed_precision"] if mp_from_config else [])
    clean_accelerate_env.setenv("ACCELERATE_CONFIG_DS_FIELDS", ",".join(fields))
    plugin = DeepSpeedPlugin(hf_ds_config=args.deepspeed_config_file)
    assert plugin.zero_stage == 2

    # Control: the check is real - a forbidden key next to the JSON file makes accelerate raise.
    clean_accelerate_env.setenv("ACCELERATE_CONFIG_DS_FIELDS", ",".join(fields + ["zero_stage"]))
    with pytest.raises(ValueError, match="deepspeed_config_file"):
        DeepSpeedPlugin(hf_ds_config=args.deepspeed_config_file)
