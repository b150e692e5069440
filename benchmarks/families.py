"""Architectures users bring, not the built-in models: the family memory suite's (family_suite.py) models.

Each factory `name(num_classes=10)` returns a freshly initialised module that maps a normalised
(B, 1, 28, 28) float batch to (B, num_classes) logits (the ViT returns transformers'
`ImageClassifierOutput`, whose `logits` the loop reads). Each exercises something the built-in
models do not: cuDNN's RNN kernels (gru, lstm), scaled-dot-product attention (encoder, vit),
depthwise and grouped convolutions (dwconv, grouped), an embedding table (embed), and a forward
that branches on the mode and on the data (branchy: it cannot run on the meta device).
`LAYER_CLASSES` names each family's repeated block, for FSDP's TRANSFORMER_BASED_WRAP.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


class RowRNN(nn.Module):
    """The image's 28 rows as a 28-step sequence through a recurrent network; the last step's output -> Linear."""

    def __init__(self, rnn: type[nn.GRU] | type[nn.LSTM], num_classes: int = 10, hidden: int = 256,
                 bidirectional: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.rnn = rnn(28, hidden, num_layers=2, batch_first=True, bidirectional=bidirectional)
        self.head = nn.Linear(hidden * (2 if bidirectional else 1), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x.flatten(1, 2))  # (B, 28 rows, 28 pixels)
        return self.head(out[:, -1])


def gru(num_classes: int = 10) -> nn.Module:
    """nn.GRU, 2 layers of 256: 0.6M parameters."""
    return RowRNN(nn.GRU, num_classes)


def lstm(num_classes: int = 10) -> nn.Module:
    """A bidirectional nn.LSTM, 2 layers of 256: 2.2M parameters."""
    return RowRNN(nn.LSTM, num_classes, bidirectional=True)


class PatchEncoder(nn.Module):
    """7x7 patches -> 16 tokens + learned positions -> nn.TransformerEncoder (SDPA) -> mean-pool -> Linear."""

    def __init__(self, num_classes: int = 10, dim: int = 128, heads: int = 4, layers: int = 4) -> None:
        super().__init__()
        self.patches = nn.Conv2d(1, dim, 7, stride=7)
        self.positions = nn.Parameter(torch.randn(1, 16, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=4 * dim, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patches(x).flatten(2).transpose(1, 2) + self.positions
        return self.head(self.norm(self.encoder(tokens).mean(1)))


def encoder(num_classes: int = 10) -> nn.Module:
    """d_model 128, 4 heads, 4 layers: 0.8M parameters."""
    return PatchEncoder(num_classes)


def vit(num_classes: int = 10) -> nn.Module:
    """transformers' ViTForImageClassification from a small ViTConfig (nothing downloaded): 49 patches of 4x4,
    hidden 192, 6 layers of 3 heads: 1.8M parameters."""
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(image_size=28, patch_size=4, num_channels=1, hidden_size=192, num_hidden_layers=6,
                       num_attention_heads=3, intermediate_size=384)  # fmt: skip
    config.num_labels = num_classes
    return ViTForImageClassification(config)


class DepthwiseSeparable(nn.Sequential):
    """MobileNet's block: a depthwise 3x3 (groups=in_channels), then a pointwise 1x1, each with BatchNorm and ReLU6."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__(nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), nn.BatchNorm2d(cin),
                         nn.ReLU6(inplace=True), nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU6(inplace=True))  # fmt: skip


def dwconv(num_classes: int = 10) -> nn.Module:
    """A MobileNet-style stack on 28x28: 0.27M parameters."""
    widths = [(32, 64, 1), (64, 128, 2), (128, 128, 1), (128, 256, 2), (256, 256, 1), (256, 512, 2)]
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU6(inplace=True),
                         *[DepthwiseSeparable(*w) for w in widths], nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(512, num_classes))  # fmt: skip


class GroupedBlock(nn.Module):
    """ResNeXt's bottleneck: 1x1, a grouped 3x3 (32 groups), 1x1, GroupNorm after each, plus the shortcut."""

    def __init__(self, cin: int, cout: int, stride: int = 1, groups: int = 32) -> None:
        super().__init__()
        mid = cout // 2
        self.body = nn.Sequential(
            nn.Conv2d(cin, mid, 1, bias=False), nn.GroupNorm(8, mid), nn.ReLU(inplace=True),
            nn.Conv2d(mid, mid, 3, stride, 1, groups=groups, bias=False), nn.GroupNorm(8, mid), nn.ReLU(inplace=True),
            nn.Conv2d(mid, cout, 1, bias=False), nn.GroupNorm(8, cout),
        )  # fmt: skip
        self.shortcut = (nn.Identity() if cin == cout and stride == 1 else
                         nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.GroupNorm(8, cout)))  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.shortcut(x))


