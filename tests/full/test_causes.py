"""Causes name the condition that failed, with its values, on ExecuTorch's own Cortex-M test models;
every export change a cause suggests is applied to the model it came from and makes the op a kernel."""

from __future__ import annotations

import importlib
from collections import Counter
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from qlint.full.lint import lint_program
from qlint.loading.quantize import quantize
from qlint.settings.config import Config

TESTS = "executorch.backends.cortex_m.test."


def case(spec: str) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    """`ops.test_add:alpha` -> the McuTestCase's model and example inputs, as ExecuTorch ships them."""
    module, name = spec.split(":")
    found = importlib.import_module(TESTS + module).test_cases[name]
    return found.model, tuple(found.get_example_inputs())


def lint(model: torch.nn.Module, inputs: tuple[Any, ...]) -> Any:
    return lint_program(quantize(model, inputs), "case", Config())


def reasons(checked: Any) -> list[str]:
    return [f.details["reason"] for f in checked.findings if f.code == "QL002"]


def kernels(checked: Any) -> Counter[str]:
    """The Cortex-M kernels of the lowered program, by name."""
    return Counter(str(n.target).split("cortex_m.")[-1].split(".")[0] for n in checked.lowered.graph.nodes
                   if n.op == "call_function" and "cortex_m." in str(n.target))


TRANSPOSE_CONV = {
    "conv_transpose2d_groups_2": ["groups=2"],
    "conv_transpose2d_output_padding_1": ["output_padding=[1, 1]"],
    "conv_transpose2d_output_padding_asym": ["output_padding=[1, 0]"],
    "conv_transpose2d_dilation_2": ["dilation=[2, 2]"],
    "conv_transpose2d_depthwise": ["groups=4"],
    "conv_transpose2d_complex": ["output_padding=[1, 1]"],
    "conv_transpose2d_all_params": ["output_padding=[1, 1]", "dilation=[2, 2]"],
}


@pytest.mark.parametrize("name", list(TRANSPOSE_CONV))
def test_a_refused_transpose_convolution_names_its_arguments_not_the_layout(name: str) -> None:
    """Its inputs are channels_last already: the check refused groups, output_padding or dilation,
    which CMSIS-NN's transpose convolution lacks, and no export change helps."""
    model, inputs = case(f"ops.test_conv_transpose:{name}")
    assert inputs[0].is_contiguous(memory_format=torch.channels_last)
    [reason] = reasons(lint(model, inputs))
    head = ("aten.convolution.default: CortexMQuantizer's conv_transpose2d pattern refused it "
            "(CortexMConvTranspose2DCheck): ")
    assert reason.startswith(head)
    for value in TRANSPOSE_CONV[name]:
        assert f"{value} (CMSIS-NN's transpose convolution " in reason
    assert "channels_last" not in reason
    assert reason.endswith("; no export change gives it an int8 path in executorch 1.5.1")


@pytest.mark.parametrize(("spec", "sign"), [("ops.test_add:alpha", "+"), ("ops.test_sub:alpha_float", "-")])
def test_a_float_alpha_is_named_with_the_change_that_meets_it(spec: str, sign: str) -> None:
    [reason] = reasons(lint(*case(spec)))
    op = "add" if sign == "+" else "sub"
    assert reason.startswith(f"runtime (non-constant) operand input `y` [4, 5] of aten.{op}.Tensor; ")
    assert (f"refused it (CortexMAddMulCheck): alpha=0.5 (quantized_add folds only an integer alpha into its "
            f"operand multiplier); fix: scale the second operand instead of passing alpha: "
            f"`x {sign} y * 0.5`") in reason
    assert "shape" not in reason  # the operands have one shape


