"""The NPU target's fixes on `transformers` classes at tiny configs with seeded random weights: the
gather fold on DistilBERT's word embedding, and both placements of ViT's LayerNorms, priced."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import ROOT

from examples import zoo
from qlint.settings.config import Config, RemedyName
from qlint.settings.npus import npu

U55 = "ethos-u55-128"


@pytest.mark.model("make_distilbert_tokens")
def test_distilberts_word_embedding_gathers_its_int8_table_on_u55() -> None:
    from qlint.fix.apply import fix_program
    from qlint.full.lint import lint_program
    from qlint.loading.inputs import verification_inputs
    from qlint.loading.quantize import quantize

    model, example, calibration = zoo.make_distilbert_tokens()
    config = replace(Config(root=ROOT), npu=npu(U55))
    program = quantize(model, example, calibration, npu=npu(U55))
    before = lint_program(program, "distilbert", config)
    [gather] = [f for f in before.findings if f.code == "QL010" and f.details["op"] == "aten.index_select.default"]
    assert gather.fixable and "`index_select`: no U55 operator" in gather.details["causes"]
    result = fix_program(program, "distilbert", config, verification_inputs(example, calibration), linted=before)
    summary = result.summary
    [fold] = summary.folds
    assert (fold.code, fold.kind) == ("QL010", "gather")
    # the 64x32 table is no longer dequantized every inference, nor the 8 rows gathered in float
    assert summary.fp32_elements == (before.stats.fp32_elements, before.stats.fp32_elements - 64 * 32 - 8 * 32)
    assert summary.partitions == (2, 2) and summary.activation_bytes[1] < summary.activation_bytes[0]
    assert summary.cycles[1] < summary.cycles[0]
    assert not [f for f in result.findings if f.code == "QL007"]  # each partition checked on the reference model


@pytest.mark.model("make_vit")
def test_vits_layernorms_are_each_priced_on_the_cpu_and_stay_on_the_npu() -> None:
    from qlint.api import remedy
    from qlint.records.results import RemedyStatus

    model, example, calibration = zoo.make_vit()
    config = replace(Config(root=ROOT), npu=npu(U55))
    done = remedy(model, example, calibration, (RemedyName.LAYERNORM_PLACEMENT,), config, artifact="vit")
    [outcome] = done.report.outcomes
    baseline = done.report.baseline
    assert baseline.partitions == 1 and baseline.fp32_ops == 0
    # the layer's two LayerNorms and the final one, each built alone on the CPU: at 16 tokens of 32
    # channels the NPU's LayerNorm costs less than the CPU's and the split it makes
    assert [site.site for site in outcome.sites] == ["model.encoder.layer.0.layernorm_before",
                                                      "model.encoder.layer.0.layernorm_after", "model.layernorm"]
    assert all(site.cycles is not None and site.cycles > baseline.cycles for site in outcome.sites)
    assert all(site.sqnr_db > baseline.sqnr_db - config.remedy_max_sqnr_drop_db for site in outcome.sites)
    assert outcome.status == RemedyStatus.SKIPPED and done.fixed.stats.partitions == 1
