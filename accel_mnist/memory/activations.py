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
counted again. The step is traced as a CUDA GPU runs it, where that differs from the meta device:
under DeepSpeed's and FSDP2's 16-bit weights every float is 16-bit; beside fp32 weights (one process,
DDP) torch.autocast's choice of each call's precision is emulated (16-bit copies of a matmul's or a
convolution's inputs, fp32 outputs of norms, softmax and losses); scaled dot-product attention keeps
what its fused kernels keep, not the math path's attention matrix; dropout keeps a one-byte mask.
Layers whose GPU memory it cannot see (cuDNN's recurrent layers, grouped convolutions) raise
Untraceable with a line that says so: no number that may be under. Judged against GPU measurements on
a CPU: benchmarks/trace_check.py.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
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


# torch.autocast on CUDA (torch's "Automatic Mixed Precision" docs): the calls that run in 16 bits, their
# floating inputs cast there (a new tensor each, which the call may keep for the backward), and the calls
# that run in fp32. Any other call runs in its inputs' dtype (mixed: the widest).
_AUTOCAST_LOW = frozenset({"linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                           "conv_transpose3d", "matmul", "__matmul__", "mm", "bmm", "baddbmm", "addmm", "addbmm",
                           "addmv", "addr", "mv", "chain_matmul", "multi_dot", "prelu",
                           "scaled_dot_product_attention", "multi_head_attention_forward", "lstm", "gru", "rnn_tanh",
                           "rnn_relu", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell"})  # fmt: skip
_AUTOCAST_FP32 = frozenset({"layer_norm", "group_norm", "softmax", "log_softmax", "softmin", "cross_entropy",
                            "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "kl_div",
                            "binary_cross_entropy_with_logits", "norm", "normalize", "cumsum", "cumprod", "prod",
                            "sum", "exp", "expm1", "log", "log1p", "log2", "log10", "pow", "__pow__", "rsqrt",
                            "reciprocal", "softplus", "cosine_similarity", "cdist", "pdist", "dist", "erfinv",
                            "renorm", "acos", "asin", "cosh", "sinh", "tan"})  # fmt: skip


# What a call keeps for the backward on the GPU, given its output; None: what its meta path keeps.
Kept = Callable[[Any], list[torch.Tensor]] | None


def _unkept(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _attention_kept(args: tuple, kwargs: dict) -> Kept:
    """What scaled dot-product attention keeps for the backward on a CUDA GPU: its flash and memory-efficient
    kernels keep the query, key, value, output and each row's log-sum-exp (fp32), never the attention matrix
    that the math path (the meta device's) builds in fp32."""
    query, key, value = (list(args) + [kwargs.get(k) for k in ("query", "key", "value")][len(args) :])[:3]
    logsumexp = torch.empty(query.shape[:-1], device="meta", dtype=torch.float32)
    return lambda out: [t for t in (query, key, value, out, logsumexp) if isinstance(t, torch.Tensor)]


def _heads_last(out: Any) -> Any:
    """SDPA's output laid out as its CUDA kernels write it: (batch, tokens, heads, dim) in memory, returned
    as the (batch, heads, tokens, dim) view, so that the usual `out.transpose(1, 2).reshape(b, n, c)` is a
    view there; the meta path's contiguous output would make that reshape a copy the GPU never holds."""
    if not isinstance(out, torch.Tensor) or out.ndim != 4 or not out.is_contiguous():
        return out
    return out.transpose(1, 2).contiguous().transpose(1, 2)


def _multi_head_kept(args: tuple, kwargs: dict) -> Kept:
    """nn.MultiheadAttention without its weights (need_weights=False, as nn.TransformerEncoderLayer calls it)
    runs scaled dot-product attention between two projections: it keeps its input, the projected query, key
    and value, the attention's output and log-sum-exp. Asked for its weights, it builds the attention matrix
    itself, as the meta path does (None: that path's tensors are counted)."""
    if kwargs.get("need_weights", True) or not kwargs.get("training", True):
        return None
    query, heads = args[0], int(args[4])
    projected = torch.empty(3 * query.numel(), device="meta", dtype=query.dtype)
    attended = torch.empty(query.numel(), device="meta", dtype=query.dtype)
    logsumexp = torch.empty(query.numel() // query.shape[-1] * heads, device="meta", dtype=torch.float32)
    return lambda out: [query, projected, attended, logsumexp]


def _dropout_kept(args: tuple, kwargs: dict) -> Kept:
    """What dropout keeps on a CUDA GPU: a one-byte mask of its input's shape (native_dropout), where the meta
    path keeps a mask in the input's dtype; nothing where it does not drop (evaluation, p = 0)."""
    p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
    training = args[2] if len(args) > 2 else kwargs.get("training", True)
    if not training or not p:
        return lambda out: []
    return lambda out: [torch.empty(args[0].shape, device="meta", dtype=torch.bool)]


# Calls whose GPU kernels keep other tensors for the backward than their meta path does.
_KEPT_BY_KERNEL: dict[str, Callable[[tuple, dict], Kept]] = {
    "scaled_dot_product_attention": _attention_kept,
    "multi_head_attention_forward": _multi_head_kept,
    "dropout": _dropout_kept,
}


# Calls whose memory on a CUDA GPU the trace cannot see: cuDNN keeps a reserve for a recurrent layer's
# backward (measured 1.1x to 1.4x the traced peak for nn.GRU and nn.LSTM, benchmarks/trace_check.py).
_UNMODELLED = {"gru": "nn.GRU (its reserve)", "lstm": "nn.LSTM (its reserve)", "rnn_tanh": "nn.RNN (its reserve)",
               "rnn_relu": "nn.RNN (its reserve)"}  # fmt: skip


# A grouped, not depthwise, convolution: at batch 4096 cuDNN's workspace took 1.14x the traced peak.
_CONVOLUTIONS = frozenset({"conv1d", "conv2d", "conv3d"})


def _grouped(args: tuple, kwargs: dict) -> bool:
    groups = args[6] if len(args) > 6 else kwargs.get("groups", 1)
    channels = args[0].shape[1] if args and isinstance(args[0], torch.Tensor) and args[0].ndim > 1 else 1
    return 1 < int(groups) < channels


class Untraceable(ValueError):
    """A model whose traced peak would not hold on a GPU: the line says which layer the trace cannot model."""


@dataclass(frozen=True)
class Activations:
    """Bytes of activations at the traced batch sizes (per process)."""

    train_bytes: int  # the larger of the forward's and the backward's live peak
    eval_bytes: int  # the no-gradient forward's live peak at the evaluation batch
    largest_bytes: int  # the largest single activation of the training batch


class _Live(TorchFunctionMode):
    """Counts the live bytes of the tensors torch calls return (meta tensors: nothing is computed)."""

    def __init__(self, autocast: torch.dtype | None = None) -> None:
        super().__init__()
        self.autocast = autocast  # torch.autocast's 16-bit dtype, emulated call by call; None: no autocast
        self.live = self.peak = self.largest = 0
        self.saved: list[torch.Tensor] = []
        self.first_saver: dict[int, tuple[int, int]] = {}  # saved tensor -> (the first call saving it, bytes)
        self.calls: list[tuple[int, int]] = []  # per call: (bytes of its outputs, of its inputs needing a gradient)
        self.params: set[int] = set()
        self.unmodelled: set[str] = set()  # _UNMODELLED's layers met
        self.keep: list[torch.Tensor] = []  # autocast's weight copies (their ids are in params)
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
        kwargs = kwargs or {}
        if name in _VIEWS or name.endswith("_"):  # views and in-place results: memory already counted
            return func(*args, **kwargs)
        self.current = len(self.calls)
        if name in _UNMODELLED:
            self.unmodelled.add(_UNMODELLED[name])
        elif name in _CONVOLUTIONS and _grouped(args, kwargs):
            self.unmodelled.add("a grouped convolution (its workspace)")
        if self.autocast is not None:
            args, kwargs = self._autocast(name, args, kwargs)
        rule = _KEPT_BY_KERNEL.get(name) if torch.is_grad_enabled() else None
        kept = rule(args, kwargs) if rule is not None else None
        if kept is None:
            out = func(*args, **kwargs)
        else:  # the meta (math) path's saved tensors are not what the GPU's kernel keeps: those are packed instead
            with torch.autograd.graph.saved_tensors_hooks(_unkept, _unkept):
                out = func(*args, **kwargs)
            if name == "scaled_dot_product_attention":
                out = _heads_last(out)
            for tensor in kept(out):
                self.pack(tensor)
        inputs = [a for a in args if isinstance(a, torch.Tensor)]
        outputs = [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor)]
        ids = {id(a) for a in inputs}
        for tensor in outputs:
            if id(tensor) not in ids and id(tensor) not in self.params:
                self.add(tensor)
        graded = sum(_nbytes(a) for a in inputs if a.requires_grad and id(a) not in self.params)
        self.calls.append((sum(_nbytes(t) for t in outputs if t.requires_grad), graded))
        return out

    def _autocast(self, name: str, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """The call's arguments as torch.autocast hands them to it: floating tensors cast to 16 bits or to fp32
        where the call is on one of its lists (each cast a new tensor, counted), as they are elsewhere."""
        dtype = self.autocast if name in _AUTOCAST_LOW else torch.float32 if name in _AUTOCAST_FP32 else None
        if dtype is None:
            return args, kwargs

        def cast(value: Any) -> Any:
            if isinstance(value, (list, tuple)):  # an RNN's weights come as a list
                return type(value)(cast(v) for v in value)
            if not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.dtype == dtype:
                return value
            out = value.to(dtype)
            if id(value) in self.params:  # autocast's copies of the weights: counted as the weights are
                self.params.add(id(out))
                self.keep.append(out)  # alive as long as the trace, so that its id is not reused
            else:
                self.add(out)
            return out

        return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        """The saved-tensors hook: keep `tensor` (as autograd would) and note the first call saving it.

        A saved view holds its base's memory: three linears saving their own flattened view of one input
        (q, k and v) keep one tensor, not three; the base's bytes are counted once."""
        base = tensor._base if tensor._base is not None else tensor
        if id(base) not in self.params and not _of_a_parameter(tensor):
            self.saved.append(base)
            self.first_saver.setdefault(id(base), (self.current, _nbytes(base)))
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


def _forward(
    model: nn.Module, state: dict[str, torch.Tensor], batch: torch.Tensor, train: bool, autocast: torch.dtype | None
) -> _Live:
    live = _Live(autocast)
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
          dtype: torch.dtype | None = None, autocast: bool = False) -> Activations:  # fmt: skip
    """Trace one training and one evaluation forward of `model` at these batch sizes on the meta device, as a
    CUDA GPU would run them; Untraceable where it meets a layer whose GPU memory it cannot model.

    `dtype`: the compute precision of floating tensors (None: the model's own): with `autocast`, the
    weights stay as they are and torch.autocast's choice of each call's precision is emulated (one
    process and DDP under Accelerate's fp16/bf16); without, every floating tensor is in `dtype`
    (DeepSpeed's and FSDP's 16-bit weights). The model's mode (train/eval) is set for each pass and put back.
    """
    was_training = model.training
    amp = dtype if autocast else None
    state = _meta_state(model, None if amp else dtype)
    own = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    float_dtype = own if amp or dtype is None else dtype
    try:
        model.train()
        train = _forward(model, state, torch.empty((batch_size, *input_shape), device="meta", dtype=float_dtype),
                         train=True, autocast=amp)  # fmt: skip
        if train.unmodelled:
            layers = ", ".join(sorted(train.unmodelled))
            raise Untraceable(f"the meta-device trace cannot model what cuDNN keeps beside {layers}")
        train_bytes = max(train.peak, train.backward_peak())
        model.eval()
        evaluated = _forward(model, state, torch.empty((eval_batch_size, *input_shape), device="meta",
                                                       dtype=float_dtype), train=False, autocast=amp)  # fmt: skip
    finally:
        model.train(was_training)
    return Activations(train_bytes=int(train_bytes), eval_bytes=int(evaluated.peak), largest_bytes=int(train.largest))
