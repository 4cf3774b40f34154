"""The `int8-layernorm` remedy: LayerNorm and RMSNorm rebuilt from the ops Cortex-M has int8 kernels for."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from qlint.loading.quantize import export_float
from qlint.remedies.int8_layernorm import Int8LayerNorm, rebuild_layer_norms


class Functional(torch.nn.Module):
    """`F.layer_norm` called directly, with or without an affine, over the last `dims` dimensions."""

    def __init__(self, shape: tuple[int, ...], affine: bool, eps: float, dims: int = 1) -> None:
        super().__init__()
        normalized = shape[-dims:]
        self.normalized, self.eps = list(normalized), eps
        generator = torch.Generator().manual_seed(3)
        self.weight = torch.nn.Parameter(torch.randn(normalized, generator=generator)) if affine else None
        self.bias = torch.nn.Parameter(torch.randn(normalized, generator=generator)) if affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x * 2.0, self.normalized, self.weight, self.bias, self.eps)


def rebuilt(model: torch.nn.Module, example: tuple[torch.Tensor, ...]) -> torch.fx.GraphModule:
    return rebuild_layer_norms(export_float(model, example))


@pytest.mark.parametrize("shape", [(2, 8, 16), (4, 32), (1, 3, 5, 7)])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("eps", [1e-5, 1e-12, 0.5])
def test_the_rebuilt_layer_norm_equals_f_layer_norm_in_float(shape: tuple[int, ...], affine: bool, eps: float) -> None:
    model = Functional(shape, affine, eps).eval()
    generator = torch.Generator().manual_seed(11)
    batches = [(torch.randn(shape, generator=generator) * scale + shift,)
               for scale, shift in ((1, 0), (30, 5), (1e-3, -2))]
    graph = rebuilt(model, batches[0])
    ops = {str(n.target) for n in graph.graph.nodes if n.op == "call_function"}
    assert "aten.layer_norm.default" not in ops and "aten.linear.default" in ops and "aten.rsqrt.default" in ops
    for batch in batches:
        expected, got = model(*batch), graph(*batch)
        # Float rounding of x - mean is amplified by the row's conditioning |x| / std (≈ 2,500-6,000 for
        # the third batch): the error stays within 4 float32 ulps of the output scaled by it.
        x = batch[0] * 2.0
        conditioning = float((x.abs().amax(-1) / x.std(-1, unbiased=False)).max())
        bound = 4 * float(expected.abs().max()) * max(conditioning, 1.0) * torch.finfo(torch.float32).eps / 2
        assert float((got - expected).abs().max()) <= bound


@pytest.mark.parametrize("eps", [None, 1e-6])
@pytest.mark.parametrize("affine", [True, False])
def test_the_rebuilt_rms_norm_equals_torchs(eps: float | None, affine: bool) -> None:
    """`nn.RMSNorm` (an `aten.rms_norm` call): without eps, the dtype's machine epsilon, as torch does."""
    model = torch.nn.RMSNorm(16, eps=eps, elementwise_affine=affine).eval()
    if affine:
        model.weight.data = torch.randn(16, generator=torch.Generator().manual_seed(5))
    generator = torch.Generator().manual_seed(7)
    batches = [(torch.randn(2, 4, 16, generator=generator) * scale,) for scale in (1.0, 40.0, 1e-3)]
    graph = rebuilt(model, batches[0])
    ops = {str(n.target) for n in graph.graph.nodes if n.op == "call_function"}
    assert "aten.rms_norm.default" not in ops and "aten.sub.Tensor" not in ops and "aten.rsqrt.default" in ops
    for batch in batches:
        expected, got = model(*batch), graph(*batch)
        assert float((got - expected).abs().max()) <= 8 * float(expected.abs().max()) * torch.finfo(torch.float32).eps


def test_module_layer_norms_are_rebuilt_and_each_skip_says_why() -> None:
    example = (torch.randn(2, 4, 8),)
    several = rebuilt(torch.nn.LayerNorm(8).eval(), example)
    assert not [n for n in several.graph.nodes if n.target == torch.ops.aten.layer_norm.default]
    two_dims = export_float(Functional((2, 4, 8), True, 1e-5, dims=2).eval(), example)
    assert Int8LayerNorm().not_applicable(two_dims) == (
        "layer_norm: it normalizes over 2 dimensions [4, 8], not the last one alone")
    with pytest.raises(ValueError, match="cannot rebuild layer_norm: it normalizes over 2 dimensions"):
        rebuild_layer_norms(two_dims)
    zero_eps = export_float(Functional((2, 4, 8), False, 0.0).eval(), example)
    assert Int8LayerNorm().not_applicable(zero_eps) == (
        "layer_norm: eps=0.0 makes rsqrt(variance) infinite for a constant row")
    assert Int8LayerNorm().not_applicable(export_float(torch.nn.Linear(8, 8).eval(), example)) == (
        "the exported model has no layer_norm or rms_norm, called or written out")


