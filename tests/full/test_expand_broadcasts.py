"""The `expand-broadcasts` remedy: an add, sub, mul or div whose operands broadcast gets them
expanded, so CortexMQuantizer's one-shape checks take it as an int8 op."""

from __future__ import annotations

import pytest
import torch

from qlint.full.lint import lint_program
from qlint.loading.quantize import export_float, quantize
from qlint.records.results import RemedyStatus
from qlint.remedies.expand_broadcasts import ExpandBroadcasts, broadcast_nodes, expand_broadcasts
from qlint.remedies.remedy import Build
from qlint.remedies.search import remediate
from qlint.settings.config import Config, RemedyName


class PositionAdd(torch.nn.Module):
    """`linear(x) + pos` with `pos` a `[T, C]` parameter and `x` `[1, T, C]`, as Whisper's encoder adds
    its position embedding."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.pos = torch.nn.Parameter(torch.randn(8, 16, generator=generator))
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.proj(x) + self.pos)


class Mixed(torch.nn.Module):
    """Broadcasts of every kind the remedy acts on (a one-element runtime operand among them), and three it
    leaves: a literal, a one-element constant (a QL001 scale) and a per-channel operand of a channels_last
    tensor (the add/mul check takes that one as it is)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("c", torch.tensor([0.25]))

    def forward(self, x: torch.Tensor, mask: torch.Tensor, row: torch.Tensor, image: torch.Tensor,
                gain: torch.Tensor, one: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x + mask, x - row, x * row, x / mask, one / x, x * 0.5, x * self.c, x * x, image * gain)


def mixed_inputs(seed: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    image = torch.randn(1, 4, 3, 3, generator=generator).contiguous(memory_format=torch.channels_last)
    return (torch.randn(1, 2, 4, 4, generator=generator), torch.rand(1, 1, 1, 4, generator=generator) + 0.5,
            torch.randn(4, generator=generator), image, torch.randn(1, 4, 1, 1, generator=generator),
            torch.randn(1, generator=generator))


def test_expanding_leaves_the_float_results_equal_and_every_op_with_operands_of_one_shape() -> None:
    batch = mixed_inputs(0)
    graph = export_float(Mixed().eval(), batch)
    acted = [str(n.target) for n in broadcast_nodes(graph)]
    assert acted == ["aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", "aten.div.Tensor", "aten.div.Tensor"]
    before = [graph(*mixed_inputs(seed)) for seed in (1, 2)]
    expand_broadcasts(graph)
    assert broadcast_nodes(graph) == []
    # one operand of each of the five: `x` already has the output's shape
    assert sum(1 for n in graph.graph.nodes if n.target == torch.ops.aten.expand.default) == 5
    for seed, expected in zip((1, 2), before, strict=True):
        for want, got in zip(expected, graph(*mixed_inputs(seed)), strict=True):
            assert torch.equal(want, got)


def test_a_position_embedding_add_becomes_quantized_add_and_the_remedy_is_kept() -> None:
    model, example = PositionAdd().eval(), (torch.randn(1, 8, 16, generator=torch.Generator().manual_seed(1)),)
    calibration = (example, (torch.randn(1, 8, 16, generator=torch.Generator().manual_seed(2)),))
    plain = lint_program(quantize(model, example, list(calibration)), "position", Config())
    [island] = [f for f in plain.findings if f.code == "QL002"]
    assert ("CortexMQuantizer's add pattern refused it (CortexMAddMulCheck): operand shapes [1, 8, 16] and [8, 16]"
            in island.message)
    assert "expand the second operand to [1, 8, 16]" in island.message and "expand-broadcasts remedy" in island.message
    assert ExpandBroadcasts().sites(export_float(model, example)) == ["add"]
    done = remediate(Build(model, example, calibration), [RemedyName.EXPAND_BROADCASTS], Config(), "position")
    [outcome] = done.report.outcomes
    assert outcome.status == RemedyStatus.KEPT and done.error is None, outcome.reason
    base, final = done.report.baseline, done.report.final
    assert final is not None
    assert (base.fp32_elements, final.fp32_elements) == (256, 0) and final.coverage == 1.0
    assert final.kernels["cortex_m.quantized_add"] == 1 and "cortex_m.quantized_add" not in base.kernels
    assert base.sqnr_db - final.sqnr_db <= Config().remedy_max_sqnr_drop_db


@pytest.mark.parametrize("skip", [frozenset(), frozenset({"add"})])
def test_a_skipped_site_is_left_and_named_in_the_export_line(skip: frozenset[str]) -> None:
    model, example = PositionAdd().eval(), (torch.randn(1, 8, 16),)
    remedy = ExpandBroadcasts().leaving(skip)
    graph = remedy.on_graph(export_float(model, example))
    assert len(broadcast_nodes(graph)) == len(skip)
    assert remedy.user_lines()[1].endswith(
        ".module(), skip={'add'})  # before prepare_pt2e" if skip else ".module())  # before prepare_pt2e")
