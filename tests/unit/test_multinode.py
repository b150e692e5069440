"""Two "machines" on localhost, as `accelerate launch --num_machines 2 --machine_rank R` resolves
them (what examples/slurm_multinode.sbatch runs on a real cluster, one launch per node)."""

from __future__ import annotations

import os

import pytest

from tests.helpers import MULTINODE, free_port, machine_args


def _resolve(config: str, *extra: str):
    """The torchrun arguments `accelerate launch` would use, without launching."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    args = launch_command_parser().parse_args(["--config_file", config, *extra, "script.py"])
    args, _, _ = _validate_launch_command(args)
    if args.use_deepspeed:
        args.deepspeed_fields_from_accelerate_config = ""  # launch_command sets it before this call
        cmd, _ = prepare_deepspeed_cmd_env(args)
        assert cmd is None  # "standard": torchrun on every machine, not the pdsh `deepspeed` command
    else:
        prepare_multi_gpu_env(args)
    return args


@pytest.mark.parametrize("name", sorted(MULTINODE))
def test_launcher_resolves_a_static_two_node_rendezvous(name, monkeypatch):
    for key in list(os.environ):
        if key.startswith("ACCELERATE_"):
            monkeypatch.delenv(key)
    config = MULTINODE[name][1]
    port = free_port()
    for rank in (0, 1):
        args = _resolve(config, *machine_args(rank, port), "--mixed_precision", "no")
        assert (args.nnodes, args.node_rank, args.nproc_per_node) == ("2", rank, "1")
        assert args.rdzv_backend == "static"
        # accelerate 1.15 never reads `same_network: true` from the file (`--same_network` is a
        # store_true flag defaulting to False, and file values fill only None arguments), so the
        # launch takes the other branch: torchrun --rdzv_endpoint IP:PORT. With the static backend
        # that is the same rendezvous as --master_addr/--master_port (torch's get_rdzv_endpoint).
        assert args.same_network is False and args.rdzv_endpoint == f"127.0.0.1:{port}"
        assert not hasattr(args, "master_addr")
        args = _resolve(config, *machine_args(rank, port), "--mixed_precision", "no", "--same_network")
        assert (args.master_addr, args.master_port) == ("127.0.0.1", str(port))
    # Without the flags the file's placeholders are used: 16 processes, 8 per machine. (Rank 1:
    # only machine 0 checks that the port is free, and 29500 may be busy here.)
    args = _resolve(config, "--mixed_precision", "no", "--machine_rank", "1")
    assert (args.num_machines, args.num_processes, args.nproc_per_node) == (2, 16, "8")
    assert (args.main_process_ip, args.main_process_port) == ("MAIN_NODE_IP", 29500)
