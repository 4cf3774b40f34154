"""The seed cases: real models, exported, quantized with CortexMQuantizer and lowered."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from qlint.full.lint import lint_program
from qlint.settings.config import Config, FoldGuards
from qlint.settings.options import LoweringOrder, RunOptions


def codes(findings: list[Any]) -> list[str]:
    return [f.code for f in findings]


def only(findings: list[Any], code: str) -> Any:
    matching = [f for f in findings if f.code == code]
    assert len(matching) == 1, [f.message for f in findings]
    return matching[0]


@pytest.mark.parametrize(
    ("factory", "op", "value", "line_text"),
    [
        ("make_attention", "div", 4.0, "scores = scores / math.sqrt(self.dim)"),
        ("make_attention_mul", "mul", 0.25, "scores = scores * (1.0 / math.sqrt(self.dim))"),
        ("make_multi_head", "div", 8 ** 0.5, "attn = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)"),
    ],
)
def test_attention_scale_is_ql001(linted: Callable[..., Any], quantized: Callable[..., Any], factory: str, op: str,
                                  value: float, line_text: str) -> None:
    checked = linted(factory)
    assert checked.lowered is not None, "qlint's lowering must handle attention"
    finding = only(checked.findings, "QL001")
    assert finding.severity == "error" and finding.fixable
    assert finding.details["ops"] == [f"aten.{op}.Tensor"]
    [constant] = finding.details["constants"]
    assert constant["op"] == op and constant["value"] == pytest.approx(value, rel=1e-6)
    assert constant["kind"] == "buffer"
    assert finding.details["input_qparams"]["dtype"] == "int8"
    assert finding.location.path == "examples/models.py"
    assert finding.location.code == line_text
    # The quantizer observed the post-scale range: output scale = input scale / factor.
    qin, qout = finding.details["input_qparams"], finding.details["output_qparams"]
    assert qout["scale"] == pytest.approx(qin["scale"] * finding.details["factor"], rel=1e-5)
    assert qin["zero_point"] == qout["zero_point"]
    assert finding.details["identity"] is True
    assert "already an exact identity on int8 values" in finding.message


@pytest.mark.model("make_attention")
def test_attention_softmax_requantize_is_ql004(linted: Callable[..., Any], quantized: Callable[..., Any]) -> None:
    checked = linted("make_attention")
    finding = only(checked.findings, "QL004")
    assert finding.details["input_qparams"]["scale"] == pytest.approx(1 / 256)
    assert finding.details["identity"] is False
    assert "a rescale done in fp32" in finding.message


@pytest.mark.model("make_pool")
def test_scale_feeding_pool_is_ql001_not_identity(linted: Callable[..., Any], quantized: Callable[..., Any]) -> None:
    checked = linted("make_pool")
    finding = only(checked.findings, "QL001")
    assert finding.details["identity"] is False
    assert "not an identity on int8 values" in finding.message
    assert finding.location.code == "return nn.functional.avg_pool2d(torch.relu(x) / 4.0, 2)"
    # The pool itself lowered to an int kernel: it is not part of any island.
    assert all("avg_pool" not in op for f in checked.findings for op in f.details.get("ops", []))


@pytest.mark.model("make_constant_first")
def test_constant_first_operand_is_not_ql001(linted: Callable[..., Any], quantized: Callable[..., Any]) -> None:
    checked = linted("make_constant_first")
    assert "QL001" not in codes(checked.findings)
    finding = only(checked.findings, "QL002")
    assert "constant-first operand" in finding.details["reason"]


@pytest.mark.model("make_runtime_divisor")
def test_runtime_divisor_is_not_ql001(linted: Callable[..., Any], quantized: Callable[..., Any]) -> None:
    checked = linted("make_runtime_divisor")
    assert "QL001" not in codes(checked.findings)
    finding = only(checked.findings, "QL002")
    reason = finding.details["reason"]
    # The ops that are no scale come first, then the divisor by its op, line and the input it is computed from.
    assert reason.startswith("aten.abs.default, aten.amax.default: no CortexMQuantizer pattern covers it; ")
    assert ("runtime (non-constant) operand aten.amax.default [] at examples/models.py:76, computed from input `y` "
            "of aten.div.Tensor; ") in reason
    assert "CortexMDivCheck): operand shapes [1, 8, 16] and [] (" in reason
    assert "aten.div.Tensor" in finding.details["ops"]


@pytest.mark.model("make_norm")
def test_layer_norm_is_ql002_never_ql001(linted: Callable[..., Any], quantized: Callable[..., Any]) -> None:
    checked = linted("make_norm")
    assert "QL001" not in codes(checked.findings)
    finding = only(checked.findings, "QL002")
    assert finding.details["reason"] == (
        "data-dependent normalization (aten.native_layer_norm.default): CortexMQuantizer has no layer_norm pattern, "
        "so no Cortex-M kernel runs it; fix: rebuild it from linear, add, mul and an rsqrt table, which have int8 "
        "kernels (for a config target: the int8-layernorm remedy)"
    )
    assert finding.details["fp32_elements"] == 3 * 8 * 16  # dequantized input, output, getitem
    assert finding.location.code == "return self.norm(self.proj(x))"


@pytest.mark.model("make_scale")
def test_int16_scale_names_the_dtype_guard(linted: Callable[..., Any], quantized: Callable[..., Any]) -> None:
    checked = linted("make_scale", int16=True)
    finding = only(checked.findings, "QL001")
    assert finding.details["input_qparams"]["dtype"] == "int16"
    assert finding.details["blocked_by"] == ["fold.dtypes: int16 not in [int8]"]
    assert not finding.fixable
    assert "fold blocked by fold.dtypes" in finding.message
    allowed = Config(fold=FoldGuards(dtypes=("int8", "int16")))
    finding = only(lint_program(quantized("make_scale", int16=True), "i16", allowed).findings, "QL001")
    assert finding.details["blocked_by"] == [] and finding.fixable


@pytest.mark.model("make_attention")
def test_constant_kind_guard(quantized: Callable[..., Any]) -> None:
    config = Config(fold=FoldGuards(constant_kinds=("parameter",)))
    finding = only(lint_program(quantized("make_attention"), "a", config).findings, "QL001")
    assert finding.details["blocked_by"] == ["fold.constant_kinds: buffer not in [parameter]"]


@pytest.mark.model("make_multi_head")
def test_stock_lowering_crash_is_ql003_and_quantized_program_still_analysed(quantized: Callable[..., Any]) -> None:
    checked = lint_program(quantized("make_multi_head"), "mha", Config(), RunOptions(order=LoweringOrder.STOCK))
    assert checked.lowered is None
    failure = checked.findings[0]
    assert failure.code == "QL003"
    assert failure.details["pass_name"] == "ReplaceScalarWithTensorArgPass"
    assert "expected scalar type torch.int8 but found torch.int32" in failure.message
    assert failure.node.startswith("aten_bmm")
    assert failure.location.code == "out = attn.softmax(-1) @ v"
    assert "\n" not in failure.message
    # The quantized program still yields the attention scale island.
    scale = only(checked.findings, "QL001")
    assert scale.location.code == "attn = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)"
    assert checked.stats.lowered is False


@pytest.mark.model("make_multi_head")
def test_coverage_counts_int_kernels(linted: Callable[..., Any], quantized: Callable[..., Any]) -> None:
    checked = linted("make_multi_head")
    finding = only(checked.findings, "QL005")
    # 4 linears, 2 bmm, 1 softmax run as cortex_m kernels; the scale div does not.
    assert finding.details["int_ops"] == 7
    assert finding.details["fp32_ops"] == {"div": 1}
    assert finding.details["coverage"] == pytest.approx(7 / 8)
    relaxed = Config(coverage_threshold=0.8)
    assert "QL005" not in codes(lint_program(quantized("make_multi_head"), "mha", relaxed).findings)


@pytest.mark.model("make_scale_chain")
def test_chain_with_reshape_is_one_ql001(linted: Callable[..., Any], quantized: Callable[..., Any]) -> None:
    checked = linted("make_scale_chain")
    finding = only(checked.findings, "QL001")
    assert finding.details["ops"] == ["aten.mul.Tensor", "aten.div.Tensor"]
    assert [(c["op"], c["value"]) for c in finding.details["constants"]] == [("mul", 0.5), ("div", 3.0)]
    assert finding.details["factor"] == pytest.approx(0.5 / 3.0)
    assert finding.location.code == "y = torch.relu(x) * 0.5"
    # The reshape between the two constants is part of the island, not an island of its own.
    assert checked.stats.fp32_islands == 1


@pytest.mark.model("make_masked_attention")
def test_an_in_graph_mask_that_masks_nothing_is_part_of_a_ql001_scale(linted: Callable[..., Any]) -> None:
    """`scores * scaling + mask` with the mask built in the graph (`ones`, `full`, quantize ops):
    the mask is a computed constant, zero everywhere, so the island is a scale with a zero offset."""
    checked = linted("make_masked_attention")
    finding = only(checked.findings, "QL001")
    assert "QL002" not in codes(checked.findings)
    assert [(c["op"], c["kind"], c["value"]) for c in finding.details["constants"]] == [
        ("mul", "buffer", pytest.approx(8 ** -0.5)), ("add", "computed", 0.0)
    ]
    assert "(computed, all 8 elements)" in finding.message
    assert finding.location.code == "scores = q @ k.transpose(-2, -1) * self.scaling + mask"
    # The mask's own ops (ones, sub, mul by finfo.min, quantize) are constants, not islands or kernels:
    # work on constants (QL008), whose int8 add reads the `ones` as floats, so it is left to the island's fold.
    assert checked.stats.fp32_islands == 1
    assert finding.fixable
    [mask] = [f for f in checked.findings if f.code == "QL008"]
    assert mask.details["ops"] == ["aten.full.default", "cortex_m.quantized_add.default",
                                   "cortex_m.quantized_mul.default"]
    assert mask.details["misread"].startswith("cortex_m.quantized_add.default reads the float32 output of "
                                              "aten.full.default") and not mask.fixable


@pytest.mark.model("make_causal_attention")
def test_a_causal_mask_differs_by_position(linted: Callable[..., Any]) -> None:
    """Named as the model writes it (`torch.triu`), not as lowering decomposed it (`aten.where`)."""
    finding = only(linted("make_causal_attention").findings, "QL002")
    assert finding.details["reason"].startswith("constant triu differs by position (64 elements)")
    assert not finding.fixable


def test_an_int8_tensor_left_to_a_float_op_is_ql007(linted: Callable[..., Any]) -> None:
    """NCHW conv -> batch-norm -> hardswish: ExecuTorch 1.5.1 leaves aten.hardswish on the int8
    output of the convolution's quantize; the .pte would not run. channels_last lowers cleanly."""
    checked = linted("make_conv_hardswish")
    finding = only(checked.findings, "QL007")
    assert finding.message == (
        "lowered program cannot run: aten.hardswish.default at aten_hardswish_default receives int8: "
        "\"hardswish_cpu\" not implemented for 'Char'"
    )
    assert finding.severity == "error" and finding.details["input_dtypes"] == ["int8"]
    assert finding.location.code == "return self.act(self.bn(self.conv(x)))"
    clean = linted("make_conv_hardswish_channels_last")
    assert clean.findings == [] and clean.stats.coverage == 1.0


