"""Model states: the prediction's accounting, the count of real tensors in one process, `estimate`, and
the report's memory table and chart (the multi-process runs are in tests/launch/test_memory.py)."""

from __future__ import annotations

import json

import pytest
import torch

from accel_mnist import UsageError
from accel_mnist.cli import main
from accel_mnist.config import TrainConfig
from accel_mnist.errors import ConfigError
from accel_mnist.memory.estimate import estimate
from accel_mnist.memory.memory_watch import MemoryWatch, trainable_numels
from accel_mnist.memory.model_states import KINDS, STRATEGIES, Setup, format_bytes, predict, summary_line
from accel_mnist.models import MLP, build_model, mlp_num_parameters
from accel_mnist.report.memory import memory_of, memory_table, write_memory_charts

M = 10**6  # one tensor of a million elements: above ZeRO-3's persistence threshold


def _kinds(params, grads, optimizer, offloaded=0):
    return dict(zip(KINDS, (params, grads, optimizer, offloaded), strict=True))


@pytest.mark.parametrize("setup, expected", [
    # The paper's fp16 Adam (K = 12) on 2 processes; DeepSpeed's fp32 gradient partition at the step.
    (Setup("replicated", 2, mixed_precision="bf16"), _kinds(4 * M, 4 * M, 8 * M)),  # autocast: fp32 weights
    (Setup("deepspeed", 2, 1, "fp16"), _kinds(2 * M, 2 * M, 6 * M)),
    (Setup("deepspeed", 2, 2, "fp16"), _kinds(2 * M, 2 * M, 6 * M)),
    (Setup("deepspeed", 2, 3, "fp16"), _kinds(1 * M, 3 * M, 6 * M)),
    # fp32: DeepSpeed still copies the master partition; ZeRO-1 holds every gradient.
    (Setup("deepspeed", 1, 1, "no"), _kinds(4 * M, 4 * M, 12 * M)),
    (Setup("deepspeed", 2, 1, "no"), _kinds(4 * M, 4 * M, 6 * M)),
    (Setup("deepspeed", 2, 3, "no"), _kinds(2 * M, 4 * M, 6 * M)),
    # Offload: what moved to host memory, and on a CPU nothing moves.
    (Setup("deepspeed", 2, 2, "fp16", offload_optimizer=True), _kinds(2 * M, 0, 0, 1 * M + 2 * M + 6 * M)),
    (Setup("deepspeed", 2, 3, "fp16", True, True), _kinds(0, 0, 0, 1 * M + 3 * M + 6 * M)),
    (Setup("deepspeed", 2, 3, "fp16", True, True, on_accelerator=False), _kinds(1 * M, 3 * M, 6 * M)),
    (Setup("fsdp", 2, mixed_precision="bf16"), _kinds(2 * M, 2 * M, 4 * M)),
    (Setup("fsdp", 2, offload_param=True), _kinds(0, 0, 0, 8 * M)),
    (Setup("replicated", 1, optimizer_states=0), _kinds(4 * M, 4 * M, 0)),  # sgd without momentum
])  # fmt: skip
def test_prediction_by_strategy(setup, expected):
    assert predict([M], setup) == expected


def test_zero_3_keeps_small_parameters_whole_on_every_process():
    numels = [M, 1000]  # a weight and its bias
    two, one = Setup("deepspeed", 2, 3, "fp16"), Setup("deepspeed", 1, 3, "fp16")
    assert predict(numels, two)["parameter_bytes"] == 2 * (M + 1000) // 2 + 2 * 1000
    assert predict(numels, one)["parameter_bytes"] == 2 * (M + 1000)  # one process: the partition is the whole


def test_labels():
    assert Setup("replicated", 1).label == "one process" and Setup("replicated", 4).label == "DDP"
    assert Setup("deepspeed", 2, 3, offload_optimizer=True, offload_param=True).label == (
        "ZeRO-3 + offload (optimizer, params)"
    )


