"""The peak prediction: activations traced on the meta device, the peak's moments, `estimate --fits`,
and the one line a run ends with out of memory (the run itself: tests/e2e/test_checkpoint.py)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from accel_mnist.cli import main
from accel_mnist.distributed.strategy import Strategy
from accel_mnist.memory.activations import trace
from accel_mnist.memory.estimate import MNIST_DEVICE_BYTES, meta_model
from accel_mnist.memory.model_states import STRATEGIES, Setup, format_bytes
from accel_mnist.memory.peak import (
    FIT_SHARE,
    FRAGMENTATION,
    MIB,
    WORKSPACES,
    PeakInputs,
    largest_batch,
    largest_parts,
    phases,
    predict_peak,
    reserved_peak,
    why_nothing_fits,
)
from accel_mnist.memory.peak_inputs import inputs_for
from accel_mnist.models import build_model

ROOT = Path(__file__).resolve().parents[2]

BF16_GPU = Strategy(device="cuda", precision="bf16")


def tiny_model() -> nn.Module:
    """`estimate --model tests.unit.test_peak:tiny_model` builds this."""
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 32), nn.ReLU(), nn.Linear(32, 10))


def test_the_seed_linear_models_activations_are_its_input_and_logits():
    # fp32 at batch 4: the input (saved by addmm for the weight's gradient) and the logits, then
    # the backward pass holds the input and the logits' gradient: 4*784*4 + 4*10*4 bytes.
    traced = trace(build_model("linear"), (1, 28, 28), 4, 2)
    assert traced.train_bytes == 4 * 784 * 4 + 4 * 10 * 4
    assert traced.eval_bytes == 2 * 784 * 4 + 2 * 10 * 4


@pytest.mark.parametrize("name", ["bncnn", "cnn", "lenet5", "mlp"])
def test_activations_scale_with_the_batch_and_halve_in_16_bit(name):
    model = build_model(name)
    small, large = (trace(model, (1, 28, 28), b, 100, torch.bfloat16) for b in (64, 128))
    # BatchNorm's per-channel statistics (a few kB) are all that does not grow with the batch.
    assert abs(large.train_bytes - 2 * small.train_bytes) <= 4096 and large.eval_bytes == small.eval_bytes
    fp32 = trace(model, (1, 28, 28), 64, 100)
    # Floats halve; max-pool indices (int64) and dropout masks (bool) do not.
    assert small.train_bytes < fp32.train_bytes <= 2 * small.train_bytes


def test_tracing_leaves_the_model_its_statistics_and_the_random_stream_alone():
    model = build_model("bncnn").eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    trace(model, (1, 28, 28), 32, 32, torch.float16)
    assert not model.training and torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(before[k], v) and v.device.type == "cpu" for k, v in model.state_dict().items())


def test_the_peak_is_the_optimizer_step_for_a_large_mlp_as_the_h200_measured():
    # The 121M mlp on one GPU under bf16 autocast: the first Adam step holds fp32 parameters,
    # gradients, both moments and one full-size temporary: 20 bytes a parameter over the data and
    # the workspaces (benchmarks/results/h200-2026-12-03-peak: 2579 MiB measured).
    module = meta_model("mlp", ",".join(["4096"] * 8))
    numels = [p.numel() for p in module.parameters()]
    inputs = inputs_for(module, batch_size=64, eval_batch_size=1000, mixed_precision="bf16", optimizer="adam",
                        data_bytes=MNIST_DEVICE_BYTES)  # fmt: skip
    moments = phases(numels, Setup(mixed_precision="bf16"), inputs)
    assert max(moments.values()) == moments["step"] == MNIST_DEVICE_BYTES + WORKSPACES + 20 * sum(numels)
    assert round(moments["step"] / MIB) == 2579
    # ZeRO-3 (fp16): 16-bit parameters and gradient partition, master and moments, the reduce bucket
    # for the whole run, and at the step the fp32 gradient and the temporary: 24 bytes + the bucket.
    zero3 = phases(numels, Setup("deepspeed", zero_stage=3, mixed_precision="fp16"), inputs)["step"]
    assert zero3 == MNIST_DEVICE_BYTES + WORKSPACES + 24 * sum(numels) + 2 * 500_000_000


def test_deepspeeds_json_buckets_and_overlap_count():
    module = meta_model("linear")
    numels = [p.numel() for p in module.parameters()]
    zero = {"reduce_bucket_size": 200_000_000, "overlap_comm": True}
    inputs = inputs_for(module, batch_size=64, eval_batch_size=1000, mixed_precision="fp16", optimizer="adam",
                        data_bytes=0, zero=zero)  # fmt: skip
    default = replace(inputs, reduce_bucket_size=500_000_000, reduce_buckets=1)
    setup = Setup("deepspeed", zero_stage=2, mixed_precision="fp16")
    assert predict_peak(numels, setup, default) - predict_peak(numels, setup, inputs) == 2 * (5e8 - 4e8)


def test_the_largest_batch_is_the_boundary_of_the_prediction():
    module = meta_model("bncnn")
    numels = [p.numel() for p in module.parameters()]
    inputs = inputs_for(module, batch_size=512, eval_batch_size=1000, mixed_precision="bf16", optimizer="adam",
                        data_bytes=MNIST_DEVICE_BYTES)  # fmt: skip
    inputs = replace(inputs, fragmentation=FRAGMENTATION)  # a run whose allocator does not expand segments
    setup, capacity = Setup(mixed_precision="bf16"), 2 << 30
    batch = largest_batch(numels, setup, inputs, capacity)
    assert 1000 < batch < 20_000
    assert reserved_peak(numels, setup, inputs.at_batch(batch)) <= FIT_SHARE * capacity
    assert reserved_peak(numels, setup, inputs.at_batch(batch + 1)) > FIT_SHARE * capacity
    # The reserve is the allocated peak and the room its activations leave split.
    at = inputs.at_batch(batch)
    assert reserved_peak(numels, setup, at) == predict_peak(numels, setup, at) + int(
        FRAGMENTATION * at.train_activations
    )
    assert largest_batch(numels, setup, inputs, 100 * MIB) == 0  # the data alone is more


def test_estimate_fits_names_the_strategies_and_their_largest_batch(capsys):
    argv = ["estimate", "--model", "bncnn", "--batch-size", "8192", "--num-processes", "1", "--fits", "4e9"]
    assert main([*argv, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["per_process"]
    assert set(rows) == set(STRATEGIES)
    for row in rows.values():
        # A fit also leaves the allocator room for fragmentation: the allocated peak alone is below the share.
        assert not row["fits"] or row["peak_allocated_bytes"] < FIT_SHARE * 4e9
        assert row["fits"] == (row["largest_batch"] >= 8192)
    # ZeRO's reduce bucket (1e9 bytes at fp16) costs DDP's batch room.
    assert rows["ddp"]["largest_batch"] > rows["zero2"]["largest_batch"] > 0
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "largest batch" in printed and "fits in 3.73 GiB" in printed


def test_estimate_takes_a_model_by_import_path(capsys):
    assert main(["estimate", "--model", "tests.unit.test_peak:tiny_model", "--strategy", "ddp", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["num_parameters"] == 784 * 32 + 32 + 32 * 10 + 10
    assert printed["per_process"]["ddp"]["peak_allocated_bytes"] > MNIST_DEVICE_BYTES


def test_estimate_with_ema_decay_adds_the_average_where_a_run_keeps_it_and_leaves_out_where_it_refuses(capsys):
    argv = ["estimate", "--model", "tests.unit.test_peak:tiny_model", "--json"]
    assert main(argv) == 0
    without = json.loads(capsys.readouterr().out)["per_process"]
    assert main([*argv, "--ema-decay", "0.95"]) == 0
    out = capsys.readouterr()
    averaged = json.loads(out.out)["per_process"]
    assert set(averaged) == {"ddp", "zero1", "zero2", "zero2_offload"}  # ZeRO-3 and FSDP shard the parameters
    assert "zero3, zero3_offload, fsdp, fsdp_offload left out" in out.err
    numel = 784 * 32 + 32 + 32 * 10 + 10
    for name, row in averaged.items():  # an fp32 average and the fp32 weights it swaps out at an evaluation
        assert row["peak_allocated_bytes"] - without[name]["peak_allocated_bytes"] == numel * (4 + 4)
    assert main(["estimate", "--parameters", "1e9", "--ema-decay", "0.95"]) == 0  # no peak: the line says so
    assert "average of the weights: 7.45 GiB per process more on the device (not in" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--model", "bncnn", "--ema-decay", "1.5"], "--ema-decay: must be in (0, 1), got 1.5"),
    (["--model", "bncnn", "--ema-decay", "0.9", "--strategy", "zero3"], "--ema-decay: zero3 shards the parameters"),
    (["--parameters", "1e9", "--fits", "8e9"], "--fits needs --model"),
    (["--model", "bncnn", "--fits", "lots"], "--fits: expected a number of bytes"),
    (["--model", "no_such_module:build"], "--model no_such_module:build: cannot import it"),
    (["--model", "bncnn", "--batch-size", "0"], "--batch-size and --eval-batch-size must be >= 1"),
])  # fmt: skip
def test_estimate_refuses_what_it_cannot_answer_in_one_line(capsys, argv, message):
    assert main(["estimate", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and err.count("\n") == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a machine without a GPU")
def test_estimate_fits_without_a_number_needs_a_gpu(capsys):
    assert main(["estimate", "--model", "bncnn", "--fits"]) == 2
    assert "no GPU is visible here" in capsys.readouterr().err


def test_the_cast_cache_counts_only_under_autocast():
    numels = [1_000_000]
    inputs = PeakInputs(train_activation_bytes=0, eval_activation_bytes=0, cast_numel=1_000_000)
    fp32, bf16 = (phases(numels, Setup(mixed_precision=p), inputs)["train"] for p in ("no", "bf16"))
    assert bf16 - fp32 == 2 * 1_000_000
    assert math.isclose(FIT_SHARE, 0.9)


def test_every_row_of_the_h200_suite_is_predicted_within_ten_percent():
    # The committed measurements (benchmarks/results/h200-2026-12-03-peak), predicted again by this
    # code from each row's command: a change to the prediction that moves a row off is caught here.
    from benchmarks.peak_suite import measured_peak, predict_row

    rows = json.loads((ROOT / "benchmarks/results/h200-2026-12-03-peak/peak_suite.json").read_text())["rows"]
    assert len(rows) == 84 and all(r["rc"] == 0 for r in rows)
    for row in rows:
        predicted = predict_row(row)
        assert abs(measured_peak(row) / predicted - 1) <= 0.10, row["name"]
        if "--cuda-graph" not in row["cmd"]:
            # The run predicted then what the estimate predicts now, but for the trace's later emulation of
            # autocast's fp32 calls and dropout's one-byte masks: at most 0.4% apart on these rows.
            ran = row["memory"]["predicted"]["peak_allocated_bytes"]
            assert predicted == pytest.approx(ran, rel=0.005), row["name"]


class NeedsValues(nn.Module):
    """A forward pass that reads a value: it cannot run on the meta device."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(784, 10)

    def forward(self, x):
        if x.flatten(1).sum().item() > 0:
            return self.fc(x.flatten(1))
        return self.fc(-x.flatten(1))


