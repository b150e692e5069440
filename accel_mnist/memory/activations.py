"""The activation memory of one training step and one evaluation batch, traced before a run.

One forward pass runs on the meta device (no memory, no arithmetic) through
`torch.func.functional_call` with meta copies of the model's parameters and buffers, so the
model itself, its BatchNorm statistics and the random stream are untouched. While it runs, a
`TorchFunctionMode` sees every torch call and the bytes of each new tensor it returns;
`weakref.finalize` takes them off when Python frees the tensor, and a saved-tensors hook keeps
what autograd saves for the backward pass alive, as autograd would. The live bytes' peak is
the forward pass's. The backward pass is then walked call by call from the last: at each, what
is still saved (a saved tensor is freed once the earliest call that saved it is done) plus the
gradient arriving at its output and the one it hands to its inputs; `train_bytes` is the larger
of the two peaks. Under no gradient (`eval_bytes`) only the tensors Python still refers to are
live.

Views (flatten, view, reshape ...) and in-place results share their input's memory and are not
counted again. Activations take the strategy's compute precision: 16-bit floats under fp16/bf16
(DeepSpeed's half model and autocast alike), integer and boolean tensors (max-pool indices,
dropout masks) as they are.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

# Calls whose result shares its input's storage.
_VIEWS = frozenset({"flatten", "view", "view_as", "reshape", "reshape_as", "t", "transpose", "permute", "squeeze",
                    "unsqueeze", "expand", "expand_as", "narrow", "select", "__getitem__", "detach", "unflatten",
                    "chunk", "split", "unbind", "contiguous", "as_strided", "movedim", "swapaxes", "T", "mT",
                    "real", "imag", "diagonal", "unfold", "__get__", "dim", "size", "numel", "stride",
                    "data_ptr", "is_contiguous", "requires_grad_", "retain_grad"})  # fmt: skip


@dataclass(frozen=True)
class Activations:
    """Bytes of activations at the traced batch sizes (per process)."""

    train_bytes: int  # the larger of the forward's and the backward's live peak
    eval_bytes: int  # the no-gradient forward's live peak at the evaluation batch
    largest_bytes: int  # the largest single activation of the training batch


class _Live(TorchFunctionMode):
    """Counts the live bytes of the tensors torch calls return (meta tensors: nothing is computed)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = self.largest = 0
        self.saved: list[torch.Tensor] = []
        self.first_saver: dict[int, tuple[int, int]] = {}  # saved tensor -> (the first call saving it, bytes)
        self.calls: list[tuple[int, int]] = []  # per call: (bytes of its outputs, of its inputs needing a gradient)
        self.params: set[int] = set()
        self._seen: set[int] = set()

    def add(self, tensor: torch.Tensor) -> None:
        if id(tensor) in self._seen:
            return
        size = tensor.numel() * tensor.element_size()
        self._seen.add(id(tensor))
        self.live += size
        self.peak = max(self.peak, self.live)
        self.largest = max(self.largest, size)
        weakref.finalize(tensor, self._free, id(tensor), size)

    def _free(self, key: int, size: int) -> None:
        self._seen.discard(key)
        self.live -= size

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in _VIEWS or name.endswith("_"):  # views and in-place results: memory already counted
            return func(*args, **(kwargs or {}))
        self.current = len(self.calls)
        out = func(*args, **(kwargs or {}))
        inputs = [a for a in args if isinstance(a, torch.Tensor)]
        outputs = [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor)]
        ids = {id(a) for a in inputs}
        for tensor in outputs:
            if id(tensor) not in ids and id(tensor) not in self.params:
                self.add(tensor)
        graded = sum(_nbytes(a) for a in inputs if a.requires_grad and id(a) not in self.params)
        self.calls.append((sum(_nbytes(t) for t in outputs if t.requires_grad), graded))
        return out

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        """The saved-tensors hook: keep `tensor` (as autograd would) and note the first call saving it."""
        if id(tensor) not in self.params and not _of_a_parameter(tensor):
            self.saved.append(tensor)
            self.first_saver.setdefault(id(tensor), (self.current, _nbytes(tensor)))
        return tensor

    def backward_peak(self) -> int:
        """The live peak of the backward pass, walked from the last call to the first."""
        saved_by = [0] * (len(self.calls) + 1)
        for first, size in self.first_saver.values():
            saved_by[first] += size
        held = sum(saved_by)
        peak = 0
        for index in range(len(self.calls) - 1, -1, -1):
            out_grad, in_grad = self.calls[index]
            peak = max(peak, held + out_grad + in_grad)
            held -= saved_by[index]
        return peak


def _of_a_parameter(tensor: torch.Tensor) -> bool:
    """A view autograd took of a parameter (linear's transposed weight): the parameter's memory, no activation."""
    fn = tensor.grad_fn
    if fn is None or len(fn.next_functions) != 1:
        return False
    source = fn.next_functions[0][0]
    return source is not None and type(source).__name__ == "AccumulateGrad"


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _meta_state(model: nn.Module, dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """Meta copies of the parameters and buffers, floats in `dtype` where given."""
    out = {}
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        cast = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
        meta = torch.empty_like(tensor, device="meta", dtype=cast)
        out[name] = nn.Parameter(meta, requires_grad=tensor.requires_grad) if isinstance(tensor, nn.Parameter) else meta
    return out


def _forward(model: nn.Module, state: dict[str, torch.Tensor], batch: torch.Tensor, train: bool) -> _Live:
    live = _Live()
    live.params = {id(t) for t in state.values()}
    with live:
        live.add(batch)
        if train:
            with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(live.pack, lambda tensor: tensor):
                out = torch.func.functional_call(model, state, (batch,), strict=False)
        else:
            with torch.no_grad():
                out = torch.func.functional_call(model, state, (batch,), strict=False)
        del out
    return live


def trace(model: nn.Module, input_shape: tuple[int, ...], batch_size: int, eval_batch_size: int,
          dtype: torch.dtype | None = None) -> Activations:  # fmt: skip
    """Trace one training and one evaluation forward of `model` at these batch sizes on the meta device.

    `dtype`: the compute precision of floating tensors (None: the model's own). The model's mode
    (train/eval) is set for each pass and put back.
    """
    was_training = model.training
    state = _meta_state(model, dtype)
    float_dtype = dtype or next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    try:
        model.train()
        train = _forward(model, state, torch.empty((batch_size, *input_shape), device="meta", dtype=float_dtype),
                         train=True)  # fmt: skip
        train_bytes = max(train.peak, train.backward_peak())
        model.eval()
        evaluated = _forward(model, state, torch.empty((eval_batch_size, *input_shape), device="meta",
                                                       dtype=float_dtype), train=False)  # fmt: skip
    finally:
        model.train(was_training)
    return Activations(train_bytes=int(train_bytes), eval_bytes=int(evaluated.peak), largest_bytes=int(train.largest))
