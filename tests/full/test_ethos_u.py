"""The Ethos-U flow on the cases of the NPU table: each model quantized with `EthosUQuantizer` and
lowered with `EthosUPartitioner` (Vela compiles each partition), as Arm's compiler script does.
What runs on the NPU, what falls back to the CPU and why, at the user's line, and each delegate's
SRAM and flash."""

from __future__ import annotations

import functools
import json
import math
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import ROOT

from qlint.full.lint import lint_program
from qlint.records.results import Finding
from qlint.settings.config import Config
from qlint.settings.npus import npu
from qlint.settings.options import RunOptions

U55, U85 = "ethos-u55-128", "ethos-u85-256"
NPU_SOURCE = ROOT / "examples" / "npu.py"


def line_of(text: str) -> int:
    """The line of examples/npu.py that holds `text` (once)."""
    [line] = [i for i, code in enumerate(NPU_SOURCE.read_text().splitlines(), 1) if text in code]
    return line


def lint(quantized: Any, factory: str, accelerator: str, split_costs: bool = False) -> Any:
    """The stored program's lint; `split_costs`: each float fallback also compiled onto the NPU (a lowering
    each), for the tests of what a split costs."""
    config = replace(Config(root=ROOT), npu=npu(accelerator))
    return lint_program(quantized(factory, npu=accelerator), factory, config, RunOptions(split_costs=split_costs))


def fallbacks(linted: Any) -> list[Finding]:
    return [f for f in linted.findings if f.code == "QL010"]


def where(finding: Finding) -> tuple[str, int] | None:
    return (finding.location.path, finding.location.line) if finding.location else None


@pytest.mark.model("make_attention_folded@npu")
@pytest.mark.parametrize("accelerator", [U55, U85])
def test_fully_quantized_attention_is_one_partition_with_nothing_on_the_cpu(quantized: Any, accelerator: str) -> None:
    linted = lint(quantized, "make_attention_folded", accelerator)
    assert (linted.stats.partitions, fallbacks(linted), linted.stats.target) == (1, [], accelerator)
    assert linted.stats.coverage == 1.0
    # Its partition's TOSA, run on the TOSA reference model, writes the quantized program's integers.
    assert [f for f in linted.findings if f.code == "QL007"] == []


@pytest.mark.model("make_attention@npu")
def test_a_float_scale_splits_attention_in_two_partitions_and_folds(quantized: Any) -> None:
    linted = lint(quantized, "make_attention", U55, split_costs=True)
    [div] = fallbacks(linted)
    assert linted.stats.partitions == 2
    assert div.message == (
        "aten.div.Tensor (float32) runs on the CPU between NPU partitions 1 and 2, splitting the NPU's work; "
        "2 NPU partitions on ethos-u55-128: left in float by the quantizer: no int8 annotation for aten.div.Tensor; "
        f"est. {div.details['cycles']:,} cycles, {div.details['time_share']:.1%} of the artifact's time")
    # its dequantize, div and quantize on the CPU; a div marked quantized is still no TOSA INT op, so
    # the program compiled the other way keeps it on the CPU: no figure for the split
    assert div.details["cycles"] == div.details["cpu_cycles"] > 0 and "npu_split_cycles" not in div.details
    assert where(div) == ("examples/npu.py", line_of("scores = scores / math.sqrt(self.dim)"))
    assert (div.details["after_partition"], div.details["splits"], div.details["dtype"]) == (1, True, "float32")
    assert [r["check"] for r in div.details["reasons"]] == ["tosa_support_factory", "CheckArmQuantized"]
    # QL001 still applies between the partitions: the scale is a foldable island.
    [scale] = [f for f in linted.findings if f.code == "QL001"]
    assert (scale.node, where(scale)) == (div.node, where(div))
    assert scale.fixable  # an identity: --fix makes it before partitioning, and the partitions merge
    assert [f.code for f in linted.findings if f.code == "QL002"] == []  # QL010 takes its place
    sizes = [(d.sram, d.flash) for d in linted.stats.delegates]
    assert len(sizes) == 2 and all(sram > 0 and flash > 0 for sram, flash in sizes)


