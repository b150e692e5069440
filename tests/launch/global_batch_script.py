"""Train with `batch_size: auto` and a global batch, the GPU's fit stubbed at 32 per process (a CPU has no
probe): run under `accelerate launch` by test_global_batch.py, so that the accumulation the plan chooses
meets DeepSpeed's and DDP's own setup.

    global_batch_script.py OUTPUT_DIR GLOBAL_BATCH
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for the tests package

from accel_mnist import TrainConfig, train  # noqa: E402
from accel_mnist.training import memory_plan  # noqa: E402
from tests.matrix_worker import small_mnist  # noqa: E402

FITS = 32


def settle(plan, numels, setup, room, samples, probe_at, agreed, most):
    """What the GPU's probe would settle: FITS per process fit."""
    return plan, FITS, f"batch size auto: {FITS} per process (stubbed)"


def main() -> None:
    out, global_batch = sys.argv[1], int(sys.argv[2])
    data_dir = small_mnist(Path(out).with_name("mnist"))  # 640 synthetic training images, read as mnist
    memory_plan.settle_auto_batch = settle  # the project's own module: a CPU has no GPU to probe
    config = TrainConfig(model="mlp", batch_size="auto", global_batch_size=global_batch, max_steps=4,  # type: ignore[arg-type]
                         eval_every=4, data_dir=data_dir, download=False, quiet=True, plots=False,
                         export=False, output_dir=out)  # fmt: skip
    train(config)


if __name__ == "__main__":
    main()
