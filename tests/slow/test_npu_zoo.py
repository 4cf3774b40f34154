"""The NPU target's fixes on a `transformers` class at a tiny config with seeded random weights: the
gather fold on DistilBERT's word embedding, and one of its LayerNorms priced on the CPU."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from conftest import ROOT

from examples import zoo
from qlint.settings.config import Config
from qlint.settings.npus import npu
from qlint.settings.options import RunOptions

U55 = "ethos-u55-128"


@pytest.mark.model("make_distilbert_tokens")
def test_distilbert_on_u55_gathers_its_int8_word_embedding_and_a_layernorm_is_priced_on_the_cpu(
        quantized: Callable[..., Any]) -> None:
    """One build of DistilBERT from token ids for U55-128: its word embedding's gather folded and verified,
    and the placement remedy's pricing of its last LayerNorm (8 tokens of 32 channels) built alone on the
    CPU, against the build as Arm's quantizer makes it."""
    from qlint.fix.apply import fix_program
    from qlint.full.lint import lint_program
    from qlint.loading.inputs import verification_inputs
    from qlint.loading.quantize import export_float
    from qlint.remedies.layernorm_placement import LayerNormPlacement, layer_norm_modules
    from qlint.remedies.remedy import Build
    from qlint.remedies.search import _priced, float_outputs, sqnr_batches

    model, example, calibration = zoo.make_distilbert_tokens()
    config = replace(Config(root=ROOT), npu=npu(U55))
    program = quantized("make_distilbert_tokens", npu=U55)  # as Arm's quantizer makes it, nothing left float
    options = RunOptions(split_costs=False)  # the fold is what is checked here, not what each fallback's split costs
    before = lint_program(program, "distilbert", config, options)
    [gather] = [f for f in before.findings if f.code == "QL010" and f.details["op"] == "aten.index_select.default"]
    assert gather.fixable and "`index_select`: no U55 operator" in gather.details["causes"]
    result = fix_program(program, "distilbert", config, verification_inputs(example, calibration), options,
                         linted=before)
    summary = result.summary
    [fold] = summary.folds
    assert (fold.code, fold.kind) == ("QL010", "gather")
    # the 64x32 table is no longer dequantized every inference, nor the 8 rows gathered in float
    assert summary.fp32_elements == (before.stats.fp32_elements, before.stats.fp32_elements - 64 * 32 - 8 * 32)
    assert summary.partitions == (2, 2) and summary.activation_bytes[1] < summary.activation_bytes[0]
    assert summary.cycles[1] < summary.cycles[0]
    assert not [f for f in result.findings if f.code == "QL007"]  # each partition checked on the reference model

    last = "model.transformer.layer.0.output_layer_norm"
    assert layer_norm_modules(export_float(model, example)) == [
        "model.embeddings.LayerNorm", "model.transformer.layer.0.sa_layer_norm", last]
    build = Build(model, example, tuple(calibration))
    batches = sqnr_batches(build)
    placed = _priced(build, LayerNormPlacement(frozenset({last})), config, "distilbert", batches,
                     float_outputs(model, batches))
    assert placed.site == last and not placed.failed
    # on the CPU the NPU's part loses the LayerNorm, and the CPU's float LayerNorm and the split cost more
    assert placed.cycles is not None and before.stats.cycles is not None and placed.cycles > before.stats.cycles
