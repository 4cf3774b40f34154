"""Memory, budgets and every output of a check for an Ethos-U target: each NPU partition's Vela scratch
joins SRAM and its command stream and weights are named in flash, for a `.pt2` lowered by the check
and the `.pte` of the same lowering alike; every format, the baseline and the result cache answer an
NPU `.pt2` as they answer a Cortex-M one.

Two lowerings for the module (each runs Vela): the `.pte` of the attention whose division stays
float (2 partitions), written here, and the check's own lowering of its `.pt2`, which the result
cache then answers for every other run."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli

from qlint.fix.measure import AS_LOWERED_NPU
from qlint.io.vela import NpuBlob
from qlint.report.escape import github_value

pytestmark = pytest.mark.model("make_attention@npu")

U55 = "ethos-u55-128"
BUDGETS = "budgets: {sram: 4KiB, flash: 20KiB}\n"


@pytest.fixture(scope="module")
def lowered(quantized: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes,
                                                                                               tuple[NpuBlob, ...]]:
    """The attention's `.pt2` (quantized for the U55) in a folder with a budgets config, and the `.pte`
    and delegate blobs of its lowering as Arm's flow writes it."""
    import torch

    from qlint.loading import ethos_u
    from qlint.settings.npus import npu

    folder = tmp_path_factory.mktemp("npu-memory")
    program = quantized("make_attention", npu=U55)
    torch.export.save(program, str(folder / "attention.pt2"))
    lowering = ethos_u.lower(program, npu(U55))
    data = bytes(lowering.edge.to_executorch().buffer)
    (folder / "attention.pte").write_bytes(data)
    (folder / ".qlint.yaml").write_text(BUDGETS)
    return folder, data, tuple(lowering.delegation.blobs.values())


def _scratch_and_blobs(blobs: tuple[NpuBlob, ...]) -> tuple[list[str], list[str]]:
    """The SRAM and flash contributors each partition adds, as a QL009 message names them."""
    sram = [f"NPU partition {k} scratch (Vela) (the SRAM the NPU works in, from the temp allocator while the "
            f"partition runs): {b.sram:,}" for k, b in enumerate(blobs, 1)]
    flash = [f"NPU partition {k} {part} (Vela) ({what}): {amount:,}" for k, b in enumerate(blobs, 1)
             for part, what, amount in (("weights", "read by the NPU, in the .pte", b.flash),
                                        ("command stream", "in the .pte", b.command_stream))]
    return sram, flash


def _check_memory(figures: dict[str, Any], findings: list[dict[str, Any]], pte: bytes,
                  blobs: tuple[NpuBlob, ...], measured: str) -> None:
    scratch = max(b.sram for b in blobs)
    assert len(blobs) == 2 and figures["measured"] == measured
    assert figures["npu_scratch_bytes"] == scratch
    assert figures["sram_bytes"] == figures["arena_bytes"] + figures["method_allocator_bytes"] + scratch
    assert figures["flash_bytes"] == len(pte)
    budget = {f["details"]["budget"]: f for f in findings if f["code"] == "QL009"}
    sram, flash = _scratch_and_blobs(blobs)
    assert (f"arena {figures['arena_bytes']:,} B + method allocator {figures['method_allocator_bytes']:,} B "
            f"+ NPU scratch {scratch:,} B (the largest partition's: partitions run one at a time and reuse the "
            "temp allocator)") in budget["sram"]["message"]
    assert all(part in budget["sram"]["message"] for part in sram)
    assert "largest parts: NPU partitions and constants: " in budget["flash"]["message"]
    assert all(part in budget["flash"]["message"] for part in flash)
    names = [c["name"] for c in budget["flash"]["details"]["contributors"]]
    assert {"NPU partition 1 weights (Vela)", "NPU partition 2 command stream (Vela)"} <= set(names)
    amounts = [c["amount"] for c in budget["flash"]["details"]["contributors"]]
    assert amounts == sorted(amounts, reverse=True)