def test_estimate_is_the_prediction_and_its_command_prints_it(capsys):
    numels = trainable_numels(MLP((4096,) * 8))
    assert sum(numels) == mlp_num_parameters((4096,) * 8) == 120_725_514  # the client's model
    rows = estimate(numels, num_processes=8, num_nodes=2, mixed_precision="bf16")
    assert list(rows) == list(STRATEGIES)
    zero3 = predict(numels, Setup("deepspeed", 8, 3, "bf16"))
    assert {k: rows["zero3"][k] for k in KINDS} == zero3
    offload = rows["zero3_offload"]
    small = sum(k for k in numels if k <= 100_000)  # biases and the last layer stay whole on the GPU
    assert offload["device_bytes"] == 2 * small and offload["host_bytes_per_node"] == 4 * offload["offloaded_bytes"]
    hidden = ",".join(["4096"] * 8)
    argv = ["estimate", "--mlp-hidden", hidden, "--num-processes", "8", "--num-nodes", "2", "--mixed-precision", "bf16"]
    assert main([*argv, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["num_parameters"] == 120_725_514
    for name, row in json.loads(json.dumps(rows)).items():  # the command adds each strategy's peak (test_peak.py)
        assert printed["per_process"][name] == {
            **row,
            "peak_allocated_bytes": printed["per_process"][name]["peak_allocated_bytes"],
        }
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "120,725,514 parameters" in table and "ZeRO-3 + offload (optimizer, params)" in table


@pytest.mark.parametrize("argv, message", [
    (["--num-processes", "3", "--num-nodes", "2"], "--num-processes 3 must be a positive multiple of --num-nodes 2"),
    (["--parameters", "many"], "--parameters: expected a number of parameters (e.g. 1.2e9), got 'many'"),
    (["--strategy", "zero4"], "--strategy zero4: not one of"),
    (["--model", "cnn", "--mlp-hidden", "64"], "mlp_hidden: only the mlp has hidden widths to set (model is cnn)"),
])  # fmt: skip
def test_estimate_refuses_bad_input_in_one_line(capsys, argv, message):
    assert main(["estimate", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and err.count("\n") == 1


@pytest.mark.parametrize("text", ["", "64,", "0", "-3", "4096,abc", "1.5"])
def test_mlp_hidden_takes_positive_widths_only(text):
    with pytest.raises(ConfigError, match="mlp_hidden: expected positive integers"):
        TrainConfig(model="mlp", mlp_hidden=text)


def test_mlp_hidden_sets_the_mlp_and_nothing_else():
    assert [m.out_features for m in build_model("mlp", "32, 16").net if isinstance(m, torch.nn.Linear)] == [32, 16, 10]
    with pytest.raises(ConfigError, match="only the mlp"):
        TrainConfig(model="cnn", mlp_hidden="64")


def test_an_exported_wide_mlp_loads_and_a_lying_config_builds_nothing(tmp_path):
    from accel_mnist.export.model_dir import CONFIG_FILE, load_model, save_exported

    model = build_model("mlp", "48,24")
    save_exported(model.state_dict(), tmp_path / "m", model_name="mlp", dataset="mnist", extra={"mlp_hidden": "48,24"})
    loaded = load_model(tmp_path / "m")
    pairs = zip(loaded.state_dict().values(), model.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    config = json.loads((tmp_path / "m" / CONFIG_FILE).read_text())
    # Widths of a billion-parameter model in a few bytes: refused before any weight is made.
    (tmp_path / "m" / CONFIG_FILE).write_text(json.dumps({**config, "mlp_hidden": "40000,40000"}))
    with pytest.raises(UsageError, match="do not fit model 'mlp' with mlp_hidden 40000,40000"):
        load_model(tmp_path / "m")


def test_one_process_counts_the_real_tensors_and_its_hooks_go_after_the_first_step():
    from accelerate import Accelerator

    from accel_mnist.distributed.strategy import Strategy

    accelerator = Accelerator(cpu=True)
    model = MLP((256, 128))
    numels = trainable_numels(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    watch = MemoryWatch.start(accelerator, TrainConfig(model="mlp"), Strategy.of(accelerator), numels, model,
                              optimizer)  # fmt: skip
    psi = sum(numels)
    assert watch.held == _kinds(4 * psi, 0, 0)  # no gradient nor Adam state before the first step
    for _ in range(2):
        loss = model(torch.randn(8, 1, 28, 28)).square().mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        assert watch._gradient_hooks == [] and watch._step_hook is None  # the first step removed them
    watch.count(at_rest=True)
    [row] = watch.gather()
    # Adam's step counters (one 0-dim fp32 tensor per parameter, on the host unless capturable)
    # are not states: counted, they read as "offloaded" on a GPU where nothing was offloaded.
    assert all(s["step"].dim() == 0 for s in optimizer.optimizer.state.values())
    assert {k: row[k] for k in KINDS} == _kinds(4 * psi, 4 * psi, 8 * psi)
    assert watch.predicted == {**_kinds(4 * psi, 4 * psi, 8 * psi), "peak_allocated_bytes": None, "peak_source": None}
    assert row["peak_rss_bytes"] > 4 * psi and row["peak_allocated_bytes"] is None and row["ooms"] is None
    assert summary_line(watch.results()).startswith(f"model states per process: {format_bytes(16 * psi)} ")


def _results(per_process, predicted, **facts):
    return {"model": "mlp", "num_parameters": 1000, "memory": {"per_process": per_process, "predicted": predicted},
            **facts}  # fmt: skip


def _process(rank, params, grads, optimizer, peak):
    return {"rank": rank, **_kinds(params, grads, optimizer), "peak_allocated_bytes": peak, "peak_reserved_bytes": None,
            "peak_rss_bytes": 3 * peak, "alloc_retries": 0, "ooms": 0}  # fmt: skip


def test_report_table_and_chart_per_run(tmp_path):
    pytest.importorskip("matplotlib")
    mib = 1 << 20
    two = _results([_process(0, 4 * mib, 2 * mib, 6 * mib, 50 * mib), _process(1, 4 * mib, 2 * mib, 6 * mib, 51 * mib)],
                   _kinds(4 * mib, 2 * mib, 6 * mib))  # fmt: skip
    old = {"model": "cnn"}  # a run from before memory was recorded
    table = memory_table(["runs/a", "old"], ["zero2", "old"], [two, old])
    lines = table.splitlines()
    assert lines[0] == "memory per process, MiB (measured / predicted):" and len(lines) == 5
    assert lines[1].split()[:3] == ["run", "strategy", "rank"]
    assert lines[3].split()[:4] == ["runs/a", "zero2", "0", "4.0"] and "12.0 / 12.0" in lines[3] and "51.0" in lines[4]
    written = write_memory_charts([tmp_path / "a", tmp_path / "b"], ["zero2", "old"], [two, old])
    assert written == [tmp_path / "a" / "memory.png"] and written[0].stat().st_size > 10_000
    assert memory_table(["old"], ["old"], [old]) == ""


@pytest.mark.parametrize("memory", [None, [], {"per_process": []}, {"per_process": [{"rank": 0}], "predicted": {}},
                                    {"per_process": "x", "predicted": _kinds(1, 1, 1)}])  # fmt: skip
def test_report_passes_over_a_memory_record_of_another_shape(memory):
    assert memory_of({"memory": memory}) is None


@pytest.mark.parametrize("value, said", [
    (0, "0 B"), (1023, "1023 B"), (28 * 1024 * 1024 + 400_000, "28.4 MiB"), (1023 * (1 << 20) + 900_000, "1024 MiB"),
    ((1 << 30) + (1 << 28), "1.25 GiB"), (150 * (1 << 30), "150 GiB"), (None, "-"),
])  # fmt: skip
def test_bytes_read_as_people_write_them(value, said):
    assert format_bytes(value) == said and "e+" not in format_bytes(value)
