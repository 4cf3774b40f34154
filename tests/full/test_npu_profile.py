"""Measured on the board, with an Ethos-U: an ETDump of a `.pte` whose partitions run on the NPU.

ExecuTorch's runtime records a `DELEGATE_CALL` event on a delegate call's instruction
(`Method::execute_instruction`), and its Ethos-U backend records its own events on that instruction
inside it (`EthosUBackend::execute()`, a `+EthosUBackend::execute()handles.input.memcpy()` for each
input, `+EthosUBackend::execute()NPU` while the command stream runs), each written when it ends, so
before the `DELEGATE_CALL`. The profiles here are built that way, with the ETDump writer of
`test_profile.py`; the cycles are illustrative, not measured on a board.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli, run_json
from test_profile import etdump, instructions, profile_event

U55 = "ethos-u55-128"
KINDS = {"KernelCall": "OPERATOR_CALL", "MoveCall": "MOVE_CALL", "FreeCall": "FREE_CALL"}
NPU_RUN, COPY, BACKEND = 9_000, 150, 400  # a delegate call: its NPU run, one input's copy, the backend's own work


def runs_of(kinds: list[str], runs: int, *, npu_events: bool = True) -> list[list[Any]]:
    """Each run's events as the runtime and the Ethos-U backend record them; a kernel call takes
    1,000 + 10 * index cycles, a delegate call its copy, NPU run and backend work, the NPU's run
    longer by 100 cycles a run (the median run is the middle one)."""
    made = []
    for run in range(runs):
        clock, events = 5_000, []
        for index, kind in enumerate(kinds):
            if kind != "DelegateCall":
                took = 1_000 + 10 * index
                events.append(profile_event(KINDS[kind], 0, index, clock, clock + took))
                clock += took + 7
                continue
            start = clock
            inner = [profile_event("+EthosUBackend::execute()handles.input.memcpy()", 0, index, clock, clock + COPY)]
            clock += COPY
            ran = NPU_RUN + 100 * run
            if npu_events:
                inner.append(profile_event("+EthosUBackend::execute()NPU", 0, index, clock, clock + ran))
            clock += ran + BACKEND
            events += [*inner, profile_event("EthosUBackend::execute()", 0, index, start + 2, clock - 2),
                       profile_event("DELEGATE_CALL", 0, index, start, clock)]
            clock += 7
        made.append([profile_event("Method::execute", -1, 0, 4_990, clock + 3), *events])
    return made


@pytest.fixture(scope="module")
def conv_pte(quantized: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """The conv block with its hardswishes left float, lowered for a U55 as Arm's flow writes it: three
    delegate calls with the CPU's float hardswish between them."""
    from qlint.loading import ethos_u
    from qlint.settings.npus import npu

    lowering = ethos_u.lower(quantized("make_conv_hardswish", npu=U55), npu(U55))
    pte = tmp_path_factory.mktemp("npu-profile") / "conv.pte"
    pte.write_bytes(bytes(lowering.edge.to_executorch().buffer))
    return pte, instructions(pte)