@pytest.mark.model("make_conv_hardswish@npu")
def test_hardswish_left_float_splits_conv_into_three_partitions(quantized: Any) -> None:
    linted = lint(quantized, "make_conv_hardswish", U55)
    found = fallbacks(linted)
    assert linted.stats.partitions == 3
    assert [(f.details["op"], f.details["after_partition"], where(f)) for f in found] == [
        ("aten.hardswish.default", 1, ("examples/npu.py", line_of("x = nn.functional.hardswish(self.c1(x))"))),
        ("aten.hardswish.default", 2, ("examples/npu.py", line_of("x = nn.functional.hardswish(self.c2(x))"))),
    ]
    assert {tuple(f.details["causes"]) for f in found} == {
        ("left in float by the quantizer: no int8 annotation for aten.hardswish.default",)}


@pytest.mark.model("make_token_mixing@npu")
def test_a_transpose_left_float_between_partitions_is_reported_as_a_split(quantized: Any) -> None:
    """A data move the NPU does not run, between two partitions in data flow, splits the NPU's work as
    compute does; before the first partition or after the last it is only data movement."""
    from qlint.analysis.partitions import partitions
    from qlint.loading.view import GraphView, op_name

    linted = lint(quantized, "make_token_mixing", U55, split_costs=True)
    [move] = fallbacks(linted)
    assert linted.stats.partitions == 2
    details = move.details
    assert move.message == (
        "aten.permute_copy.default (float32) runs on the CPU between NPU partitions 1 and 2, splitting the NPU's "
        "work; 2 NPU partitions on ethos-u55-128: left in float by the quantizer: no int8 annotation for "
        f"aten.permute_copy.default; est. {details['cycles']:,} cycles, {details['time_share']:.1%} of the "
        "artifact's time")
    # the lowered permute traces to no node of the quantized program (the decomposition that made it
    # from `transpose` named none), so it is not compiled the other way: its CPU cycles only
    assert details["cycles"] == details["cpu_cycles"] > 0 and "npu_split_cycles" not in details
    assert where(move) == ("examples/npu.py", line_of("return self.tokens(self.channels(x).transpose(1, 2))"))
    assert (move.details["after_partition"], move.details["splits"], move.details["dtype"]) == (1, True, "float32")
    assert [r["check"] for r in move.details["reasons"]] == ["CheckArmQuantized"]
    split = partitions(GraphView(linted.lowered, quantized=quantized("make_token_mixing", npu=U55)))
    assert [(op_name(f.node), f.after, f.splits) for f in split.fallbacks] == [("aten.permute_copy.default", 0, True)]


@pytest.mark.model("make_causal_attention@npu")
def test_a_causal_mask_falls_back_on_u55_and_not_on_u85(quantized: Any) -> None:
    on_u55 = lint(quantized, "make_causal_attention", U55)
    found = {f.details["op"]: f for f in fallbacks(on_u55)}
    assert on_u55.stats.partitions == 2
    assert sorted(found) == ["aten.scalar_tensor.default", "aten.where.self"]
    where_ = found["aten.where.self"]
    assert where(where_) == ("examples/npu.py", line_of("scores = scores.masked_fill(self.mask"))
    assert where_.details["causes"] == [
        "left in float by the quantizer: no int8 annotation for aten.where.self",
        "`where` with float32 operands: U55's TOSA profile is integer-only",
        "a bool input (b__tensor_constant1) that U55's integer-only TOSA profile does not take",
        "`where`: no U55 operator",
    ]
    assert not any("BaseTOSASupportList" in cause for f in found.values() for cause in f.details["causes"])
    on_u85 = lint(quantized, "make_causal_attention", U85)
    assert (on_u85.stats.partitions, fallbacks(on_u85)) == (1, [])


