"""The `layernorm-placement` remedy on an Ethos-U target: each LayerNorm quantized onto the NPU (as
Arm's quantizer builds it) or left in float on the CPU, both built, lowered and priced, the cheaper
kept within the SQNR guard."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from conftest import ROOT

import examples.npu as npu_examples
from qlint.api import remedy
from qlint.records.results import RemedyStatus
from qlint.report.formats import remedy_lines
from qlint.settings.config import Config, RemedyName
from qlint.settings.npus import npu


def placed(factory: str, accelerator: str, names: tuple[str, ...] = (RemedyName.LAYERNORM_PLACEMENT,)) -> Any:
    model, example, calibration = getattr(npu_examples, factory)()
    config = replace(Config(root=ROOT), npu=npu(accelerator))
    return remedy(model, example, calibration, names, config, artifact=factory)


@pytest.mark.model("make_head_layernorm")
def test_a_layernorm_cheaper_on_the_cpu_is_placed_there_with_both_costs_reported() -> None:
    done = placed("make_head_layernorm", "ethos-u55-32")  # one 64-element vector: the NPU's chain costs more
    report = done.report
    [outcome] = report.outcomes
    on_npu, on_cpu = report.baseline, outcome.measured
    assert on_cpu is not None and outcome.status == RemedyStatus.KEPT
    # as built the LayerNorm is in the one partition; left float it splits it, and the CPU runs it
    assert (on_npu.partitions, on_cpu.partitions) == (1, 2)
    assert (on_npu.fp32_ops, on_cpu.fp32_ops) == (0, 1)
    assert on_cpu.npu_cycles < on_npu.npu_cycles and on_cpu.cpu_cycles > on_npu.cpu_cycles
    for measured in (on_npu, on_cpu):  # no board: the NPU's cycles count as the core's
        assert measured.cycles == measured.npu_cycles + measured.cpu_cycles
    assert on_cpu.cycles < on_npu.cycles and on_cpu.sqnr_db > on_npu.sqnr_db  # the float LayerNorm is the model's own
    said = "\n".join(remedy_lines(report))
    assert f"{on_npu.cycles:,} ({on_npu.npu_cycles:,} NPU + {on_npu.cpu_cycles:,} CPU; 1 partition)" in said
    assert f"{on_cpu.cycles:,} ({on_cpu.npu_cycles:,} NPU + {on_cpu.cpu_cycles:,} CPU; 2 partitions)" in said
    # what --fix writes is that build: the LayerNorm on the CPU, verified
    assert (done.fixed.stats.partitions, done.fixed.summary.fp32_ops[1]) == (2, 1)


@pytest.mark.model("make_tokens_and_head")
def test_each_layernorm_is_placed_where_it_is_cheaper() -> None:
    """On U55-64 the LayerNorm over 16 positions is cheaper on the NPU, the one over the pooled vector on the
    CPU: each is built alone, then the cheaper ones together."""
    done = placed("make_tokens_and_head", "ethos-u55-64")
    report = done.report
    [outcome] = report.outcomes
    alone = {site.site: site for site in outcome.sites}
    assert set(alone) == {"tokens.norm", "head_norm"}
    base = report.baseline.cycles
    assert alone["tokens.norm"].cycles > base > alone["head_norm"].cycles
    assert outcome.status == RemedyStatus.KEPT and outcome.measured is not None
    assert outcome.measured.cycles == alone["head_norm"].cycles  # the one placed is the build measured alone
    assert outcome.user_change == ("quantizer.set_module_name('head_norm', None)  # before prepare_pt2e: this "
                                   "LayerNorm runs in float on the CPU",)
    assert (outcome.measured.partitions, outcome.measured.fp32_ops) == (2, 1)
    said = "\n".join(remedy_lines(report))
    assert f"      head_norm: SQNR {report.baseline.sqnr_db:.1f} -> {alone['head_norm'].sqnr_db:.1f} dB" in said
    assert f"; est. cycles {base:,} -> {alone['tokens.norm'].cycles:,}" in said


def test_each_flow_tries_only_its_own_remedies() -> None:
    from qlint.remedies.all_remedies import REMEDIES
    from qlint.remedies.search import _other_flow, remedies_for

    on_npu = replace(Config(root=ROOT), npu=npu("ethos-u55-128"))
    assert remedies_for(on_npu) == (RemedyName.LAYERNORM_PLACEMENT,)
    assert RemedyName.LAYERNORM_PLACEMENT not in remedies_for(Config(root=ROOT))
    assert _other_flow(REMEDIES[RemedyName.INT8_LAYERNORM], on_npu) == (
        "it changes what the Cortex-M CPU flow quantizes; this target lowers for ethos-u55-128, whose quantizer "
        "is Arm's")
    assert _other_flow(REMEDIES[RemedyName.LAYERNORM_PLACEMENT], Config(root=ROOT)) == (
        "it places ops between an Ethos-U NPU and the CPU; this target lowers for the Cortex-M CPU alone")
    assert _other_flow(REMEDIES[RemedyName.LAYERNORM_PLACEMENT], on_npu) is None
