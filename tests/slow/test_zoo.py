"""Public architectures (examples/zoo.py) at tiny configs with seeded random weights, no downloads:
their attention scales hide behind in-graph constants and masks, and stay fp32 for reasons decided
at export and quantization time. Each is checked, fixed, and read back from its `.pte`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from examples.zoo import ZOO
from qlint.full.lint import lint_pte
from qlint.loading.view import op_name
from qlint.settings.config import Config

ZOO_MODELS = [f"make_{name}" for name in ZOO]
# Attention layers whose scale is a `div`/`mul` island between quantized ops.
SCALES = {"make_bert": 2, "make_distilbert": 1, "make_vit": 1, "make_whisper_encoder": 2, "make_mobilevit": 2}


def codes(findings: list[Any]) -> Counter[str]:
    return Counter(f.code for f in findings)


def scales(findings: list[Any]) -> list[Any]:
    return [f for f in findings if f.code == "QL001"]


@pytest.mark.parametrize("name", ZOO_MODELS)
def test_the_pte_of_every_zoo_model_reads_as_its_program(
    name: str, linted: Callable[..., Any], fixed: Callable[[str], Any]
) -> None:
    """The `.pte` ExecuTorch writes from the lowered program, and the one `qlint fix` writes,
    report what the programs they were serialized from report."""
    from qlint.fix.program import to_pte

    checked = linted(name)
    assert checked.failure is None and "QL007" not in codes(checked.findings)
    shipped = to_pte(checked.lowered, Config().root).pte
    assert codes(lint_pte(shipped, f"{name}.pte", Config()).findings) == codes(checked.findings)
    result = fixed(name)
    assert result.summary.verified_inputs == 9  # channels_last programs are fed channels_last batches
    assert codes(lint_pte(result.pte, f"{name}.fixed.pte", Config()).findings) == codes(result.findings)


@pytest.mark.parametrize("name", list(SCALES))
def test_every_attention_scale_is_ql001_and_folds(name: str, linted: Callable[..., Any],
                                                  fixed: Callable[[str], Any]) -> None:
    found = scales(linted(name).findings)
    assert len(found) == SCALES[name] and all(f.fixable for f in found)
    family = name.removeprefix("make_").removesuffix("_encoder")
    # Located in the library's own attention code, where the scale is written.
    assert all(f.location.path.startswith(f"transformers/models/{family}/modeling_") for f in found), [
        str(f.location) for f in found
    ]
    result = fixed(name)
    assert [f.code for f in result.summary.folds].count("QL001") == SCALES[name]
    assert scales(result.findings) == []
    assert result.summary.verified_inputs == 9  # bit for bit, on the lowered program


@pytest.mark.parametrize("name", ["make_bert", "make_distilbert", "make_vit"])
def test_eager_scales_with_no_mask_are_exact_identities(name: str, linted: Callable[..., Any],
                                                        fixed: Callable[[str], Any]) -> None:
    assert all(f.details["identity"] for f in scales(linted(name).findings))
    folds = [f for f in fixed(name).summary.folds if f.code == "QL001"]
    assert {f.kind for f in folds} == {"identity"}
    program = fixed(name).program
    assert not any(op_name(n).startswith(("aten.div", "aten.mul")) for n in program.graph.nodes
                   if n.op == "call_function")


@pytest.mark.model("make_bert")
def test_bert_scale_carries_the_mask_built_in_the_graph(linted: Callable[..., Any]) -> None:
    """No attention_mask passed: BERT still adds (1 - ones) * finfo.min, built with aten.full."""
    [first, _] = scales(linted("make_bert").findings)
    assert [(c["op"], c["kind"]) for c in first.details["constants"]] == [("div", "buffer"), ("add", "computed")]
    assert first.details["constants"][1]["value"] == 0.0 and first.details["identity"]


@pytest.mark.model("make_distilbert")
def test_distilbert_masked_fill_with_an_empty_mask_folds_away(linted: Callable[..., Any],
                                                              fixed: Callable[[str], Any]) -> None:
    [where] = [f for f in linted("make_distilbert").findings if "aten.where.self" in f.details.get("ops", [])]
    assert where.code == "QL002" and where.fixable
    assert where.details["reason"] == "aten.where.self: no CortexMQuantizer pattern covers aten.masked_fill.Tensor"
    assert ("QL002", "identity") in [(f.code, f.kind) for f in fixed("make_distilbert").summary.folds]


@pytest.mark.parametrize("name", ["make_vit", "make_resnet", "make_mobilenet", "make_mobilevit"])
def test_nchw_convolutions_name_channels_last(name: str, linted: Callable[..., Any]) -> None:
    findings = linted(name).findings
    convs = [f for f in findings if "aten.convolution.default" in f.details.get("ops", [])]
    # Judged on the graph the quantizer saw: after lowering, a lowered pool hands on channels_last tensors.
    assert convs and all("conv2d pattern refused it (CortexMConv2DCheck)" in f.details["reason"] for f in convs)
    assert not any("matches CortexMQuantizer" in f.details.get("reason", "") for f in findings)
    assert any("model.to(memory_format=torch.channels_last)" in f.details["reason"] for f in convs)


@pytest.mark.parametrize("name", ["make_resnet_channels_last", "make_mobilenet_channels_last"])
def test_the_same_networks_exported_channels_last_are_all_int8(name: str, linted: Callable[..., Any]) -> None:
    checked = linted(name)
    assert checked.findings == [] and checked.stats.coverage == 1.0 and checked.stats.fp32_islands == 0


@pytest.mark.model("make_convnext")
def test_convnext_stem_island_keeps_the_convolution_cause(linted: Callable[..., Any]) -> None:
    """The NCHW stem conv and the LayerNorm after it are one island: both causes are named."""
    [stem] = [f for f in linted("make_convnext").findings if "aten.convolution.default" in f.details.get("ops", [])]
    assert stem.details["reason"].startswith("data-dependent normalization (aten.native_layer_norm.default): ")
    assert "(for a config target: the int8-layernorm remedy); aten.convolution.default: CortexMQuantizer's conv2d " \
           "pattern refused it" in stem.details["reason"]


@pytest.mark.model("make_transformer_encoder")
def test_transformer_encoder_sdpa_is_one_finding_per_layer_with_its_cause(linted: Callable[..., Any]) -> None:
    """nn.TransformerEncoder (one layer) attends with SDPA: no quantizer pattern covers it, and qlint says so."""
    sdpa = [f for f in linted("make_transformer_encoder").findings
            if "F.scaled_dot_product_attention" in f.details.get("reason", "")]
    assert len(sdpa) == 1
    assert "runtime" not in sdpa[0].details["reason"] and "unfused" in sdpa[0].details["reason"]
    # The attention runs inside torch (no frame of the user's code): located by its module.
    assert sdpa[0].location is None and sdpa[0].details["module"] == "layers.0.self_attn (MultiheadAttention)"


@pytest.mark.model("make_resnet")
def test_a_relu_fused_with_a_refused_convolution_shares_its_cause(linted: Callable[..., Any]) -> None:
    """No pattern starts with relu; conv2d -> relu is one, refused for its layout, and that is the cause."""
    [block] = [f for f in linted("make_resnet").findings if "aten.relu.default" in f.details.get("ops", [])][:1]
    assert block.details["reason"].startswith("aten.convolution.default, aten.relu.default: CortexMQuantizer's "
                                              "conv2d pattern refused it (CortexMConv2DCheck)")


@pytest.mark.model("make_mobilevit")
def test_text_output_groups_a_network_of_nchw_convolutions_into_one_cause(linted: Callable[..., Any]) -> None:
    from qlint.records.results import Report
    from qlint.report.formats import text

    checked = linted("make_mobilevit")
    out = text(Report(findings=checked.findings, stats=[checked.stats]))
    [line] = [line for line in out.splitlines() if "CortexMConv2DCheck" in line and "islands" in line
              and "normalization" not in line]
    assert line.startswith("make_mobilevit: QL002 [warning] 23 fp32 islands, 118016 fp32 elements "
                           "per inference: aten.convolution.default: CortexMQuantizer's conv2d")
    # The convolutions' output shapes differ: the grouped line elides them, each finding keeps its own.
    assert "conv2d output [...] is NCHW (dim order 0, 1, 2, 3)" in line


@pytest.mark.model("make_whisper_encoder")
def test_whisper_position_embedding_add_names_its_constant_and_the_broadcast_the_add_check_refused(
        linted: Callable[..., Any]) -> None:
    [add] = [f for f in linted("make_whisper_encoder").findings if f.details.get("ops") == ["aten.add.Tensor"]]
    assert add.details["reason"] == (
        "constant embedding differs by position (256 elements), so no table folds it; it is computed in the graph "
        "(aten.embedding.default) from constants, one value per element, and never quantized; "
        "aten.add.Tensor: CortexMQuantizer's add pattern refused it (CortexMAddMulCheck): operand shapes [1, 8, 32] "
        "and [8, 32] (quantized add/mul take operands of one shape, or a per-channel [N, C, 1, 1] operand of a "
        "channels_last tensor); fix: expand the second operand to [1, 8, 32] (`.expand(1, 8, 32)`) before the op "
        "(for a config target: the expand-broadcasts remedy, qlint fix --unsafe-fixes)"
    )
    assert add.location.code == "hidden_states = inputs_embeds + self.embed_positions(all_positions)"
