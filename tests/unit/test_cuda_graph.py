"""The captured step's choices, on the CPU: when it is refused and why, and what capture changes
in the optimizer. The capture itself runs on a GPU: tests/gpu/test_cuda_graph.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from accelerate.utils import DistributedType, DynamoBackend

from accel_mnist import TrainConfig
from accel_mnist.config import OPTIMIZERS
from accel_mnist.distributed.ddp_capture import captures_under_ddp, ddp_side_stream
from accel_mnist.distributed.option_rules import capture_refusal
from accel_mnist.distributed.strategy import Strategy
from accel_mnist.optim import OPTIMIZER_CLASSES, build_optimizer, optimizer_class_name
from accel_mnist.training.captured_step import build_step, hyperparameters, make_capturable, optimizer_name
from accel_mnist.training.resolved import StepPlan
from accel_mnist.training.step import EagerStep, to_memory_format


def _accelerator(device="cuda", kind=DistributedType.NO, processes=1, accum=1, scaler=None, precision="no",
                 dynamo=DynamoBackend.NO, mode="default"):  # fmt: skip
    return SimpleNamespace(device=torch.device(device), distributed_type=kind, num_processes=processes,
                           gradient_accumulation_steps=accum, scaler=scaler, mixed_precision=precision,
                           state=SimpleNamespace(dynamo_plugin=SimpleNamespace(backend=dynamo, mode=mode)),
                           print=print)  # fmt: skip


def _adam(params=None):
    return torch.optim.Adam(params or [torch.nn.Parameter(torch.ones(2))], lr=1e-2)


def why_eager(accelerator, config: TrainConfig) -> str | None:
    """The run's plan for `config` (cuda_graph asked) under the strategy `accelerator` set up: why it is eager."""
    plan = StepPlan.of(Strategy.of(accelerator), config.replace(cuda_graph=True))
    assert plan.captured is (plan.why_eager is None)
    return plan.why_eager


def plan_of(accelerator, config: TrainConfig) -> StepPlan:
    return StepPlan.of(Strategy.of(accelerator), config)


@pytest.mark.parametrize(
    "accelerator, config, reason",
    [
        (_accelerator("cpu"), {}, "the device is cpu; CUDA graphs need a CUDA GPU"),
        (_accelerator(kind=DistributedType.DEEPSPEED), {}, "DEEPSPEED is not captured here"),
        (_accelerator(kind=DistributedType.FSDP, processes=2), {}, "FSDP is not captured here"),
        (_accelerator(kind=DistributedType.MULTI_CPU, processes=2), {}, "MULTI_CPU is not captured here"),
        (_accelerator(kind=DistributedType.MULTI_GPU, processes=2, accum=2), {}, "gradient accumulation"),
        (_accelerator(accum=2), {}, "gradient accumulation"),
        (_accelerator(), {"max_grad_norm": 1.0}, "max_grad_norm: gradient clipping is not captured"),
        (_accelerator(scaler=object()), {}, "fp16's grad scaler"),
        (_accelerator(precision="fp8"), {}, "fp8"),
        (_accelerator(dynamo=DynamoBackend.INDUCTOR, mode="reduce-overhead"), {},
         "torch.compile's mode reduce-overhead records CUDA graphs of its own"),
        (_accelerator(dynamo=DynamoBackend.INDUCTOR, mode="max-autotune"), {}, "mode max-autotune records CUDA graphs"),
        (_accelerator(dynamo=DynamoBackend.CUDAGRAPHS), {}, "dynamo_backend cudagraphs is not captured here"),
        (_accelerator(dynamo=DynamoBackend.INDUCTOR, kind=DistributedType.MULTI_GPU, processes=2), {},
         "torch.compile under DDP is not captured here"),
        (_accelerator(), {"optimizer": "sgd"}, "optimizer SGD"),
        (_accelerator(), {"scheduler": "onecycle"}, "onecycle's cycle_momentum sets Adam's beta1"),
    ],
)  # fmt: skip
def test_what_cannot_be_captured_is_named(accelerator, config, reason):
    assert reason in why_eager(accelerator, TrainConfig(**config))  # type: ignore[operator]
    assert plan_of(accelerator, TrainConfig(**config)) == StepPlan()  # not asked for: eager, nothing to say