@pytest.mark.model("make_conv_hardswish@npu")
def test_a_profile_prices_the_delegate_calls_a_pte_alone_cannot(
        conv_pte: tuple[Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pte, kinds = conv_pte
    assert kinds.count("DelegateCall") == 3
    _, plain = run_json(["check", str(pte), "--board", "alif-e7-dk-he-u55", "--output-format", "json"], capsys)
    assert plain["artifacts"][0]["cycles"] is None  # a .pte holds no estimate of its partitions
    profile = tmp_path / "run.etdump"
    profile.write_bytes(etdump(runs_of(kinds, 3)))
    comparison = tmp_path / "comparison.json"
    code, report = run_json(["check", str(pte), "--board", "alif-e7-dk-he-u55", "--profile", str(profile),
                             "--write", f"profile-comparison:{comparison}", "--output-format", "json"], capsys)
    [stats] = report["artifacts"]
    delegate_call = [COPY + NPU_RUN + 100 + BACKEND]  # the median run's
    kernels = [1_000 + 10 * i for i, kind in enumerate(kinds) if kind == "KernelCall"]
    assert stats["cycles"] == sum(kernels) + 3 * delegate_call[0] and stats["measured_runs"] == 3
    assert stats["latency_ms"] == pytest.approx(stats["cycles"] / 160e6 * 1e3)  # the HE core's 160 MHz
    [row] = [r for r in stats["profile"] if r["op"] == "executorch_call_delegate"]
    assert (row["calls"], row["estimated"], row["measured"], row["npu"]) == (
        3, 0, 3 * delegate_call[0], 3 * (NPU_RUN + 100))
    assert stats["npu_cycles"] is None and stats["cpu_cycles"] == sum(kernels)
    [written] = [r for r in json.loads(comparison.read_text())["rows"] if r["operator"] == "executorch_call_delegate"]
    assert (written["measured_cycles"], written["npu_run_cycles"]) == (row["measured"], row["npu"])
    code, out, _ = run_cli(["check", str(pte), "--profile", str(profile)], capsys)
    assert (f"  executorch_call_delegate: the NPU's runs took {3 * (NPU_RUN + 100):,} of its "
            f"{3 * delegate_call[0]:,} cycles") in out


@pytest.mark.model("make_conv_hardswish@npu")
def test_a_delegate_call_profile_of_another_program_is_refused_in_one_line(
        conv_pte: tuple[Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pte, kinds = conv_pte
    first = kinds.index("DelegateCall")
    [run] = runs_of(kinds, 1)
    cases: dict[str, tuple[list[list[Any]], str]] = {
        "no delegate event": ([[e for e in run if e.profile_event.instruction_id != first
                                or e.profile_event.chain_index == -1]],
                              f"instruction {first} (DelegateCall) has no DELEGATE_CALL event"),
        "a kernel call as a delegate": (runs_of(["DelegateCall", *kinds[1:]], 1),
                                        "records DELEGATE_CALL there"),
        "backend events on a kernel call": (
            [[*run, profile_event("+EthosUBackend::execute()NPU", 0, 0, 1, 2)]],
            "records the Ethos-U backend's '+EthosUBackend::execute()NPU' at instruction 0, where it records no "
            "DELEGATE_CALL"),
        "another backend's event": ([[*run, profile_event("XnnpackBackend::execute()", 0, first, 1, 2)]],
                                    f"records 'XnnpackBackend::execute()' at instruction {first}"),
        "runs that disagree on the NPU's run": ([run, *runs_of(kinds, 1, npu_events=False)],
                                                "run 2 records the NPU's run in 0 delegate calls, run 1 in 3"),
    }
    for case, (runs, said) in cases.items():
        profile = tmp_path / f"{case.replace(' ', '_')}.etdump"
        profile.write_bytes(etdump(runs))
        code, out, err = run_cli(["check", str(pte), "--profile", str(profile)], capsys)
        [line] = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and said in line and line.startswith(f"qlint: error: {pte}: profile {profile}"), (case, line)
    # without the backend's NPU event the call is still measured, as a whole
    profile = tmp_path / "calls.etdump"
    profile.write_bytes(etdump(runs_of(kinds, 1, npu_events=False)))
    code, report = run_json(["check", str(pte), "--profile", str(profile), "--output-format", "json"], capsys)
    [row] = [r for r in report["artifacts"][0]["profile"] if r["op"] == "executorch_call_delegate"]
    assert row["npu"] is None and row["measured"] == 3 * (COPY + NPU_RUN + BACKEND)
    assert json.dumps(report["errors"]) == "[]"


@pytest.mark.model("make_conv_hardswish@npu")
def test_through_an_etrecord_a_delegated_programs_profile_is_refused_in_one_line(
        quantized: Callable[..., Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    pt2 = tmp_path / "conv.pt2"
    torch.export.save(quantized("make_conv_hardswish", npu=U55), str(pt2))
    code, _, _ = run_cli(["check", str(pt2), "--target", U55, "--fix", "--output-dir", str(tmp_path / "out")], capsys)
    fixed = tmp_path / "out" / "conv.pte"
    assert code in (0, 1) and fixed.exists() and fixed.with_suffix(".etrecord").exists()
    profile = tmp_path / "run.etdump"
    profile.write_bytes(etdump(runs_of(instructions(fixed), 1)))
    code, _, err = run_cli(["check", str(pt2), "--target", U55, "--profile", str(profile),
                            "--etrecord", str(fixed.with_suffix(".etrecord"))], capsys)
    [line] = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and line.endswith(
        "the .pte written with it, calls NPU delegates: through an ETRecord a profile is placed on the .pt2's nodes, "
        "and a partition is not one of them; check that .pte itself with --profile"), line