def test_a_model_that_needs_real_values_gets_no_peak_from_estimate_and_none_from_a_run(capsys):
    assert main(["estimate", "--model", "tests.unit.test_peak:NeedsValues", "--strategy", "ddp"]) == 0
    out, err = capsys.readouterr()
    assert "peak: not predicted: its forward pass does not run on the meta device (RuntimeError: " in err
    assert "ddp" in out and "peak allocated" not in out  # the model states, no peak column
    from contextlib import nullcontext
    from types import SimpleNamespace

    from accelerate import PartialState

    from accel_mnist.config import TrainConfig
    from accel_mnist.memory.plan import plan_peak

    PartialState(cpu=True)  # what a run has set up before it logs

    # A GPU as the plan sees it; here the probe cannot run (no CUDA), so only the trace can predict.
    gpu = SimpleNamespace(device=torch.device("cuda", 0), autocast=nullcontext,
                          state=SimpleNamespace(deepspeed_plugin=None, fsdp_plugin=None))  # fmt: skip

    def plan(model):
        return plan_peak(gpu, TrainConfig(), BF16_GPU, model, (1, 28, 28), 0,
                         lambda m, x, y, dtype: m(x).sum())  # fmt: skip

    unpredicted = plan(NeedsValues())
    assert unpredicted.inputs is None and unpredicted.unpredicted.startswith("cannot predict: the probe failed")
    assert "does not run on the meta device" in unpredicted.unpredicted
    traced = plan(tiny_model())
    assert traced.inputs is not None and traced.inputs.source == "trace" and traced.unpredicted is None
    assert traced.note.startswith("peak memory predicted from the meta-device trace only")


