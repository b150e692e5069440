"""What a model may return, as the ecosystem returns it, and the logits in it.

A plain tensor (the built-in models, most hand-written ones); an object or mapping with
`logits` (a transformers `ModelOutput`, which is both, or a dict); or a tuple or list whose first
element is the logits (transformers with `return_dict=False`, many older models). Training,
evaluation and predict all read the logits through `logits_of`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .errors import UsageError

__all__ = ["logits_of"]

_WANTED = (
    "a model must return its logits (batch, classes): a tensor, an object or mapping with `logits` "
    "(a transformers ModelOutput), or a tuple or list whose first element is the logits"
)


def logits_of(output: Any) -> torch.Tensor:
    """The logits in what a model returned; a one-line UsageError that says what came back otherwise."""
    if isinstance(output, torch.Tensor):  # first: the common case costs one isinstance check
        return output
    if isinstance(output, Mapping):
        logits = output.get("logits")
    elif isinstance(output, (tuple, list)):
        logits = output[0] if output else None
    else:
        logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    raise UsageError(f"the model returned {describe(output)}; {_WANTED}")


def describe(value: Any) -> str:
    """A short account of a value for an error message: its type, and what it holds."""
    kind = type(value).__name__
    if isinstance(value, Mapping):
        keys = ", ".join(map(str, list(value)[:6])) + (", ..." if len(value) > 6 else "")
        return f"a {kind} with keys ({keys})" if value else f"an empty {kind}"
    if isinstance(value, (tuple, list)):
        return f"a {kind} of {len(value)} whose first element is {_short(value[0])}" if value else f"an empty {kind}"
    if hasattr(value, "logits"):
        return f"a {kind} whose logits is {_short(value.logits)}"
    return _short(value)


def _short(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"
