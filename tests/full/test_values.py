"""The value check of the lowering (QL007): the lowered program against the quantized program it was
lowered from, node by node, on the program's own inputs (a check) and on the fix's verification inputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import run_cli

from qlint.fix.apply import FixError, fix_program, verification_inputs
from qlint.graph.lint import lint_program
from qlint.graph.quantize import quantize
from qlint.graph.values import DIVERGED_STEPS, first_divergence
from qlint.graph.view import GraphView
from qlint.settings.config import Config


class IntegerClamp(torch.nn.Module):
    """`clamp(-1, 1)` with integer bounds: ExecuTorch 1.5.1 lowers it int16 to an `aten.clamp` of the
    integers by the same bounds, so every output is -1, 0 or 1 *integers*, about 0.0001."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clamp(-1, 1)


@pytest.fixture(scope="module")
def integer_clamp() -> tuple[Any, tuple[torch.Tensor]]:
    from executorch.backends.cortex_m.quantizer.quantization_configs import INT16_PER_TENSOR_CONFIG

    generator = torch.Generator().manual_seed(0)
    example = (torch.randn(1, 16, generator=generator) * 2,)
    return quantize(IntegerClamp(), example, [example], INT16_PER_TENSOR_CONFIG), example


def test_a_lowering_that_changes_the_values_is_ql007_at_the_node_that_changed_them(
        integer_clamp: tuple[Any, tuple[torch.Tensor]]) -> None:
    program, example = integer_clamp
    checked = lint_program(program, "clamp", Config())
    [finding] = [f for f in checked.findings if f.code == "QL007"]
    assert finding.severity == "error" and not finding.fixable
    assert finding.message.startswith(
        "lowered program computes other values: aten.clamp.default at aten_clamp_default receives int16: it computes "
        "other values than the quantized program's clamp: ")
    assert finding.details["reference"] == "clamp" and finding.details["steps"] > 1000
    assert finding.details["expected_value"] == pytest.approx(-1.0, abs=1e-3)
    assert abs(finding.details["lowered_value"]) < 1e-3  # the integer -1, read back: one step of the scale
    assert finding.location.code == "return x.clamp(-1, 1)"
    with pytest.raises(FixError, match="^cannot fix: lowered program computes other values: aten.clamp.default"):
        fix_program(program, "clamp", Config(), verification_inputs(example), linted=checked)


def test_the_float_bounds_clamp_agrees_and_the_check_finds_nothing(
        integer_clamp: tuple[Any, tuple[torch.Tensor]]) -> None:
    """The same program with the lowering's clamp bounds requantized, as a correct lowering would do it:
    no node diverges, and the largest difference is within requantization's."""
    program, example = integer_clamp
    checked = lint_program(program, "clamp", Config())
    assert checked.lowered is not None
    lowered = checked.lowered
    [clamp] = [n for n in lowered.graph.nodes if n.name == "aten_clamp_default"]
    scale = clamp.args[0].args[1]
    clamp.args = (clamp.args[0], round(-1 / scale), round(1 / scale))
    lowered.graph_module.recompile()
    batches = verification_inputs(example)
    assert first_divergence(GraphView(lowered, quantized=program), batches) is None
    outputs = [lowered.module()(*b) for b in batches]
    expected = [program.module()(*b) for b in batches]
    assert all(torch.allclose(o, e, atol=DIVERGED_STEPS * scale) for o, e in zip(outputs, expected, strict=True))


class Op(torch.nn.Module):
    """One op of a model, as written: `Op(lambda x: F.pad(x, (2, 2), value=1.0))`."""

    def __init__(self, op: Any) -> None:
        super().__init__()
        self.op = op

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.op(*inputs)