@pytest.mark.model("make_embedding@npu")
def test_an_embedding_gathers_on_the_cpu_in_float_on_u55(quantized: Any) -> None:
    linted = lint(quantized, "make_embedding", U55)
    found = {f.details["op"]: f for f in fallbacks(linted)}
    assert linted.stats.partitions == 1
    gather = found["aten.index_select.default"]
    assert gather.details["after_partition"] is None and not gather.details["splits"]
    assert "runs on the CPU before the first NPU partition" in gather.message
    # EthosUQuantizer's DecomposeEmbeddingPass made the gather: it is found at the embedding's line
    assert where(gather) == ("examples/npu.py", line_of("return self.linear(self.embedding(tokens))"))
    assert "`index_select`: no U55 operator" in gather.details["causes"]
    [coverage] = [f for f in linted.findings if f.code == "QL005"]
    int8 = 1 - linted.stats.fp32_cycles / linted.stats.cycles  # the NPU's share, and the CPU's int8 work
    assert coverage.message == ("NPU coverage 50.0% < 90%: 1 of 2 compute ops run on the CPU (index_select x1); "
                                f"{math.floor(int8 * 1000) / 10:.1f}% of the estimated time is int8; "
                                "main cause (1 ops): `index_select`: no U55 operator")


@pytest.mark.model("make_attention@npu")
def test_the_cli_checks_a_pt2_for_a_target_and_reports_partitions_and_delegates(
        quantized: Any, tmp_path: Path) -> None:
    import torch

    torch.export.save(quantized("make_attention", npu=U55), str(tmp_path / "attention.pt2"))
    result = subprocess.run([sys.executable, "-m", "qlint", "check", "attention.pt2", "--target", U55,
                             "--output-format", "json", "--no-cache", "--write", "markdown:report.md"],
                            cwd=tmp_path, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 1, result.stderr  # QL001 is an error
    data = json.loads(result.stdout)
    [stats] = data["artifacts"]
    assert (stats["target"], stats["partitions"], len(stats["delegates"])) == (U55, 2, 2)
    assert all(set(d) >= {"sram", "flash"} for d in stats["delegates"])
    assert sorted(f["code"] for f in data["findings"]) == ["QL001", "QL010"]  # its values checked, on TOSA
    sram, flash = ("/".join(f"{d[field]:,}" for d in stats["delegates"]) for field in ("sram", "flash"))
    cycles = "/".join(f"{d['npu_cycles']:,}" for d in stats["delegates"])
    cell = f"| 2 on {U55}: {cycles} NPU cycles, SRAM {sram} B, flash {flash} B |"
    assert cell in (tmp_path / "report.md").read_text()


def test_a_check_that_refuses_without_a_reason_is_named_never_an_empty_cause() -> None:
    import torch

    from qlint.analysis.npu_causes import causes
    from qlint.loading.ethos_u import GENERIC_REASON, Delegation, Rejection

    graph = torch.fx.Graph()
    node = graph.call_function(torch.ops.aten.relu.default, (graph.placeholder("x"),))
    said = causes(node, Delegation(U55, "TOSA-1.0+INT+u55", {node.name: (
        Rejection("tosa_support_factory", True, GENERIC_REASON), Rejection("CheckSomething", False, ""))}, {}, {}))
    assert said == ["refused by ExecuTorch's CheckSomething"]
    only_generic = Delegation(U55, "TOSA-1.0+INT+u55", {node.name: (
        Rejection("tosa_support_factory", True, GENERIC_REASON),)}, {}, {})
    assert causes(node, only_generic) == [
        "ExecuTorch's Arm backend has no TOSA lowering for aten.relu.default on TOSA-1.0+INT+u55"]


def test_a_dtype_cause_names_the_input_the_check_named_and_a_check_that_raised_is_no_cause() -> None:
    import torch

    from qlint.analysis.npu_causes import causes
    from qlint.loading.ethos_u import Delegation, Rejection

    graph = torch.fx.Graph()
    x, x_1 = graph.placeholder("x"), graph.placeholder("x_1")
    x.meta["val"], x_1.meta["val"] = torch.zeros(2, dtype=torch.int8), torch.zeros(2, dtype=torch.bool)
    node = graph.call_function(torch.ops.aten.where.self, (x_1, x, x))
    node.meta["val"] = torch.zeros(2, dtype=torch.int8)
    rejections = {node.name: (
        Rejection("CheckDtypeInputsAndOutputs", False, "Had torch.bool input x_1 that is not supported by TOSA."),
        Rejection("CheckSomething", False, "the check raised KeyError: 'val'"))}
    assert causes(node, Delegation(U55, "TOSA-1.0+INT+u55", rejections, {}, {})) == [
        "a bool input (x_1) that U55's integer-only TOSA profile does not take"]


def vela_cycles(tosa: bytes, accelerator: str, folder: Path) -> int:
    """Vela's own estimate for one partition's TOSA, compiled again apart from qlint's lowering."""
    import contextlib
    import csv
    import io

    from ethosu.vela import vela

    from qlint.loading import ethos_u

    (folder / "part.tosa").write_bytes(tosa)
    flags = [*ethos_u.compile_spec(npu(accelerator)).compiler_flags, f"--output-dir={folder}",
             str(folder / "part.tosa")]
    with contextlib.redirect_stdout(io.StringIO()):
        vela.main(flags)
    [summary] = folder.glob("part_summary_*.csv")
    return round(float(next(csv.DictReader(summary.open()))["cycles_total"]))


@pytest.mark.model("make_attention@npu")
def test_each_delegate_is_priced_at_velas_estimate_and_the_inference_adds_the_cpu(
        quantized: Any, tmp_path: Path) -> None:
    config = replace(Config(root=ROOT), npu=npu(U55))
    lowered = lint_program(quantized("make_attention", npu=U55), "make_attention", config)
    stats = lowered.stats
    from qlint.loading import ethos_u

    delegation = ethos_u.lower(quantized("make_attention", npu=U55), npu(U55)).delegation
    again = [vela_cycles(c.tosa, U55, tmp_path / str(k)) for k, c in enumerate(delegation.compiled.values())
             if (tmp_path / str(k)).mkdir() is None]
    assert [d.npu_cycles for d in stats.delegates] == again and len(again) == 2
    assert stats.npu_cycles == sum(again)
    # no board: no clock for the core, so the NPU's cycles count as they are
    assert stats.cycles == stats.cpu_cycles + stats.npu_cycles and stats.cpu_cycles > 0
    assert stats.latency_ms is None
    # the time's contributors give each partition's cycles by the source lines they come from
    parts = [c for c in stats.costliest if c.what.startswith("NPU partition")]
    by_part: dict[int, int] = {}
    for c in parts:
        number, cycles = c.what.removeprefix("NPU partition ").split(", ")
        by_part[int(number)] = by_part.get(int(number), 0) + int(cycles.split(" ")[0].replace(",", ""))
    assert by_part == {1: again[0], 2: again[1]}
    lines = {(c.location.path, c.location.line) for c in parts if c.location}
    assert ("examples/npu.py", line_of("scores = q @ k.transpose(-1, -2)")) in lines


@pytest.mark.model("make_conv_hardswish@npu")
def test_a_fallback_says_what_the_split_costs_by_compiling_the_program_both_ways(quantized: Any) -> None:
    linted = lint(quantized, "make_conv_hardswish", U55, split_costs=True)
    total = linted.stats.npu_cycles
    found = fallbacks(linted)
    assert len(found) == 2 and total == sum(d.npu_cycles for d in linted.stats.delegates)
    for finding in found:
        details = finding.details
        assert details["partitions_on_npu"] == 2  # the other hardswish still splits
        assert details["npu_split_cycles"] == total - details["npu_cycles_on_npu"] > 0
        assert details["cycles"] == details["cpu_cycles"] + details["npu_split_cycles"]
        assert details["time_share"] == round(details["cycles"] / linted.stats.cycles, 4)
        assert (f"; the split costs the NPU {details['npu_split_cycles']:,} cycles ({total:,} as it is, "
                f"{details['npu_cycles_on_npu']:,} with it quantized onto the NPU: 2 partitions); "
                f"est. {details['cycles']:,} cycles, ") in finding.message


def _corrupted_lowering(monkeypatch: pytest.MonkeyPatch, corrupt: Callable[[Any, dict[str, Any]], None]) -> None:
    """`ethos_u.lower` with each partition's kept TOSA changed by `corrupt(program, compiled)` after Vela
    compiled it: what a TOSA lowering that miscomputes would hand the check."""
    from qlint.loading import ethos_u

    lower = ethos_u.lower

    def lowered(program: Any, target: Any) -> Any:
        result = lower(program, target)
        corrupt(program, result.delegation.compiled)
        return result

    monkeypatch.setattr(ethos_u, "lower", lowered)


@pytest.mark.model("make_attention@npu")
def test_a_partition_whose_tosa_changes_the_values_is_named(quantized: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def negate_q_weights(program: Any, compiled: dict[str, Any]) -> None:
        weight = program.state_dict["_frozen_param0"].contiguous().numpy().tobytes()  # the first linear's int8
        first = compiled["executorch_call_delegate"]
        assert first.tosa.count(weight) == 1
        negated = bytes((-int.from_bytes([b], signed=True)) & 0xFF for b in weight)
        compiled["executorch_call_delegate"] = replace(first, tosa=first.tosa.replace(weight, negated))

    _corrupted_lowering(monkeypatch, negate_q_weights)
    linted = lint(quantized, "make_attention", U55)
    [error] = [f for f in linted.findings if f.code == "QL007"]
    assert (error.severity, error.node) == ("error", "getitem")
    assert error.message.startswith(
        "lowered program computes other values: NPU partition 1 (executorch_call_delegate), its TOSA run on the TOSA "
        "reference model, writes output 0 (getitem) other than the quantized program's quantize_per_tensor_10: ")
    assert error.message.endswith("(on input 0, the partition's inputs taken from the quantized program)")
    details = error.details
    assert (details["partition"], details["output"], details["values"], details["batch"]) == (1, 0, 256, 0)
    assert details["differing"] > 0 and details["steps"] > 2
    assert f"{details['differing']} of 256 values more than 2 quantization steps apart, up to " \
           f"{details['steps']:.0f}: " in error.message


@pytest.mark.model("make_attention@npu")
def test_a_partition_the_reference_model_cannot_run_is_said_never_skipped(
        quantized: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def swap(program: Any, compiled: dict[str, Any]) -> None:
        first, second = compiled["executorch_call_delegate"], compiled["executorch_call_delegate_1"]
        compiled["executorch_call_delegate"] = replace(first, tosa=second.tosa)  # reads 2 inputs, is given 1

    _corrupted_lowering(monkeypatch, swap)
    linted = lint(quantized, "make_attention", U55)
    [error] = [f for f in linted.findings if f.code == "QL007"]
    assert (error.severity, error.node, error.details["unchecked"], error.details["partition"]) == (
        "error", "executorch_call_delegate", "tosa", 1)
    assert error.message == (
        "lowered program's values cannot be checked: NPU partition 1 (executorch_call_delegate) cannot run on the "
        f"TOSA reference model: {error.details['reason']}")
    assert "\n" not in error.message


@pytest.mark.model("make_attention@npu")
def test_a_missing_reference_model_is_said_never_skipped(quantized: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tosa_reference_model", None)  # import raises ImportError
    linted = lint(quantized, "make_attention", U55)
    [error] = [f for f in linted.findings if f.code == "QL007"]
    assert (error.severity, error.message) == (
        "error", "lowered program's values cannot be checked: NPU partition 1 (executorch_call_delegate) cannot run "
                 "on the TOSA reference model: tosa-tools cannot be imported: import of tosa_reference_model halted; "
                 "None in sys.modules")


def test_a_config_targets_program_in_memory_is_value_checked_like_a_saved_one() -> None:
    """A program quantized in memory (a config target's) records fake tensors for its inputs: the run on
    made-up inputs makes real ones, so an int64 token input is no QL007 'cannot run'."""
    from conftest import npu_quantized

    from examples import npu as examples

    model, example, calibration = examples.make_embedding()
    program = npu_quantized(model, example, calibration, U55, ())
    linted = lint_program(program, "embedding", replace(Config(root=ROOT), npu=npu(U55)))
    assert [f.message for f in linted.findings if f.code == "QL007"] == []
    assert linted.stats.partitions == 1


def fix_attention(quantized: Any) -> tuple[Any, Any, Any]:
    from qlint.fix.apply import fix_program
    from qlint.loading.inputs import sample_inputs, verification_inputs

    program = quantized("make_attention", npu=U55)
    config = replace(Config(root=ROOT), npu=npu(U55))
    return program, config, lambda: fix_program(program, "attention", config, verification_inputs(
        sample_inputs(program)), RunOptions(split_costs=False))


@pytest.mark.model("make_attention@npu")
def test_fix_folds_the_float_scale_before_partitioning_and_the_partitions_merge(quantized: Any) -> None:
    from qlint.full.lint import lint_pte

    program, config, fix = fix_attention(quantized)
    before = lint_program(program, "attention", config, RunOptions(split_costs=False))
    result = fix()
    summary = result.summary
    assert summary.partitions == (2, 1) and summary.verified_inputs == 9
    [fold] = summary.folds
    assert (fold.code, fold.kind, fold.node) == ("QL001", "identity", "aten_div_tensor")
    assert summary.fp32_elements == (512, 0)
    # nothing left on the CPU between partitions, and the merged partition's values checked on the TOSA
    # reference model (an error there would be a QL007 in the findings)
    assert [f.code for f in result.findings if f.code in ("QL001", "QL007", "QL010")] == []
    assert result.stats.partitions == 1
    # Vela prices the merged partition as the two together here (the split cost the NPU nothing); the CPU
    # no longer dequantizes, divides and quantizes
    assert result.stats.npu_cycles == before.stats.npu_cycles == 32269
    assert result.stats.cpu_cycles < before.stats.cpu_cycles
    assert summary.cycles == (before.stats.cycles, result.stats.cycles)
    shipped = lint_pte(result.pte, "attention.pte", config)
    assert shipped.stats[0].partitions == 1 and not [f for f in shipped.findings if f.code == "QL010"]
    assert any("div" in str(n.target) for n in program.graph.nodes)  # the input program is left as it was


@pytest.mark.model("make_embedding@npu")
def test_fix_makes_an_embedding_on_u55_gather_its_int8_table(quantized: Any) -> None:
    from qlint.fix.apply import fix_program
    from qlint.loading.inputs import sample_inputs, verification_inputs
    from qlint.report.formats import fix_lines

    program = quantized("make_embedding", npu=U55)
    config = replace(Config(root=ROOT), npu=npu(U55))
    before = lint_program(program, "embedding", config)
    [gather] = fallbacks(before)
    assert gather.fixable and gather.details["op"] == "aten.index_select.default"
    result = fix_program(program, "embedding", config, verification_inputs(sample_inputs(program)))
    summary = result.summary
    [fold] = summary.folds
    assert (fold.code, fold.kind, fold.node) == ("QL010", "gather", "aten_index_select_default")
    assert "cortex_m.dequantize_per_tensor.default (3,200 elements a call)" in fold.change  # the 100x32 table
    assert "  islands: 1 found, 1 folded, 0 left" in fix_lines(summary)  # the fallback is the NPU's island
    # the CPU no longer dequantizes the table every inference: nothing float is left, the gather reads int8
    assert summary.fp32_elements == (3456, 0) and summary.partitions == (1, 1)
    gathers = [n for n in result.program.graph.nodes if "index_select" in str(n.target)]
    assert [n.meta["val"].dtype for n in gathers] == [torch.int8]
    [kept] = [n for n in program.graph.nodes if "index_select" in str(n.target)]
    assert "dequantize" in str(kept.args[0].target)  # the input program is left as it was
    assert [f.code for f in result.findings if f.code in ("QL007", "QL010")] == []
    assert result.stats.npu_cycles == before.stats.npu_cycles  # the partition is the same
    assert result.stats.cpu_cycles < before.stats.cpu_cycles / 5


@pytest.mark.model("make_embedding@npu")
def test_a_gather_whose_quantize_changes_the_table_values_is_left_with_the_count(quantized: Any) -> None:
    from qlint.analysis.folds import Left, plan_gather

    before = lint(quantized, "make_embedding", U55)
    view = before.analysis.view
    [gather] = [n for n in view.nodes if "index_select" in str(n.target)]
    [q] = gather.users
    scale = q.args[1]
    q.args = (q.args[0], scale * 2, *q.args[2:])  # the rows requantized at twice the table's scale
    left = plan_gather(view, gather)
    assert isinstance(left, Left) and left.code == "QL010"
    # at half the resolution q = round((v + 1) / 2) - 1 (zero point -1): only v = -1 maps to itself
    assert left.reason.startswith(f"the quantize after it, int8(scale={scale * 2:.6g}, zp=-1, range=[-128, 127]), "
                                  "changes 255 of 256 table values")


@pytest.mark.model("make_attention@npu")
def test_fix_writes_nothing_when_the_merged_partitions_tosa_changes_the_values(
        quantized: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from qlint.fix.errors import VerificationError

    def negate_merged_weights(program: Any, compiled: dict[str, Any]) -> None:
        if len(compiled) != 1:
            return  # the program as given: its two partitions are left as they are
        weight = program.state_dict["_frozen_param0"].contiguous().numpy().tobytes()
        [(call, merged)] = compiled.items()
        negated = bytes((-int.from_bytes([b], signed=True)) & 0xFF for b in weight)
        compiled[call] = replace(merged, tosa=merged.tosa.replace(weight, negated))

    _corrupted_lowering(monkeypatch, negate_merged_weights)
    _, _, fix = fix_attention(quantized)
    with pytest.raises(VerificationError, match=r"^lowered program computes other values: NPU partition 1 "):
        fix()


class ScaledIntoCat(torch.nn.Module):
    """`a(x) / d` concatenated with `b(x)`, the division left float: the concatenation's shared qparams
    make the quantize after the division no identity of its dequantize. With `tied`, the concatenation
    holds `a(x)` itself beside `a(x) / 2`, so both quantizes share one scale and the folded scale is
    exactly twice the dequantize's: a RESCALE by 0.5, where every odd integer is a rounding tie."""

    def __init__(self, divisor: float, tied: bool = False) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)
        self.divisor, self.tied = divisor, tied

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        return torch.cat([y / self.divisor, y if self.tied else self.b(x)], -1)


@functools.cache
def scaled_into_cat(divisor: float, tied: bool = False) -> tuple[Any, Config]:
    """The model quantized for the U55 as Arm's flow does, the division left float; once a session (a
    fix copies the program it is given and leaves it as it was)."""
    from conftest import npu_quantized

    torch.manual_seed(0)
    model = ScaledIntoCat(divisor, tied).eval()
    calibration = [(torch.randn(1, 16, 32),) for _ in range(4)]
    program = npu_quantized(model, (torch.randn(1, 16, 32),), calibration, U55, ("aten.div.Tensor",))
    return program, replace(Config(root=ROOT), npu=npu(U55))


def fix_scaled(program: Any, config: Config) -> Any:
    from qlint.fix.apply import fix_program
    from qlint.loading.inputs import sample_inputs, verification_inputs

    return fix_program(program, "cat", config, verification_inputs(sample_inputs(program)),
                       RunOptions(split_costs=False))


@pytest.mark.model("scaled_into_cat@npu")
def test_fix_folds_a_scale_that_is_no_identity_into_the_quantize_and_the_partitions_merge() -> None:
    """The division's constant goes into the scale of the quantize after it; the dequantize -> quantize
    pair left becomes a TOSA RESCALE inside one partition, proven on all 256 int8 inputs against the
    float quantize and against that RESCALE on the reference model, then the device's outputs compared
    bit for bit before and after."""
    program, config = scaled_into_cat(3.0)
    before = lint_program(program, "cat", config, RunOptions(split_costs=False))
    [scale] = [f for f in before.findings if f.code == "QL001"]
    assert "not an identity" in scale.message and scale.fixable
    assert before.stats.partitions == 2
    result = fix_scaled(program, config)
    summary = result.summary
    [fold] = summary.folds
    assert (fold.code, fold.kind, fold.node) == ("QL001", "rescale", "aten_div_tensor")
    assert fold.change == ("rescale: remove aten.div.Tensor; output quantize scale -> 0.0428939536 "
                           "(a TOSA RESCALE on the NPU, proven on every input integer)")
    assert summary.partitions == (2, 1) and summary.verified_inputs == 9 and summary.left == []
    assert [f.code for f in result.findings if f.code in ("QL001", "QL007", "QL010")] == []
    assert result.stats.cpu_cycles < before.stats.cpu_cycles  # the CPU no longer divides between partitions
    assert any("div" in str(n.target) for n in program.graph.nodes)  # the input program is left as it was


@pytest.mark.model("scaled_into_cat@npu")
def test_a_scale_the_npus_rescale_rounds_otherwise_is_left_with_the_count() -> None:
    """A RESCALE by exactly 0.5 rounds each odd integer's tie up where the quantize rounds it to even:
    the float proof holds, the NPU's does not, so the island is left and says on how many inputs."""
    program, config = scaled_into_cat(2.0, tied=True)
    linted = lint_program(program, "cat", config, RunOptions(split_costs=False))
    [scale] = [f for f in linted.findings if f.code == "QL001"]
    assert not scale.fixable
    [left] = linted.left
    # each odd integer is a tie for the RESCALE; where the quantized program's float product lands on the
    # tie too, it rounds to even
    assert left.reason == ("the NPU's RESCALE by 0.5 (fixed point, rounding half up, clamped to the dtype's range) "
                           "differs from the quantize on 60 of 256 int8 inputs, by up to 1 step")


@pytest.mark.model("scaled_into_cat@npu")
def test_a_fold_only_the_float_proof_holds_is_caught_on_the_device_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the NPU's proof the tied fold would be made: its partition differs by one step from the
    quantized program (within the value check's tolerance), and the device's outputs differ from the
    unfolded program's, so nothing is written."""
    import qlint.analysis.folds as folds
    from qlint.fix.errors import VerificationError

    def float_proof_only(region: Any, qp_in: Any, exhaustive: Any, outputs: Any, rescaler: Any) -> Any:
        fold = folds._rescale(region, qp_in, exhaustive, outputs)
        return replace(fold, npu_proven=True) if isinstance(fold, folds.Fold) else fold

    monkeypatch.setattr(folds, "_npu_fold", float_proof_only)
    program, config = scaled_into_cat(2.0, tied=True)
    with pytest.raises(VerificationError, match=r"^the device computes other values after the fold: output 0 "
                                                r"differs on verification input 0$"):
        fix_scaled(program, config)


class FinfoMasked(torch.nn.Module):
    """Scores plus an additive mask built in the graph the way `transformers` builds BERT's when no
    attention mask is given: `(1.0 - ones) * torch.finfo(float32).min`, a constant whose int8 scale
    is 1.3e36."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keep = torch.ones(x.shape[:-1], dtype=x.dtype)[..., None]
        mask = (1.0 - keep) * torch.finfo(x.dtype).min
        return self.linear(x) + mask


@pytest.mark.model("finfo_masked@npu")
def test_a_product_no_rescale_can_scale_is_named_at_its_line_when_the_lowering_fails() -> None:
    """Arm's TOSA lowering raises "Shift should be in range [2, 62]" naming no node; the finding goes to
    the `mul` whose product's RESCALE (the constant's scale times the zeros' over the zeros') Arm's own
    multiplier and shift refuse, at its line."""
    from conftest import npu_quantized

    torch.manual_seed(0)
    calibration = [(torch.randn(1, 4, 8),) for _ in range(2)]
    program = npu_quantized(FinfoMasked().eval(), calibration[0], calibration, U55, ())
    linted = lint_program(program, "masked", replace(Config(root=ROOT), npu=npu(U55)))
    [failed] = [f for f in linted.findings if f.code == "QL003"]
    scale = -torch.finfo(torch.float32).min / 255  # the constant's: its int8 range holds finfo.min to 0
    assert failed.message.startswith(
        "Cortex-M lowering failed in EthosUPartitioner: Shift should be in range [2, 62]; mul's int8 product ")
    assert f"needs a RESCALE by {scale:.3g} (its operands' scales " in failed.message
    assert f" x {scale:.3g} over its output's " in failed.message
    source = Path(__file__).read_text().splitlines()
    line = next(i for i, code in enumerate(source, 1) if "mask = (1.0 - keep) * torch.finfo(x.dtype).min" in code)
    assert where(failed) == ("tests/full/test_ethos_u.py", line)