@pytest.mark.model("make_clamp")
def test_an_int16_clamp_with_float_bounds_is_ql007(linted: Callable[..., Any]) -> None:
    finding = only(linted("make_clamp", int16=True).findings, "QL007")
    assert finding.message == (
        "lowered program cannot run: aten.clamp.default at aten_clamp_default receives int16: "
        "it computes float32 from int16 and feeds cortex_m.dequantize_per_tensor.default, which needs integers"
    )
    assert finding.location.code == "return x.clamp(-1.0, 1.0)"


@pytest.mark.model("make_transformer_encoder")
def test_a_transformer_encoder_is_exported_without_the_fused_fast_path(linted: Callable[..., Any]) -> None:
    """Under no_grad the layer would export as one aten._transformer_encoder_layer_fwd (0 % int8)."""
    import torch

    checked = linted("make_transformer_encoder")
    ops = {op for f in checked.findings for op in f.details.get("ops", [])}
    assert not any("_transformer_encoder_layer_fwd" in op or "_native_multi_head" in op for op in ops)
    assert {"aten.bmm.default", "aten._softmax.default"} <= ops  # the attention core, op by op
    # 10 int kernels against 11 fp32 ops, the SDPA scale's two one-element aten.full (QL008) among them.
    assert checked.stats.coverage == pytest.approx(10 / 21)
    assert torch.backends.mha.get_fastpath_enabled()  # restored after the export
    [attention] = [f for f in checked.findings if "aten.bmm.default" in f.details.get("ops", [])]
    assert attention.details["reason"].startswith(
        "aten.bmm.default, aten._softmax.default, aten.full_like.default, aten.where.self: part of "
        "F.scaled_dot_product_attention, which no CortexMQuantizer pattern covers; fix: write the attention unfused"
    )


