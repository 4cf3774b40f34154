"""Small models that leave fp32 islands after Cortex-M lowering.

Each `make_*` function is a qlint target factory: it returns the module, its
example inputs and a few calibration batches.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def _batches(shapes: list[tuple[int, ...]], n: int = 4, seed: int = 0) -> list[tuple[torch.Tensor, ...]]:
    generator = torch.Generator().manual_seed(seed)
    return [tuple(torch.randn(s, generator=generator) for s in shapes) for _ in range(n)]


class ScaledAttention(nn.Module):
    """softmax(q @ k^T / sqrt(d)) @ v on rank-3 inputs, scaled by div or mul."""

    def __init__(self, dim: int = 16, op: str = "div") -> None:
        super().__init__()
        self.dim, self.op = dim, op

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = torch.bmm(q, k.transpose(1, 2))
        if self.op == "div":
            scores = scores / math.sqrt(self.dim)
        else:
            scores = scores * (1.0 / math.sqrt(self.dim))
        return torch.bmm(scores.softmax(-1), v)


class MultiHeadAttention(nn.Module):
    """Rank-4 multi-head attention with linear projections (matmul becomes bmm)."""

    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.q, self.k, self.v, self.out = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q = self.q(x).reshape(b, n, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).reshape(b, n, self.heads, self.head_dim).transpose(1, 2)
        v = self.v(x).reshape(b, n, self.heads, self.head_dim).transpose(1, 2)
        attn = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        out = attn.softmax(-1) @ v
        return self.out(out.transpose(1, 2).reshape(b, n, c))


class ScaleThenPool(nn.Module):
    """A constant scale feeding an avg-pool, which shares its input's scale."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.avg_pool2d(torch.relu(x) / 4.0, 2)


class ConstantFirst(nn.Module):
    """`c / x`: the activation is the divisor, the constant the dividend."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("c", torch.tensor(2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c / (torch.relu(x) + 0.5)


class RuntimeDivisor(nn.Module):
    """Divides by a value computed at run time from another input: not a constant."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) / y.abs().amax()


class Norm(nn.Module):
    """LayerNorm: a divide by sqrt(var) that depends on the data."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.proj, self.norm = nn.Linear(dim, dim), nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(x))


def make_attention() -> tuple:
    shapes = [(1, 8, 16)] * 3
    return ScaledAttention(16, "div"), _batches(shapes, 1)[0], _batches(shapes)


def make_attention_mul() -> tuple:
    shapes = [(1, 8, 16)] * 3
    return ScaledAttention(16, "mul"), _batches(shapes, 1)[0], _batches(shapes)


def make_multi_head() -> tuple:
    torch.manual_seed(0)
    shapes = [(1, 8, 16)]
    return MultiHeadAttention(16, 2), _batches(shapes, 1)[0], _batches(shapes)


def make_pool() -> tuple:
    shapes = [(1, 4, 8, 8)]
    return ScaleThenPool(), _batches(shapes, 1)[0], _batches(shapes)


def make_constant_first() -> tuple:
    shapes = [(1, 8, 16)]
    return ConstantFirst(), _batches(shapes, 1)[0], _batches(shapes)


def make_runtime_divisor() -> tuple:
    shapes = [(1, 8, 16), (1, 8, 16)]
    return RuntimeDivisor(), _batches(shapes, 1)[0], _batches(shapes)


def make_norm() -> tuple:
    torch.manual_seed(0)
    shapes = [(1, 8, 16)]
    return Norm(16), _batches(shapes, 1)[0], _batches(shapes)


class Scale(nn.Module):
    """A lone constant scale between the input and output quantizers."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / 3.0


def make_scale() -> tuple:
    shapes = [(1, 8, 16)]
    return Scale(), _batches(shapes, 1)[0], _batches(shapes)


class ScaleIntoConcat(nn.Module):
    """A constant scale whose output shares its quantizer with a concatenation."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.cat([x / 3.0, y], dim=-1)


def make_scale_into_concat() -> tuple:
    shapes = [(1, 8, 16), (1, 8, 16)]
    return ScaleIntoConcat(), _batches(shapes, 1)[0], _batches(shapes)


class HalfIntoConcat(nn.Module):
    """A power-of-two scale into a shared concat quantizer: not an identity, but exact as a rescale."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.cat([x / 2.0, y], dim=-1)


