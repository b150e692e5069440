"""fsdp.yaml and fsdp2.yaml are what the real `accelerate config` wizard (accelerate 1.15) writes
for their answers."""

from __future__ import annotations

import pytest
import yaml

from tests.helpers import CONFIGS, run_wizard

# The wizard's questions for FSDP, in the order accelerate 1.15 asks them (This machine ->
# multi-GPU -> FSDP), with the answers that fsdp.yaml / fsdp2.yaml hold.
_FSDP_START = [
    ("In which compute environment are you running?", "0\r"),  # This machine
    ("Which type of machine are you using?", "\x1b[B" * 4 + "\r"),  # multi-GPU
    ("How many different machines will you use", "1\n"),
    ("Should distributed operations be checked while running for errors?", "no\n"),
    ("Do you wish to optimize your script with torch dynamo?", "no\n"),
    ("Do you want to use DeepSpeed?", "no\n"),
    ("Do you want to use FullyShardedDataParallel?", "yes\n"),
]
FSDP_WIZARD = {
    "fsdp.yaml": [
        *_FSDP_START,
        ("What should be your FSDP version?", "0\r"),  # 1
        ("What should be your sharding strategy?", "0\r"),  # FULL_SHARD
        ("Do you want to offload parameters and gradients to CPU?", "no\n"),
        ("What should be your auto wrap policy?", "2\r"),  # NO_WRAP
        ("What should be your FSDP's backward prefetch policy?", "0\r"),  # BACKWARD_PRE
        ("What should be your FSDP's state dict type?", "2\r"),  # SHARDED_STATE_DICT
        ("Do you want to enable FSDP's forward prefetch policy?", "no\n"),
        ("Do you want to enable FSDP's `use_orig_params` feature?", "yes\n"),
        ("Do you want to enable CPU RAM efficient model loading?", "no\n"),
        ("Do you want each individually wrapped FSDP unit to broadcast module parameters", "yes\n"),
        ("Do you want to enable FSDP activation checkpointing?", "no\n"),
        ("How many GPU(s) should be used for distributed training?", "2\n"),
        ("Do you wish to use mixed precision?", "2\r"),  # bf16
    ],
    "fsdp2.yaml": [
        *_FSDP_START,
        ("What should be your FSDP version?", "1\r"),  # 2
        ("Do you want to enable resharding after forward?", "yes\n"),
        ("Do you want to offload parameters and gradients to CPU?", "no\n"),
        ("What should be your auto wrap policy?", "2\r"),  # NO_WRAP
        ("What should be your FSDP's state dict type?", "0\r"),  # SHARDED_STATE_DICT
        ("Do you want to enable CPU RAM efficient model loading?", "no\n"),
        ("Do you want to enable FSDP activation checkpointing?", "no\n"),
        ("Do you want to use the parallelism config?", "no\n"),
        ("How many GPU(s) should be used for distributed training?", "2\n"),
        ("Do you wish to use mixed precision?", "2\r"),  # bf16
    ],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FSDP_WIZARD))
def test_fsdp_yaml_is_what_the_wizard_writes(name, tmp_path):
    pytest.importorskip("pexpect")
    written = tmp_path / name
    run_wizard(FSDP_WIZARD[name], written)
    assert yaml.safe_load(written.read_text()) == yaml.safe_load((CONFIGS / name).read_text())