@pytest.mark.parametrize("backend", [DynamoBackend.INDUCTOR, DynamoBackend.AOT_EAGER, DynamoBackend.EAGER])
@pytest.mark.parametrize("mode", ["default", "max-autotune-no-cudagraphs"])
def test_a_compiled_model_is_captured_in_one_process(backend, mode):
    """torch.compile's kernels are captured with the rest of the step, in the modes that leave CUDA graphs to it;
    the plan says the model is compiled (a batch of another shape then runs eager kernels)."""
    config = TrainConfig(cuda_graph=True, optimizer="adam")
    plan = plan_of(_accelerator(dynamo=backend, mode=mode), config)
    assert plan == StepPlan(captured=True, compiled=True)
    assert plan_of(_accelerator(), config) == StepPlan(captured=True, compiled=False)
    strategy = Strategy.of(_accelerator(dynamo=backend, mode=mode))
    assert Strategy.from_fields(strategy.fields()) == strategy  # results.json keeps the mode
    assert "dynamo_mode" not in Strategy.of(_accelerator()).fields()


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_the_plan_and_the_step_name_each_optimizer_alike(name):
    """The step's plan asks the capture rule before an optimizer exists (optimizer_class_name): the
    name is the built optimizer's own."""
    config = TrainConfig(optimizer=name)
    built = build_optimizer(torch.nn.Linear(2, 2), config)
    assert optimizer_class_name(config) == optimizer_name(built) == type(built).__name__
    plain = why_eager(_accelerator(), config)
    assert plain == capture_refusal(Strategy.of(_accelerator()), config.replace(cuda_graph=True), type(built).__name__)


@pytest.mark.parametrize("processes", [1, 2])
def test_ddp_on_cuda_can_be_captured(processes):
    # torchrun --nproc_per_node 1 gives MULTI_GPU with one process too (Accelerate then wraps no DDP).
    accelerator = _accelerator(kind=DistributedType.MULTI_GPU, processes=processes)
    assert why_eager(accelerator, TrainConfig()) is None


@pytest.mark.parametrize(
    "device, kind, cuda_graph, expected",
    [
        ("cuda", DistributedType.MULTI_GPU, True, True),
        ("cuda", DistributedType.MULTI_GPU, False, False),
        ("cuda", DistributedType.NO, True, False),
        ("cuda", DistributedType.DEEPSPEED, True, False),
        ("cuda", DistributedType.FSDP, True, False),
        ("cpu", DistributedType.MULTI_CPU, True, False),
    ],
)
def test_only_a_ddp_run_on_cuda_asking_for_capture_builds_ddp_on_a_side_stream(device, kind, cuda_graph, expected):
    accelerator = _accelerator(device, kind=kind, processes=2)
    assert captures_under_ddp(accelerator, TrainConfig(cuda_graph=cuda_graph)) is expected  # type: ignore[arg-type]


@pytest.mark.parametrize("device, kind", [("cpu", DistributedType.MULTI_CPU), ("cuda", DistributedType.NO)])
def test_elsewhere_prepare_stays_on_its_stream(device, kind):
    # No CUDA call at all where the run will not capture under DDP: without a GPU, making a
    # stream would raise. The side stream itself is checked on a GPU (tests/gpu/test_cuda_graph.py).
    with ddp_side_stream(_accelerator(device, kind=kind), TrainConfig(cuda_graph=True)):  # type: ignore[arg-type]
        pass


def test_onecycle_without_momentum_cycling_can_be_captured():
    config = TrainConfig(scheduler="onecycle", cycle_momentum=False)
    assert why_eager(_accelerator(), config) is None


def test_onecycle_sets_beta1_anew_each_step_unless_told_not_to():
    # What the captured step guards against: the graph holds every setting but the lr tensor.
    for cycle, changes in ((True, True), (False, False)):
        optimizer = _adam()
        schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2, total_steps=20, cycle_momentum=cycle)
        make_capturable(optimizer, torch.device("cpu"))
        before = hyperparameters(optimizer)
        optimizer.step()
        schedule.step()
        assert (hyperparameters(optimizer) != before) is changes


def test_one_cuda_process_with_adam_can_be_captured():
    assert why_eager(_accelerator(), TrainConfig()) is None
    assert plan_of(_accelerator(precision="bf16"), TrainConfig(optimizer="adamw", cuda_graph=True)).captured


def test_on_the_cpu_the_run_takes_the_eager_step_and_says_why(capsys):
    model = torch.nn.Linear(4, 2)
    accelerator = _accelerator("cpu")
    config = TrainConfig(cuda_graph=True)
    step = build_step(accelerator, config, model, _adam(list(model.parameters())), (8, 4),
                      plan_of(accelerator, config))  # type: ignore[arg-type]  # fmt: skip
    assert isinstance(step, EagerStep) and not step.captured
    assert step.facts == {"step": "eager", "capture_seconds": 0.0,
                          "eager_reason": "the device is cpu; CUDA graphs need a CUDA GPU"}  # fmt: skip
    assert capsys.readouterr().out == "cuda_graph: eager step: the device is cpu; CUDA graphs need a CUDA GPU\n"


def test_without_cuda_graph_nothing_is_said(capsys):
    model = torch.nn.Linear(4, 2)
    step = build_step(_accelerator(), TrainConfig(), model, _adam(list(model.parameters())), (8, 4), StepPlan())  # type: ignore[arg-type]
    assert isinstance(step, EagerStep) and step.facts == {"step": "eager", "capture_seconds": 0.0}
    assert capsys.readouterr().out == ""


