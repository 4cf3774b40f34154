"""Vela's per-layer cycles of each NPU partition placed on the user's source lines
(`analysis.npu_cycles`), on the NPU table's models as Arm's flow quantizes and lowers them."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import ROOT

from qlint.analysis.npu_cycles import NpuCycles, npu_cycles, source_of, tosa_tensor
from qlint.loading import ethos_u
from qlint.settings.npus import npu

U55, U85 = "ethos-u55-128", "ethos-u85-256"
NPU_SOURCE = ROOT / "examples" / "npu.py"


def line_of(text: str) -> int:
    [line] = [i for i, code in enumerate(NPU_SOURCE.read_text().splitlines(), 1) if text in code]
    return line


PROJECTIONS, SCORES, SOFTMAX = line_of("q, k, v = self.q(x)"), line_of("scores = q @ k"), line_of("torch.softmax")


def cycles(quantized: Any, factory: str, accelerator: str) -> list[NpuCycles]:
    lowered = ethos_u.lower(quantized(factory, npu=accelerator), npu(accelerator))
    return list(npu_cycles(lowered.delegation, ROOT).values())


def lines(partition: NpuCycles) -> dict[int, int]:
    assert {location.path for location in partition.by_line} == {"examples/npu.py"}
    return {location.line: count for location, count in partition.by_line.items()}


def rows(quantized: Any, factory: str, accelerator: str, operator: str) -> set[int]:
    """The lines the rows of one Vela operator land on, across the program's partitions."""
    lowered = ethos_u.lower(quantized(factory, npu=accelerator), npu(accelerator))
    found = set()
    for compiled in lowered.delegation.compiled.values():
        for layer in compiled.estimate.layers:
            if layer.operator == operator:
                writer = compiled.writers[tosa_tensor(layer.name, compiled.writers) or ""]
                location = source_of(writer, compiled.origins, ROOT)
                found.add(location.line if location else None)
    return found


@pytest.mark.model("make_attention@npu")
def test_a_split_attention_s_cycles_land_on_its_lines_on_the_u55(quantized: Any) -> None:
    first, second = cycles(quantized, "make_attention", U55)
    # the MatMul of `q @ k.T` (a `bmm` Arm's quantizer decomposed `matmul` into) is the scores line's
    assert (first.cycles, lines(first), first.unplaced, first.share) == (
        12800, {PROJECTIONS: 2720, SCORES: 10080}, (), 1.0)
    # a Rescale Vela adds on the partition's input (the float division's quantize, on the CPU) has no line
    assert (second.cycles, lines(second)) == (19469, {PROJECTIONS: 1552, SOFTMAX: 17533})
    assert [(row.name, row.operator, row.cycles) for row in second.unplaced] == [
        ("quantized_decomposed_quantize_per_tensor_default_11_int32", "Rescale", 384)]
    assert round((first.attributed + second.attributed) / (first.cycles + second.cycles), 4) == 0.9881


@pytest.mark.model("make_attention@npu")
def test_a_split_attention_s_cycles_all_land_on_its_lines_on_the_u85(quantized: Any) -> None:
    first, second = cycles(quantized, "make_attention", U85)
    assert (lines(first), lines(second), first.share, second.share) == (
        {PROJECTIONS: 1664, SCORES: 1376}, {PROJECTIONS: 1240, SOFTMAX: 2841}, 1.0, 1.0)


@pytest.mark.model("make_attention_folded@npu")
@pytest.mark.parametrize(("accelerator", "expected"), [
    (U55, {PROJECTIONS: 4272, SCORES: 10464, SOFTMAX: 17533}),
    (U85, {PROJECTIONS: 2904, SCORES: 1376, SOFTMAX: 2841}),
])
def test_a_folded_attention_s_cycles_all_land_on_its_lines(quantized: Any, accelerator: str,
                                                           expected: dict[int, int]) -> None:
    [partition] = cycles(quantized, "make_attention_folded", accelerator)
    assert (lines(partition), partition.unplaced, partition.share) == (expected, (), 1.0)


@pytest.mark.model("make_attention_folded@npu")
def test_matmuls_land_on_their_matmul_lines_and_tables_on_the_softmax(quantized: Any) -> None:
    assert rows(quantized, "make_attention_folded", U55, "MatMul") == {SCORES, SOFTMAX, PROJECTIONS}
    assert rows(quantized, "make_attention_folded", U55, "Table") == {SOFTMAX}


@pytest.mark.model("make_conv_hardswish@npu")
def test_convolutions_land_on_their_lines_and_vela_s_anonymous_transposes_stay_unplaced(quantized: Any) -> None:
    partitions = cycles(quantized, "make_conv_hardswish", U55)
    c1, c2, c3 = (line_of(f"self.c{i}(x)") for i in (1, 2, 3))
    assert [lines(p) for p in partitions] == [{c1: 6368}, {c2: 11684}, {c3: 11684}]
    assert {(row.operator, row.name.startswith("#")) for p in partitions for row in p.unplaced} == {
        ("Transpose", True)}
    assert [round(p.share, 4) for p in partitions] == [0.8057, 0.8509, 0.8509]
