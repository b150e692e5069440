"""Multi-process training from a notebook (or any Python process) with accelerate's
`notebook_launcher`, here 2 CPU processes -- the same call starts one process per GPU on a
GPU machine.

    python examples/notebook_launch.py --max-steps 50

In a notebook, paste `train_fn` and the `notebook_launcher(...)` line into cells. What the
launcher needs (accelerate 1.15):
  * no Accelerator created in the notebook's own process before the call (it refuses:
    "the `Accelerator` should only be initialized inside your training function");
    importing accel_mnist is fine, training is not;
  * on GPUs, CUDA untouched in the notebook's process (the workers are forked);
  * num_processes=N: it runs torch's elastic launcher in-process with fork, which sets
    RANK/WORLD_SIZE/MASTER_ADDR for each worker. On a machine without CUDA the workers would
    each run alone; accel_mnist's distributed.strategy makes them join one gloo group (MULTI_CPU) when
    WORLD_SIZE > 1 and there is no GPU, so nothing else is needed here.
  * The function's return value is dropped by notebook_launcher: read results from the
    output directory afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from accelerate import notebook_launcher


def train_fn(max_steps: int, output_dir: str, data_dir: str | None) -> None:
    """Runs in every worker process."""
    from accel_mnist import TrainConfig, train

    train(TrainConfig(model="linear", max_steps=max_steps, eval_every=max_steps, data_dir=data_dir,
                      output_dir=output_dir, overwrite=True, quiet=True))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-steps", type=int, default=int(os.environ.get("EXAMPLE_MAX_STEPS", 100)))
    parser.add_argument("--num-processes", type=int, default=2)
    parser.add_argument("--output-dir", default="outputs/notebook_launch")
    parser.add_argument("--data-dir", default=None, help="IDX files (default: $ACCEL_MNIST_DATA_DIR, else ./data)")
    parser.add_argument("--port", default="29500", help="the processes' rendezvous port (notebook_launcher's use_port)")
    args = parser.parse_args()

    notebook_launcher(train_fn, (args.max_steps, args.output_dir, args.data_dir), num_processes=args.num_processes,
                      use_port=args.port)  # fmt: skip

    results = json.loads((Path(args.output_dir) / "results.json").read_text())
    print(f"{results['distributed_type']} on {results['num_processes']} processes: "
          f"test accuracy {results['test_accuracy']:.4f} after {results['steps']} steps")  # fmt: skip


if __name__ == "__main__":
    main()
