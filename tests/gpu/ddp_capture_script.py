"""The captured step under DDP against the eager one, from the same start on the same batches;
run by tests/gpu/test_cuda_graph.py under `torchrun --nproc_per_node 2`.

    ddp_capture_script.py OUTPUT_JSON

Each rank trains on batches of its own, so only the replayed gradient all-reduce keeps the
ranks' weights equal: rank 0 writes whether they are, bit for bit, beside how far the captured
run ended from the eager one. One batch is smaller: the eager step between replays.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root

from accel_mnist import TrainConfig  # noqa: E402
from accel_mnist.distributed.accelerator import build_accelerator
from accel_mnist.distributed.prepare import prepare  # noqa: E402
from accel_mnist.training.captured_step import build_step  # noqa: E402

STEPS, BATCH, SMALL = 20, 64, 10  # batch SMALL has half the samples


def model() -> nn.Module:
    """The same start on every rank and in both runs; BatchNorm for buffers that DDP broadcasts."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 10))


def train(accelerator, config: TrainConfig) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """The step's facts, the final parameters (flat) and the losses of one run of STEPS steps."""
    prepared, optimizer, scheduler = prepare(accelerator, config, model(), STEPS, STEPS)
    step = build_step(accelerator, config, prepared, optimizer, (BATCH, 1, 28, 28))
    prepared.train()
    gen = torch.Generator().manual_seed(100 + accelerator.process_index)  # each rank its own data
    losses = []
    for i in range(STEPS):
        n = BATCH // 2 if i == SMALL else BATCH
        inputs = torch.randn(n, 1, 28, 28, generator=gen).to(accelerator.device)
        labels = torch.randint(0, 10, (n,), generator=gen).to(accelerator.device)
        losses.append(step(inputs, labels).detach().float())
        scheduler.step()
    params = torch.cat([p.detach().float().flatten() for p in accelerator.unwrap_model(prepared).parameters()])
    return step.facts, params, torch.stack(losses)


def main() -> None:
    out = Path(sys.argv[1])
    config = TrainConfig(batch_size=BATCH, lr=1e-2, optimizer="adam", scheduler="cosine", max_steps=STEPS,
                         cuda_graph=True, output_dir=str(out.parent), quiet=True)  # fmt: skip
    accelerator = build_accelerator(config)
    try:
        facts, captured, captured_losses = train(accelerator, config)
        _, eager, eager_losses = train(accelerator, dataclasses.replace(config, cuda_graph=False))
        both = accelerator.gather(torch.stack([captured, eager])[None])  # (ranks, 2, numel)
        losses = accelerator.gather(captured_losses[None])
        if accelerator.is_main_process:
            report = {
                "facts": facts,
                "distributed_type": accelerator.distributed_type.value,
                "num_processes": accelerator.num_processes,
                "ranks_equal_captured": all(torch.equal(both[0, 0], r[0]) for r in both),
                "ranks_equal_eager": all(torch.equal(both[0, 1], r[1]) for r in both),
                "ranks_saw_other_batches": not all(torch.equal(losses[0], r) for r in losses[1:]),
                "captured_vs_eager": ((captured - eager).norm() / eager.norm()).item(),
                "losses_captured_vs_eager": ((captured_losses - eager_losses).abs() / eager_losses).max().item(),
            }
            out.write_text(json.dumps(report, indent=1))
    finally:
        accelerator.end_training()


if __name__ == "__main__":
    main()
