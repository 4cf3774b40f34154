"""Constant subgraphs (QL008): fp32 work no runtime input reaches, reported, counted and folded into
stored constants, verified bit for bit against the program as lowered."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch

from qlint.api import fix
from qlint.full.lint import lint_program
from qlint.loading.quantize import quantize
from qlint.loading.view import GraphView, op_name
from qlint.settings.config import Config, ConstantKind, FoldGuards


def only(findings: list[Any], code: str) -> list[Any]:
    return [f for f in findings if f.code == code]


def ops(program: Any) -> Counter[str]:
    return Counter(op_name(n) for n in program.graph.nodes if n.op == "call_function")


def seeded(template: tuple[Any, ...], n: int = 8) -> list[tuple[Any, ...]]:
    return [tuple(torch.randn(t.shape, generator=torch.Generator().manual_seed(200 + i)) * 3 for t in template)
            for i in range(n)]


def assert_same_outputs(before: Any, after: Any, inputs: list[tuple[Any, ...]]) -> None:
    for batch in inputs:
        b, a = before.module()(*batch), after.module()(*batch)
        assert b.dtype == a.dtype and torch.equal(b, a)


def stored(program: Any, suffix: str = "_qlint_const") -> dict[str, torch.Tensor]:
    """The constants a fold stored, by placeholder name."""
    view = GraphView(program)
    return {n.name: view.constant(n).value for n in program.graph.nodes
            if n.op == "placeholder" and n.name.endswith(suffix)}


@pytest.fixture(scope="module")
def lstm() -> tuple[Any, tuple[Any, ...]]:
    """ExecuTorch's own Cortex-M test LSTM, exported without an initial state: its zero state is built
    with `aten.full` and run through `linear(h0, W_hh, b_hh)` on every inference."""
    from executorch.backends.cortex_m.test.ops.test_lstm import test_cases

    case = test_cases["lstm_fp32"]
    return quantize(case.model, case.example_inputs), case.example_inputs


@pytest.fixture(scope="module")
def lstm_linted(lstm: tuple[Any, tuple[Any, ...]]) -> Any:
    return lint_program(lstm[0], "lstm", Config())


def test_lstm_zero_state_is_two_constant_subgraphs(lstm_linted: Any) -> None:
    hidden, cell = only(lstm_linted.findings, "QL008")
    # h0 = full -> squeeze -> unsqueeze [1, 1, 3], then linear with W_hh [12, 3] and b_hh [12]: 3 * 3 + 12.
    assert hidden.details["ops"] == ["aten.full.default", "aten.linear.default"]
    assert hidden.details["fp32_elements"] == 21 and hidden.node == "aten_linear_default_1"
    # c0 = full -> squeeze -> unsqueeze [1, 1, 3], read by the first cell update.
    assert cell.details["ops"] == ["aten.full.default"] and cell.details["fp32_elements"] == 9
    for finding in (hidden, cell):
        assert finding.fixable and finding.severity == "warning"
        assert finding.details["reason"].endswith("), so it gives the same value on every inference")
        assert finding.details["module"] == "lstm (LSTM)"  # made inside torch's LSTM
    assert hidden.details["reason"].startswith("computed only from constants (parameter `_param_constant1` [12, 3], "
                                               "parameter `_param_constant3` [12], aten.full.default)")
    assert sum(hidden.details["graph_nodes"].values()) == 21


def test_lstm_constant_work_counts_as_fp32(lstm_linted: Any) -> None:
    """Both fulls and the h0 linear are fp32 ops of the device, next to the 22 of the island."""
    [coverage] = only(lstm_linted.findings, "QL005")
    assert coverage.details["fp32_ops"]["full"] == 2 and coverage.details["fp32_ops"]["linear"] == 3
    assert sum(coverage.details["fp32_ops"].values()) == 25 and coverage.details["int_ops"] == 0
    [island] = only(lstm_linted.findings, "QL002")
    assert lstm_linted.stats.fp32_elements == island.details["fp32_elements"] + 21 + 9
    assert lstm_linted.stats.fp32_islands == 1  # constant subgraphs are not islands


def test_accounting_does_not_depend_on_the_rule_being_selected(lstm: tuple[Any, tuple[Any, ...]],
                                                               lstm_linted: Any) -> None:
    unselected = lint_program(lstm[0], "lstm", Config(ignore=("QL008",)))
    assert only(unselected.findings, "QL008") == []
    assert unselected.stats.fp32_elements == lstm_linted.stats.fp32_elements
    assert unselected.stats.coverage == lstm_linted.stats.coverage


def test_lstm_fix_stores_the_zero_state_and_is_bit_exact(lstm: tuple[Any, tuple[Any, ...]], lstm_linted: Any) -> None:
    program, example = lstm
    result = fix(program, [example])
    assert [(f.code, f.kind) for f in result.summary.folds] == [("QL008", "constant"), ("QL008", "constant")]
    assert result.summary.fp32_ops == (25, 22) and result.summary.fp32_elements == (236, 206)
    before, after = ops(lstm_linted.lowered), ops(result.program)
    assert before["aten.full.default"] == 2 and "aten.full.default" not in after
    assert (before["aten.linear.default"], after["aten.linear.default"]) == (3, 2)
    assert only(result.findings, "QL008") == [] and result.summary.left[0].code == "QL002"
    # linear(0, W_hh, b_hh) is b_hh exactly; the cell state is zeros.
    values = stored(result.program)
    bias = next(v for name, v in lstm_linted.lowered.state_dict.items() if name.endswith("_param_constant3"))
    assert torch.equal(values["aten_linear_default_1_qlint_const"], bias.detach().reshape(1, 1, 12))
    assert torch.equal(values["aten_unsqueeze_copy_default_1_qlint_const"], torch.zeros(1, 1, 3))
    assert_same_outputs(lstm_linted.lowered, result.program, [example, *seeded(example)])


def test_the_lstm_pte_reports_what_the_program_reports(lstm_linted: Any, lstm: tuple[Any, tuple[Any, ...]]) -> None:
    from qlint.fix.program import to_pte
    from qlint.full.lint import lint_pte

    shipped = lint_pte(to_pte(lstm_linted.lowered, Config().root).pte, "lstm.pte", Config())
    assert [(f.details["ops"], f.details["fp32_elements"]) for f in only(shipped.findings, "QL008")] == [
        (["aten.full.default", "aten.linear.default"], 21), (["aten.full.default"], 9)
    ]
    fixed = fix(lstm[0], [lstm[1]])
    assert only(lint_pte(fixed.pte, "lstm.fixed.pte", Config()).findings, "QL008") == []


@pytest.mark.model("make_computed_scale")
def test_a_scale_computed_from_a_parameter_is_reported_where_it_is_written(linted: Callable[..., Any]) -> None:
    """`x + torch.full((1, 8, 16), 0.5) * w`: full and mul run in fp32 on every inference, and their
    result is quantized for the int8 add; coverage counts them."""
    checked = linted("make_computed_scale")
    [finding] = only(checked.findings, "QL008")
    assert finding.details["ops"] == ["aten.full.default", "aten.mul.Tensor"]
    assert finding.details["fp32_elements"] == 2 * 8 * 16  # full and mul; the quantize's output is int8
    assert finding.node == "cortex_m_quantize_per_tensor_default_1" and finding.fixable
    assert finding.location.code == "return x + torch.full(self.shape, 0.5) * self.w"
    assert checked.stats.coverage == pytest.approx(1 / 3)  # the int8 add against full and mul
    assert checked.stats.fp32_islands == 0


@pytest.mark.model("make_computed_scale")
def test_a_scale_ending_in_a_quantize_is_stored_as_int8(linted: Callable[..., Any],
                                                         quantized: Callable[..., Any]) -> None:
    from examples.models import make_computed_scale

    model, example, _ = make_computed_scale()
    unfixed = linted("make_computed_scale").lowered
    [quantize_node] = [n for n in unfixed.graph.nodes if n.name == "cortex_m_quantize_per_tensor_default_1"]
    scale, zero_point = quantize_node.args[1:3]
    result = fix(quantized("make_computed_scale"), [example])
    assert [(f.code, f.kind) for f in result.summary.folds] == [("QL008", "constant")]
    [value] = stored(result.program).values()
    expected = torch.ops.quantized_decomposed.quantize_per_tensor(
        torch.full((1, 8, 16), 0.5) * model.w.detach(), scale, zero_point, -128, 127, torch.int8)
    assert value.dtype == torch.int8 and torch.equal(value, expected)
    assert ops(result.program) == Counter({"cortex_m.quantize_per_tensor.default": 1,
                                           "cortex_m.quantized_add.default": 1,
                                           "cortex_m.dequantize_per_tensor.default": 1})
    assert result.stats.coverage == 1.0 and result.summary.fp32_elements == (256, 0)
    assert result.summary.activation_bytes[1] < result.summary.activation_bytes[0]
    assert_same_outputs(unfixed, result.program, [example, *seeded(example)])


@pytest.mark.model("make_computed_scale_quantized_mul")
def test_an_int_kernel_reading_a_float_constant_is_ql007(linted: Callable[..., Any]) -> None:
    """With the parameter's shape the quantizer's mul pattern takes `full * w`; the lowering folds the
    quantize of the `full` away and never computes it, so cortex_m.quantized_mul reads floats: an error,
    named by kernel, producer and the line that wrote it."""
    checked = linted("make_computed_scale_quantized_mul")
    [invalid] = only(checked.findings, "QL007")
    assert invalid.severity == "error" and invalid.fixable
    assert invalid.message.startswith(
        "lowered program cannot run: cortex_m.quantized_mul.default at cortex_m_quantized_mul_default receives "
        "float32, int8: it reads the float32 output of aten.full.default (aten_full_default) where its kernel "
        "expects int8")
    assert invalid.details["producer_op"] == "aten.full.default"
    assert invalid.details["restored_qparams"]["dtype"] == "int8"
    assert invalid.location.code == "return x + torch.full(self.shape, 0.5) * self.w"
    [finding] = only(checked.findings, "QL008")
    [island] = only(checked.findings, "QL002")
    # The island reads the subgraph's dequantize [16] as its input: the total counts it once.
    assert checked.stats.fp32_elements == island.details["fp32_elements"] + 16
    assert finding.details["ops"] == ["aten.full.default", "cortex_m.quantized_mul.default"]
    assert finding.details["misread"].startswith(
        "cortex_m.quantized_mul.default reads the float32 output of aten.full.default where its kernel expects "
        "integers")
    assert not finding.fixable and finding.details["misread"] in finding.message


@pytest.mark.model("make_computed_scale_quantized_mul")
def test_fix_puts_the_folded_quantize_back_and_stores_what_the_quantized_program_computes(
        quantized: Callable[..., Any], linted: Callable[..., Any]) -> None:
    """`--fix` quantizes the `full` as the folded quantize did, then computes the constant group once:
    the program it writes reads integers and gives the quantized program's values, which the lowered
    one did not (127 quantization steps off)."""
    from examples.models import make_computed_scale_quantized_mul
    from qlint.analysis.validity import find_invalid, float_reads
    from qlint.analysis.values import first_divergence

    program = quantized("make_computed_scale_quantized_mul")
    example = make_computed_scale_quantized_mul()[1]
    batches = [example, *seeded(example)]
    unfixed = GraphView(linted("make_computed_scale_quantized_mul").lowered, quantized=program)
    wrong = first_divergence(unfixed, batches)
    assert wrong is not None and wrong.node.name == "cortex_m_quantized_mul_default" and wrong.steps > 100
    result = fix(program, [example])
    assert [(f.code, f.kind) for f in result.summary.folds] == [("QL007", "quantize"), ("QL008", "constant")]
    assert "put back the quantize of aten.full.default's output (int8(scale=" in result.summary.folds[0].change
    left = ops(result.program)
    assert "aten.full.default" not in left and "cortex_m.quantized_mul.default" not in left
    fixed = GraphView(result.program, quantized=program)
    assert float_reads(fixed) == [] and find_invalid(fixed, batches) is None
    assert not only(result.findings, "QL007") and not only(result.findings, "QL008")
    # The stored [16] is the quantized program's dequantized int8 product, exactly.
    [value] = stored(result.program).values()
    module = program.module()
    recorded: dict[str, torch.Tensor] = {}

    class Recording(torch.fx.Interpreter):
        def run_node(self, n: Any) -> Any:
            recorded[n.name] = super().run_node(n)
            return recorded[n.name]

    Recording(module).run(*example)
    [product] = [n.name for n in module.graph.nodes if n.op == "call_function" and n.name.startswith("dequantize")
                 and n.args[0].op == "call_function" and n.args[0].args[0].target == torch.ops.aten.mul.Tensor]
    assert value.dtype == torch.float32 and torch.equal(value, recorded[product])


@pytest.mark.model("make_computed_scale")
def test_the_constant_kinds_guard_applies(quantized: Callable[..., Any]) -> None:
    guarded = Config(fold=FoldGuards(constant_kinds=tuple(k for k in ConstantKind if k != ConstantKind.PARAMETER)))
    [finding] = only(lint_program(quantized("make_computed_scale"), "scale", guarded).findings, "QL008")
    assert finding.details["blocked_by"] == [
        "fold.constant_kinds: parameter not in [buffer, constant, literal, computed]"
    ] and not finding.fixable


@pytest.mark.model("make_causal_attention")
def test_a_mask_that_mixes_integer_and_float_work_is_one_subgraph(linted: Callable[..., Any],
                                                                   quantized: Callable[..., Any]) -> None:
    """The causal mask: arange, sub and ge on integers, full, scalar_tensor and where in float."""
    from examples.models import make_causal_attention

    checked = linted("make_causal_attention")
    [finding] = only(checked.findings, "QL008")
    assert finding.details["ops"] == [
        "aten.full.default", "aten.arange.start_step", "aten.arange.start_step", "aten.sub.Tensor",
        "aten.ge.Scalar", "aten.scalar_tensor.default", "aten.where.self",
    ]
    assert finding.details["fp32_elements"] == 64 + 1 + 64  # full, scalar_tensor, where
    example = make_causal_attention()[1]
    result = fix(quantized("make_causal_attention"), [example])
    assert ("QL008", "constant") in [(f.code, f.kind) for f in result.summary.folds]
    assert not {"aten.arange.start_step", "aten.where.self", "aten.full.default"} & set(ops(result.program))
    assert_same_outputs(checked.lowered, result.program, seeded(example))