# Each a lowering by ExecuTorch 1.5.1 that carries a float literal of the model onto the integers (the
# node named), and lowerings of the same ops that keep the values. One input (1, 16), two for `where`.
LOWERINGS = [
    ("int16", lambda x: F.hardtanh(x, -0.5, 0.5), "aten_hardtanh_default"),
    ("int16", lambda x: x.clamp(min=-1), "aten_clamp_default"),
    ("int16", lambda x: F.hardswish(x), "aten_clamp_default"),      # the clamp(x, -3) the Cortex-M passes add
    ("int16", lambda x: F.pad(x, (2, 2), value=1.0), "cortex_m_pad_default"),  # the value clamped to int8's range
    ("int8", lambda x, y: torch.where(x > 0.5, x, y), "aten_where_self"),     # compared with 0.5 as an integer
    ("int16", lambda x, y: torch.where(x >= 0.5, x, y), "aten_where_self"),
    ("int8", lambda x: torch.cat([x, torch.ones_like(x)], 1), "aten_full_like_default"),  # the fill not quantized
    ("int8", lambda x: torch.cat([x, torch.full_like(x, 0.5)], 1), "aten_full_like_default"),
    ("int16", lambda x: torch.maximum(x, torch.full_like(x, 0.5)), "aten_full_like_default"),
    ("int16", lambda x: F.relu6(x), None),
    ("int8", lambda x, y: torch.where(x > 0, x, y), None),  # 0 is the zero point's integer: the same test
    ("int8", lambda x: F.pad(x, (2, 2), value=0.5), None),
]


@pytest.mark.parametrize(("dtype", "op", "node"), LOWERINGS)
def test_lowerings_that_carry_a_float_literal_onto_the_integers_diverge_at_that_node(
        dtype: str, op: Any, node: str | None) -> None:
    from executorch.backends.cortex_m.quantizer.quantization_configs import INT16_PER_TENSOR_CONFIG

    generator = torch.Generator().manual_seed(0)
    example = tuple(torch.randn(1, 16, generator=generator) * 2 for _ in range(op.__code__.co_argcount))
    program = quantize(Op(op), example, [example], INT16_PER_TENSOR_CONFIG if dtype == "int16" else None)
    checked = lint_program(program, "op", Config())
    assert checked.lowered is not None
    found = first_divergence(GraphView(checked.lowered, quantized=program), [example])
    assert (found.node.name if found else None) == node
    invalid = [f for f in checked.findings if f.code == "QL007"]
    if node is None:
        assert not invalid
    else:
        assert [f.details.get("steps", 0) > DIVERGED_STEPS for f in invalid] == [True]
        assert abs(found.lowered - found.expected) > 0.1  # a value the float model would not recognise


MUL_MODEL = '''import torch


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(0.5, 2.0, 16))

    def forward(self, x):
        return x + torch.full((16,), 0.5) * self.w


def make():
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(1, 8, 16, generator=g),) for _ in range(4)]
    return Model(), batches[0], batches
'''


def test_a_config_target_whose_kernel_reads_floats_fails_and_fix_writes_a_valid_pte(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's case as a user meets it: `x + torch.full((16,), 0.5) * self.w` as a target is an error
    (exit 1); `--fix` writes a `.pte` that, checked again, reads no floats."""
    (tmp_path / "mul.py").write_text(MUL_MODEL)
    config = tmp_path / ".qlint.yaml"
    config.write_text("targets:\n  - name: mul\n    factory: mul:make\n")
    code, out, _ = run_cli(["check", "--config", str(config), "--targets-only", "--no-cache"], capsys)
    assert code == 1 and "QL007" in out and "reads the float32 output of aten.full.default" in out
    code, out, err = run_cli(["check", "--config", str(config), "--targets-only", "--no-cache", "--fix",
                              "--output-dir", str(tmp_path)], capsys)
    written = tmp_path / "mul.pte"
    assert written.exists(), out + err
    assert "put back the quantize of aten.full.default's output" in out + err
    code, out, _ = run_cli(["check", "--no-cache", str(written)], capsys)
    assert "QL007" not in out and "QL008" not in out and code == 0, out