@pytest.mark.parametrize(("name", "shapes", "expand"), [
    ("broadcast_1", "[1] and [2, 2, 2, 2]", "the first operand"),
    ("broadcast_2", "[2, 2, 2, 2] and [1]", "the second operand"),
])
def test_a_div_broadcast_names_the_shapes(name: str, shapes: str, expand: str) -> None:
    [reason] = reasons(lint(*case(f"ops.test_div:{name}")))
    assert f"CortexMDivCheck): operand shapes {shapes} (the int8 div kernel takes operands of one shape" in reason
    assert reason.endswith(f"fix: expand {expand} to [2, 2, 2, 2] (`.expand(2, 2, 2, 2)`) before the op "
                           "(for a config target: the expand-broadcasts remedy, qlint fix --unsafe-fixes)")


def test_a_softmax_over_another_dimension_names_it() -> None:
    [reason] = reasons(lint(*case("ops.test_softmax:dim_not_last")))
    assert reason == (
        "aten._softmax.default: CortexMQuantizer's softmax pattern refused it (CortexMSoftmaxCheck): softmax over "
        "dim=1 of a 3-D tensor [2, 3, 4] (CMSIS-NN's softmax runs over the last dimension); fix: move that dimension "
        "last: `x.transpose(1, -1).softmax(-1).transpose(1, -1)`"
    )


def test_an_lstm_names_the_op_the_quantizer_saw() -> None:
    """nn.LSTM reaches the quantizer as one aten.lstm, which no pattern covers; lowering decomposes it."""
    [reason] = reasons(lint(*case("ops.test_lstm:lstm_fp32")))
    assert reason.startswith("aten.linear.default, aten.sigmoid.default, aten.tanh.default: no CortexMQuantizer "
                             "pattern covers aten.lstm.input")
    assert "mask" not in reason.split(";")[0]


def test_relu6_is_offered_the_form_the_conv_pattern_fuses() -> None:
    [reason] = reasons(lint(*case("models.test_nn_functional:conv_relu6_avgpool")))
    assert reason == (
        "aten.hardtanh.default: no CortexMQuantizer pattern lists aten.relu6.default; fix: write it as "
        "`F.hardtanh(x, 0.0, 6.0)` (equal to F.relu6), which CortexMQuantizer's conv2d, linear and add patterns fuse"
    )


# Every change a cause above suggests, applied to the model it came from.
class AlphaAsScale(torch.nn.Module):
    def __init__(self, sign: int) -> None:
        super().__init__()
        self.sign = sign

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y * 0.5 if self.sign > 0 else x - y * 0.5


class SoftmaxLast(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, -1).softmax(-1).transpose(1, -1)


class DivExpanded(torch.nn.Module):
    def __init__(self, first: bool) -> None:
        super().__init__()
        self.first = first

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x.expand(2, 2, 2, 2) / y if self.first else x / y.expand(2, 2, 2, 2)


class ConvHardtanhAvgpool(torch.nn.Module):
    def __init__(self, original: torch.nn.Module) -> None:
        super().__init__()
        self.conv = original.conv

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool2d(F.hardtanh(self.conv(x), 0.0, 6.0), kernel_size=2, stride=2)


def _changed(spec: str) -> tuple[torch.nn.Module, tuple[Any, ...], torch.nn.Module]:
    model, inputs = case(spec)
    changed = {
        "ops.test_add:alpha": lambda: AlphaAsScale(1),
        "ops.test_sub:alpha_float": lambda: AlphaAsScale(-1),
        "ops.test_softmax:dim_not_last": SoftmaxLast,
        "ops.test_div:broadcast_1": lambda: DivExpanded(True),
        "ops.test_div:broadcast_2": lambda: DivExpanded(False),
        "models.test_nn_functional:conv_relu6_avgpool": lambda: ConvHardtanhAvgpool(model),
    }[spec]()
    return model, inputs, changed


