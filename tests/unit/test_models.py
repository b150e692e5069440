"""The model registry: every model maps (N, 1, 28, 28) to (N, 10) and trains."""

from __future__ import annotations

import pytest
import torch

from accel_mnist.errors import ConfigError
from accel_mnist.models import MODELS, build_model, num_parameters


@pytest.mark.parametrize("name", sorted(MODELS))
def test_shapes_and_gradients(name):
    torch.manual_seed(0)
    model = build_model(name)
    x = torch.randn(5, 1, 28, 28)
    logits = model(x)
    assert logits.shape == (5, 10) and logits.dtype == torch.float32
    logits.logsumexp(1).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_known_sizes():
    # The seed's linear model and the pytorch/examples CNN have well-known parameter counts.
    assert num_parameters(build_model("linear")) == 784 * 10 + 10
    assert num_parameters(build_model("cnn")) == 1_199_882
    # convs without bias (9*(1*32 + 32*64 + 64*128)), BatchNorm scale and shift, 1152 -> 10
    assert num_parameters(build_model("bncnn")) == 9 * (32 + 2048 + 8192) + 2 * (32 + 64 + 128) + 1152 * 10 + 10


def test_bncnn_pool_pools_before_batchnorm_with_bncnn_s_parameters():
    torch.manual_seed(0)
    plain = build_model("bncnn")
    torch.manual_seed(0)
    pooled = build_model("bncnn_pool")
    kinds = [type(m).__name__ for m in pooled.features]
    assert kinds[:4] == ["Conv2d", "MaxPool2d", "BatchNorm2d", "ReLU"] and len(kinds) == 12
    assert [p.shape for p in pooled.parameters()] == [p.shape for p in plain.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(pooled.parameters(), plain.parameters(), strict=True))
    # Max-pooling and ReLU commute, BatchNorm does not: in eval mode with fresh statistics (the
    # identity), the two orders compute the same logits; in training the statistics differ.
    x = torch.randn(8, 1, 28, 28)
    torch.testing.assert_close(pooled.eval()(x), plain.eval()(x))
    assert not torch.allclose(pooled.train()(x), plain.train()(x))


def test_unknown_model():
    with pytest.raises(ConfigError, match="model: 'vit' is not one of"):
        build_model("vit")
