"""--fix on real lowered programs: every fold proven, verified end to end, written atomically."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import main_json, run_cli, run_json

from qlint.api import fix, lint
from qlint.full.lint import lint_program
from qlint.full.rules import run_rules
from qlint.loading.view import GraphView, op_name
from qlint.settings.config import Config, FoldGuards


def example(name: str) -> tuple[Any, ...]:
    from examples import models

    return getattr(models, name)()[1]


def luts(program: Any) -> list[torch.Tensor]:
    """The tables of every cortex_m.quantized_activation in a program."""
    view = GraphView(program)
    return [view.constant(n.args[1]).value for n in program.graph.nodes
            if n.op == "call_function" and op_name(n) == "cortex_m.quantized_activation.default"]


def ops(program: Any) -> list[str]:
    return [op_name(n) for n in program.graph.nodes if n.op == "call_function"]


def literal_args(program: Any, name: str) -> list[list[Any]]:
    return [[a for a in n.args if not isinstance(a, torch.fx.Node)] for n in program.graph.nodes
            if n.op == "call_function" and name in op_name(n)]


def assert_same_outputs(before: Any, after: Any, inputs: list[tuple[Any, ...]]) -> None:
    for batch in inputs:
        for b, a in zip(before.module()(*batch), after.module()(*batch), strict=True):
            assert torch.equal(b, a)


def seeded(template: tuple[Any, ...], n: int = 8) -> list[tuple[Any, ...]]:
    return [tuple(torch.randn(t.shape, generator=torch.Generator().manual_seed(100 + i)) * 3 for t in template)
            for i in range(n)]


@pytest.mark.parametrize("factory", ["make_attention", "make_attention_mul", "make_multi_head"])
def test_attention_scale_folds_and_is_bit_exact(
    fixed: Callable[..., Any], linted: Callable[..., Any], factory: str
) -> None:
    result = fixed(factory)
    kinds = {f.code: f.kind for f in result.summary.folds}
    assert kinds["QL001"] in ("identity", "table") and kinds["QL004"] == "table"
    assert result.summary.left == []
    assert not any(o.startswith(("aten.div", "aten.mul")) for o in ops(result.program))
    assert [f.code for f in result.findings] == []
    assert result.summary.fp32_ops[1] == 0 and result.summary.fp32_elements[1] == 0
    # Independent end-to-end check on inputs the fix never saw.
    unfixed = linted(factory).lowered
    assert_same_outputs(unfixed, result.program, seeded(example(factory)))


@pytest.mark.model("make_pool")
def test_scale_feeding_pool_keeps_the_pool_scale(fixed: Callable[..., Any], linted: Callable[..., Any]) -> None:
    unfixed = linted("make_pool").lowered
    pool_args = literal_args(unfixed, "avg_pool")
    assert pool_args  # the pool's baked-in zero point, multiplier and shift
    result = fixed("make_pool")
    assert [f.kind for f in result.summary.folds] == ["table"]
    assert literal_args(result.program, "avg_pool") == pool_args
    # The fix folded a copy: the linted program it started from still has its island and no table.
    assert "aten.div.Tensor" in ops(unfixed) and luts(unfixed) == [] and len(luts(result.program)) == 1
    assert result.summary.activation_bytes == (2048, 1280)
    # Before, the island's fp32 buffers set the live peak; after, the fp32 model input does.
    assert result.summary.live_peak_bytes == (2048, 1280)
    assert result.summary.live_peak.input_bytes == 4 * 4 * 8 * 8
    assert_same_outputs(unfixed, result.program, seeded(example("make_pool")))


@pytest.mark.model("make_pool")
def test_table_fold_maps_all_256_inputs_like_the_island(
    fixed: Callable[..., Any], quantized: Callable[..., Any]
) -> None:
    """The table, read back from the fixed program, against the island's math on every int8."""
    program = quantized("make_pool")
    [finding] = [f for f in lint(program) if f.code == "QL001"]
    qin, qout = finding.details["input_qparams"], finding.details["output_qparams"]
    divisor = finding.details["constants"][0]["value"]
    q = torch.arange(-128, 128, dtype=torch.int8)
    dq = torch.ops.quantized_decomposed.dequantize_per_tensor(q, qin["scale"], qin["zero_point"], -128, 127, torch.int8)
    expected = torch.ops.quantized_decomposed.quantize_per_tensor(
        dq / torch.tensor(divisor), qout["scale"], qout["zero_point"], -128, 127, torch.int8
    )
    [lut] = luts(fixed("make_pool").program)
    assert lut.dtype == torch.int8 and lut.shape == (256,)
    assert torch.equal(lut[q.to(torch.int64) + 128], expected)
    assert len(set(expected.tolist())) > 10  # a real function, not a constant table


