"""The value check of the lowering (QL007): the lowered program against the quantized program it was
lowered from, node by node, on the program's own inputs (a check) and on the fix's verification inputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import run_cli

from qlint.analysis.values import DIVERGED_STEPS, first_divergence
from qlint.fix.apply import FixError, fix_program
from qlint.full.lint import lint_program
from qlint.loading.inputs import verification_inputs
from qlint.loading.quantize import quantize
from qlint.loading.view import GraphView
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
    assert finding.severity == "error" and finding.fixable
    assert finding.message.startswith(
        "lowered program computes other values: aten.clamp.default at aten_clamp_default receives int16: it computes "
        "other values than the quantized program's clamp: ")
    assert finding.details["reference"] == "clamp" and finding.details["steps"] > 1000
    assert finding.details["expected_value"] == pytest.approx(-1.0, abs=1e-3)
    assert abs(finding.details["lowered_value"]) < 1e-3  # the integer -1, read back: one step of the scale
    assert finding.location.code == "return x.clamp(-1, 1)"


def test_fix_clamps_the_integers_at_the_quantized_bounds_and_the_value_check_passes_it(
        integer_clamp: tuple[Any, tuple[torch.Tensor]]) -> None:
    """A clamp on the integers has one right answer: its bounds quantized as its input and output are read.
    `--fix` makes that clamp, and writes it only once the value check passes it on every verification input."""
    from qlint.analysis.validity import find_invalid

    program, example = integer_clamp
    checked = lint_program(program, "clamp", Config())
    batches = verification_inputs(example)
    fixed = fix_program(program, "clamp", Config(), batches, linted=checked)
    [repair] = [f for f in fixed.summary.folds if f.code == "QL007"]
    assert (repair.kind, repair.node) == ("clamp", "aten_clamp_default")
    assert repair.change == (
        "aten.clamp.default clamped the int16 integers at [-1, 1], the model's float bounds: now aten.clamp at "
        "[-7746, 7746], those bounds quantized (int16(scale=0.000129107, zp=0, range=[-32767, 32767]))")
    [clamp] = [n for n in fixed.program.graph.nodes if n.name == "aten_clamp_default"]
    assert clamp.args[1:] == (-7746, 7746) and fixed.findings == [] and fixed.pte
    assert find_invalid(GraphView(fixed.program, quantized=program), batches) is None
    unfixed = checked.lowered
    assert unfixed is not None
    assert [n.args[1:] for n in unfixed.graph.nodes if n.name == "aten_clamp_default"] == [(-1, 1)]


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


class WhereBesideABigBranch(torch.nn.Module):
    """`torch.where(x > 0.5, x, y)`, which ExecuTorch 1.5.1 lowers wrong (the 0.5 compared with the int8
    integers), after a branch whose tensors hold 115 MB (`repeat`'s float output) of the quantized
    program's 259 MB: the value check runs through the branch, in graph order, before it reaches the where."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        big = x.repeat(1, 1800000).amax()
        return torch.where(x > 0.5, x, y), big


@pytest.fixture(scope="module")
def big_where(tmp_path_factory: pytest.TempPathFactory) -> Path:
    generator = torch.Generator().manual_seed(0)
    example = tuple(torch.randn(1, 16, generator=generator) * 2 for _ in range(2))
    path = tmp_path_factory.mktemp("big-where") / "where.pt2"
    torch.export.save(quantize(WhereBesideABigBranch(), example, [example]), str(path))
    return path


WHERE_DIVERGES = ("lowered program computes other values: aten.where.self at aten_where_self receives bool, int8, "
                  "int8: it computes other values than the quantized program's where: ")


def test_a_wrong_lowering_beside_tensors_of_hundreds_of_megabytes_is_still_ql007(
        big_where: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Both programs' tensors total 288 MB, over the 256 MiB the check may hold: it runs them in step and
    drops each value once nothing needs it, so it holds what is live (about 64 MB here) and finds the where."""
    assert big_where.stat().st_size < 64 * 1024
    code, out, _ = run_cli(["check", "--no-cache", str(big_where)], capsys)
    assert code == 1, out
    [line] = [line for line in out.splitlines() if "QL007" in line]
    assert line.startswith(f"{big_where}: QL007 [error] {WHERE_DIVERGES}")


def test_a_value_check_past_its_bound_says_so_in_every_format(
        big_where: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a run would hold more than the bound, QL007 says it cannot check, at the node it stopped
    before, in every format: a check that did not run is never a pass."""
    from qlint.analysis import values
    from qlint.report.escape import markdown_text

    monkeypatch.setattr(values, "RUN_BUDGET_BYTES", 32 * 1024 * 1024)
    message = ("lowered program's values cannot be checked: running it beside the quantized program would hold "
               "61 MiB at once at aten_repeat_default (aten.repeat.default), over the 32 MiB (33,554,432 B) "
               "the check may hold")
    written = {f: tmp_path / f"report.{f}" for f in ("json", "github", "sarif", "markdown")}
    code, out, err = run_cli(["check", "--no-cache", str(big_where),
                              *(a for f, p in written.items() for a in ("--write", f"{f}:{p}"))], capsys)
    assert code == 1, out + err
    assert f"{big_where}: QL007 [error] {message}" in out.splitlines()
    [finding] = json.loads(written["json"].read_text())["findings"]
    assert (finding["code"], finding["message"], finding["node"]) == ("QL007", message, "aten_repeat_default")
    assert finding["details"]["unchecked"] == "values" and finding["details"]["budget_bytes"] == 32 * 1024 * 1024
    assert finding["location"]["code"] == "big = x.repeat(1, 1800000).amax()"
    assert f"title=QL007 lowered-program-invalid::{big_where}: {message}" in written["github"].read_text()
    [result] = json.loads(written["sarif"].read_text())["runs"][0]["results"]
    assert (result["ruleId"], result["level"], result["message"]["text"]) == ("QL007", "error", message)
    assert f"| {markdown_text(message)} |" in written["markdown"].read_text()


def test_a_run_of_the_lowered_program_past_the_bound_says_so(
        big_where: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`aten.repeat` on int8 is no elementwise op: only running the lowered program tells whether it runs.
    Past the bound that run is not made, and QL007 says so instead of passing."""
    from qlint.analysis import values
    from qlint.loading.inputs import sample_inputs
    from qlint.loading.readers import read_pt2

    monkeypatch.setattr(values, "RUN_BUDGET_BYTES", 16 * 1024 * 1024)
    program = read_pt2(big_where.read_bytes(), Config().limits)
    checked = lint_program(program, "where", Config())
    [finding] = [f for f in checked.findings if f.code == "QL007"]
    assert finding.message == (
        "whether the lowered program runs cannot be checked: running it would hold 27 MiB at once at "
        "aten_repeat_default (aten.repeat.default), over the 16 MiB (16,777,216 B) the check may hold")
    assert finding.details["unchecked"] == "run" and not finding.fixable
    with pytest.raises(FixError) as refused:  # a fix of a program the check could not check is not written
        fix_program(program, "where", Config(), verification_inputs(sample_inputs(program)), linted=checked)
    assert str(refused.value) == f"cannot fix: {finding.message}"


@pytest.mark.parametrize("shape", [(1, 3 * (1 << 18) + 5), (1, 700, 1100, 3), ()])
def test_a_node_is_judged_a_slice_at_a_time_and_every_element_counts(shape: tuple[int, ...]) -> None:
    """The largest difference of a compared node is found in whichever slice it is, with both values there."""
    from qlint.analysis.values import _as_read, _worst
    from qlint.rules.qparams import QParams

    qparams = QParams(0.5, 3, -128, 127, "int8")
    got = torch.full(shape, 3, dtype=torch.int8)
    want = torch.zeros(shape)                     # the quantized program's float: the integer 3 there
    if len(shape) == 4:
        got, want = (t.contiguous(memory_format=torch.channels_last) for t in (got, want))
    last = tuple(s - 1 for s in shape)
    want[last] = -4.0                             # the integer -5: 8 steps from 3
    worst = _worst(got, want, qparams, None)
    assert (worst.steps, worst.lowered, worst.expected) == (8.0, 0.0, -4.0)
    finite = torch.ones(shape, dtype=torch.bool)
    finite[last] = False                          # where the quantize reads no finite value: not compared
    assert _worst(got, want, qparams, finite).steps == 0.0
    read = _as_read(want, qparams, torch.int8)
    assert read.stride() == want.stride() and read[last] == -5 and int((read == 3).sum()) == got.numel() - 1
