"""Compiled runs one after another in one process (a sweep, a notebook, the option matrix's cells): each
run's model is compiled, not only the first eight (dynamo's recompile limit)."""

from __future__ import annotations

import logging

from accel_mnist import TrainConfig, train
from tests.your_model_data import PairDataset, splits


def test_every_compiled_run_in_a_process_compiles_its_model(tmp_path, monkeypatch, caplog):
    # bf16: Accelerate wraps each model's forward in autocast, and dynamo guards on that wrapper, so that
    # every new model recompiles; dynamo's eager backend traces as inductor does, without code generation.
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "EAGER")
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    data = splits(10, 64, 32)
    train_set, test_set = PairDataset(*data["train"]), PairDataset(*data["test"])
    with caplog.at_level(logging.WARNING):
        for run in range(10):
            config = TrainConfig(model="linear", max_steps=1, batch_size=32, eval_batch_size=32, quiet=True,
                                 plots=False, export=False, save_checkpoints=False,
                                 output_dir=str(tmp_path / f"run{run}"))  # fmt: skip
            results = train(config, train_data=train_set, test_data=test_set)
            assert (results["dynamo_backend"], results["mixed_precision"]) == ("eager", "bf16")
    # Past the limit dynamo runs the model uncompiled and says so once, as a warning.
    assert "recompile_limit" not in caplog.text