@pytest.mark.model("make_constant_first")
def test_constant_first_island_becomes_a_table(fixed: Callable[..., Any], linted: Callable[..., Any]) -> None:
    result = fixed("make_constant_first")
    assert [(f.code, f.kind) for f in result.summary.folds] == [("QL002", "table")]
    unfixed = linted("make_constant_first").lowered
    assert_same_outputs(unfixed, result.program, seeded(example("make_constant_first")))


def test_runtime_divisor_and_layer_norm_are_left_with_reasons(fixed: Callable[..., Any]) -> None:
    result = fixed("make_runtime_divisor")
    [left] = result.summary.left
    assert left.code == "QL002" and "runtime (non-constant) operand aten.amax.default" in left.reason
    result = fixed("make_norm")
    [left] = result.summary.left
    assert left.reason.startswith("data-dependent normalization (aten.native_layer_norm.default): CortexMQuantizer "
                                  "has no layer_norm pattern, so no Cortex-M kernel runs it; fix: rebuild it")
    # The LayerNorm sets the peak: its fp32 input and output (8x16 each) plus mean and rstd (8 each).
    peak = result.summary.live_peak
    assert peak.node == "aten_native_layer_norm_default" and peak.location == "examples/models.py:87"
    assert peak.bytes == peak.fp32_bytes == 4 * (2 * 8 * 16 + 2 * 8) and peak.input_bytes == 0


@pytest.mark.model("make_scale")
def test_int16_guards_leave_the_island_and_say_why(fixed: Callable[..., Any], quantized: Callable[..., Any]) -> None:
    program = quantized("make_scale", int16=True)
    result = fixed("make_scale", int16=True)
    [left] = result.summary.left
    assert left.reason == "blocked by fold.dtypes: int16 not in [int8]"
    assert "aten.div.Tensor" in ops(result.program)
    allowed = Config(fold=FoldGuards(dtypes=("int8", "int16")))
    result = fix(program, [example("make_scale")], allowed)
    assert [f.kind for f in result.summary.folds] == ["identity"]
    assert "aten.div.Tensor" not in ops(result.program)


@pytest.mark.model("make_multi_head")
def test_fix_is_idempotent(fixed: Callable[..., Any]) -> None:
    result = fixed("make_multi_head")
    again = run_rules(GraphView(result.program), "mha", Config())
    assert again.plans == [] and again.analysis.islands == []


