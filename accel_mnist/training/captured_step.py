"""The training step captured once as a CUDA graph and replayed.

A small model's optimizer step on a GPU is mostly kernel launches: the fast recipe's
BatchNorm CNN at batch 512 takes about twice as long eager as replayed as one graph in
channels-last (the measurements: benchmarks/README.md).

With `cuda_graph`, the forward, backward and optimizer step are recorded once and each step
then copies its batch into static input buffers and replays them: one launch per step.

Capture needs a CUDA device, one process or DDP (not DeepSpeed or FSDP), one micro-batch per
step, no gradient clipping, no grad scaler (fp16's scaler reads the gradients' finiteness on the
host each step) and a torch Adam or AdamW (their `capturable` mode; SGD and Adadelta turn a
tensor learning rate into a host number, which a graph cannot replay). Anywhere else the eager
step runs and `why_eager` says why, in one line. What capture changes, and what it costs:

* Adam/AdamW run fused (`fused=True`: the parameters' updates in multi-tensor kernels, not a
  dozen foreach ones) and with `capturable=True` and the learning rate as a float32 device tensor that
  the schedule fills in place (torch's LRScheduler does so for tensor learning rates), so the
  replayed step reads the current rate; the step count stays on the device. Every other
  setting is a constant of the graph: onecycle's `cycle_momentum`, which sets beta1 anew each
  step, is refused (torch's capturable Adam reads a tensor beta1 on the host), and a setting
  that changes after capture all the same turns the eager step on, with a line.
* Capture wants a few eager iterations first, on a side stream (torch.cuda.graphs docs); they
  run on the real model and optimizer, and are then undone in place (parameters, buffers and
  optimizer state copied back, state created by them zeroed: what a fresh Adam starts from),
  so the run trains the same weights as the eager step, within float tolerance.
* A batch of another shape (the epoch's last, smaller one) takes the eager step on the same
  tensors; the replayed loss is copied out each step (one small device copy), since the loop
  keeps each step's loss until it next reads them.
* A torch.compile'd model (the launch's dynamo_backend, one process, a mode that leaves CUDA graphs
  to the caller: option_rules.capture_refusal) compiles in the warm-up iterations, so compilation
  counts in `capture_seconds`, and its kernels are captured with the rest. A batch of another shape
  runs under `torch.compiler.set_stance("force_eager")`: the model's eager kernels, which prewarm
  loaded, rather than a compilation of seconds inside the training clock.
* Dropout inside a graph draws from the CUDA generator as graphs allow; its masks are not the
  eager run's. The fast recipe's model has no dropout.
* Under DDP (torch.cuda.graphs docs, "Usage with DistributedDataParallel"; NCCL >= 2.9.6) the
  graph holds the whole step, DDP's collectives included: the buffer broadcast of its forward
  and the gradient all-reduce of its backward are replayed each step, into the same bucket
  tensors. The reducer's host bookkeeping (marking gradients ready, launching buckets) runs
  once, at capture. DDP is built on a side stream (distributed/ddp_capture.py, `ddp_side_stream`) and
  warmed up for 11 iterations, not 3: eight more eager steps in `capture_seconds`. At world
  size 1 (torchrun --nproc_per_node 1) Accelerate sets up MULTI_GPU but wraps no DDP: the plain
  module is captured, after the same side stream and warm-up.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from accelerate import Accelerator
from torch import nn

from ..config import TrainConfig
from ..distributed.ddp_capture import captures_under_ddp
from ..distributed.lean_steps import torch_optimizer
from ..distributed.option_rules import eager_line
from .resolved import StepPlan
from .step import EagerStep, step_input

# Eager iterations before capture, as torch's docs run them: 3, and at least 11 under DDP.
WARMUP_ITERATIONS, DDP_WARMUP_ITERATIONS = 3, 11


def optimizer_name(optimizer: Any) -> str:
    """torch's optimizers by their class name (the ones capture takes among them); others by their full name."""
    cls = type(optimizer)
    return cls.__name__ if cls.__module__.startswith("torch.optim") else f"{cls.__module__}.{cls.__name__}"


