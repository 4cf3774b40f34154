"""Small models for a Cortex-M with an Ethos-U NPU, one per way the NPU's work gets split.

Each `make_*` function is a qlint target factory (module, example inputs, calibration batches).
`FLOAT_OPS` names, per factory, the ops a user left in float when quantizing it for the NPU
(`EthosUQuantizer.set_node_target(op, None)`): quantized with them, the program is what Arm's flow
lowers with those ops on the CPU.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def _batches(shape: tuple[int, ...], n: int = 4, seed: int = 0) -> list[tuple[torch.Tensor, ...]]:
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(shape, generator=generator),) for _ in range(n)]


class Attention(nn.Module):
    """Single-head attention with projections; `scores / sqrt(d)`, or the scale folded into q's weights,
    and optionally a causal mask (`masked_fill`, which exports as `where`)."""

    def __init__(self, dim: int = 32, seq: int = 16, causal: bool = False, folded: bool = False) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.dim, self.causal, self.folded = dim, causal, folded
        if folded:
            with torch.no_grad():
                self.q.weight /= math.sqrt(dim)
                self.q.bias /= math.sqrt(dim)
        if causal:
            self.register_buffer("mask", torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)
        scores = q @ k.transpose(-1, -2)
        if not self.folded:
            scores = scores / math.sqrt(self.dim)
        if self.causal:
            scores = scores.masked_fill(self.mask, float("-inf"))
        return self.o(torch.softmax(scores, dim=-1) @ v)


class ConvHardswish(nn.Module):
    """Three convolutions with a hardswish between each."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(8, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 16, 3, padding=1)
        self.c3 = nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.hardswish(self.c1(x))
        x = nn.functional.hardswish(self.c2(x))
        return self.c3(x)


class EmbeddingLinear(nn.Module):
    """A token embedding in front of a linear layer."""

    def __init__(self, vocab: int = 100, dim: int = 32) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, dim)
        self.linear = nn.Linear(dim, dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.linear(self.embedding(tokens))


class TokenMixing(nn.Module):
    """A linear over channels, a transpose, and a linear over tokens (an MLP-Mixer's token mixing)."""

    def __init__(self, tokens: int = 16, dim: int = 16) -> None:
        super().__init__()
        self.channels, self.tokens = nn.Linear(dim, dim), nn.Linear(tokens, tokens)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tokens(self.channels(x).transpose(1, 2))


class ConvLayerNorm(nn.Module):
    """A convolution whose output channels are LayerNorm'ed per position, then a linear layer: a
    token mixer's stem over `size`x`size` positions (1: a pooled vector, a classifier's head)."""

    def __init__(self, channels: int = 32) -> None:
        super().__init__()
        self.conv = nn.Conv2d(16, channels, 3, padding=1)
        self.norm = nn.LayerNorm(channels)
        self.linear = nn.Linear(channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.norm(self.conv(x).flatten(2).transpose(1, 2)))


class TokensAndHead(nn.Module):
    """`ConvLayerNorm` over 4x4 positions, then the tokens' mean through a second LayerNorm and a linear
    layer: a LayerNorm over many elements and one over a single vector, each placed on its own."""

    def __init__(self, channels: int = 32) -> None:
        super().__init__()
        self.tokens = ConvLayerNorm(channels)
        self.head_norm = nn.LayerNorm(channels)
        self.head = nn.Linear(channels, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.head_norm(self.tokens(x).mean(1)))


def make_attention() -> tuple[nn.Module, tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    return Attention().eval(), (torch.randn(1, 16, 32),), _batches((1, 16, 32))


def make_attention_folded() -> tuple[nn.Module, tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    return Attention(folded=True).eval(), (torch.randn(1, 16, 32),), _batches((1, 16, 32))


def make_causal_attention() -> tuple[nn.Module, tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    return Attention(causal=True).eval(), (torch.randn(1, 16, 32),), _batches((1, 16, 32))


def make_conv_hardswish() -> tuple[nn.Module, tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    return ConvHardswish().eval(), (torch.randn(1, 8, 16, 16),), _batches((1, 8, 16, 16))


def make_embedding() -> tuple[nn.Module, tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    tokens = [(torch.randint(0, 100, (1, 8), generator=generator),) for _ in range(4)]
    return EmbeddingLinear().eval(), (torch.randint(0, 100, (1, 8)),), tokens


def make_token_mixing() -> tuple[nn.Module, tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    return TokenMixing().eval(), (torch.randn(1, 16, 16),), _batches((1, 16, 16))


def make_conv_layernorm() -> tuple[nn.Module, tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    return ConvLayerNorm().eval(), (torch.randn(1, 16, 4, 4),), _batches((1, 16, 4, 4))


def make_head_layernorm() -> tuple[nn.Module, tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    return ConvLayerNorm(64).eval(), (torch.randn(1, 16, 1, 1),), _batches((1, 16, 1, 1))


def make_tokens_and_head() -> tuple[nn.Module, tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    return TokensAndHead().eval(), (torch.randn(1, 16, 4, 4),), _batches((1, 16, 4, 4))


# The ops a user left in float, by factory: `make_attention` with its scale left float is the
# attention island the NPU splits on; `make_conv_hardswish` with its activations left float;
# `make_token_mixing` with its transpose left float, a data move the NPU does not run between two
# partitions.
FLOAT_OPS = {
    "make_attention": ("aten.div.Tensor",),
    "make_conv_hardswish": ("aten.hardswish.default",),
    "make_token_mixing": ("aten.transpose.int",),
}
