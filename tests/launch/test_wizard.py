"""The real `accelerate config` wizard, answered through a pseudo-terminal, then a training run
with each file it wrote (accelerate 1.15).

The wizard's menus (BulletMenu) read raw keys: a digit moves the cursor to that row and Enter
("\\r") selects it; the arrow keys ("\\x1b[B" = down) work too. Free-text questions are read by
input() and answered with a line. Each scenario lists the questions in the exact order the
wizard asks them: an unexpected question leaves the wizard waiting, and the test fails on a
timeout showing the wizard's last output. Keys for a menu are sent once it has hidden the cursor,
which it does just before it starts reading them.
"""

from __future__ import annotations

import pytest
import yaml

from tests.helpers import CONFIGS, DOWN, ENTER, MNIST_DIR, accelerate_launch, real_mnist_present, run_wizard

pexpect = pytest.importorskip("pexpect")
pytestmark = pytest.mark.slow

COMMON_START = [
    ("In which compute environment are you running?", "0" + ENTER),  # This machine
]
SCENARIOS = {
    # "No distributed training", CPU only.
    "cpu": [
        *COMMON_START,
        ("Which type of machine are you using?", "0" + ENTER),
        ("Do you want to run your training on CPU only", "yes\n"),
        ("Do you wish to optimize your script with torch dynamo?", "no\n"),
        ("Do you want to use DeepSpeed?", "no\n"),
        ("Do you wish to use mixed precision?", "0" + ENTER),  # no
    ],
    # "multi-CPU" with 2 processes and no mpirun.
    "multi_cpu": [
        *COMMON_START,
        ("Which type of machine are you using?", "1" + ENTER),
        ("How many different machines will you use", "1\n"),
        ("Should distributed operations be checked while running for errors?", "no\n"),
        ("Do you want accelerate to launch mpirun?", "no\n"),
        ("Do you wish to optimize your script with torch dynamo?", "no\n"),
        ("How many processes should be used for distributed training?", "2\n"),
        ("Do you wish to use mixed precision?", "0" + ENTER),
    ],
    # "multi-GPU" (chosen with the arrow keys), then DeepSpeed ZeRO-2 on 2 processes. No GPU
    # id or NUMA question: they are not asked once DeepSpeed is on. Mixed precision "no": fp16
    # does not run on CPU.
    "zero2": [
        *COMMON_START,
        ("Which type of machine are you using?", DOWN * 4 + ENTER),
        ("How many different machines will you use", "1\n"),
        ("Should distributed operations be checked while running for errors?", "no\n"),
        ("Do you wish to optimize your script with torch dynamo?", "no\n"),
        ("Do you want to use DeepSpeed?", "yes\n"),
        ("Do you want to specify a json file to a DeepSpeed config?", "no\n"),
        ("What should be your DeepSpeed's ZeRO optimization stage?", "2" + ENTER),
        ("Where to offload optimizer states?", "0" + ENTER),  # none
        ("Where to offload parameters?", "0" + ENTER),
        ("How many gradient accumulation steps you're passing in your script?", "1\n"),
        ("Do you want to use gradient clipping?", "no\n"),
        ("Do you want to enable `deepspeed.zero.Init`", "no\n"),
        ("Do you want to enable Mixture-of-Experts training (MoE)?", "no\n"),
        ("How many GPU(s) should be used for distributed training?", "2\n"),
        ("Do you wish to use mixed precision?", "0" + ENTER),
    ],
}
# What the launch really gives (results.json), and the files' key facts.
EXPECTED = {
    # The file is exactly accelerate_configs/cpu.yaml.
    "cpu": dict(yaml={"distributed_type": "NO", "num_processes": 1, "use_cpu": True},
                run=("NO", 1, 0)),
    # MULTI_CPU with num_processes 2, but without an mpirun hostfile `accelerate launch` uses its
    # simple launcher: ONE python process, which sees world size 1 (hence multi_cpu.yaml is
    # MULTI_GPU + use_cpu, launched through torchrun). accel_mnist refuses it (run=None).
    "multi_cpu": dict(yaml={"distributed_type": "MULTI_CPU", "num_processes": 2, "use_cpu": True},
                      run=None),
    "zero2": dict(yaml={"distributed_type": "DEEPSPEED", "num_processes": 2, "use_cpu": False},
                  run=("DEEPSPEED", 2, 2)),
}  # fmt: skip
TRAIN_ARGS = ["--model", "linear", "--max-steps", "20", "--no-download"]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_wizard_config_trains(name, tmp_path):
    if not real_mnist_present():
        pytest.skip(f"real MNIST files not found at {MNIST_DIR}")
    config_file = tmp_path / f"{name}.yaml"
    run_wizard(SCENARIOS[name], config_file)
    written = yaml.safe_load(config_file.read_text())
    expected = EXPECTED[name]
    assert {k: written[k] for k in expected["yaml"]} == expected["yaml"]
    assert written["mixed_precision"] == "no"
    if name == "cpu":
        assert written == yaml.safe_load((CONFIGS / "cpu.yaml").read_text())
    if name == "zero2":
        assert written["deepspeed_config"] == {
            "gradient_accumulation_steps": 1, "offload_optimizer_device": "none", "offload_param_device": "none",
            "zero3_init_flag": False, "zero_stage": 2,
        }  # fmt: skip

    proc, results = accelerate_launch(["--config_file", str(config_file)], TRAIN_ARGS, tmp_path / "run", timeout=300)
    if expected["run"] is None:  # refused before any work, with the fix named
        assert proc.returncode != 0 and "accelerate_configs/multi_cpu.yaml" in proc.stderr, proc.stderr[-4000:]
        assert not (tmp_path / "run").exists()
        return
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (results["distributed_type"], results["num_processes"], results["zero_stage"]) == expected["run"]
    assert results["steps"] == 20 and results["global_batch_size"] == 64 * expected["run"][1]