def make_half_into_concat() -> tuple:
    shapes = [(1, 8, 16), (1, 8, 16)]
    return HalfIntoConcat(), _batches(shapes, 1)[0], _batches(shapes)


class ScaleThroughReshape(nn.Module):
    """`x * 2` then a reshape then `/ 2`: an identity whose island changes the shape."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 2.0).reshape(1, 16, 8) / 2.0


def make_scale_through_reshape() -> tuple:
    shapes = [(1, 8, 16)]
    return ScaleThroughReshape(), _batches(shapes, 1)[0], _batches(shapes)


class ScaleThroughTranspose(nn.Module):
    """A square transpose inside an island that is not an identity: the shape stays, the layout does not."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 3.0).transpose(1, 2).abs()


def make_scale_through_transpose() -> tuple:
    shapes = [(1, 8, 8)]
    return ScaleThroughTranspose(), _batches(shapes, 1)[0], _batches(shapes)


class SplitIsland(nn.Module):
    """A split inside an island: a multi-output shape op, replayed on int8 with its getitem."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.split(x / 3.0, 8, dim=-1)[0].abs()


def make_split_island() -> tuple:
    shapes = [(1, 8, 16)]
    return SplitIsland(), _batches(shapes, 1)[0], _batches(shapes)


class HalfPrecisionIsland(nn.Module):
    """A dtype conversion inside an island: not data movement, so not replayable on integers."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x * 3.0).to(torch.float16) / 7.0).to(torch.float32).abs()


def make_half_precision_island() -> tuple:
    shapes = [(1, 8, 8)]
    return HalfPrecisionIsland(), _batches(shapes, 1)[0], _batches(shapes)