def test_npu_scratch_and_blobs_join_the_budgets_of_a_pt2_and_its_pte(
        lowered: tuple[Path, bytes, tuple[NpuBlob, ...]], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    folder, pte, blobs = lowered
    monkeypatch.chdir(folder)
    code, out, err = run_cli(["check", "attention.pt2", "--target", U55, "--output-format", "json",
                              "--write", "metrics:pt2.json"], capsys)
    assert code == 1, err
    pt2 = json.loads((folder / "pt2.json").read_text())["artifacts"]["attention.pt2"]
    _check_memory(pt2, json.loads(out)["findings"], pte, blobs, AS_LOWERED_NPU)

    code, out, err = run_cli(["check", "attention.pte", "--output-format", "json", "--write", "metrics:pte.json"],
                             capsys)
    assert code == 1, err
    shipped = json.loads((folder / "pte.json").read_text())["artifacts"]["attention.pte"]
    _check_memory(shipped, json.loads(out)["findings"], pte, blobs, "the .pte as shipped")
    same = ("arena_bytes", "method_allocator_bytes", "npu_scratch_bytes", "sram_bytes", "flash_bytes")
    assert [pt2[k] for k in same] == [shipped[k] for k in same]


def test_every_format_the_baseline_and_the_result_cache_answer_an_npu_pt2(
        lowered: tuple[Path, bytes, tuple[NpuBlob, ...]], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from qlint.loading import ethos_u
    from qlint.rules.catalog import load_catalog

    folder, _, blobs = lowered
    monkeypatch.chdir(folder)
    check = ["check", "attention.pt2", "--target", U55]
    code, first, err = run_cli([*check, "--output-format", "json"], capsys)  # lowers, or the cache answers
    assert code == 1, err

    def lowering_again(*args: Any) -> Any:
        raise AssertionError("the result cache did not answer")

    monkeypatch.setattr(ethos_u, "lower", lowering_again)
    code, again, err = run_cli([*check, "--output-format", "json"], capsys)
    assert (code, again) == (1, first), err
    data = json.loads(first)
    [stats] = data["artifacts"]
    assert (stats["target"], stats["partitions"]) == (U55, 2)
    assert [(d["sram"], d["flash"], d["command_stream"]) for d in stats["delegates"]] == [
        (b.sram, b.flash, b.command_stream) for b in blobs]
    codes = ["QL001", "QL009", "QL009", "QL010"]  # QL007 ran the partitions on the TOSA reference model: equal
    assert sorted(f["code"] for f in data["findings"]) == codes
    by_code = {f["code"]: f for f in data["findings"]}

    code, out, _ = run_cli([*check, "--output-format", "sarif"], capsys)
    results = json.loads(out)["runs"][0]["results"]
    assert code == 1 and sorted(r["ruleId"] for r in results) == codes
    assert {r["ruleId"]: r["message"]["text"] for r in results}["QL010"] == by_code["QL010"]["message"]
    assert {r["properties"]["artifact"] for r in results} == {"attention.pt2"}

    code, out, _ = run_cli([*check, "--output-format", "github"], capsys)
    name = load_catalog()["QL010"].name
    assert code == 1 and sorted(line.split("title=")[1][:5] for line in out.splitlines()) == codes
    where = by_code["QL010"]["location"]
    assert (f"::warning file={where['path']},line={where['line']},title=QL010 {name}::"
            + github_value(f"attention.pt2: {by_code['QL010']['message']}")) in out.splitlines()

    code, out, _ = run_cli([*check, "--output-format", "markdown"], capsys)
    sram, flash = ("/".join(f"{getattr(b, part):,}" for b in blobs) for part in ("sram", "flash"))
    cycles = "/".join(f"{d['npu_cycles']:,}" for d in stats["delegates"])
    assert code == 1 and f"| 2 on {U55}: {cycles} NPU cycles, SRAM {sram} B, flash {flash} B |" in out

    code, out, err = run_cli([*check, "--write-baseline", "baseline.json"], capsys)
    assert code == 0, err
    code, out, err = run_cli([*check, "--baseline", "baseline.json", "--output-format", "json"], capsys)
    assert (code, json.loads(out)["findings"]) == (0, []), err
    assert json.loads(out)["artifacts"] == data["artifacts"]


def test_the_model_explorer_overlay_marks_npu_partitions_and_cpu_fallbacks(
        lowered: tuple[Path, bytes, tuple[NpuBlob, ...]], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("model_explorer")
    folder = lowered[0]
    monkeypatch.chdir(folder)
    placed = {}
    for artifact, extra in (("attention.pt2", ["--target", U55]), ("attention.pte", [])):
        code, out, err = run_cli(["check", artifact, *extra, "--output-format", "json",
                                  "--write", "model-explorer:overlay"], capsys)
        assert code == 1, err
        [fallback] = [f for f in json.loads(out)["findings"] if f["code"] == "QL010"]
        overlay = json.loads((folder / "overlay" / f"{artifact}.placement.json").read_text())
        [(graph, data)] = overlay.items()
        assert graph == ("graph" if artifact.endswith(".pt2") else "forward")
        assert data["name"] == f"qlint: where each node runs ({U55})"
        placed[artifact] = {node: (r["value"], r["bgColor"]) for node, r in data["results"].items()}
        assert {node for node, (label, _) in placed[artifact].items() if label == "cpu fallback"} == set(
            fallback["details"]["graph_nodes"])
    npu, cpu = "#b7e4c7", "#f4a261"
    # The .pt2: the nodes each partition was lowered from, by their names in the quantized program; the
    # float division between them on the CPU; the CPU's own quantize at the input is neither.
    pt2 = placed["attention.pt2"]
    assert {node: pt2[node] for node in ("linear", "linear_1", "bmm", "amax", "exp", "linear_3", "div")} == {
        "linear": ("npu partition 1", npu), "linear_1": ("npu partition 1", npu), "bmm": ("npu partition 1", npu),
        "amax": ("npu partition 2", npu), "exp": ("npu partition 2", npu), "linear_3": ("npu partition 2", npu),
        "div": ("cpu fallback", cpu)}
    assert "quantize_per_tensor" not in pt2 and len(pt2) > 40
    # The .pte: one instruction per delegate call, and the division's instruction.
    assert sorted(label for label, _ in placed["attention.pte"].values()) == [
        "cpu fallback", "npu partition 1", "npu partition 2"]
    assert all(node.startswith("forward_0_") for node in placed["attention.pte"])
