"""The cost table against the published per-operator measurements of docs/cost-model.md, those its
coefficients are fitted to and those that check them: each row's work (MACs, output elements,
windows) is worked out here from the layer's quoted shape and its kernel class named, priced with
`cycles.yaml`, and compared with the quoted cycles. How a program's nodes come to these figures is
held where programs are lowered (tests/full/test_cost.py, tests/slow/test_executorch_corpus.py)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from importlib import resources
from typing import Any

import pytest
import yaml

from qlint.settings.config import CPUS
from qlint.settings.cycles import INT8_CLASSES, Core, CostTableError, Source, cost_table, default_fpu, parse_table

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
    table = cost_table()
    assert set(table.fpu).isdisjoint(table.no_fpu) and set(table.fpu) | table.no_fpu == set(CPUS)
    assert table.no_fpu == {"cortex-m0", "cortex-m0plus", "cortex-m3", "cortex-m23"}
    assert [cpu for cpu in CPUS if not default_fpu(cpu)] == ["cortex-m0", "cortex-m0plus", "cortex-m3", "cortex-m23"]


def test_the_loader_keeps_every_rows_source() -> None:
    sources = cost_table().sources
    assert sources["dispatch"].kind == "assumed" and "no per-call measurement" in sources["dispatch"].text
    assert sources["cores.cortex-m7"].kind == "source" and "ARMScheduleM7.td" in sources["cores.cortex-m7"].text
    assert sources["fp32.fpu.cortex-m55"] == Source("source", "LLVM ARMScheduleM55.td")
    assert sources["fp32.fpu.cortex-m0"] == Source("source", "Armv6-M: no floating-point extension")
    assert sources["fp32.soft"].kind == "source" and sources["fp32.soft"].text.startswith("Qfplib README")
    assert sources["fp32.exp"].kind == sources["fp32.arithmetic.layer_norm"].kind == "assumed"
    assert {key.split(".")[2] for key in sources if key.startswith("fp32.arithmetic.")} >= {"div", "gelu", "other"}


def _yaml() -> dict[str, Any]:
    text = resources.files("qlint.settings").joinpath("cycles.yaml").read_text(encoding="utf-8")
    data: dict[str, Any] = yaml.safe_load(text)
    return data


def _drop(*path: str) -> Callable[[dict[str, Any]], None]:
    def edit(data: dict[str, Any]) -> None:
        for key in path[:-1]:
            data = data[key]
        del data[path[-1]]
    return edit


def _set(value: Any, *path: str) -> Callable[[dict[str, Any]], None]:
    def edit(data: dict[str, Any]) -> None:
        for key in path[:-1]:
            data = data[key]
        data[path[-1]] = value
    return edit


CPU_LIST = "cortex-m0, cortex-m0plus, cortex-m3, cortex-m4, cortex-m7, cortex-m23, cortex-m33, cortex-m35p, " \
           "cortex-m55, cortex-m85"
NO_ROW = "missing: every CPU target_cpu accepts has FPU timings (add, mul, div, sqrt) or none: true"
MALFORMED = [
    (_drop("int8", "dsp", "pool"), "int8.dsp.pool: missing"),
    (_drop("cores", "cortex-m7", "depthwise"), "cores.cortex-m7.depthwise: missing"),
    (_set({"per_mak": 3.0, "fit": "x"}, "int8", "mve", "depthwise"),
     "int8.mve.depthwise.per_mak: unknown key (known: per_mac, per_output, per_element, per_window, fit, source, "
     "assumed)"),
    (_set({"per_element": 1.0}, "int8", "scalar", "copy"),
     "int8.scalar.copy: needs one of fit:, source: or assumed: saying where its figures come from"),
    (_set({"per_element": 1.0}, "int8", "npu"), "int8.npu: unknown backend (known: mve, dsp, scalar)"),
    (_drop("fp32", "fpu", "cortex-m23"), f"fp32.fpu.cortex-m23: {NO_ROW}"),
    (_set({"add": 1, "mul": 1, "div": 14, "sqrt": 14, "source": "x"}, "fp32", "fpu", "cortex-m99"),
     f"fp32.fpu.cortex-m99: not a CPU target_cpu accepts ({CPU_LIST})"),
    (_set({"add": 1, "mul": 1, "div": 14, "source": "x"}, "fp32", "fpu", "cortex-m4"),
     "fp32.fpu.cortex-m4.sqrt: missing"),
    (_set({"none": "yes", "source": "x"}, "fp32", "fpu", "cortex-m0"),
     "fp32.fpu.cortex-m0.none: expected true (the core has no FPU), got 'yes'"),
    (_set("475", "fp32", "soft", "div"), "fp32.soft.div: expected a number of cycles (0 or more), got '475'"),
    (_set({"per_op": 200}, "dispatch"),
     "dispatch: needs one of fit:, source: or assumed: saying where its figures come from"),
    (_set({"mac": 0.5, "fit": "x"}, "cores", "cortex-m9"),
     f"cores.cortex-m9: not a CPU target_cpu accepts ({CPU_LIST})"),
    (_set({"exp": 1, "log": 1, "assumed": "x"}, "fp32", "arithmetic", "log"),
     "fp32.arithmetic.log.log: unknown key (known: add, mul, div, sqrt, exp, fit, source, assumed)"),
    (_drop("fp32", "arithmetic", "other"), "fp32.arithmetic.other: missing (the arithmetic of an op not listed)"),
    (_drop("fp32", "loop"), "fp32.loop: missing"),
]


@pytest.mark.parametrize(("edit", "message"), MALFORMED, ids=[m for _, m in MALFORMED])
def test_a_malformed_table_is_one_error_naming_the_key(edit: Callable[[dict[str, Any]], None], message: str) -> None:
    data = _yaml()
    parse_table(copy.deepcopy(data), CPUS)  # the shipped table parses
    edit(data)
    with pytest.raises(CostTableError) as error:
        parse_table(data, CPUS)
    assert str(error.value) == f"cycles.yaml: {message}"


def test_a_new_core_is_one_fpu_row() -> None:
    """A CPU target_cpu comes to accept is refused until cycles.yaml gives it FPU timings or none."""
    data, cpus = _yaml(), (*CPUS, "cortex-m52")
    with pytest.raises(CostTableError) as error:
        parse_table(data, cpus)
    assert str(error.value) == f"cycles.yaml: fp32.fpu.cortex-m52: {NO_ROW}"
    data["fp32"]["fpu"]["cortex-m52"] = {"add": 2, "mul": 2, "div": 16, "sqrt": 16, "source": "as cortex-m55"}
    table = parse_table(data, cpus)
    m52, m55 = Core("cortex-m52", "mve", True), Core("cortex-m55", "mve", True)
    assert table.fp32_element(m52, table.arithmetic_of("div")) == table.fp32_element(m55, table.arithmetic_of("div"))
    assert table.sources["fp32.fpu.cortex-m52"] == Source("source", "as cortex-m55")


# The CMSIS-NN paper's Table 1 (arXiv 1801.06601): a CIFAR-10 network on an STM32F746 at 216 MHz, each
# layer's MACs (from Arm's M7 code for it) and its published milliseconds; held out of every fit.
PAPER_M7_ROWS = [("conv", 2_457_600, 31.4, 0.64), ("conv", 6_553_600, 42.8, 1.25), ("conv", 3_276_800, 22.6, 1.18),
                 ("linear", 10_240, 0.1, 1.0)]


def test_the_m7_is_priced_per_kernel_class_and_its_validation_rows_are_the_tables() -> None:
    """Each MAC class of the M7 scales the DSP figure by its own factor (its inner loop's M7 over M4
    cycles as LLVM schedules them); the paper's M7 layers, estimated from the table, give the ratios
    docs/cost-model.md shows."""
    table, m7, m4 = cost_table(), Core("cortex-m7", "dsp", True), Core("cortex-m4", "dsp", True)
    factors = {kind: table.kernel(m7, kind).per_mac / table.kernel(m4, kind).per_mac
               for kind in ("conv", "pointwise", "depthwise", "linear", "transpose")}
    assert {kind: round(f, 2) for kind, f in factors.items()} == {
        "conv": 0.63, "pointwise": 0.63, "depthwise": 0.75, "linear": 0.64, "transpose": 0.63}
    assert table.kernel(m7, "pool") == table.kernel(m4, "pool")  # not priced by the MAC: the M4's figure
    ratios = [round(table.kernel(m7, kind).cycles(macs, 0, 0) / 216e3 / published, 2)
              for kind, macs, published, _ in PAPER_M7_ROWS]
    assert ratios == [row[3] for row in PAPER_M7_ROWS]
