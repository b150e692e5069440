"""Compiled runs one after another in one process (a sweep, a notebook, the option matrix's cells): each
run's model is compiled, not only the first eight (dynamo's recompile limit)."""

from __future__ import annotations

import json
import sys

from tests.helpers import run_command

# Ten runs in a fresh process: the launch's dynamo and precision settings are read once per process
# (Accelerate's shared state), so they cannot be set for one test among others in a pytest worker.
RUNS = """
import json, sys
from accel_mnist import TrainConfig, train
from tests.your_model_data import PairDataset, splits

data = splits(10, 64, 32)
train_set, test_set = PairDataset(*data["train"]), PairDataset(*data["test"])
for run in range(10):
    config = TrainConfig(model="linear", max_steps=1, batch_size=32, eval_batch_size=32, quiet=True, plots=False,
                         export=False, save_checkpoints=False, output_dir=f"{sys.argv[1]}/run{run}")
    results = train(config, train_data=train_set, test_data=test_set)
    print(json.dumps([results["dynamo_backend"], results["mixed_precision"], results.get("compile_threads")]))
"""


def test_every_compiled_run_in_a_process_compiles_its_model(tmp_path):
    # bf16: Accelerate wraps each model's forward in autocast, and dynamo guards on that wrapper, so that
    # every new model recompiles; dynamo's eager backend traces as inductor does, without code generation.
    env = {"ACCELERATE_DYNAMO_BACKEND": "EAGER", "ACCELERATE_MIXED_PRECISION": "bf16"}
    # Inductor's compile threads: one, where the caller set none (distributed/compile_threads.py).
    proc = run_command([sys.executable, "-c", RUNS, str(tmp_path)], env=env, unset=["TORCHINDUCTOR_COMPILE_THREADS"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("[")]
    assert runs == [["eager", "bf16", "1"]] * 10, proc.stdout[-3000:]
    # Past the limit dynamo runs the model uncompiled and says so once, as a warning.
    assert "recompile_limit" not in proc.stderr, proc.stderr[-3000:]