def test_the_report_sets_the_predicted_peak_beside_the_measured(tmp_path):
    from accel_mnist.report.memory import memory_table, plot_memory

    rows = json.loads((ROOT / "benchmarks/results/h200-2026-12-03-peak/peak_suite.json").read_text())["rows"]
    record = {"memory": next(r["memory"] for r in rows if r["name"] == "zero3-mlp121m-b64")}
    assert "3993.3 / 3992.7" in memory_table(["run"], ["zero3"], [record])  # measured / predicted peak allocated, MiB
    assert plot_memory(record, "zero3", tmp_path / "memory.png").stat().st_size > 0


def test_a_model_only_the_probe_runs_is_predicted_with_a_line_on_its_paths(monkeypatch):
    from contextlib import nullcontext
    from types import SimpleNamespace

    from accel_mnist.config import TrainConfig
    from accel_mnist.memory import plan as plan_module
    from accel_mnist.memory.probe import Line, Probe

    measured = Probe(Line(1 << 20, 1000.0, 0.0), Line(1 << 20, 500.0, 0.0), (16, 32, 64), 0.1)
    draws_probed = []

    def measure(*args, examples=(), **kwargs):  # the GPU's answer, and the draws it was given
        draws_probed.append(len(examples))
        return measured

    monkeypatch.setattr(plan_module, "measure", measure)
    gpu = SimpleNamespace(device=torch.device("cuda", 0), autocast=nullcontext,
                          state=SimpleNamespace(deepspeed_plugin=None, fsdp_plugin=None))  # fmt: skip
    draws = [torch.full((4, 1, 28, 28), float(v)) for v in (-1, -2, 2)]

    def examples(every):  # as training/memory_plan.py reads them: one draw, or every draw
        return draws if every else draws[:1]

    plan = plan_module.plan_peak(gpu, TrainConfig(), BF16_GPU, NeedsValues(), (1, 28, 28), 0,
                                 lambda m, x, y, dtype: m(x).sum(), examples=examples)  # fmt: skip
    assert plan.inputs is not None and plan.inputs.source == "probe" and plan.trace is None
    assert plan.note.startswith("peak memory: the probe measured 3 draws of example images and kept the largest")
    assert "does not run on the meta device" in plan.note and draws_probed == [3]  # its paths may differ: all
    traced = plan_module.plan_peak(gpu, TrainConfig(), BF16_GPU, tiny_model(), (1, 28, 28), 0,
                                   lambda m, x, y, dtype: m(x).sum(), examples=examples)  # fmt: skip
    assert traced.note is None and traced.trace is not None and draws_probed == [3, 1]  # one path: one draw
    # A layer the trace refuses (cuDNN's GRU): the probe measured it, and its forward takes one path.
    gru = nn.Sequential(nn.Flatten(1, 2), nn.GRU(28, 16, batch_first=True))  # 28 rows of 28 pixels
    probed = plan_module.plan_peak(gpu, TrainConfig(), BF16_GPU, gru, (1, 28, 28), 0,
                                   lambda m, x, y, dtype: m(x)[0].sum())  # fmt: skip
    assert probed.inputs is not None and probed.inputs.source == "probe" and probed.trace is None
    assert probed.note is None and probed.unpredicted is None


