"""Device ops per training step of accel_mnist's loop (steps 20-70, linear b64, CPU).

Counts the dispatched aten ops that are not views (what would each be a kernel launch on a
GPU; the profiler's record_function markers are listed apart) with a TorchDispatchMode entered
and left from a forward pre-hook on the model, in one accel_mnist.train() run:

    PYTHONPATH=. python opcount.py accel_mnist         # this checkout
    BASE_PKG=DIR python opcount.py accel_mnist_base    # 47cc19d: its accel_mnist/ as DIR/accel_mnist_base
"""

from __future__ import annotations

import collections
import importlib
import json
import os
import sys
import tempfile

from torch.utils._python_dispatch import TorchDispatchMode

NO_KERNEL = {"detach", "alias", "view", "_unsafe_view", "unsqueeze", "split_with_sizes", "split", "slice", "select",
             "t", "expand", "as_strided", "lift_fresh", "squeeze", "permute", "transpose", "reshape", "flatten",
             "unbind", "_local_scalar_dense", "empty", "empty_strided"}  # fmt: skip
FIRST, LAST = 20, 70


class Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def main() -> None:
    sys.path.insert(0, os.environ.get("BASE_PKG", "."))
    pkg = sys.argv[1]
    loop, config, models = (importlib.import_module(f"{pkg}.{m}") for m in ("loop", "config", "models"))
    mode, seen = Count(), [0]
    net = models.build_model("linear")

    def hook(module, _inputs):
        if module.training:
            seen[0] += 1
            if seen[0] == FIRST:
                mode.__enter__()
            if seen[0] == LAST:
                mode.__exit__(None, None, None)

    net.register_forward_pre_hook(hook)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = config.TrainConfig(model="linear", batch_size=64, max_steps=100, download=False, output_dir=tmp,
                                 data_dir=os.environ.get("ACCEL_MNIST_DATA_DIR", "../shared/data/mnist"),
                                 overwrite=True, quiet=True, export=False, save_checkpoints=False, plots=False,
                                 data_loader="device", log_every=50)  # fmt: skip
        loop.train(cfg, model=net)
    steps = LAST - FIRST
    ops = {k: v / steps for k, v in mode.ops.most_common() if k not in NO_KERNEL}
    markers = sum(v for k, v in ops.items() if k.startswith("_record_function"))
    print(json.dumps({"package": pkg, "device_ops_per_step": sum(ops.values()) - markers,
                      "record_function_markers_per_step": markers, "ops": ops}))  # fmt: skip


if __name__ == "__main__":
    main()
