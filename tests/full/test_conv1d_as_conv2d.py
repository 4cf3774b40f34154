"""The `conv1d-as-conv2d` remedy: a 1-D convolution, which CortexMQuantizer has no pattern for,
run as a channels_last 2-D convolution of kernel height 1, which `cortex_m.quantized_conv2d` runs."""

from __future__ import annotations

import pytest
import torch
from executorch.backends.cortex_m.quantizer.quantizer import CortexMQuantizer

from qlint.full.lint import lint_program
from qlint.loading.quantize import export_float, quantize, quantize_graph
from qlint.loading.view import op_name
from qlint.records.results import RemedyStatus
from qlint.remedies.conv1d_as_conv2d import Conv1dAsConv2d, conv1d_as_conv2d
from qlint.remedies.remedy import Build
from qlint.remedies.search import remediate
from qlint.settings.config import Config, RemedyName


class FrontEnd(torch.nn.Module):
    """Whisper's audio front end in small: two 1-D convolutions with GELU, the second strided."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = torch.nn.Conv1d(8, 16, 3, padding=1)
        self.conv2 = torch.nn.Conv1d(16, 16, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.gelu(self.conv1(x))
        return torch.nn.functional.gelu(self.conv2(x)).permute(0, 2, 1)


def batch(seed: int, shape: tuple[int, ...] = (1, 8, 32)) -> tuple[torch.Tensor]:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)),)


@pytest.mark.parametrize("conv", [
    torch.nn.Conv1d(4, 6, 3),
    torch.nn.Conv1d(4, 6, 5, stride=2, padding=2, bias=False),
    torch.nn.Conv1d(4, 8, 3, dilation=2, padding=3, groups=2),
    torch.nn.Conv1d(4, 4, 3, padding=1, groups=4),  # depthwise
    torch.nn.Conv1d(4, 6, 3, padding="same"),
    torch.nn.Conv1d(4, 6, 4, padding="same", dilation=1),  # 3 zeros: one more on the right, padded first
    torch.nn.Conv1d(4, 6, 3, padding="valid"),
], ids=["plain", "strided-no-bias", "dilated-grouped", "depthwise", "same", "same-even-kernel", "valid"])
def test_the_rewrite_computes_what_the_1d_convolution_does(conv: torch.nn.Module) -> None:
    model = torch.nn.Sequential(conv).eval()
    graph = export_float(model, batch(0, (1, 4, 20)))
    expected = [graph(*batch(seed, (1, 4, 20))) for seed in (1, 2)]
    conv1d_as_conv2d(graph)
    targets = [n.target for n in graph.graph.nodes if n.op == "call_function"]
    assert not {torch.ops.aten.conv1d.default, torch.ops.aten.conv1d.padding} & set(targets)
    assert targets.count(torch.ops.aten.conv2d.default) == 1
    # every recorded shape stays concrete (a symbolic one would reach prepare_pt2e's retrace)
    assert all(type(d) is int for n in graph.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)
               for d in n.meta["val"].shape)
    for seed, want in zip((1, 2), expected, strict=True):
        got = graph(*batch(seed, (1, 4, 20)))
        assert got.shape == want.shape and got.is_contiguous()
        assert torch.allclose(got, want, rtol=0, atol=1e-5)  # the same sums, maybe in another order


def test_a_weight_computed_in_the_graph_is_left_with_the_reason() -> None:
    class Computed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(4, 4, 3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.conv1d(x, self.weight * 0.5)

    graph = export_float(Computed().eval(), batch(0, (1, 4, 20)))
    assert Conv1dAsConv2d().not_applicable(graph) == "conv1d: its weight is computed in the graph, not a parameter"
    with pytest.raises(ValueError, match="cannot rewrite conv1d: its weight is computed in the graph"):
        conv1d_as_conv2d(graph)


def test_the_front_end_becomes_int8_convolutions_and_the_cause_names_the_remedy() -> None:
    model, example = FrontEnd().eval(), batch(1)
    calibration = (example, batch(2), batch(3))
    plain = lint_program(quantize(model, example, list(calibration)), "front", Config())
    islands = [f for f in plain.findings if f.code == "QL002"]
    assert len(islands) == 2 and all("no CortexMQuantizer pattern covers" in f.message for f in islands)
    assert all("run it as a channels_last conv2d over [N, C, 1, L]" in f.message
               and "the conv1d-as-conv2d remedy" in f.message for f in islands)
    assert Conv1dAsConv2d().sites(export_float(model, example)) == ["conv1", "conv2"]

    done = remediate(Build(model, example, calibration), [RemedyName.CONV1D_AS_CONV2D], Config(), "front")
    [outcome] = done.report.outcomes
    assert outcome.status == RemedyStatus.KEPT and done.error is None, outcome.reason
    base, kept = done.report.baseline, outcome.measured
    assert (base.coverage, kept.coverage) == (0.5, 1.0) and (base.fp32_elements, kept.fp32_elements) == (1536, 0)
    assert kept.kernels["cortex_m.quantized_conv2d"] == 2 and base.sqnr_db - kept.sqnr_db <= 1.0
    # Only the convolutions' own tensors are NHWC: every view and the output keep the default dim order.
    layouts = {(tuple(n.meta["val"].shape), n.meta["val"].dim_order()) for n in done.fixed.program.graph.nodes
               if n.op == "call_function" and isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].dim() > 1}
    moved = {(shape, order) for shape, order in layouts if order != tuple(range(len(shape)))}
    assert moved == {((1, 8, 1, 32), (0, 2, 3, 1)), ((1, 16, 1, 32), (0, 2, 3, 1)), ((1, 16, 1, 16), (0, 2, 3, 1))}
    # CMSIS-NN runs a 1xN convolution over one row as a matrix product, without im2col
    # (arm_convolve_1_x_n_s8: stride times channels, 8 and 32, multiples of 4): no window is priced
    from qlint.device.cost import core_for, estimate
    from qlint.loading.view import GraphView
    from qlint.settings.cycles import cost_table

    core = core_for("cortex-m55")
    ops = estimate(GraphView(done.fixed.program), core).ops
    convs = [o for o in ops if o.op == "cortex_m.quantized_conv2d.default"]
    product = cost_table().kernel(core, "pointwise")
    assert [o.work for o in convs] == [512 * 8 * 3, 256 * 16 * 3]  # output elements x (channels x 3 taps)
    assert [o.cycles for o in convs] == pytest.approx([product.cycles(512 * 24, 512) + 200,
                                                       product.cycles(256 * 48, 256) + 200])


def test_executorchs_silero_vad_test_model_runs_its_six_conv1d_as_int8_convolutions() -> None:
    """ExecuTorch's own Cortex-M test model (`test_silero_vad`), whose docstring says it does not lower
    for want of LSTM and conv1d support: every conv1d is rewritten, float-equal, and lowers to int8."""
    from executorch.backends.cortex_m.test.models import test_silero_vad as case

    model, example = case.pt_model.eval(), (case.x, case.state)
    graph = export_float(model, example)
    assert Conv1dAsConv2d().sites(graph) == ["stft_conv", "encoder.0", "encoder.1", "encoder.2", "encoder.3",
                                             "final_conv"]
    expected = graph(*example)
    conv1d_as_conv2d(graph)
    for want, got in zip(expected, graph(*example), strict=True):
        assert torch.allclose(got, want, rtol=0, atol=1e-5)
    plain = lint_program(quantize(model, example, [example]), "silero", Config())
    rewritten = torch.export.export(graph, example, strict=False).module(check_guards=False)
    remedied = lint_program(quantize_graph(rewritten, example, [example], CortexMQuantizer()), "silero", Config())
    calls = [n for n in remedied.lowered.graph.nodes if n.op == "call_function"]
    kernels = sorted(op_name(n) for n in calls if "conv" in op_name(n))
    assert kernels == ["cortex_m.quantized_conv2d.default"] * 5 + ["cortex_m.quantized_depthwise_conv2d.default"]
    assert remedied.stats.fp32_elements < plain.stats.fp32_elements
    assert remedied.stats.coverage > plain.stats.coverage