def test_fsdp_activation_checkpointing_is_not_predicted_and_the_probe_never_runs(monkeypatch):
    from contextlib import nullcontext
    from types import SimpleNamespace

    from accel_mnist.config import TrainConfig
    from accel_mnist.memory import plan as plan_module

    def measure(*args, **kwargs):
        raise AssertionError("the probe ran: its copy keeps what checkpointing recomputes")

    monkeypatch.setattr(plan_module, "measure", measure)
    fsdp = SimpleNamespace(activation_checkpointing=True)
    gpu = SimpleNamespace(device=torch.device("cuda", 0), autocast=nullcontext,
                          state=SimpleNamespace(deepspeed_plugin=None, fsdp_plugin=fsdp))  # fmt: skip
    strategy = Strategy(kind="FSDP", device="cuda", precision="bf16", fsdp_version=2)
    plan = plan_module.plan_peak(gpu, TrainConfig(), strategy, tiny_model(), (1, 28, 28), 0,
                                 lambda m, x, y, dtype: m(x).sum())  # fmt: skip
    assert plan.inputs is None and plan.unpredicted.startswith("cannot predict: FSDP's activation checkpointing")
    assert plan.trace is not None  # the trace is kept beside the refusal (results.json's trace_peak)


@pytest.mark.parametrize("changes, moment, remedy", [
    ({"eval_activation_bytes": 3 << 30}, "the evaluation", "a smaller eval_batch_size"),
    ({"data_bytes": 3 << 30}, "the training step", "data_loader=\"torch\" (the images stay in host memory)"),
    ({"train_activation_bytes": 3 << 30, "traced_batch": 1}, "the training step", "a smaller model"),
    ({"average_bytes": 3 << 30}, "the training step", "no ema_decay (its fp32 copy"),
])  # fmt: skip
def test_the_line_where_nothing_fits_names_what_takes_the_room(changes, moment, remedy):
    inputs = replace(PeakInputs(train_activation_bytes=MIB, eval_activation_bytes=MIB), **changes)
    line = why_nothing_fits([1000], Setup(), inputs, 2 << 30)
    assert line.startswith(f"{moment} needs ") and f"; try {remedy}" in line and "\n" not in line
    part, size = largest_parts([1000], Setup(), inputs)[1][0]
    assert size >= 3 << 30 and f"{part} {format_bytes(size)}" in line