def hyperparameters(optimizer: torch.optim.Optimizer) -> list[tuple[Any, ...]]:
    """Each param group's settings that a captured step holds as constants: all but the
    parameters and the learning rate (a device tensor, compared by identity)."""
    return [
        tuple((k, id(v) if k == "lr" else v) for k, v in sorted(group.items()) if k != "params")
        for group in optimizer.param_groups
    ]


class Snapshot:
    """The model's parameters and buffers and the optimizer's state, to be put back in place
    (the same tensors, so that a graph recorded on them stays valid). State the optimizer
    creates after the snapshot is zeroed on restore: what a fresh Adam or AdamW starts from.
    A DDP wrapper's parameters and buffers are its module's (it holds none of its own), and its
    gradient buckets are written anew by every step: there is nothing more to undo."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer
        with torch.no_grad():
            self.tensors = [t.detach().clone() for t in (*model.parameters(), *model.buffers())]
            self.state = {
                id(p): {k: v.clone() for k, v in s.items() if torch.is_tensor(v)} for p, s in optimizer.state.items()
            }

    def restore(self) -> None:
        """Copy everything back into the tensors it was taken from."""
        with torch.no_grad():
            for tensor, value in zip((*self.model.parameters(), *self.model.buffers()), self.tensors, strict=True):
                tensor.copy_(value)
            for p, state in self.optimizer.state.items():
                before = self.state.get(id(p), {})
                for key, value in state.items():
                    if key in before:
                        value.copy_(before[key])
                    elif torch.is_tensor(value):
                        value.zero_()


class KeptGradients:
    """The torch optimizer as the captured step records it: its `step`, and a `zero_grad` that keeps the
    gradients, since a replayed backward writes them where the capture allocated them rather than
    adding to them (and a graph cannot record a tensor being let go)."""

    def __init__(self, inner: torch.optim.Optimizer) -> None:
        self.inner = inner

    def step(self) -> None:
        """The torch optimizer's step."""
        self.inner.step()

    def zero_grad(self) -> None:
        """Nothing: the next replay overwrites the gradients."""


