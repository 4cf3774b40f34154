"""Shipped programs: a .pte is read with ExecuTorch's deserializer and checked with the same rules."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import cache_entry, rewrite_cache_entry, run_cli, run_json


@pytest.fixture(scope="module")
def attention_pte(attention_plan: tuple[Path, Any]) -> Path:
    return attention_plan[0]


def test_pte_memory_plan_is_read_and_drawn(attention_plan: tuple[Path, Any], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The live bytes read from the .pte's instructions and allocations agree with the peak of the
    plan ExecuTorch made (its tensor specs' lifetimes), and the figure draws the reported series."""
    from qlint.records.results import LivePeak, MemoryTimeline, PlanMemory, Report
    from qlint.report.memory_plot import figure

    pte, planned = attention_plan
    plot = tmp_path / "memory.png"
    _, data = run_json(["check", str(pte), "--no-cache", "--write", f"memory-plot:{plot}"], capsys)
    [memory] = data["memory"]
    series = MemoryTimeline(tuple(memory["timeline"]["total"]), tuple(memory["timeline"]["fp32"]))
    peak = LivePeak(**memory["peak"])
    assert (peak.bytes, peak.fp32_bytes, peak.input_bytes) == (planned.bytes, planned.fp32_bytes, planned.input_bytes)
    assert peak.bytes == max(series.total) == memory["arena_bytes"] == 1664  # q, k, v in fp32 + int8 q
    assert peak.node == "cortex_m::quantize_per_tensor.out" and len(series.total) == 16  # inputs + 15 instructions
    _, out, _ = run_cli(["check", str(pte)], capsys)  # twice: the second from the cache
    _, again, _ = run_cli(["check", str(pte)], capsys)
    line = f"{pte}: memory plan: arena 1664 bytes, live peak 1664 bytes at step 1 (cortex_m::quantize_per_tensor.out)"
    assert line in out and line in again
    fig = figure(Report(memory=[PlanMemory(str(pte), 1664, series, peak)]))
    [ax] = fig.axes
    total, fp32, marker = ax.get_lines()
    assert tuple(total.get_ydata()) == series.total and tuple(fp32.get_ydata()) == series.fp32
    assert list(marker.get_ydata()) == [1664]
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_pte_islands_match_the_lowered_program(
    attention_pte: Path, pt2_dir: Callable[[str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, pte = run_json(["check", str(attention_pte)], capsys)
    _, pt2 = run_json(["check", str(pt2_dir("make_attention"))], capsys)
    assert code == 1
    assert [f["code"] for f in pte["findings"]] == [f["code"] for f in pt2["findings"]] == ["QL001", "QL004", "QL005"]
    ql001 = pte["findings"][0]
    assert ql001["details"]["ops"] == ["aten.div.Tensor"]
    assert ql001["details"]["constants"][0]["value"] == pytest.approx(4.0)  # read from the constant buffer
    assert ql001["details"]["identity"] == pt2["findings"][0]["details"]["identity"]
    assert ql001["location"] is None  # a .pte carries no source lines
    [stats] = pte["artifacts"]
    assert stats["int_kernels"] == 3 and stats["fp32_islands"] == 1 and stats["fp32_elements"] == 128


MEMORY_TAMPERED: dict[str, Callable[[dict[str, Any]], Any]] = {
    "peak-step-outside": lambda m: m["peak"].update(step=10_000),
    "lengths-differ": lambda m: m["timeline"]["fp32"].pop(),
    "float-bytes": lambda m: m["timeline"]["total"].__setitem__(0, 1.5),
    "other-artifact": lambda m: m.update(artifact="other.pte"),
    "extra-field": lambda m: m.update(evil=True),
}


@pytest.mark.parametrize("tamper", list(MEMORY_TAMPERED))
def test_a_tampered_memory_plan_in_the_cache_is_recomputed(
    tamper: str, attention_pte: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    args = ["check", "--cache-dir", str(tmp_path), str(attention_pte), "--output-format", "json"]
    honest_out = run_cli(args, capsys)[1]
    [entry] = list(tmp_path.rglob("*.json"))
    honest = cache_entry(entry)
    tampered = cache_entry(entry)
    MEMORY_TAMPERED[tamper](tampered["memory"][0])
    rewrite_cache_entry(entry, tampered)  # signed: its fields alone decide
    assert json.loads(run_cli(args, capsys)[1]) == json.loads(honest_out)
    assert cache_entry(entry) == honest  # rewritten


@pytest.mark.parametrize("name", ["make_levit_attention", "make_levit_attention_trained", "make_causal_attention"])
def test_a_pte_reports_the_islands_of_constants_computed_in_the_graph_as_its_program(
    name: str, linted: Callable[..., Any]
) -> None:
    """Attention biases gathered with `index` from a parameter and a causal mask built with `triu`
    are computed in the graph: the `.pte` of the program reports the same islands, codes and
    identity verdicts as the program."""
    from qlint.fix.program import to_pte
    from qlint.full.lint import lint_pte
    from qlint.settings.config import Config

    def islands(findings: list[Any]) -> list[tuple[str, Any, int]]:
        return sorted((f.code, f.details.get("identity"), f.details.get("fp32_elements", 0)) for f in findings
                      if f.code in ("QL001", "QL002", "QL004"))

    checked = linted(name)
    shipped = to_pte(checked.lowered, Config().root).pte
    expected = islands(checked.findings)
    assert expected and islands(lint_pte(shipped, f"{name}.pte", Config()).findings) == expected


def _stock_pte(program: Any) -> bytes:
    """What the stock Cortex-M flow writes from a quantized program: `to_edge`, the stock
    CortexMPassManager, `to_executorch`."""
    from executorch.backends.cortex_m.edge_compile_config import cortex_m_edge_compile_config
    from executorch.backends.cortex_m.passes.cortex_m_pass_manager import CortexMPassManager
    from executorch.exir import EdgeProgramManager

    from qlint.loading.lowering import target_config, to_edge

    lowered = CortexMPassManager(to_edge(program).exported_program(), target_config=target_config("cortex-m55"))
    manager = EdgeProgramManager({"forward": lowered.transform()}, compile_config=cortex_m_edge_compile_config())
    return manager.to_executorch().buffer


def _levit_mlp() -> tuple:
    """LeViT's `MLPLayerWithBN` (transformers): a Linear, then an eval-mode BatchNorm1d that nothing fuses."""
    import torch
    from transformers.models.levit.modeling_levit import MLPLayerWithBN

    torch.manual_seed(0)
    example = (torch.randn(1, 16, 16),)
    return MLPLayerWithBN(16, 32), example, [example]


@pytest.fixture(scope="module")
def levit_mlp_pte(program_store: Path) -> bytes:
    """`_levit_mlp` quantized with CortexMQuantizer (kept in the program store: torchao's conv-bn
    folding exports 96 patterns when a graph has a batch norm, 20 s), as the stock flow writes it."""
    import hashlib
    import inspect
    import os

    import torch

    from qlint.loading.quantize import quantize

    digest = hashlib.sha256(inspect.getsource(_levit_mlp).encode()).hexdigest()[:16]
    stored = program_store / f"levit_mlp_with_bn-{digest}.pt2"
    if not stored.exists():
        temp = stored.with_name(f".{stored.name}.{os.getpid()}.tmp")
        torch.export.save(quantize(*_levit_mlp()), str(temp))
        temp.replace(stored)
    return _stock_pte(torch.export.load(str(stored)))


def _with_statistics(data: bytes, mean: list[int], invstd: list[int]) -> bytes:
    """The program with the batch norm's saved mean and invstd outputs recorded at these sizes."""
    from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary

    pte = deserialize_pte_binary(data)
    plan = pte.program.execution_plan[0]
    [call] = [i.instr_args for i in plan.chains[0].instructions if type(i.instr_args).__name__ == "KernelCall"
              and plan.operators[i.instr_args.op_index].name == "aten::_native_batch_norm_legit_no_training"]
    _, *statistics = plan.values[call.args[-1]].val.items  # the returned TensorList
    for index, sizes in zip(statistics, (mean, invstd), strict=True):
        plan.values[index].val.sizes = sizes
    return bytes(serialize_pte_binary(pte))


# case -> (the saved mean's and invstd's sizes, None as written; the refusal, None if read)
STATISTICS: dict[str, tuple[tuple[list[int], list[int]] | None, str | None]] = {
    "as-written": (None, None),  # [0] and [0]: the CPU's answer
    "non-cpu": (([32], [32]), None),  # the meta kernel's, any other device's
    "crafted": (([7], [0]), "records [7] torch.float32, the operator computes [32] torch.float32"),
    "mixed": (([32], [0]), "records [0] torch.float32, the operator computes [32] torch.float32"),
}


@pytest.mark.parametrize("case", list(STATISTICS))
def test_eval_batch_norm_statistics_are_read_as_the_cpu_export_records_them(levit_mlp_pte: bytes, case: str) -> None:
    """Export traces on the CPU, where eval-mode batch norm keeps no statistics: to_executorch records
    its saved mean and invstd as [0] where the meta kernel computes [C] (any other device's answer).
    Either device's answer is read; sizes that neither gives are refused."""
    from qlint.full.lint import lint_pte
    from qlint.io.reads import ReadError
    from qlint.settings.config import Config

    sizes, refusal = STATISTICS[case]
    data = levit_mlp_pte if sizes is None else _with_statistics(levit_mlp_pte, *sizes)
    if refusal is not None:
        with pytest.raises(ReadError) as raised:
            lint_pte(data, "levit_mlp.pte", Config())
        assert str(raised.value) == ("not a valid .pte program: aten._native_batch_norm_legit_no_training.default: "
                                     f"the program {refusal}")
        return
    [island] = [f for f in lint_pte(data, "levit_mlp.pte", Config()).findings if f.code == "QL002"]
    assert island.details["ops"] == ["aten._native_batch_norm_legit_no_training.default"]


def test_a_program_that_takes_a_python_number_is_read() -> None:
    """A model called with a float is exported with the example's value, and the emitter lists that
    value among the plan's inputs as a `Double` (ExecuTorch's own Cortex-M add and mul tests take
    one): the `.pte` the stock flow writes reads as the program it was written from."""
    import torch
    from executorch.exir._serialize._program import deserialize_pte_binary

    from qlint.full.lint import lint_program, lint_pte
    from qlint.loading.quantize import quantize
    from qlint.settings.config import Config

    class AddNumber(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: float) -> torch.Tensor:
            return x + y

    program = quantize(AddNumber(), (torch.ones(1, 4), 1.1))
    pte = _stock_pte(program)
    plan = deserialize_pte_binary(pte).program.execution_plan[0]
    assert [type(plan.values[i].val).__name__ for i in plan.inputs] == ["Tensor", "Double"]
    expected = [f.code for f in lint_program(program, "add", Config()).findings]
    assert expected and [f.code for f in lint_pte(pte, "add.pte", Config()).findings] == expected