@pytest.mark.filterwarnings("ignore:Detected call of")  # no optimizer step between the schedule's here
def test_make_capturable_keeps_the_schedule_and_the_state():
    params = [torch.nn.Parameter(torch.ones(3))]
    optimizer = _adam(params)
    params[0].grad = torch.ones(3)
    optimizer.step()  # a state with a host step count, as an eager checkpoint holds it
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2, total_steps=20)
    twin = torch.optim.lr_scheduler.OneCycleLR(_adam(), max_lr=1e-2, total_steps=20)
    make_capturable(optimizer, torch.device("cpu"))
    group = optimizer.param_groups[0]
    assert group["capturable"] is True and torch.is_tensor(group["lr"]) and group["lr"].dtype == torch.float32
    lr_tensor = group["lr"]
    for _ in range(5):
        schedule.step()
        twin.step()
    # Filled in place: a captured step reads the schedule's current rate from the same tensor.
    assert optimizer.param_groups[0]["lr"] is lr_tensor
    assert float(schedule.get_last_lr()[0]) == pytest.approx(twin.get_last_lr()[0], rel=1e-6)
    assert optimizer.state[params[0]]["step"].dtype == torch.float32


@pytest.mark.parametrize("name", ["adam", "adamw"])
def test_the_captured_steps_fused_adam_trains_as_the_eager_one(name):
    # Fused where capture makes it capturable: the same updates as torch's default Adam, to rounding.
    def trained(capture: bool) -> tuple[torch.optim.Optimizer, list[torch.Tensor]]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
        optimizer = OPTIMIZER_CLASSES[name](model.parameters(), lr=1e-2, weight_decay=0.01)
        schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2, total_steps=10, cycle_momentum=False)
        if capture:
            make_capturable(optimizer, torch.device("cpu"))
        data = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
        for _ in range(6):
            optimizer.zero_grad()
            model(data).square().mean().backward()
            optimizer.step()
            schedule.step()
        return optimizer, [p.detach() for p in model.parameters()]

    fused, got = trained(capture=True)
    plain, want = trained(capture=False)
    assert fused.param_groups[0]["fused"] is True and not plain.param_groups[0].get("fused")
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_group_that_asked_for_foreach_keeps_it():
    optimizer = torch.optim.Adam([torch.nn.Parameter(torch.ones(2))], foreach=True)
    make_capturable(optimizer, torch.device("cpu"))
    assert optimizer.param_groups[0]["foreach"] is True and not optimizer.param_groups[0]["fused"]


def test_channels_last_changes_the_layout_not_the_values():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert to_memory_format(model, TrainConfig()) is model and model[0].weight.is_contiguous()
    to_memory_format(model, TrainConfig(channels_last=True))
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last) and not model[0].weight.is_contiguous()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_run_asking_for_capture_on_the_cpu_trains_eagerly_and_records_why(synthetic_mnist, tmp_path, capsys):
    from accel_mnist import train

    config = TrainConfig(model="linear", data_dir=str(synthetic_mnist), download=False, max_steps=3,
                         output_dir=str(tmp_path / "run"), cuda_graph=True, channels_last=True, export=False,
                         plots=False, save_checkpoints=False, quiet=True)  # fmt: skip
    results = train(config)
    assert results["step"] == "eager" and results["capture_seconds"] == 0.0
    assert results["eager_reason"] == "the device is cpu; CUDA graphs need a CUDA GPU"
    assert "cuda_graph: eager step: the device is cpu" in capsys.readouterr().out
    assert results["steps"] == 3


def _bn_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                               torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 3))  # fmt: skip


def _steps(model, optimizer, n, seed):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(n):
        optimizer.zero_grad(set_to_none=True)
        x, y = torch.randn(8, 1, 8, 8, generator=gen), torch.randint(0, 3, (8,), generator=gen)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


@pytest.mark.parametrize("trained_before", [0, 2])  # a fresh optimizer, and one with state (a resume)
def test_the_warm_up_before_capture_is_undone_bit_for_bit(trained_before):
    import copy

    from accel_mnist.training.captured_step import Snapshot

    model = _bn_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _steps(model, optimizer, trained_before, seed=1)
    twin = copy.deepcopy(model)
    twin_optimizer = torch.optim.AdamW(twin.parameters(), lr=1e-2)
    twin_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))  # load_state_dict keeps the tensors
    tensors = [id(t) for t in (*model.parameters(), *model.buffers())]
    snapshot = Snapshot(model, optimizer)
    _steps(model, optimizer, 3, seed=2)  # capture's warm-up: real steps, running stats included
    snapshot.restore()
    assert [id(t) for t in (*model.parameters(), *model.buffers())] == tensors  # the same tensors, in place
    _steps(model, optimizer, 4, seed=3)
    _steps(twin, twin_optimizer, 4, seed=3)
    for (name, a), b in zip(model.state_dict().items(), twin.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    for state, twin_state in zip(optimizer.state.values(), twin_optimizer.state.values(), strict=True):
        assert all(torch.equal(state[k], twin_state[k]) for k in state)