@pytest.fixture(scope="module")
def sam_fixed(sam_pt2: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    out_dir = tmp_path_factory.mktemp("sam_fix") / "build"  # --output-dir is created when missing
    code, data = main_json(["check", "--fix", str(sam_pt2), "--output-dir", str(out_dir),
                            "--write", f"memory-plot:{out_dir.parent / 'memory.svg'}",
                            "--write", f"markdown:{out_dir.parent / 'summary.md'}"])
    return {"code": code, **data}, out_dir / f"{sam_pt2.stem}.pte"


def test_sam_memory_plot_draws_the_reported_plan(sam_fixed: tuple[dict[str, Any], Path]) -> None:
    from qlint.records.results import FixSummary, LivePeak, MemoryTimeline, Report
    from qlint.report.formats import fix_lines
    from qlint.report.memory_plot import figure

    data, pte = sam_fixed
    [summary] = data["fixes"]
    timelines = [MemoryTimeline(tuple(m["total"]), tuple(m["fp32"])) for m in summary["memory"]]
    peaks = [LivePeak(**summary["live_peak_before"]), LivePeak(**summary["live_peak"])]
    # The series the live-peak line of the text report is read from.
    for timeline, peak, printed in zip(timelines, peaks, summary["live_peak_bytes"], strict=True):
        assert max(timeline.total) == timeline.total[peak.step] == peak.bytes == printed
        assert timeline.fp32[peak.step] == peak.fp32_bytes
        assert all(f <= t for f, t in zip(timeline.fp32, timeline.total, strict=True))
    fixed = FixSummary(artifact=summary["artifact"], memory=(timelines[0], timelines[1]),
                       live_peak_bytes=tuple(summary["live_peak_bytes"]), live_peak=peaks[1],
                       live_peak_before=peaks[0])
    assert "  live peak 5248 -> 5248 bytes, at " in "\n".join(fix_lines(fixed))
    fig = figure(Report(fixes=[fixed]))
    for ax, timeline, peak in zip(fig.axes, timelines, peaks, strict=True):
        total, fp32, marker = ax.get_lines()
        assert tuple(total.get_ydata()) == timeline.total and tuple(fp32.get_ydata()) == timeline.fp32
        assert (list(marker.get_xdata()), list(marker.get_ydata())) == ([peak.step], [peak.bytes])
        assert any(f"peak {peak.bytes} B at {peak.node}" in t.get_text() for t in ax.texts)
    # The folds removed fp32 tensors from the plan: fewer steps hold fp32 bytes after them.
    assert sum(timelines[1].fp32) < sum(timelines[0].fp32)
    # Read back from the written .pte's instructions and allocations: the same peak.
    from qlint.full.lint import lint_pte
    from qlint.settings.config import Config

    [shipped] = lint_pte(pte.read_bytes(), "sam.pte", Config()).memory
    assert shipped is not None and shipped.arena_bytes == summary["activation_bytes"][1]
    assert (shipped.peak.bytes, shipped.peak.fp32_bytes) == (peaks[1].bytes, peaks[1].fp32_bytes) == (5248, 4736)
    svg = (pte.parent.parent / "memory.svg").read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    assert "![memory.svg](memory.svg)" in (pte.parent.parent / "summary.md").read_text()


def test_sam_fix(sam_fixed: tuple[dict[str, Any], Path]) -> None:
    data, pte = sam_fixed
    assert data["code"] == 0  # only warnings (LayerNorm) remain
    assert not [f for f in data["findings"] if f["code"] == "QL001"]
    [summary] = data["fixes"]
    assert sum(1 for f in summary["folds"] if f["code"] == "QL001") == 7
    assert summary["islands_found"] == 16
    assert len(summary["left"]) == 9 and all("normalization" in item["reason"] for item in summary["left"])
    assert summary["lowering_repair"] is True
    # 79 of 88 ops are int8 now: just under the threshold, and the message must not say 90%.
    [coverage] = [f for f in data["findings"] if f["code"] == "QL005"]
    assert coverage["message"].startswith("int8 coverage 89.7% < 90%: 9 of 88")
    before, after = summary["activation_bytes"]
    assert 0 < after <= before  # measured 5728 -> 5728
    # The live peak, the floor under any plan, is where the fp32 model inputs are
    # quantized: all three inputs (2 x 1x32x4x4 + 1x5x32 fp32 = 4736 B) plus the first
    # int8 copy (512 B). No fold touches that step, so it is the same before and after.
    peak = summary["live_peak"]
    assert summary["live_peak_bytes"] == [5248, 5248]
    assert peak["input_bytes"] == peak["fp32_bytes"] == 4 * (2 * 32 * 4 * 4 + 5 * 32)
    assert peak["bytes"] == 5248 <= after and "quantize_per_tensor" in peak["node"]
    assert summary["fp32_elements"][1] < summary["fp32_elements"][0]
    assert summary["fp32_ops"][1] == 9
    assert summary["pte_bytes"] == pte.stat().st_size

    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(pte.read_bytes()).program
    names = [op.name for op in program.execution_plan[0].operators]
    assert "aten::div" not in names and "cortex_m::quantized_activation" in names
    buffer_sizes = list(program.execution_plan[0].non_const_buffer_sizes)
    assert buffer_sizes[1:] and sum(buffer_sizes) == after


@pytest.mark.model("make_two_way_transformer")
def test_sam_fixed_outputs_match_on_8_seeded_inputs(fixed: Callable[..., Any], linted: Callable[..., Any]) -> None:
    from examples.sam import make_two_way_transformer

    unfixed = linted("make_two_way_transformer")
    template = make_two_way_transformer()[1]
    result = fixed("make_two_way_transformer")  # folds a copy of the session's lowering
    assert result.summary.verified_inputs == 9
    assert_same_outputs(unfixed.lowered, result.program, seeded(template))


def test_fixed_pte_checks_clean(sam_fixed: tuple[dict[str, Any], Path], capsys: pytest.CaptureFixture[str]) -> None:
    _, pte = sam_fixed
    code, data = run_json(["check", str(pte)], capsys)
    assert code == 0
    assert {f["code"] for f in data["findings"]} == {"QL002", "QL005"}
    assert not any(f["fixable"] for f in data["findings"])


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.model("make_attention")
def test_cli_fix_writes_next_to_input_and_never_touches_it(
    pt2_dir: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "attention.pt2"
    source.write_bytes(pt2_dir("make_attention").read_bytes())
    before = digest(source)
    code, out, err = run_cli(["fix", str(source)], capsys)
    assert code == 0, err
    assert digest(source) == before
    assert (tmp_path / "attention.pte").stat().st_size > 0
    assert "fixed -> " in out and "verified bit-exact on 9 inputs" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attention.etrecord", "attention.pt2", "attention.pte"]
    # docs/fixing.md's `qlint check --fix models/` again: the walk passes over the .pte the first run wrote
    code, data = run_json(["check", "--fix", "--no-cache", str(tmp_path)], capsys)
    assert (code, data["errors"]) == (0, [])
    assert [a["artifact"] for a in data["artifacts"]] == [str(tmp_path / "attention.pt2")]


@pytest.mark.model("make_attention")
def test_diff_writes_nothing(pt2_dir: Callable[[str], Path], tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "attention.pt2"
    source.write_bytes(pt2_dir("make_attention").read_bytes())
    code, out, _ = run_cli(["check", "--fix", "--diff", str(source)], capsys)
    assert "would fold QL001 at aten_div_tensor: identity: remove" in out
    assert "would fold QL004" in out and "table: replace" in out
    assert code == 1  # nothing was fixed: the error finding stays
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attention.pt2"]


def test_fix_on_pte_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pte = tmp_path / "m.pte"
    pte.write_bytes(b"\x00\x00\x00\x00ET12" + b"\x00" * 56)
    code, _, err = run_cli(["check", "--fix", str(pte)], capsys)
    assert code == 2
    assert err.strip() == f"qlint: error: {pte}: .pte files can be checked but not fixed: fix the .pt2 it came from"


@pytest.mark.model("make_attention")
def test_unwritable_output_is_a_clear_error(pt2_dir: Callable[[str], Path], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    code, _, err = run_cli(["fix", str(pt2_dir("make_attention")), "--output-dir", str(not_a_dir)], capsys)
    assert code == 2 and f"--output-dir {not_a_dir}: not a directory" in err
    orphan = tmp_path / "missing" / "build"
    code, _, err = run_cli(["fix", str(pt2_dir("make_attention")), "--output-dir", str(orphan)], capsys)
    assert code == 2 and f"--output-dir {orphan}: its parent {orphan.parent} is not a directory" in err
    assert not orphan.parent.exists()
    target = tmp_path / "ro"
    target.mkdir()
    (target / "attention.pte").mkdir()  # the output path is taken by a directory
    code, _, err = run_cli(["fix", str(pt2_dir("make_attention")), "--output-dir", str(target)], capsys)
    assert code == 2 and "cannot write" in err and "attention.pte" in err


@pytest.mark.model("make_attention")
def test_verification_mismatch_writes_nothing(
    pt2_dir: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fold that is wrong (here: a table shifted by one) must be caught end to end."""
    import qlint.analysis.folds as folds

    original = folds._int_fold

    def corrupt(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        if isinstance(result, folds.Fold) and result.kind == "table":
            result.luts = {o: torch.clamp(t.to(torch.int16) + 1, -128, 127).to(torch.int8)
                           for o, t in result.luts.items()}
        return result

    monkeypatch.setattr(folds, "_int_fold", corrupt)
    source = tmp_path / "attention.pt2"
    source.write_bytes(pt2_dir("make_attention").read_bytes())
    code, _, err = run_cli(["fix", str(source)], capsys)
    assert code == 2
    assert "attention.pt2: fix failed verification, nothing written: output 0 differs on verification input 0" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attention.pt2"]


@pytest.mark.model("make_scale_chain")
def test_chain_with_reshape_folds_to_a_table_after_the_reshape(
    fixed: Callable[..., Any], linted: Callable[..., Any]
) -> None:
    result = fixed("make_scale_chain")
    [fold] = result.summary.folds
    assert fold.kind == "table" and "aten.view_copy.default on integers" in fold.change
    assert not any(o.startswith(("aten.mul", "aten.div")) for o in ops(result.program))
    unfixed = linted("make_scale_chain")
    assert_same_outputs(unfixed.lowered, result.program, seeded(example("make_scale_chain")))


@pytest.mark.model("make_scale_into_concat")
def test_int16_scale_that_cannot_fold_exactly_is_left_with_the_count(quantized: Callable[..., Any]) -> None:
    program = quantized("make_scale_into_concat", int16=True)
    config = Config(fold=FoldGuards(dtypes=("int8", "int16")))
    [finding] = [f for f in lint(program, config) if f.code == "QL001"]
    assert finding.details["identity"] is False and not finding.fixable
    result = fix(program, [example("make_scale_into_concat")], config)
    [left] = result.summary.left
    assert left.reason.startswith("folding into the output scale changes at least ")
    assert left.reason.endswith("of 65535 int16 values for every candidate scale")
    assert "aten.div.Tensor" in ops(result.program)


@pytest.mark.model("make_half_into_concat")
def test_int16_power_of_two_scale_folds_into_the_output_quantize(quantized: Callable[..., Any]) -> None:
    """x / 2 into a concat's shared quantizer: not an identity, exact as a rescale."""
    program = quantized("make_half_into_concat", int16=True)
    config = Config(fold=FoldGuards(dtypes=("int8", "int16")))
    unfixed = lint_program(program, "half", config).lowered
    result = fix(program, [example("make_half_into_concat")], config)
    [fold] = result.summary.folds
    assert fold.kind == "rescale" and fold.change.startswith("rescale: remove aten.div.Tensor;")
    assert "aten.div.Tensor" not in ops(result.program)
    [div] = [n for n in unfixed.graph.nodes if n.op == "call_function" and op_name(n) == "aten.div.Tensor"]
    dq, [q_node] = div.args[0], list(div.users)
    original = q_node.args[1]
    [new] = [n for n in result.program.graph.nodes if n.op == "call_function"
             and op_name(n) == op_name(q_node) and "dequantize" in op_name(n.args[0]) and n.args[1] != original]
    assert new.args[1] == 2 * original  # the divisor moved into the scale, exactly
    # Every int16 value maps as the island maps it, with the graph's own ops.
    values = dq.target(torch.arange(-32767, 32768, dtype=torch.int16), *dq.args[1:])
    island = q_node.target(values / 2.0, *q_node.args[1:])
    folded = q_node.target(values, new.args[1], *q_node.args[2:])
    assert torch.equal(island, folded) and len(set(island.tolist())) > 1000
    assert_same_outputs(unfixed, result.program, seeded(example("make_half_into_concat")))


@pytest.mark.parametrize(("factory", "kind", "replayed"), [
    ("make_scale_through_reshape", "identity", "aten.view_copy.default"),
    ("make_scale_through_transpose", "table", "aten.permute_copy.default"),
    ("make_split_island", "table", "aten.split_with_sizes_copy.default"),
])
def test_shape_ops_inside_an_island_are_replayed_on_the_integers(
    fixed: Callable[..., Any], linted: Callable[..., Any], factory: str, kind: str, replayed: str
) -> None:
    """An identity must still reshape; a square transpose keeps the shape but not the layout."""
    result = fixed(factory)
    [fold] = result.summary.folds
    assert fold.kind == kind and f"{replayed} on integers" in fold.change
    assert not any(o.startswith(("aten.mul", "aten.div")) for o in ops(result.program))
    assert replayed in ops(result.program)
    unfixed = linted(factory).lowered
    assert_same_outputs(unfixed, result.program, seeded(example(factory)))


@pytest.mark.model("make_half_precision_island")
def test_a_dtype_conversion_inside_an_island_is_evaluated_not_replayed(
    fixed: Callable[..., Any], linted: Callable[..., Any]
) -> None:
    """`.to(float16)` rounds: the table must include that rounding, and no conversion is replayed on int8."""
    result = fixed("make_half_precision_island")
    [fold] = result.summary.folds
    assert fold.kind == "table" and "on integers" not in fold.change
    assert not any("to_dim_order_copy" in o or o.startswith(("aten.mul", "aten.div")) for o in ops(result.program))
    unfixed = linted("make_half_precision_island").lowered
    # Every int8 input, against the model's own math with the graph's qparams.
    [mul] = [n for n in unfixed.graph.nodes if n.op == "call_function" and op_name(n) == "aten.mul.Tensor"]
    [abs_] = [n for n in unfixed.graph.nodes if n.op == "call_function" and op_name(n) == "aten.abs.default"]
    dq, [q_out] = mul.args[0], list(abs_.users)
    q = torch.arange(-128, 128, dtype=torch.int8)
    x = dq.target(q, *dq.args[1:])
    expected = q_out.target(((x * 3.0).to(torch.float16) / 7.0).to(torch.float32).abs(), *q_out.args[1:])
    rounded_once = q_out.target((x * 3.0 / 7.0).abs(), *q_out.args[1:])
    assert not torch.equal(expected, rounded_once)  # float16 rounding changes some entries
    [lut] = luts(result.program)
    assert torch.equal(lut[q.to(torch.int64) + 128], expected)
    assert_same_outputs(unfixed, result.program, seeded(example("make_half_precision_island")))


@pytest.mark.model("make_per_channel_scale")
def test_a_per_channel_constant_is_reported_and_left_not_evaluated(
    fixed: Callable[..., Any], quantized: Callable[..., Any]
) -> None:
    """A constant that differs by position makes the island no function of one integer: no table."""
    program = quantized("make_per_channel_scale")
    [finding] = [f for f in lint(program) if f.code == "QL002"]
    assert "per-channel constant" in finding.message and not finding.fixable
    result = fixed("make_per_channel_scale")
    assert result.summary.folds == []
    assert [item.reason for item in result.summary.left] == [
        "aten.abs.default: no CortexMQuantizer pattern covers it; "
        "per-channel constant _tensor_constant0 (16 elements); "
        "aten.div.Tensor: CortexMQuantizer's div pattern refused it (CortexMDivCheck): operand shapes [1, 8, 16] and "
        "[16] (the int8 div kernel takes operands of one shape: division is not commutative, so no broadcast); fix: "
        "expand the second operand to [1, 8, 16] (`.expand(1, 8, 16)`) before the op (for a config target: the "
        "expand-broadcasts remedy, qlint fix --unsafe-fixes)"]


@pytest.mark.model("make_uniform_vector_scale")
def test_a_uniform_vector_constant_folds_like_a_scalar(fixed: Callable[..., Any], linted: Callable[..., Any]) -> None:
    result = fixed("make_uniform_vector_scale")
    [fold] = result.summary.folds  # QL002: the island is x / w then abs
    assert fold.code == "QL002" and fold.kind == "table"
    unfixed = linted("make_uniform_vector_scale").lowered
    assert_same_outputs(unfixed, result.program, seeded(example("make_uniform_vector_scale")))


def test_a_program_executorch_cannot_serialize_is_a_one_line_error() -> None:
    """A model with no outputs lowers, but to_executorch's memory planner refuses it."""
    from qlint.api import FixError
    from qlint.loading.quantize import quantize

    class NoOutput(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> None:
            (x / 3.0).abs()

    x = torch.randn(1, 8, 16, generator=torch.Generator().manual_seed(0))
    with pytest.raises(FixError) as caught:
        fix(quantize(NoOutput(), (x,)), [(x,)])
    assert str(caught.value) == (
        "to_executorch failed on the unfixed program: AssertionError: graph_output_allocated not set"
    )


@pytest.mark.model("make_masked_attention")
def test_a_scale_with_an_in_graph_mask_folds_after_its_quantize_is_put_back(
        fixed: Callable[..., Any], quantized: Callable[..., Any]) -> None:
    """The mask's `aten.full` feeds the int8 add as floats (QL007): `--fix` puts its quantize back, stores the
    mask it then computes (QL008), and removes the island that adds it, an identity (QL001)."""
    from qlint.analysis.validity import find_invalid

    result = fixed("make_masked_attention")
    assert sorted((f.code, f.kind) for f in result.summary.folds) == [
        ("QL001", "identity"), ("QL004", "table"), ("QL007", "quantize"), ("QL008", "constant")]
    assert not any(o.startswith(("aten.mul", "aten.add", "aten.full")) for o in ops(result.program))
    assert result.summary.fp32_ops == (4, 0) and result.summary.left == []
    program = quantized("make_masked_attention")
    batches = seeded(example("make_masked_attention"))
    assert find_invalid(GraphView(result.program, quantized=program), batches) is None


@pytest.mark.model("make_conv_hardswish")
def test_fix_refuses_a_lowered_program_that_cannot_run(quantized: Callable[..., Any]) -> None:
    from qlint.fix.apply import FixError

    program = quantized("make_conv_hardswish")
    for config in (Config(), Config(ignore=("QL007",))):  # deselecting the rule does not make it runnable
        with pytest.raises(FixError, match="^cannot fix: lowered program cannot run: aten.hardswish.default at "
                                           "aten_hardswish_default receives int8"):
            fix(program, [example("make_conv_hardswish")], config)


class FanOut(torch.nn.Module):
    """x -> linear -> (relu, h - 1), and with `where` also `torch.where(x > 0.5, x, y)`. The relu's input has
    another user, so the Cortex-M passes cannot fuse it into the linear kernel: ExecuTorch 1.5.1 leaves a
    standalone `aten.relu` on the int8 integers, whose zero point is not 0, and it clamps them at 0."""

    def __init__(self, where: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear, self.where = torch.nn.Linear(8, 8), where

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = self.linear(x)
        return (torch.relu(h), h - 1.0, *([torch.where(x > 0.5, x, y)] if self.where else []))


@pytest.fixture(scope="module")
def fan_out(tmp_path_factory: pytest.TempPathFactory) -> Callable[[bool], tuple[Any, Path]]:
    """`fan_out(where)` -> the quantized program and its .pt2, built once."""
    from qlint.loading.quantize import quantize

    built: dict[bool, tuple[Any, Path]] = {}

    def get(where: bool) -> tuple[Any, Path]:
        if where not in built:
            generator = torch.Generator().manual_seed(0)
            example = (torch.randn(1, 8, generator=generator), torch.randn(1, 8, generator=generator))
            program = quantize(FanOut(where).eval(), example, [example])
            path = tmp_path_factory.mktemp("fan-out") / f"fan_out{'_where' if where else ''}.pt2"
            torch.export.save(program, str(path))
            built[where] = program, path
        return built[where]

    return get


def test_a_relu_left_on_integers_is_clamped_at_the_zero_point_by_fix(
        fan_out: Callable[[bool], tuple[Any, Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The relu's input has the zero point 12: the stock lowering's relu keeps the integers 0 to 11 (down to
    -0.094 once read) where the quantized program gives 0.0. `--fix` clamps at the zero point, the one
    right answer, and writes the program once the value check passes it on every verification input."""
    from qlint.analysis.validity import find_invalid

    program, pt2 = fan_out(False)
    code, report = run_json(["check", "--no-cache", str(pt2)], capsys)
    assert code == 1 and sorted(f["code"] for f in report["findings"]) == ["QL001", "QL005", "QL007"]
    [wrong] = [f for f in report["findings"] if f["code"] == "QL007"]
    assert wrong["fixable"] and wrong["node"] == "aten_relu_default" and wrong["details"]["steps"] == 12
    assert wrong["details"]["expected_value"] == 0
    assert wrong["details"]["lowered_value"] == pytest.approx(-12 * 0.00783951)
    code, out, err = run_cli(["check", "--no-cache", "--fix", "--output-dir", str(tmp_path), str(pt2)], capsys)
    assert code == 0, out + err
    assert ("  folded QL007 at aten_relu_default: aten.relu.default clamped the int8 integers at 0, not at the zero "
            "point: now aten.clamp at 12 (int8(scale=0.00783951, zp=12, range=[-128, 127]))") in out.splitlines()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fan_out.etrecord", "fan_out.pte"]
    result = fix(program, [tuple(torch.randn(1, 8) for _ in range(2))])
    [clamp] = [n for n in result.program.graph.nodes if n.name == "aten_relu_default"]
    assert op_name(clamp) == "aten.clamp.default" and clamp.args[1:] == (12, None)
    assert find_invalid(GraphView(result.program, quantized=program), seeded((torch.randn(1, 8),) * 2)) is None


def test_fix_that_cannot_repair_the_lowering_gives_the_findings_and_writes_nothing(
        fan_out: Callable[[bool], tuple[Any, Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With a `torch.where` lowered wrong beside the relu, the relu is repaired but the where has no repair:
    the check's findings are shown, the one that refused the fix among them, nothing is written, and the
    exit is the findings' (1), not an input error's."""
    _, pt2 = fan_out(True)
    args = ["check", "--no-cache", "--fix", "--output-dir", str(tmp_path), str(pt2)]
    code, out, err = run_cli([*args, "--write", f"json:{tmp_path / 'r.json'}", "--write", f"github:{tmp_path / 'r.gh'}",
                              "--write", f"sarif:{tmp_path / 'r.sarif'}"], capsys)
    assert code == 1 and err == "", out + err
    report = json.loads((tmp_path / "r.json").read_text())
    assert sorted((f["code"], f["node"], f["fixable"]) for f in report["findings"]) == [
        ("QL001", "aten_sub_tensor", True), ("QL005", "", False), ("QL007", "aten_relu_default", True),
        ("QL007", "aten_where_self", False)]
    why = "lowered program computes other values (QL007 at aten_where_self)"
    assert [f["not_written"] for f in report["fixes"]] == [why] and report["errors"] == []
    assert f"{pt2}: fix not written: {why}" in out.splitlines()
    assert out.endswith("Found 4 findings (3 error, 1 warning).\n[*] 2 fixable with `qlint check --fix`.\n"
                        "1 fix not written: the findings above say why.\n")
    assert f"::warning file={pt2},title=qlint --fix::{pt2}: fix not written: {why}" in (tmp_path / "r.gh").read_text()
    [run] = json.loads((tmp_path / "r.sarif").read_text())["runs"]
    assert run["invocations"][0]["toolExecutionNotifications"] == [
        {"level": "warning", "message": {"text": f"{pt2}: fix not written: {why}"}}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.gh", "r.json", "r.sarif"]