def grouped(num_classes: int = 10) -> nn.Module:
    """Four grouped bottlenecks, 28x28 -> 7x7: 0.54M parameters."""
    return nn.Sequential(nn.Conv2d(1, 64, 3, padding=1, bias=False), nn.GroupNorm(8, 64), nn.ReLU(inplace=True),
                         GroupedBlock(64, 128), GroupedBlock(128, 256, 2), GroupedBlock(256, 256),
                         GroupedBlock(256, 512, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(512, num_classes))  # fmt: skip


class MixBlock(nn.Module):
    """Attention-free mixing: LayerNorm, every token plus a Linear of the tokens' mean, then a residual MLP."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mix = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return x + self.mlp(h + self.mix(h.mean(1, keepdim=True)))


class PixelEmbed(nn.Module):
    """Each pixel quantised back to its 256 grey levels -> nn.Embedding(256, 64) + positions -> MixBlocks -> Linear."""

    MEAN, STD = 0.1307, 0.3081  # MNIST's normalisation (the run's own is within a few parts in a thousand)

    def __init__(self, num_classes: int = 10, dim: int = 64, hidden: int = 128, depth: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(256, dim)
        self.positions = nn.Parameter(torch.randn(1, 28 * 28, dim) * 0.02)
        self.blocks = nn.Sequential(*[MixBlock(dim, hidden) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        levels = ((x.flatten(1).float() * self.STD + self.MEAN) * 255).round().clamp(0, 255).long()
        tokens = self.blocks(self.embed(levels) + self.positions)
        return self.head(self.norm(tokens).mean(1))


def embed(num_classes: int = 10) -> nn.Module:
    """784 tokens of 64 per image (the heaviest activations per sample of the families): 0.1M parameters."""
    return PixelEmbed(num_classes)


class InceptionBlock(nn.Module):
    """Parallel 1x1, 3x3, 5x5 and pooled branches, concatenated: 3 * width channels out."""

    def __init__(self, cin: int, width: int) -> None:
        super().__init__()

        def conv(a: int, b: int, k: int) -> nn.Module:
            return nn.Sequential(nn.Conv2d(a, b, k, padding=k // 2, bias=False), nn.BatchNorm2d(b), nn.ReLU(True))

        self.b1 = conv(cin, width, 1)
        self.b3 = nn.Sequential(conv(cin, width // 2, 1), conv(width // 2, width, 3))
        self.b5 = nn.Sequential(conv(cin, width // 4, 1), conv(width // 4, width // 2, 5))
        self.pool = nn.Sequential(nn.MaxPool2d(3, 1, 1), conv(cin, width // 2, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b1(x), self.b3(x), self.b5(x), self.pool(x)], 1)


class Branchy(nn.Module):
    """Inception blocks, an auxiliary head that runs only in training (added to the logits, so that its weights
    get gradients), and a pooling chosen by the batch's values: `if x.mean() > 0` needs real numbers, so this
    forward does not run on the meta device."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True))
        self.inception1 = InceptionBlock(32, 32)  # 96 channels, 28x28
        self.inception2 = InceptionBlock(96, 64)  # 192 channels, 14x14
        self.aux = nn.Sequential(nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(96 * 16, num_classes))
        self.head = nn.Linear(192, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inception1(self.stem(x))
        aux = self.aux(h) if self.training else None
        h = F.max_pool2d(h, 2) if x.mean() > 0 else F.avg_pool2d(h, 2)
        logits = self.head(self.inception2(h).mean((2, 3)))
        return logits + 0.3 * aux if aux is not None else logits


def branchy(num_classes: int = 10) -> nn.Module:
    """Two Inception blocks and the auxiliary head: 0.07M parameters."""
    return Branchy(num_classes)


FAMILIES: dict[str, Callable[..., nn.Module]] = {
    "gru": gru, "lstm": lstm, "encoder": encoder, "vit": vit, "dwconv": dwconv, "grouped": grouped, "embed": embed,
    "branchy": branchy,
}  # fmt: skip
# The block class each family repeats, for FSDP's TRANSFORMER_BASED_WRAP (fsdp_transformer_layer_cls_to_wrap);
# the RNNs have none (nn.GRU/nn.LSTM hold every layer in one module).
LAYER_CLASSES = {"encoder": "TransformerEncoderLayer", "vit": "ViTLayer", "dwconv": "DepthwiseSeparable",
                 "grouped": "GroupedBlock", "embed": "MixBlock", "branchy": "InceptionBlock"}  # fmt: skip
