"""The cost table against the published per-operator measurements of docs/cost-model.md, those its
coefficients are fitted to and those that check them: each row's work (MACs, output elements,
windows) is worked out here from the layer's quoted shape and its kernel class named, priced with
`cycles.yaml`, and compared with the quoted cycles. How a program's nodes come to these figures is
held where programs are lowered (tests/full/test_cost.py, tests/slow/test_executorch_corpus.py)."""

from __future__ import annotations

import pytest

from qlint.settings.config import CPUS
from qlint.settings.cycles import INT8_CLASSES, NO_FPU, Core, cost_table

MVE, DSP = Core("cortex-m55", "mve", True), Core("cortex-m4", "dsp", True)

# (source and layer, core, kernel class, MACs, output elements, windows, measured cycles, band)
# windows: output pixels times kernel positions (a regular convolution's im2col copies)
ROWS = [
    # pytorch/executorch#17651: MobileNetV2 224x224 on the Alif E8 HP Cortex-M55 (weights in MRAM)
    ("#17651 row 2, quantize 1x3x224x224", MVE, "quantize", 0, 150_528, 0, 1_365_831, 0.05),
    ("#17651 row 3, conv 3->32 3x3 s2", MVE, "conv", 10_838_016, 112 * 112 * 32, 112 * 112 * 9, 13_754_047, 0.05),
    ("#17651 row 4, depthwise 32 3x3", MVE, "depthwise", 3_612_672, 0, 0, 13_715_766, 0.12),
    ("#17651 row 5, pointwise 32->16", MVE, "pointwise", 6_422_528, 112 * 112 * 16, 0, 4_915_937, 0.05),
    ("#17651 row 6, pointwise 16->96", MVE, "pointwise", 19_267_584, 112 * 112 * 96, 0, 24_249_462, 0.05),
    ("#17651 row 7, depthwise 96 3x3 s2", MVE, "depthwise", 2_709_504, 0, 0, 10_286_711, 0.12),
    ("#17651 row 8, pointwise 96->24", MVE, "pointwise", 7_225_344, 56 * 56 * 24, 0, 2_791_555, 0.05),
    ("#17651 row 9, pointwise 24->144", MVE, "pointwise", 10_838_016, 56 * 56 * 144, 0, 10_329_014, 0.05),
    ("#17651 row 10, depthwise 144 3x3", MVE, "depthwise", 4_064_256, 0, 0, 15_319_785, 0.12),
    # AmbiqAI/neuralSPOT: MLPerf Tiny DS-CNN on an Apollo510 Cortex-M55 (weights in TCM), TFLM + CMSIS-NN
    ("Apollo510 layer 0, conv 1->64 10x4 s2", MVE, "conv", 320_000, 8_000, 125 * 40, 385_342, 0.05),
    ("Apollo510 layer 1, depthwise 64 3x3", MVE, "depthwise", 72_000, 0, 0, 227_158, 0.08),
    ("Apollo510 layer 2, 1x1 conv 64->64", MVE, "pointwise", 512_000, 8_000, 0, 241_234, 0.02),
    ("Apollo510 layer 9, global avgpool", MVE, "pool", 0, 8_000, 0, 14_771, 0.02),
    # Karthik-Swaminathan98/arm-riscv-benchmark-results: CMSIS-NN on a PSoC6 Cortex-M4 from RAM
    ("PSoC6 KWS-S L3, 1x1 via im2col", DSP, "pointwise", 512_000, 0, 0, 1_770_642, 0.15),
    ("PSoC6 KWS-M L3, 1x1 via im2col", DSP, "pointwise", 1_922_960, 0, 0, 5_197_590, 0.15),
    ("PSoC6 KWS-S L1, depthwise one input channel", DSP, "depthwise", 302_784, 0, 0, 3_101_817, 0.05),
    ("PSoC6 KWS-M L1, depthwise one input channel", DSP, "depthwise", 1_315_800, 0, 0, 14_101_480, 0.05),
    ("PSoC6 KWS-M L13, fully connected 172->12", DSP, "linear", 2_064, 0, 0, 6_464, 0.10),
    ("PSoC6 KWS-S L12, global avgpool", DSP, "pool", 0, 8_000, 0, 64_154, 0.05),
    ("PSoC6 KWS-M L12, global avgpool", DSP, "pool", 0, 11_180, 0, 86_141, 0.05),
]


@pytest.mark.parametrize(("row", "core", "kind", "macs", "outputs", "windows", "measured", "band"), ROWS,
                         ids=[row[0] for row in ROWS])
def test_the_table_prices_each_fitted_operator_within_its_band(
        row: str, core: Core, kind: str, macs: int, outputs: int, windows: int, measured: int, band: float) -> None:
    estimate = cost_table().kernel(core, kind).cycles(macs, outputs, windows)
    assert abs(estimate / measured - 1) <= band, f"{row}: {estimate:,.0f} against {measured:,}"


def test_every_backend_prices_every_kernel_class_and_says_where_each_figure_comes_from() -> None:
    table = cost_table()
    assert set(table.int8) == {"mve", "dsp", "scalar"}
    for backend, kinds in table.int8.items():
        assert set(kinds) == set(INT8_CLASSES), backend
        for kind, coefficient in kinds.items():
            assert coefficient.source, f"{backend}.{kind} has neither fit: nor assumed:"


def test_every_cpu_either_has_fpu_timings_or_no_fpu() -> None:
    """A core priced with an FPU needs its instruction timings; one without is soft float: every CPU
    qlint lowers for is one of the two, so no board or CPU reaches a missing row."""
    fpu = set(cost_table().fpu)
    assert fpu.isdisjoint(NO_FPU) and fpu | NO_FPU == set(CPUS)
