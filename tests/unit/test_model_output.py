"""What a model may return: a tensor, a ModelOutput, a mapping or object with `logits`, a tuple
or list whose first element is the logits; anything else stops with one line that says what
came back (training with each kind: tests/e2e/test_model_output.py)."""

from __future__ import annotations

import pytest
import torch

from accel_mnist import UsageError
from accel_mnist.model_output import logits_of
from tests.your_model_data import WRAPS, WithLogits


@pytest.mark.parametrize("name", list(WRAPS))
def test_logits_of_each_kind(name):
    t = torch.randn(3, 10)
    assert logits_of(WRAPS[name](t)) is t


@pytest.mark.parametrize(
    "output, words",
    [
        (None, ["returned None"]),
        ("text", ["a str"]),
        ({"loss": torch.zeros(())}, ["a dict with keys (loss)"]),
        ((), ["an empty tuple"]),
        (("logits", 1), ["a tuple of 2 whose first element is a str"]),
        (WithLogits(None), ["a WithLogits whose logits is None"]),
        ({}, ["an empty dict"]),
    ],
)
def test_anything_else_is_one_line_naming_what_came_back(output, words):
    with pytest.raises(UsageError) as e:
        logits_of(output)
    message = str(e.value)
    assert "\n" not in message and "ModelOutput" in message
    for word in words:
        assert word in message, message