class LlamaRMSNorm(torch.nn.Module):
    """RMSNorm as Llama-style models write it: the statistic by hand, the weight after it."""

    def __init__(self, channels: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, channels))
        self.eps = eps

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        variance = h.pow(2).mean(-1, keepdim=True)
        return self.weight * (h * torch.rsqrt(variance + self.eps))


class WrittenLayerNorm(torch.nn.Module):
    """LayerNorm written with `mean` and `sqrt`, as small speech and vision transformers do."""

    def __init__(self, channels: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, channels))
        self.bias = torch.nn.Parameter(torch.linspace(-0.2, 0.2, channels))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = x.mean(-1, keepdim=True)
        s = (x - u).pow(2).mean(-1, keepdim=True)
        return self.weight * ((x - u) / torch.sqrt(s + self.eps)) + self.bias


class Block(torch.nn.Module):
    """Two linears around a written norm, the residual reading the norm's input too."""

    def __init__(self, norm: torch.nn.Module) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.norm, self.fc2 = torch.nn.Linear(16, 16), norm, torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        return self.fc2(self.norm(h)) + h


@pytest.mark.parametrize("norm", [LlamaRMSNorm(16), WrittenLayerNorm(16)], ids=["rms", "layer"])
def test_a_written_norm_is_rebuilt_and_equals_itself_in_float(norm: torch.nn.Module) -> None:
    model = Block(norm).eval()
    generator = torch.Generator().manual_seed(7)
    batches = [(torch.randn(1, 8, 16, generator=generator) * scale,) for scale in (1.0, 20.0)]
    graph = export_float(model, batches[0])
    assert Int8LayerNorm().sites(graph) == ["norm"]
    graph = rebuild_layer_norms(graph)
    ops = {str(n.target) for n in graph.graph.nodes if n.op == "call_function"}
    assert "aten.mean.dim" not in ops and "aten.pow.Tensor_Scalar" not in ops and "aten.rsqrt.default" in ops
    assert "aten.sqrt.default" not in ops and "aten.div.Tensor" not in ops
    for batch in batches:
        expected, got = model(*batch), graph(*batch)
        assert float((got - expected).abs().max()) <= 64 * float(expected.abs().max()) * torch.finfo(torch.float32).eps


def test_a_written_norm_whose_statistic_is_read_elsewhere_is_left() -> None:
    """The variance is an output too: rebuilding would have to keep it, so the norm is not one to rebuild."""

    class Leaky(torch.nn.Module):
        def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            variance = h.pow(2).mean(-1, keepdim=True)
            return h * torch.rsqrt(variance + 1e-6), variance

    graph = export_float(Leaky().eval(), (torch.randn(2, 16),))
    assert Int8LayerNorm().not_applicable(graph) == (
        "the exported model has no layer_norm or rms_norm, called or written out")


def test_int8_layernorm_takes_a_written_rms_norm_block_to_int8() -> None:
    """The issue's block: with expand-broadcasts alone the statistic (pow, mean, add, rsqrt) stays fp32;
    with the written RMSNorm rebuilt it is int8 kernels, within the SQNR guard."""
    from qlint.records.results import RemedyStatus
    from qlint.remedies.remedy import Build
    from qlint.remedies.search import remediate
    from qlint.settings.config import Config, RemedyName

    model = Block(LlamaRMSNorm(16)).eval()
    generator = torch.Generator().manual_seed(1)
    batches = tuple((torch.randn(1, 8, 16, generator=generator),) for _ in range(4))
    done = remediate(Build(model, batches[0], batches), [RemedyName.EXPAND_BROADCASTS, RemedyName.INT8_LAYERNORM],
                     Config(), "block")
    base, final = done.report.baseline, done.report.final
    kept = next(o for o in done.report.outcomes if o.remedy == RemedyName.INT8_LAYERNORM)
    assert kept.status == RemedyStatus.KEPT and done.error is None, kept.reason
    assert final.fp32_elements < kept.measured.fp32_elements <= base.fp32_elements // 2
    assert base.sqnr_db - final.sqnr_db <= Config().remedy_max_sqnr_drop_db