@pytest.mark.parametrize(("spec", "kernel"), [
    ("ops.test_add:alpha", "quantized_add"),
    ("ops.test_sub:alpha_float", "quantized_add"),
    ("ops.test_softmax:dim_not_last", "softmax"),
    ("ops.test_div:broadcast_1", "quantized_div"),
    ("ops.test_div:broadcast_2", "quantized_div"),
    ("models.test_nn_functional:conv_relu6_avgpool", None),  # fused into the conv kernel: one op fewer
])
def test_every_suggested_change_makes_the_op_a_cortex_m_kernel(spec: str, kernel: str | None) -> None:
    """The change computes the same float function (softmax up to float32 rounding: it reads another
    memory order), and after it the op the cause was about is a kernel: no QL002 is left (a scale the
    alpha change creates is QL001, folded exactly by --fix)."""
    model, inputs, changed = _changed(spec)
    torch.testing.assert_close(changed.eval()(*inputs), model.eval()(*inputs))
    before, after = lint(model, inputs), lint(changed, inputs)
    assert reasons(before) and not reasons(after)
    assert before.stats.fp32_islands >= 1 and after.stats.fp32_islands == (1 if "alpha" in spec else 0)
    if kernel is not None:
        assert kernels(after)[kernel] == kernels(before)[kernel] + 1
    assert {f.code for f in after.findings} <= {"QL001", "QL004", "QL005"}
    if spec.startswith("ops.test_add") or spec.startswith("ops.test_sub"):
        [scale] = [f for f in after.findings if f.code == "QL001"]
        assert scale.details["identity"] is True


@pytest.mark.model("make_roberta_masked")
def test_a_padding_mask_is_named_by_the_input_it_comes_from(linted: Any) -> None:
    """transformers' RoBERTa called with `attention_mask`: the add's fp32 operand is the extended mask
    computed from that input, named by the op the user's code wrote and its line."""
    reasons_ = reasons(linted("make_roberta_masked"))
    [mask] = [r for r in reasons_ if "aten.add.Tensor" in r]
    assert mask.startswith("runtime (non-constant) operand aten.mul.Tensor [1, 1, 1, 8] at "
                           "transformers/modeling_utils.py:")
    assert ", computed from input `attention_mask` of aten.add.Tensor; " in mask
    assert mask.endswith("operand shapes [1, 2, 8, 8] and [1, 1, 1, 8] (quantized add/mul take operands of one "
                         "shape, or a per-channel [N, C, 1, 1] operand of a channels_last tensor); fix: expand the "
                         "second operand to [1, 2, 8, 8] (`.expand(1, 2, 8, 8)`) before the op "
                         "(for a config target: the expand-broadcasts remedy, qlint fix --unsafe-fixes)")


def test_the_conditions_are_written_for_the_installed_executorch() -> None:
    """The conditions are a copy of executorch's checks in words: a different executorch must be read again."""
    from importlib.metadata import version

    from qlint.analysis import conditions

    assert conditions.EXECUTORCH == f"executorch {version('executorch')}"


def test_arguments_a_crafted_program_mangled_claim_no_condition() -> None:
    """A softmax whose dim is no integer, or a max pool whose dilation is text: the conditions cannot read
    them as the op takes them, so the cause claims none (and nothing raises)."""
    from torch.fx import Graph

    from qlint.analysis.causes import cause_of

    graph = Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.zeros(2, 3)
    softmax = graph.call_function(torch.ops.aten._softmax.default, (x, "dim", False))
    softmax.meta["val"] = torch.zeros(2, 3)
    pool = graph.call_function(torch.ops.aten.max_pool2d.default, (x, [2, 2], [2, 2], [0, 0], "two"))
    pool.meta["val"] = torch.zeros(1, 1)
    # Neither ExecuTorch's check (it needs fake tensors) nor the conditions read it: no refusal is claimed.
    assert str(cause_of(softmax)) == ("aten._softmax.default: matches CortexMQuantizer's softmax pattern "
                                      "(CortexMSoftmaxCheck), yet stayed fp32")
    assert str(cause_of(pool)).endswith("pattern (CortexMMaxPool2DCheck), yet stayed fp32")