@pytest.mark.model("make_conv_hardswish")
def test_an_nchw_convolution_names_the_quantizer_check_and_channels_last(linted: Callable[..., Any]) -> None:
    """The backend lowers conv2d; CortexMQuantizer's CortexMConv2DCheck refused this one's memory format."""
    finding = only(linted("make_conv_hardswish").findings, "QL002")
    assert finding.details["reason"] == (
        "aten.convolution.default: CortexMQuantizer's conv2d pattern refused it (CortexMConv2DCheck): conv2d "
        "output [1, 8, 8, 8] is NCHW (dim order 0, 1, 2, 3) (CMSIS-NN convolutions run on channels_last tensors); "
        "fix: export with model.to(memory_format=torch.channels_last) and channels_last "
        "example inputs (for a config target: the channels-last remedy, qlint fix --unsafe-fixes)"
    )
    assert "does not lower" not in finding.message


def test_causes_name_a_missing_pattern_and_merge_ops_with_one_cause() -> None:
    import torch
    from torch.fx import Graph

    from qlint.analysis.causes import causes

    graph = Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(2, 3, device="meta")
    nodes = []
    for target in (torch.ops.aten.cumsum.default, torch.ops.aten.cumsum.default, torch.ops.aten.erf.default):
        node = graph.call_function(target, (x, 0) if target is torch.ops.aten.cumsum.default else (x,))
        node.meta["val"] = x.meta["val"]
        nodes.append(node)
    assert [str(c) for c in causes(nodes)] == [
        "aten.cumsum.default, aten.erf.default: no CortexMQuantizer pattern covers it"
    ]
    nodes[2].meta["original_aten"] = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    [plain, sdpa] = causes(nodes)
    assert plain.ops == ("aten.cumsum.default",) and sdpa.ops == ("aten.erf.default",)
    assert sdpa.why.startswith("part of F.scaled_dot_product_attention") and "unfused" in sdpa.remedy