class GraphedStep:
    """The eager step's work recorded once as a CUDA graph, replayed for every batch of its shape."""

    captured = True

    def __init__(
        self, eager: EagerStep, inner: torch.optim.Optimizer, batch_shape: tuple[int, ...], warmup: int,
        compiled: bool = False,
    ) -> None:  # fmt: skip
        self.eager, self.input_dtype, self.warmup, self.compiled = eager, eager.input_dtype, warmup, compiled
        self.inner = inner  # the torch optimizer itself: its step is what is captured
        # The eager step's own call, recorded: where capture is allowed (option_rules.capture_refusal:
        # one process or DDP, one micro-batch a step, no grad scaler, no clipping) its accumulate is
        # nothing, its backward loss.backward() and its optimizer the torch one, whose gradients stay.
        self.recorded = eager.with_optimizer(KeptGradients(inner))
        device = eager.accelerator.device
        make_capturable(self.inner, device)
        self.static_inputs = step_input(torch.zeros(batch_shape, device=device), eager.channels_last)
        self.static_labels = torch.zeros(batch_shape[0], dtype=torch.int64, device=device)
        start = time.perf_counter()
        self.graph, self.static_loss = self._capture()
        torch.cuda.synchronize(device)
        self.capture_seconds = time.perf_counter() - start
        # Replay uses the settings the step was captured with: a change to one later (a
        # schedule of the caller's, say) would be ignored, so the run takes the eager step from then on.
        self.captured_settings = hyperparameters(self.inner)
        self.facts: dict[str, Any] = {"step": "cuda_graph", "capture_seconds": self.capture_seconds}

    def _capture(self) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        inner = self.inner
        snapshot = Snapshot(self.eager.model, inner)
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(self.warmup):
                    inner.zero_grad(set_to_none=True)
                    self.recorded(self.static_inputs, self.static_labels)
            torch.cuda.current_stream().wait_stream(side)
            snapshot.restore()  # the run starts from the weights and state it had
            inner.zero_grad(set_to_none=True)  # the gradients are then allocated from the graph's pool
            graph = torch.cuda.CUDAGraph()
            # thread_local: the run's own threads (the lock's lease) make no CUDA calls, and another
            # library's would otherwise fail the capture.
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                loss = self.recorded(self.static_inputs, self.static_labels)
        except RuntimeError:
            # The eager step then trains from where the run stood, not from the warm-up's steps.
            torch.cuda.synchronize()
            snapshot.restore()
            raise
        # Replay writes these; eager steps in between (other shapes) leave them to the graph.
        self.static_grads = [p.grad for group in inner.param_groups for p in group["params"]]
        # Detached: the captured loss's autograd graph would keep the parameters' AccumulateGrad nodes,
        # made on the capture's stream, alive for the run; the eager step of the epoch's smaller batch then
        # reused them on the default stream, and autograd warned of the mismatch (seen on one H100).
        return graph, loss.detach()

    def __call__(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.captured and hyperparameters(self.inner) != self.captured_settings:
            self.captured = False
            reason = "the optimizer's settings changed after capture"
            self.facts.update(step="eager", eager_reason=reason)
            self.eager.accelerator.print(f"cuda_graph: the eager step from now on: {reason}")
        if not self.captured or inputs.shape != self.static_inputs.shape:
            # The replayed backward wrote the gradients rather than adding to them: clear them.
            self.inner.zero_grad(set_to_none=True)
            if self.compiled and self.captured:
                # torch.compile would compile the model again for this shape inside the training clock
                # (seconds, for one batch an epoch): the batch runs the model's eager kernels instead.
                with torch.compiler.set_stance("force_eager"):
                    return self.eager(inputs, labels)
            return self.eager(inputs, labels)
        self.static_inputs.copy_(inputs)
        self.static_labels.copy_(labels)
        self.graph.replay()
        return self.static_loss.clone()


def make_capturable(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Adam/AdamW in place as capture needs them: `capturable`, the learning rate a device tensor
    (the schedule then fills it), the step counts on the parameters' device; and `fused`, torch's
    multi-tensor Adam kernel, which reads the step counts and the learning rate on the device as
    capture needs, where the foreach Adam it replaces launches a kernel for each piece of the bias
    corrections (fast99_graph's profiled step: 151 kernels foreach, 114 fused, on one H100). A
    group that asked for foreach keeps it."""
    for group in optimizer.param_groups:
        group["capturable"] = True
        if not group.get("foreach") and not group.get("differentiable"):
            group["fused"] = True
        lr = group["lr"]
        if not (torch.is_tensor(lr) and lr.device == device):
            group["lr"] = torch.tensor(float(lr), dtype=torch.float32, device=device)
    for param, state in optimizer.state.items():
        step = state.get("step")
        if torch.is_tensor(step) and step.device != param.device:
            state["step"] = step.to(device=param.device, dtype=torch.float32)


def build_step(
    accelerator: Accelerator, config: TrainConfig, model: nn.Module, optimizer: Any, batch_shape: tuple[int, ...],
    plan: StepPlan,
) -> EagerStep | GraphedStep:  # fmt: skip
    """The run's step: captured where the run's `plan` (resolved.StepPlan, decided once) says so, else eager
    (and, where capture was asked for, one line saying why). Its `facts` go to results.json."""
    eager = EagerStep(accelerator, config, model, optimizer)
    if not config.cuda_graph:
        return eager
    reason = plan.why_eager
    inner = torch_optimizer(optimizer)
    if plan.captured and inner is not None:
        try:
            warmup = DDP_WARMUP_ITERATIONS if captures_under_ddp(accelerator, config) else WARMUP_ITERATIONS
            graphed = GraphedStep(eager, inner, batch_shape, warmup, plan.compiled)
        except RuntimeError as e:  # a model or setting that cannot be captured
            from ..errors import one_line

            reason = f"capture failed: {one_line(e)}"
            inner.zero_grad(set_to_none=True)
        else:
            accelerator.print(f"cuda_graph: the step is captured ({graphed.capture_seconds:.2f} s)")
            return graphed
    reason = reason or "no torch optimizer behind the prepared one to capture"
    eager.facts["eager_reason"] = reason
    accelerator.print(eager_line(reason))
    return eager
