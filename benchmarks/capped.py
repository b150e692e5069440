r"""Run an `accel-mnist` command with this process's GPU memory capped, for out-of-memory checks.

    accelerate launch --config_file accelerate_configs/single_gpu.yaml --num_processes 1 \
        -m benchmarks.capped --cap-gib 2 train --model bncnn --batch-size 16384 ...

`torch.cuda.set_per_process_memory_fraction` makes the caching allocator raise a real CUDA
out-of-memory error past the cap, so that a GPU of 141 GB can stand in for a small one; the
command after the cap is accel_mnist's CLI as `accel-mnist` runs it, its exit code this one's.
"""

from __future__ import annotations

import sys


def cap(gib: float) -> None:
    """Cap this process's CUDA allocator at `gib` GiB on the current device."""
    import torch

    from accel_mnist.memory.allocator import default_settings

    default_settings()  # what a run asks of the allocator, before capping starts CUDA
    device = torch.cuda.current_device()
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, gib * (1 << 30) / total), device)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] != "--cap-gib":
        raise SystemExit("usage: python -m benchmarks.capped --cap-gib GIB <accel-mnist command and flags>")
    cap(float(args[1]))
    from accel_mnist.cli import main as cli

    return cli(args[2:])


if __name__ == "__main__":
    raise SystemExit(main())