@pytest.mark.model("make_mask_input_attention")
def test_a_broadcast_mask_input_names_the_add_check_and_the_expand(linted: Callable[..., Any]) -> None:
    """`scores / c + mask` with a [1, 1, 1, n] mask input: the add stays fp32 because
    CortexMAddMulCheck refuses the broadcast (measured: with `mask.expand(...)` the add is int8)."""
    finding = only(linted("make_mask_input_attention").findings, "QL002")
    reason = finding.details["reason"]
    assert reason.startswith("runtime (non-constant) operand input `mask` [1, 1, 1, 8] of aten.add.Tensor; ")
    assert ("CortexMQuantizer's add pattern refused it (CortexMAddMulCheck): operand shapes [1, 2, 8, 8] and "
            "[1, 1, 1, 8] (") in reason
    assert reason.endswith("fix: expand the second operand to [1, 2, 8, 8] (`.expand(1, 2, 8, 8)`) before the op "
                         "(for a config target: the expand-broadcasts remedy, qlint fix --unsafe-fixes)")


def test_a_fused_fast_path_op_in_an_artifact_names_the_fast_path_and_how_to_export_without_it() -> None:
    import torch
    from torch.fx import Graph

    from qlint.analysis.causes import cause_of

    graph = Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(1, 8, 16, device="meta")
    args = (x, 16, 2, *(None,) * 11)
    node = graph.call_function(torch.ops.aten._transformer_encoder_layer_fwd.default, args)
    node.meta["val"] = x.meta["val"]
    cause = cause_of(node)
    assert cause.why.startswith("PyTorch's fused inference fast path")
    assert "torch.backends.mha.set_fastpath_enabled(False)" in cause.remedy