class VectorScale(nn.Module):
    """`x / w` with a 16-element buffer: per-channel (varies by position) or uniform (all 4.0)."""

    def __init__(self, uniform: bool) -> None:
        super().__init__()
        self.register_buffer("w", torch.full((16,), 4.0) if uniform else torch.linspace(0.5, 2.0, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x / self.w).abs()


def make_per_channel_scale() -> tuple:
    shapes = [(1, 8, 16)]
    return VectorScale(uniform=False), _batches(shapes, 1)[0], _batches(shapes)


def make_uniform_vector_scale() -> tuple:
    shapes = [(1, 8, 16)]
    return VectorScale(uniform=True), _batches(shapes, 1)[0], _batches(shapes)


class ScaleChain(nn.Module):
    """`x * a / b` with a reshape in between: one island, two constants."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x) * 0.5
        return y.reshape(1, 16, 8) / 3.0


def make_scale_chain() -> tuple:
    shapes = [(1, 8, 16)]
    return ScaleChain(), _batches(shapes, 1)[0], _batches(shapes)


class MaskedAttention(nn.Module):
    """Hugging Face-style eager attention: `scores * scaling + mask`, the mask built in the graph.

    With no padding the mask is `(1 - ones) * finfo.min`, zero everywhere (BERT, ViT); a
    causal mask is `-inf` above the diagonal, so it differs by position (GPT-style decoders).
    """

    def __init__(self, dim: int = 16, heads: int = 2, causal: bool = False) -> None:
        super().__init__()
        self.heads, self.head_dim, self.causal = heads, dim // heads, causal
        self.scaling = self.head_dim ** -0.5
        self.q, self.k, self.v = (nn.Linear(dim, dim) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q = self.q(x).reshape(b, n, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).reshape(b, n, self.heads, self.head_dim).transpose(1, 2)
        v = self.v(x).reshape(b, n, self.heads, self.head_dim).transpose(1, 2)
        if self.causal:
            mask = torch.triu(torch.full((n, n), -1e4), diagonal=1)
        else:
            mask = (1.0 - torch.ones(b, n)[:, None, None, :]) * torch.finfo(torch.float32).min
        scores = q @ k.transpose(-2, -1) * self.scaling + mask
        return (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, n, c)


def make_masked_attention() -> tuple:
    shapes = [(1, 8, 16)]
    return MaskedAttention(), _batches(shapes, 1)[0], _batches(shapes)


def make_causal_attention() -> tuple:
    shapes = [(1, 8, 16)]
    return MaskedAttention(causal=True), _batches(shapes, 1)[0], _batches(shapes)


class ConvHardswish(nn.Module):
    """MobileNetV3's conv -> batch-norm -> hardswish block."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn, self.act = nn.Conv2d(4, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Hardswish()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


def make_conv_hardswish() -> tuple:
    torch.manual_seed(0)
    shapes = [(1, 4, 8, 8)]
    return ConvHardswish().eval(), _batches(shapes, 1)[0], _batches(shapes)


def as_channels_last(model: nn.Module, example: tuple, calibration: list) -> tuple:
    """The same model, example and batches in channels_last: qlint's `channels-last` remedy."""
    from qlint.remedies.channels_last import ChannelsLast
    from qlint.remedies.remedy import Build

    built = ChannelsLast().on_build(Build(model, example, tuple(calibration)))
    return built.model, built.example, list(built.calibration)


def make_conv_hardswish_channels_last() -> tuple:
    return as_channels_last(*make_conv_hardswish())


class Clamp(nn.Module):
    """A standalone clamp; quantized int16 it is lowered to a float-bounded `aten.clamp`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clamp(-1.0, 1.0)


def make_clamp() -> tuple:
    shapes = [(1, 8, 16)]
    return Clamp(), _batches(shapes, 1)[0], _batches(shapes)


def make_transformer_encoder() -> tuple:
    """`nn.TransformerEncoder`, whose layers take PyTorch's fused fast path under `no_grad`."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False).eval()
    shapes = [(1, 8, 16)]
    return model, _batches(shapes, 1)[0], _batches(shapes)


class MaskInputAttention(MaskedAttention):
    """BERT-style attention whose additive mask is a graph input, `[batch, 1, 1, seq]`."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        b, n, c = x.shape
        q = self.q(x).reshape(b, n, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).reshape(b, n, self.heads, self.head_dim).transpose(1, 2)
        v = self.v(x).reshape(b, n, self.heads, self.head_dim).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim) + mask
        return (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, n, c)


def make_mask_input_attention() -> tuple:
    shapes = [(1, 8, 16), (1, 1, 1, 8)]
    return MaskInputAttention(), _batches(shapes, 1)[0], _batches(shapes)


class LeViTAttention(nn.Module):
    """timm LeViT's attention: `q @ k^T * scale` plus a learned bias per head and relative offset,
    gathered for every query/key pair by a constant index buffer (`aten.index`).

    timm initializes the biases to zero; training makes them differ by offset (`trained`).
    """

    def __init__(self, dim: int = 16, heads: int = 2, resolution: int = 4, trained: bool = False) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.scale = self.head_dim ** -0.5
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        grid = torch.arange(resolution)
        points = torch.stack(torch.meshgrid(grid, grid, indexing="ij")).flatten(1)
        offsets = (points[:, :, None] - points[:, None, :]).abs()
        self.register_buffer("attention_bias_idxs", offsets[0] * resolution + offsets[1], persistent=False)
        shape = (heads, resolution * resolution)
        self.attention_biases = nn.Parameter(torch.randn(shape) if trained else torch.zeros(shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        attn = q @ k.transpose(-2, -1) * self.scale + self.attention_biases[:, self.attention_bias_idxs]
        return self.proj((attn.softmax(-1) @ v).transpose(1, 2).reshape(b, n, c))


def make_levit_attention() -> tuple:
    torch.manual_seed(0)
    shapes = [(1, 16, 16)]
    return LeViTAttention().eval(), _batches(shapes, 1)[0], _batches(shapes)


def make_levit_attention_trained() -> tuple:
    torch.manual_seed(0)
    shapes = [(1, 16, 16)]
    return LeViTAttention(trained=True).eval(), _batches(shapes, 1)[0], _batches(shapes)


class ComputedScale(nn.Module):
    """`x + torch.full(shape, 0.5) * w`: a scale computed from constants on every inference.

    Broadcast to the activation's shape (1, 8, 16), the mul is refused by the quantizer's mul
    pattern and stays fp32; its result is quantized for the int8 add. With the parameter's own
    shape (16,) the mul pattern takes it, and the lowering drops the quantize of the `full`.
    """

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.shape = shape
        self.w = nn.Parameter(torch.linspace(0.5, 2.0, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.full(self.shape, 0.5) * self.w


def make_computed_scale() -> tuple:
    shapes = [(1, 8, 16)]
    return ComputedScale((1, 8, 16)), _batches(shapes, 1)[0], _batches(shapes)


def make_computed_scale_quantized_mul() -> tuple:
    shapes = [(1, 8, 16)]
    return ComputedScale((16,)), _batches(shapes, 1)[0], _batches(shapes)
