"""The probe's arithmetic (lines through measured points), the plan it feeds, `batch_size: auto` and the
allocator's default, on the CPU: the measurement itself needs a GPU (tests/gpu/test_peak.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from accel_mnist.config import AUTO_BATCH, TrainConfig, coerce
from accel_mnist.errors import ConfigError, UsageError
from accel_mnist.memory.allocator import default_settings, expandable_segments, run_expands_segments, settings
from accel_mnist.memory.model_states import Setup
from accel_mnist.memory.peak import FIT_SHARE, FRAGMENTATION, MIB, PeakInputs, predict_peak, reserved_peak
from accel_mnist.memory.peak_inputs import probed, strategy_inputs
from accel_mnist.memory.plan import (
    PeakPlan,
    auto_batch,
    auto_line,
    global_batch,
    settle_auto_batch,
    split_global_batch,
    trace_gap_line,
)
from accel_mnist.memory.probe import Line, Probe, fit, probe_batches
from accel_mnist.training.memory_plan import example_draws

NUMELS = [1_000_000, 1000]
SETUP = Setup(mixed_precision="bf16")


def probe(fixed=10 * MIB, per_sample=200_000, eval_fixed=1 * MIB, eval_per_sample=50_000):
    return Probe(Line(fixed, per_sample, 0.0), Line(eval_fixed, eval_per_sample, 0.0), (64, 128, 256), 0.5)


def base(**changes):
    fields = {"train_activation_bytes": 0, "eval_activation_bytes": 0, "cast_numel": 1_001_000, "convolves": True}
    return PeakInputs(**{**fields, **changes})


def test_a_line_through_points_on_it_is_exact_and_a_bent_one_is_not_trusted():
    line = fit([(64, 1000 + 64 * 300), (128, 1000 + 128 * 300), (256, 1000 + 256 * 300)])
    assert line.fixed == pytest.approx(1000) and line.per_sample == pytest.approx(300) and line.off_line < 1e-9
    assert line.at(8192) == 1000 + 8192 * 300
    assert Line(-5000.0, 1.0, 0.0).at(10) == 0  # never below zero
    bent = fit([(64, 10_000), (128, 20_000), (256, 80_000)])
    assert bent.off_line > 0.10
    assert Probe(bent, line, (64, 128, 256), 0.1).untrusted.startswith("the probed activation bytes are not linear")
    assert Probe(line, line, (64, 128, 256), 0.1).untrusted is None
    assert fit([(1, 500)]) == Line(500.0, 0.0, 0.0)  # one point: flat
    # 15% above the line at the smallest batch, a few hundred KiB of workspace against 4 MB: no bend.
    assert fit([(64, 1_150_000), (128, 2_000_000), (256, 4_000_000)]).off_line < 0.10


def test_probe_batches_stay_small_unless_asked():
    assert probe_batches(None) == (64, 128, 256)  # batch_size auto, before it is chosen
    assert probe_batches(64) == (16, 32, 64)
    assert probe_batches(8192) == (256, 512, 1024)  # extrapolated beyond the probe's limit
    assert probe_batches(5000, limit=5000) == (1250, 2500, 5000)  # auto's second look, up to the batch chosen
    assert probe_batches(1) == (1,)


def test_probed_inputs_scale_only_the_per_sample_bytes_and_drop_the_terms_the_probe_measured():
    inputs = probed(base(), probe(), batch_size=100, eval_batch_size=1000)
    assert inputs.source == "probe" and inputs.cast_numel == 0 and not inputs.convolves
    assert inputs.train_activations == 10 * MIB + 100 * 200_000
    assert inputs.at_batch(400).train_activations == 10 * MIB + 400 * 200_000
    assert inputs.eval_activation_bytes == 1 * MIB + 1000 * 50_000
    traced = base(train_activation_bytes=100 * 200_000, eval_activation_bytes=1 * MIB + 1000 * 50_000, traced_batch=100)
    # The same activations: the trace adds autocast's weight copies and cuDNN's allowance, the probe measured them.
    assert predict_peak(NUMELS, SETUP, traced) > predict_peak(NUMELS, SETUP, inputs)


def test_auto_batch_is_the_largest_whose_prediction_fits_and_says_so():
    plan = PeakPlan(inputs=probed(base(), probe(), 64, 1000))
    room = 2 << 30
    batch = auto_batch(plan, NUMELS, SETUP, room, samples=60_000)
    assert reserved_peak(NUMELS, SETUP, plan.inputs.at_batch(batch)) <= FIT_SHARE * room
    assert reserved_peak(NUMELS, SETUP, plan.inputs.at_batch(batch + 1)) > FIT_SHARE * room
    line = auto_line(plan, NUMELS, SETUP, room, batch, 60_000)
    assert line.startswith(f"batch size auto: {batch:,} per process") and "from the probe" in line
    assert "capped" not in line
    assert auto_batch(plan, NUMELS, SETUP, room, samples=500) == 500  # no larger than one process's share
    assert "the whole training split (its 500 samples per process" in auto_line(plan, NUMELS, SETUP, room, 500, 500)
    # The user's bound: the batch stops there, and the line says it was asked for.
    assert auto_batch(plan, NUMELS, SETUP, room, samples=60_000, most=256) == 256 < batch
    assert "256 per process, the max_batch_size asked for" in auto_line(plan, NUMELS, SETUP, room, 256, 60_000, 256)
    assert auto_batch(plan, NUMELS, SETUP, room, samples=60_000, most=10**6) == batch  # a bound above the fit
    assert global_batch(batch, 2, 4) == f"{batch * 8:,} ({batch:,} x 2 accumulation x 4 processes)"


def test_auto_batch_refuses_in_one_line_where_nothing_can_be_chosen():
    with pytest.raises(UsageError, match="needs a GPU"):
        auto_batch(PeakPlan(), NUMELS, SETUP, 1 << 30, 60_000)  # a CPU run: nothing predicted
    with pytest.raises(UsageError, match="batch_size auto: cannot predict: why; give a number"):
        auto_batch(PeakPlan(unpredicted="cannot predict: why"), NUMELS, SETUP, 1 << 30, 60_000)
    with pytest.raises(
        UsageError,
        match="no batch fits: the evaluation needs .* mostly .*the evaluation batch .*; try a smaller eval_batch_size",
    ):
        auto_batch(PeakPlan(inputs=probed(base(), probe(), 64, 1000)), NUMELS, SETUP, 16 * MIB, 60_000)


def test_batch_size_auto_is_probed_again_at_its_choice_and_every_process_takes_the_smallest():
    room = 2 << 30
    first = PeakPlan(inputs=probed(base(), probe(), 64, 1000))
    # Re-probed at the chosen batch the line is steeper (kernels that grow with the batch): the choice shrinks.
    steeper = PeakPlan(inputs=probed(base(), probe(per_sample=300_000), 64, 1000))
    asked: list[int] = []

    def probe_at(batch):
        asked.append(batch)
        return steeper

    plan, batch, line = settle_auto_batch(first, NUMELS, SETUP, room, 60_000, probe_at, lambda choose: choose())
    wide = auto_batch(first, NUMELS, SETUP, room, 60_000)
    assert batch == auto_batch(steeper, NUMELS, SETUP, room, 60_000) < wide
    assert plan is steeper and asked == [wide, batch]  # the second probe at the new choice agrees: settled
    assert line.startswith(f"batch size auto: {batch:,} per process")
    # Another process chose less: every process takes the smallest choice.
    _, smallest, _ = settle_auto_batch(first, NUMELS, SETUP, room, 60_000, probe_at, lambda choose: min(choose(), 100))
    assert smallest == 100


def test_batch_size_auto_keeps_its_answer_where_a_second_probe_cannot_predict():
    room = 2 << 30
    first = PeakPlan(inputs=probed(base(), probe(), 64, 1000))
    failed = PeakPlan(unpredicted="cannot predict: the probe's copy of the model ran out of GPU memory")
    plan, batch, _ = settle_auto_batch(first, NUMELS, SETUP, room, 60_000, lambda b: failed, lambda c: c())
    assert plan is first and batch == auto_batch(first, NUMELS, SETUP, room, 60_000)
    with pytest.raises(UsageError, match="needs a GPU"):  # the first choice's refusal is every process's
        settle_auto_batch(PeakPlan(), NUMELS, SETUP, 0, 60_000, lambda b: failed, lambda c: c())


def test_the_trace_is_named_where_it_strays_from_the_probe():
    probe_inputs = probed(base(), probe(), 1024, 1000)
    close = base(train_activation_bytes=probe_inputs.train_activations, eval_activation_bytes=51 * MIB,
                 traced_batch=1024, cast_numel=0, convolves=False)  # fmt: skip
    assert trace_gap_line(PeakPlan(inputs=probe_inputs, trace=close), NUMELS, SETUP) is None
    far = PeakPlan(inputs=probe_inputs, trace=close.at_batch(2048))
    line = trace_gap_line(far, NUMELS, SETUP)
    assert line.startswith("peak memory: the meta-device trace is") and "over the probe" in line
    assert trace_gap_line(PeakPlan(inputs=close, trace=close), NUMELS, SETUP) is None  # no probe ran


def test_batch_size_auto_is_a_value_of_the_config():
    assert TrainConfig(batch_size="auto").batch_size == AUTO_BATCH  # type: ignore[arg-type]
    assert TrainConfig.from_dict({"batch_size": "Auto"}).batch_size == AUTO_BATCH
    assert coerce("--batch-size", "auto", int) == "auto"
    with pytest.raises(ConfigError, match="batch-size: must be >= 1 or auto, got 0"):
        coerce("--batch-size", "0", int)
    with pytest.raises(ConfigError, match="batch_size: must be >= 1, got -3"):
        TrainConfig(batch_size=-3)


def test_expandable_segments_by_default_and_never_over_the_users_choice():
    env: dict[str, str] = {}
    default_settings(env)
    assert env == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"} and expandable_segments(env)
    for chosen in (
        {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"},
        {"PYTORCH_ALLOC_CONF": "garbage_collection_threshold:0.6"},
    ):
        env = dict(chosen)
        default_settings(env)
        assert env == chosen and not expandable_segments(env) and settings(env) == chosen
    assert expandable_segments({"PYTORCH_ALLOC_CONF": "max_split_size_mb:64, expandable_segments:True"})


def test_the_fit_keeps_room_for_split_blocks_only_where_segments_do_not_expand(monkeypatch):
    # A run from a process where CUDA has not started gets expandable segments (default_settings)...
    assert run_expands_segments({}) and not run_expands_segments({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    assert strategy_inputs(nn.Linear(4, 2), optimizer="adam", data_bytes=0).fragmentation == 0.0
    # ...and one whose user chose other allocator settings keeps FRAGMENTATION of its activations free.
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64")
    inputs = strategy_inputs(nn.Linear(4, 2), optimizer="adam", data_bytes=0)
    assert inputs.fragmentation == FRAGMENTATION > 0
    inputs = replace(inputs, train_activation_bytes=100 * MIB, traced_batch=10)
    assert reserved_peak(NUMELS, SETUP, inputs) == predict_peak(NUMELS, SETUP, inputs) + int(FRAGMENTATION * 100 * MIB)
    assert reserved_peak(NUMELS, SETUP, replace(inputs, fragmentation=0.0)) == predict_peak(NUMELS, SETUP, inputs)


def test_a_captured_step_is_not_predicted():
    from accel_mnist.distributed.strategy import Strategy
    from accel_mnist.memory.plan import CAPTURED
    from accel_mnist.training.resolved import StepPlan

    def captured(strategy, config):
        return StepPlan.of(strategy, config).captured

    gpu = Strategy(kind="NO", device="cuda", precision="bf16")
    graph = TrainConfig(cuda_graph=True, scheduler="onecycle", cycle_momentum=False)
    assert captured(gpu, graph)
    assert not captured(gpu, graph.replace(cuda_graph=False))
    assert not captured(Strategy(kind="DEEPSPEED", device="cuda", precision="fp16", zero_stage=2), graph)
    assert not captured(gpu, graph.replace(optimizer="sgd"))  # the eager step runs: predicted as usual
    assert not captured(gpu, graph.replace(batch_size="auto", global_batch_size=256))  # may accumulate
    plan = PeakPlan(inputs=probed(base(), probe(), 512, 1000)).refused(CAPTURED)
    assert plan.inputs is None and plan.predicted(NUMELS, SETUP)["peak_unpredicted"].startswith("cannot predict")


def test_a_global_batch_takes_the_largest_micro_batch_that_fits_and_divides_it():
    assert split_global_batch(96, 32, 1, 60_000) == (32, 3)  # 32 fit: 3 of them
    assert split_global_batch(100, 32, 1, 60_000) == (25, 4)  # 32 does not divide 100: 25 does
    assert split_global_batch(4096, 1500, 2, 30_000) == (1024, 2)  # 2,048 per process in 2 steps of 1,024
    assert split_global_batch(64, 100, 1, 60_000) == (64, 1)  # it fits in one pass: no accumulation
    with pytest.raises(UsageError, match=r"^global_batch_size 99 is not a multiple of the 2 processes; .* 98$"):
        split_global_batch(99, 32, 2, 60_000)
    with pytest.raises(UsageError, match=r"^global_batch_size 70,000: one step would take 70,000 samples per "):
        split_global_batch(70_000, 32, 1, 60_000)
    # A prime would step one sample at a time: refused, with the nearest global batches that split well.
    with pytest.raises(UsageError, match=r"micro-batches of at most 1 per process where 32 fit; .* 96 or 128$"):
        split_global_batch(97, 32, 1, 60_000)


def test_a_batch_settled_after_the_accelerator_is_built_reaches_deepspeeds_config():
    from types import SimpleNamespace

    from accel_mnist.distributed.accelerator import set_batch

    ds = {"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto", "gradient_accumulation_steps": 1}
    plugin = SimpleNamespace(deepspeed_config=ds, gradient_accumulation_steps=1)
    set_batch(SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=plugin), gradient_accumulation_steps=2,
                              num_processes=4), 300)  # fmt: skip
    # The accumulation too, as global_batch_size may choose it after the Accelerator was built.
    assert ds == {"train_micro_batch_size_per_gpu": 300, "train_batch_size": 2400, "gradient_accumulation_steps": 2}
    assert plugin.gradient_accumulation_steps == 2
    set_batch(SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=None)), 300)  # no DeepSpeed: nothing to write


def test_a_finished_run_is_returned_to_auto_where_auto_chose_its_batch():
    from accel_mnist.run.directory import same_run

    asked = TrainConfig(batch_size="auto").to_dict()  # type: ignore[arg-type]
    ran = TrainConfig(batch_size=512).to_dict()  # config.json: the batch that ran
    assert same_run(ran, {"batch_size_auto": True}, asked)
    assert not same_run(ran, {"batch_size_auto": False}, asked)  # 512 was asked for: not auto's choice
    assert not same_run(ran, {}, asked)
    assert same_run(ran, {"batch_size_auto": True}, ran)  # asking for the batch auto chose is the same run
    assert not same_run(ran, {"batch_size_auto": True}, TrainConfig(batch_size=256).to_dict())
    assert not same_run(ran, {"batch_size_auto": True}, {**asked, "model": "mlp"})
    assert same_run({**ran, "batch_size": AUTO_BATCH}, {}, asked)  # a directory that saved auto itself, as 0


def _stub_fit(monkeypatch, most: int | None = None) -> list[int]:
    """What the GPU's probe would settle for `batch_size: auto` on a CPU: 32 per process fit. Returns the
    list each settling appends to; `most`: the max_batch_size the run must hand it."""
    from accel_mnist.training import memory_plan

    settled: list[int] = []

    def settle(plan, numels, setup, room, samples, probe_at, agreed, asked_most):
        assert asked_most == most
        settled.append(32)
        return plan, 32, "batch size auto: 32 per process"

    monkeypatch.setattr(memory_plan, "settle_auto_batch", settle)
    return settled


def test_a_batch_size_auto_run_saves_the_batch_it_ran_and_is_found_again(synthetic_mnist, tmp_path, monkeypatch):
    import json

    from accel_mnist import train
    from accel_mnist.cli import main

    settled = _stub_fit(monkeypatch, most=48)  # the user's bound reaches the choice
    out = tmp_path / "run"
    config = TrainConfig(model="linear", data_dir=str(synthetic_mnist), download=False, quiet=True, export=False,
                         plots=False, output_dir=str(out), max_steps=4, eval_every=4, batch_size="auto",  # type: ignore[arg-type]
                         resume_from="auto", max_batch_size=48)  # fmt: skip
    first = train(config)
    # config.json names the batch that ran, without the bound that only `auto` takes.
    saved = config.replace(batch_size=32, max_batch_size=None, grad_accum=1).to_dict()  # and the accumulation
    assert json.loads((out / "config.json").read_text()) == saved
    assert (first["batch_size"], first["batch_size_auto"], settled) == (32, True, [32])
    assert train(config) == first and settled == [32]  # finished: returned as it is, nothing settled again
    (out / "results.json").unlink()  # as if killed after its last checkpoint: it resumes at the checkpoint's batch
    assert train(config.replace(max_steps=8))["steps"] == 8 and settled == [32]
    assert json.loads((out / "config.json").read_text())["batch_size"] == 32
    # The saved config is one the command takes, and it trains that batch again, as asked for by number.
    again = tmp_path / "again"
    assert main(["train", "--config", str(out / "config.json"), "--output-dir", str(again), "--max-steps", "4"]) == 0
    results = json.loads((again / "results.json").read_text())
    assert (results["batch_size"], results["batch_size_auto"], settled) == (32, False, [32])
    ordinary = json.loads((out / "config.json").read_text()) | {"output_dir": str(again), "max_steps": 4}
    assert json.loads((again / "config.json").read_text()) == ordinary  # a run of a number saves its config as given


def test_a_global_batch_run_saves_its_micro_batch_and_accumulation(synthetic_mnist, tmp_path, monkeypatch):
    import json

    from accel_mnist import train
    from accel_mnist.cli import main

    settled = _stub_fit(monkeypatch)
    out = tmp_path / "run"
    config = TrainConfig(model="linear", data_dir=str(synthetic_mnist), download=False, quiet=True, export=False,
                         plots=False, output_dir=str(out), max_steps=2, eval_every=2, batch_size="auto",  # type: ignore[arg-type]
                         resume_from="auto", global_batch_size=96, log_level="info")  # fmt: skip
    first = train(config)
    assert (first["batch_size"], first["global_batch_size"], first["steps"]) == (32, 96, 2)
    # config.json: the micro-batch and the accumulation that ran, which --config trains again.
    saved = json.loads((out / "config.json").read_text())
    assert (saved["batch_size"], saved["grad_accum"], saved["global_batch_size"]) == (32, 3, None)
    assert train(config) == first and settled == [32]  # finished: found again, nothing settled again
    (out / "results.json").unlink()  # killed after its last checkpoint: resumed at its batch and accumulation
    again = train(config.replace(max_steps=4))
    assert (again["steps"], again["global_batch_size"], settled) == (4, 96, [32])
    other = tmp_path / "other"
    assert main(["train", "--config", str(out / "config.json"), "--output-dir", str(other), "--max-steps", "2"]) == 0
    assert json.loads((other / "results.json").read_text())["global_batch_size"] == 96


class _Images:
    """A dataset of 300 single-channel images, the i-th of brightness i/300 plus noise."""

    def __init__(self, n=300):
        generator = torch.Generator().manual_seed(1)
        self.images = torch.arange(n).float().div(n).view(n, 1, 1, 1) + 0.01 * torch.randn(
            n, 1, 4, 4, generator=generator
        )

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.images[i], 0


def test_the_probe_draws_the_first_images_then_the_darkest_the_brightest_and_random_ones():
    data = _Images()
    draws = example_draws(data, seed=3)
    assert [len(d) for d in draws] == [64] * 5
    assert torch.equal(draws[0], data.images[:64])  # a forward blind to values needs this one draw only
    means = [d.mean().item() for d in draws]
    assert means[1] < 0.25 and means[2] > 0.75  # a threshold on a batch's mean falls between them
    assert all(means[1] < m < means[2] for m in means[3:])
    again = example_draws(data, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(draws, again, strict=True))  # seeded: the same plan each run
    assert len(example_draws(_Images(40), seed=3)) == 1  # too few images for more than the one draw
    only = example_draws(data, seed=3, every=False)  # a forward that runs on the meta device: one draw
    assert len(only) == 1 and torch.equal(only[0], data.images[:64])
