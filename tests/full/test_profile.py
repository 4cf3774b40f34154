"""Measured on the board: an ETDump of a `.pte` puts the device's cycles on the program's ops.

The profiles here are built as ExecuTorch's runtime writes them (`Method::execute`: one "Execute"
block a run, an `OPERATOR_CALL`/`MOVE_CALL`/`FREE_CALL` event an instruction with its chain and
index, size-prefixed, file identifier `ED00`), from ExecuTorch's `schema_flatcc` dataclasses with
the `flatc` its wheel ships, and ExecuTorch's Inspector reads them too.
"""

from __future__ import annotations

import json
import struct
import subprocess
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import main_json, run_cli, run_json

KINDS = {"KernelCall": "OPERATOR_CALL", "MoveCall": "MOVE_CALL", "FreeCall": "FREE_CALL"}
Cycles = Callable[[int, int], int]  # (run, instruction) -> cycles


def instructions(pte: Path) -> list[str]:
    """The plan's instruction kinds, in order, as ExecuTorch's deserializer reads them."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(pte.read_bytes()).program
    return [type(i.instr_args).__name__ for i in program.execution_plan[0].chains[0].instructions]


def operators(pte: Path) -> list[str]:
    """Each kernel call's operator base name (`quantized_add` of `cortex_m::quantized_add.out`), in order."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    plan = deserialize_pte_binary(pte.read_bytes()).program.execution_plan[0]
    return [plan.operators[i.instr_args.op_index].name.split("::")[-1]
            for i in plan.chains[0].instructions if type(i.instr_args).__name__ == "KernelCall"]


def profile_event(name: str, chain: int, index: int, start: int, end: int) -> Any:
    from executorch.devtools.etdump import schema_flatcc as schema

    return schema.Event(
        profile_event=schema.ProfileEvent(name=name, chain_index=chain, instruction_id=index, delegate_debug_id_int=-1,
                                          delegate_debug_id_str=None, delegate_debug_metadata=None,
                                          start_time=start, end_time=end),
        allocation_event=None, debug_event=None)


def runs_of(kinds: list[str], cycles: Cycles, runs: int, start: int = 5_000) -> list[list[Any]]:
    """Each run's events as the runtime records them: `Method::execute` around the instructions."""
    made = []
    for run in range(runs):
        clock, events = start, []
        for index, kind in enumerate(kinds):
            took = cycles(run, index)
            events.append(profile_event(KINDS[kind], 0, index, clock, clock + took))
            clock += took + 7  # the runtime's own work between instructions
        made.append([profile_event("Method::execute", -1, 0, start - 3, clock + 3), *events])
    return made


def etdump(runs: list[list[Any]]) -> bytes:
    """The ETDump flatbuffer of `runs`, size-prefixed as ETDumpGen writes it, by ExecuTorch's flatc."""
    import importlib.resources
    import tempfile

    import executorch.devtools.etdump as package
    from executorch.devtools.etdump import schema_flatcc as schema
    from executorch.devtools.etdump.serialize import _serialize_from_etdump_to_json
    from executorch.exir._serialize._flatbuffer import _get_flatc_path

    blocks = [schema.RunData(name="Execute", bundled_input_index=-1, allocators=None, events=events) for events in runs]
    document = _serialize_from_etdump_to_json(schema.ETDumpFlatCC(version=0, run_data=blocks))
    with tempfile.TemporaryDirectory() as folder:
        for name in ("etdump_schema_flatcc.fbs", "scalar_type.fbs"):
            (Path(folder) / name).write_bytes((importlib.resources.files(package) / name).read_bytes())
        (Path(folder) / "run.json").write_text(document)
        subprocess.run([_get_flatc_path(), "--binary", "--size-prefixed", "-o", folder,
                        f"{folder}/etdump_schema_flatcc.fbs", f"{folder}/run.json"], check=True)
        return (Path(folder) / "run.etdp").read_bytes()


def varied(run: int, index: int) -> int:
    """A different figure for every instruction and run, the middle run the median."""
    return 1_000 + 37 * index + (0, 500, 90)[run % 3]


def test_fix_writes_an_etrecord_that_ties_a_profile_to_the_program(
        pt2_dir: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--fix` writes `<name>.etrecord` beside `<name>.pte`; ExecuTorch's Inspector reads it with a profile of
    that `.pte` and ties the profiled instructions to the program's debug handles; qlint's measured cycles
    are the sum of the operator calls, each the median of the runs."""
    from executorch.devtools import Inspector
    from executorch.devtools.inspector import TimeScale

    code, _, _ = run_cli(["check", "--fix", "--no-cache", "--output-dir", str(tmp_path),
                          str(pt2_dir("make_attention"))], capsys)
    pte, record = tmp_path / "attention.pte", tmp_path / "attention.etrecord"
    assert code == 0 and pte.exists() and record.exists()
    kinds = instructions(pte)
    profile = tmp_path / "run.etdump"
    profile.write_bytes(etdump(runs_of(kinds, varied, 3)))

    inspector = Inspector(etdump_path=str(profile), etrecord=str(record), source_time_scale=TimeScale.CYCLES,
                          target_time_scale=TimeScale.CYCLES)
    [block] = inspector.event_blocks
    calls = [e for e in block.events if e.name == "OPERATOR_CALL"]
    assert len(calls) == kinds.count("KernelCall")
    assert [list(e.perf_data.raw) for e in calls] == [[float(varied(r, i)) for r in range(3)]
                                                      for i, k in enumerate(kinds) if k == "KernelCall"]
    assert any(e.debug_handles for e in calls)  # the ETRecord maps instructions to the program's nodes

    code, data = run_json(["check", str(pte), "--profile", str(profile)], capsys)
    [stats] = data["artifacts"]
    medians = [1_000 + 37 * i + 90 for i, k in enumerate(kinds) if k == "KernelCall"]
    assert code == 0 and stats["cycles"] == sum(medians) and stats["measured_runs"] == 3
    assert sum(row["measured"] for row in stats["profile"]) == stats["cycles"]
    assert sum(row["calls"] for row in stats["profile"]) == len(medians)

    # The .pt2 the .pte was fixed from, through the ETRecord: the same total, on its nodes and source lines.
    source = pt2_dir("make_attention")
    code, data = run_json(["check", str(source), "--profile", str(profile), "--etrecord", str(record)], capsys)
    [stats] = data["artifacts"]
    assert code == 1 and stats["cycles"] == sum(medians) and stats["measured_runs"] == 3
    handles = json.loads(zipfile.ZipFile(record).read("debug_handle_map"))["forward"]
    matmuls = [c for c in stats["costliest"] if c["what"].startswith("quantized_batch_matmul")]
    assert sorted(c["amount"] for c in matmuls) == sorted(
        1_090 + 37 * int(i) for i in handles if kinds[int(i)] == "KernelCall" and int(i) in (5, 9))
    assert all(c["location"] and c["location"]["path"].endswith("models.py") for c in matmuls)
    [ql001] = [f for f in data["findings"] if f["code"] == "QL001"]
    assert ql001["details"]["cycles"] == 0 and ql001["details"]["cycles_measured"]  # folded in the profiled .pte
    unplaced = [row for row in stats["profile"] if row["op"] == "an instruction of no node of the checked program"]
    assert sum(r["calls"] for r in unplaced) == len(medians) - sum(1 for i in handles if kinds[int(i)] == "KernelCall")

    # An ETRecord of another program, and none at all, are one line each.
    other = tmp_path / "other"
    run_cli(["check", "--fix", "--no-cache", "--output-dir", str(other), str(pt2_dir("make_pool"))], capsys)
    line = _refused(["check", str(source), "--profile", str(profile), "--etrecord",
                     str(other / "pool.etrecord")], capsys)
    assert f"profile {profile} is not of this program: instruction " in line, line
    assert f"{other / 'pool.pte'}, the .pte written with the ETRecord" in line, line
    assert "does not exist (--etrecord FILE)" in _refused(["check", str(source), "--profile", str(profile)], capsys)
    assert f"profile {profile}: ETRecord {profile}: not an ETRecord: not a zip archive" in _refused(
        ["check", str(source), "--profile", str(profile), "--etrecord", str(profile)], capsys)
    # An edge program that is not the shape torch writes names no operators: read as absent, never a traceback.
    odd_graph = {"edge_dialect_exported_program/forward": b'{"graph_module": [1]}'}
    odd = _etrecord_beside(record, tmp_path / "odd", odd_graph, pte)
    code, data = run_json(["check", str(source), "--profile", str(profile), "--etrecord", str(odd)], capsys)
    assert code == 1 and data["artifacts"][0]["cycles"] == sum(medians)
    assert f"profile {tmp_path / 'none'}: no such file" in _refused(
        ["check", str(pte), "--profile", str(tmp_path / "none")], capsys)


@pytest.fixture(scope="module")
def plain_profile(attention_plan: tuple[Path, Any], tmp_path_factory: pytest.TempPathFactory
                  ) -> tuple[Path, Path, list[str]]:
    """The attention example as the plain flow writes it (its div island kept) and one run's profile."""
    pte = attention_plan[0]
    kinds = instructions(pte)
    profile = tmp_path_factory.mktemp("profile") / "run.etdump"
    profile.write_bytes(etdump(runs_of(kinds, lambda run, index: 100 * (index + 1), 1)))
    return pte, profile, kinds


def test_an_islands_cycles_are_its_ops_events_and_every_figure_says_measured(
        plain_profile: tuple[Path, Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pte, profile, kinds = plain_profile
    _, estimated = run_json(["check", str(pte), "--no-cache"], capsys)
    metrics = tmp_path / "metrics.json"
    comparison = tmp_path / "comparison.csv"
    code, data = run_json(["check", str(pte), "--profile", str(profile), "--write", f"metrics:{metrics}",
                           "--write", f"profile-comparison:{comparison}"], capsys)
    assert code == 1
    [stats] = data["artifacts"]
    events = {i: 100 * (i + 1) for i, k in enumerate(kinds) if k == "KernelCall"}
    assert stats["cycles"] == sum(events.values()) and stats["measured_runs"] == 1
    ql001 = next(f for f in data["findings"] if f["code"] == "QL001")
    indices = [int(node.rsplit("_", 1)[1]) for node in ql001["details"]["graph_nodes"]]
    assert ql001["details"]["cycles"] == sum(events[i] for i in indices) > 0
    assert ql001["details"]["cycles_measured"] is True
    assert ql001["details"]["time_share"] == round(ql001["details"]["cycles"] / stats["cycles"], 4)
    # the estimate beside the measurement: the estimate's own figures, per operator
    [before] = estimated["artifacts"]
    assert sum(row["estimated"] for row in stats["profile"]) == before["cycles"]
    assert before["measured_runs"] == 0 and "cycles_measured" not in json.dumps(before)
    # each operator's row: its calls, and the sum of its instructions' events
    names = operators(pte)
    expected = {op: (names.count(op), sum(c for n, c in zip(names, events.values(), strict=True) if n == op))
                for op in set(names)}
    assert {row["op"].removesuffix(" (fp32)"): (row["calls"], row["measured"]) for row in stats["profile"]} == expected
    rows = comparison.read_text().splitlines()
    assert rows[0] == ("artifact,core,runs,operator,calls,estimated_cycles,measured_cycles,"
                       "measured_over_estimated,npu_run_cycles")
    assert len(rows) == 1 + len(stats["profile"])
    written = json.loads(metrics.read_text())["artifacts"][str(pte)]
    assert written["cycles"] == stats["cycles"] and written["cycles_measured_runs"] == 1
    _, out, _ = run_cli(["check", str(pte), "--profile", str(profile)], capsys)
    assert "measured on the device (median of 1 run) beside the estimate for cortex-m55" in out
    assert f"measured {ql001['details']['cycles']:,} cycles" in out and "est. " not in out


def test_a_latency_budget_is_checked_against_the_measured_time(
        plain_profile: tuple[Path, Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pte, profile, kinds = plain_profile
    config = tmp_path / ".qlint.yaml"
    config.write_text("board: ek-ra8d1\nbudgets: {latency: 0.001ms}\n")
    code, data = run_json(["check", "--config", str(config), str(pte), "--profile", str(profile)], capsys)
    [budget] = [f for f in data["findings"] if f["code"] == "QL009"]
    assert budget["message"].startswith("measured latency ")
    [stats] = data["artifacts"]
    assert budget["details"]["measured"] == stats["latency_ms"] == pytest.approx(stats["cycles"] / 480e6 * 1e3)


def test_a_32_bit_counter_that_wraps_inside_an_event_is_measured_across_the_wrap(
        plain_profile: tuple[Path, Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pte, _, kinds = plain_profile
    profile = tmp_path / "wrapped.etdump"
    profile.write_bytes(etdump(runs_of(kinds, lambda run, index: 100 * (index + 1), 1, start=(1 << 32) - 250)))
    _, data = run_json(["check", str(pte), "--profile", str(profile)], capsys)
    assert data["artifacts"][0]["cycles"] == sum(100 * (i + 1) for i, k in enumerate(kinds) if k == "KernelCall")


def _refused(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code, out, err = run_cli(args, capsys)
    assert code == 2, out + err
    [line] = [line for line in err.splitlines() if line.strip()]
    return line


def test_a_profile_of_another_program_is_refused_in_one_line(
        plain_profile: tuple[Path, Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pte, _, kinds = plain_profile
    cases: dict[str, tuple[list[list[Any]], str]] = {
        "past the plan": (runs_of([*kinds, "KernelCall"], varied, 1),
                          f"instruction {len(kinds)} is past the {len(kinds)} instructions of the program"),
        "a kernel call missing": (
            [[e for e in runs_of(kinds, varied, 1)[0] if e.profile_event.instruction_id != 2
              or e.profile_event.chain_index == -1]],
            "instruction 2 (cortex_m::"),
        "another kind": (runs_of(["MoveCall", *kinds[1:]], varied, 1),
                         "instruction 0 is cortex_m::quantize_per_tensor.out in the program; "
                         "the profile records MOVE_CALL there"),
        "a negative index": ([[profile_event("OPERATOR_CALL", 0, -1, 1, 2)]],
                             "at instruction -1, which is no instruction"),
        "a delegate": ([[profile_event("DELEGATE_CALL", 0, 0, 1, 2)]],
                       "instruction 0 is cortex_m::quantize_per_tensor.out in the program; the profile records "
                       "DELEGATE_CALL there"),
        "runs differ": ([*runs_of(kinds, varied, 1), *runs_of(kinds[:-1], varied, 1)],
                        f"run 2 records {len(kinds) - 1} instructions, run 1 {len(kinds)}"),
        "no events": ([[profile_event("Method::execute", -1, 0, 1, 2)]], "no instruction events (OPERATOR_CALL)"),
    }
    for case, (runs, said) in cases.items():
        profile = tmp_path / f"{case.replace(' ', '_')}.etdump"
        profile.write_bytes(etdump(runs))
        line = _refused(["check", str(pte), "--profile", str(profile)], capsys)
        assert said in line and line.startswith(f"qlint: error: {pte}: profile {profile}"), (case, line)


@pytest.fixture(scope="module")
def fixed_attention(pt2_dir: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
                    ) -> tuple[Path, Path, Path]:
    """The attention example's `.pt2`, and the `.pte` and ETRecord `--fix` wrote from it."""
    folder = tmp_path_factory.mktemp("fixed")
    source = pt2_dir("make_attention")
    code, _ = main_json(["check", "--fix", "--no-cache", "--output-dir", str(folder), str(source)])
    assert code == 0
    return source, folder / "attention.pte", folder / "attention.etrecord"


def test_through_the_etrecord_a_profile_is_held_to_the_pte_written_with_it(
        fixed_attention: tuple[Path, Path, Path], attention_plan: tuple[Path, Any], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """What the `.pte` path refuses, the ETRecord path refuses: the profile is checked against the
    instructions of the `.pte` beside the ETRecord, by the same check."""
    source, pte, record = fixed_attention
    kinds, unfixed = instructions(pte), instructions(attention_plan[0])
    handles = {int(i) for i in json.loads(zipfile.ZipFile(record).read("debug_handle_map"))["forward"]}
    unmapped = next(i for i, kind in enumerate(kinds) if kind == "KernelCall" and i not in handles)
    run = runs_of(kinds, varied, 1)[0]
    written = f"{pte}, the .pte written with the ETRecord"
    assert len(unfixed) > len(kinds) and kinds.count("KernelCall") == len(kinds)
    cases: dict[str, tuple[list[list[Any]], str]] = {
        "every event a move": (runs_of(["MoveCall"] * len(kinds), varied, 1),
                               f"instruction 0 is cortex_m::quantize_per_tensor.out in {written}; "
                               "the profile records MOVE_CALL there"),
        "the unfixed program": (runs_of(unfixed, varied, 1),
                                f"instruction {len(kinds)} is past the {len(kinds)} instructions of {written}"),
        "an event on instruction 2**31 - 1": ([[*run, profile_event("OPERATOR_CALL", 0, 2**31 - 1, 1, 2)]],
                                              f"instruction 2147483647 is past the {len(kinds)} instructions "
                                              f"of {written}"),
        "a kernel call the ETRecord maps to no node, without its event": (
            [[e for e in run if e.profile_event.instruction_id != unmapped or e.profile_event.chain_index == -1]],
            f"instruction {unmapped} (cortex_m::{operators(pte)[unmapped]}.out) has no OPERATOR_CALL event: "
            f"the profile is not of {written}, or the runner's event buffer was full"),
    }
    config = tmp_path / ".qlint.yaml"
    config.write_text("budgets: {cycles: 1}\n")  # the estimate fails it: a profile that measures nothing passed it
    for case, (runs, said) in cases.items():
        profile = tmp_path / f"{case.replace(' ', '_')}.etdump"
        profile.write_bytes(etdump(runs))
        line = _refused(["check", "--config", str(config), str(source), "--profile", str(profile),
                         "--etrecord", str(record)], capsys)
        assert line.startswith(f"qlint: error: {source}: profile {profile} is not of this program: "), (case, line)
        assert said in line, (case, line)


def _etrecord_beside(record: Path, folder: Path, replaced: dict[str, bytes], pte: Path | None) -> Path:
    """A copy of the ETRecord `record` in `folder` with the entries `replaced`, and `pte` copied beside it."""
    folder.mkdir()
    copy = folder / record.name
    with zipfile.ZipFile(record) as given, zipfile.ZipFile(copy, "w") as written:
        for name in given.namelist():
            written.writestr(name, replaced.get(name, given.read(name)))
    if pte is not None:
        (folder / pte.name).write_bytes(pte.read_bytes())
    return copy


def test_an_etrecord_that_is_not_of_the_pte_beside_it_is_refused_in_one_line(
        fixed_attention: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The ETRecord is held to the `.pte` beside it, as `--fix` writes them: an instruction it maps must be
    a kernel call there of an operator its handles' nodes call; it must map one; the `.pte` must be there."""
    source, pte, record = fixed_attention
    profile = tmp_path / "run.etdump"
    profile.write_bytes(etdump(runs_of(instructions(pte), varied, 1)))

    def mapped(entries: dict[str, Any]) -> dict[str, bytes]:
        return {"debug_handle_map": json.dumps({"forward": entries}).encode()}

    softmax = next(int(i) for i, op in enumerate(operators(pte)) if op == "softmax")
    cases: dict[str, tuple[dict[str, bytes], bool, str]] = {
        "an empty map": (mapped({}), True,
                         "not a valid ETRecord: its debug_handle_map maps no instruction to the program's nodes"),
        "no .pte": ({}, False, "the .pte written with it, {pte}: no such file"),
        "an instruction past the .pte": (mapped({"40": 1}), True, "instruction 40, which it maps to debug handles, "
                                         "is past the 11 instructions of {pte}, the .pte written with it"),
        "another operator": (mapped({str(softmax): 1}), True,
                             f"instruction {softmax} calls quantize_per_tensor in it, cortex_m::softmax.out in "
                             "{pte}, the .pte written with it"),
    }
    assert instructions(pte) == ["KernelCall"] * 11  # so an operator's index is its instruction's
    for case, (replaced, beside, said) in cases.items():
        copy = _etrecord_beside(record, tmp_path / case.replace(" ", "_"), replaced, pte if beside else None)
        line = _refused(["check", str(source), "--profile", str(profile), "--etrecord", str(copy)], capsys)
        expected = said.replace("{pte}", str(copy.with_suffix(".pte")))
        assert line == f"qlint: error: {source}: profile {profile}: ETRecord {copy}: {expected}", (case, line)


def test_etrecord_keys_that_are_no_instruction_index_are_refused_in_one_line(
        fixed_attention: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`str.isdigit` takes `²`, which `int` refuses, and Python's int conversion refuses 5,000 digits:
    a `debug_handle_map` key or handle that is no instruction index is one line, never an internal error."""
    source, pte, record = fixed_attention
    profile = tmp_path / "run.etdump"
    profile.write_bytes(etdump(runs_of(instructions(pte), varied, 1)))
    cases = {
        "a superscript key": (b'{"forward": {"\\u00b2": 1}}', "debug_handle_map entry '\u00b2' is not an "
                              "instruction's debug handles"),
        "a 5,000-digit key": (b'{"forward": {"' + b"1" * 5000 + b'": 1}}',
                              f"debug_handle_map entry {'1' * 20!r} is not an instruction's debug handles"),
        "a 5,000-digit handle": (b'{"forward": {"0": ' + b"1" * 5000 + b"}}",
                                 "its debug_handle_map or edge program is not JSON"),
    }
    for case, (mapped, said) in cases.items():
        copy = _etrecord_beside(record, tmp_path / case.replace(" ", "_"), {"debug_handle_map": mapped}, pte)
        line = _refused(["check", str(source), "--profile", str(profile), "--etrecord", str(copy)], capsys)
        assert line == f"qlint: error: {source}: profile {profile}: ETRecord {copy}: not a valid ETRecord: {said}", case


def test_an_edge_program_debug_handle_that_is_no_index_is_read_as_absent(
        fixed_attention: tuple[Path, Path, Path]) -> None:
    """`str.isdigit` takes `²` and `int` refuses it; Python's int conversion refuses 5,000 digits: either,
    as a node's debug handle in the edge program, names no handle (never an internal error)."""
    from qlint.device.profile import read_etrecord
    from qlint.io.limits import Limits

    _, _, record = fixed_attention
    entry = "edge_dialect_exported_program/forward"
    graph = json.loads(zipfile.ZipFile(record).read(entry))
    nodes = graph["graph_module"]["graph"]["nodes"]
    first = next(n for n in nodes if n.get("metadata", {}).get("debug_handle") == "1")
    honest = read_etrecord(record.read_bytes(), Limits())
    for odd in ("\u00b2", "1" * 5000):
        first["metadata"]["debug_handle"] = odd
        written = Path(str(record) + ".odd")
        with zipfile.ZipFile(record) as given, zipfile.ZipFile(written, "w") as copy:
            for name in given.namelist():
                copy.writestr(name, json.dumps(graph).encode() if name == entry else given.read(name))
        read = read_etrecord(written.read_bytes(), Limits())
        assert read.handles == honest.handles
        assert read.ops == {h: ops for h, ops in honest.ops.items() if h != 1}, odd


def test_an_event_longer_than_a_32_bit_counter_measures_is_refused_as_it_is_read(
        plain_profile: tuple[Path, Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An op measured at 2**63 cycles once crashed the time plot (OverflowError) and wrote metrics
    `--compare` refuses: the profile is refused as it is read, so no figure carries it."""
    pte, _, kinds = plain_profile
    plot = tmp_path / "time.svg"
    for took in (2**63, 2**32):
        profile = tmp_path / f"{took}.etdump"
        profile.write_bytes(etdump(runs_of(kinds, lambda run, index, took=took: took if index == 3 else 100, 1)))
        code, _, err = run_cli(["check", str(pte), "--profile", str(profile), "--write", f"time-plot:{plot}"], capsys)
        assert code == 2 and "Traceback" not in err and "internal error" not in err, err
        assert err.splitlines()[0] == (f"qlint: error: {pte}: profile {profile}: run 1's event on instruction 3 "
                                       f"spans {took:,} cycles: a 32-bit cycle counter measures at most 4,294,967,295")
        assert not plot.exists()


def test_a_profile_whose_kernel_calls_all_measure_zero_is_refused(
        plain_profile: tuple[Path, Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Events that start and end on one tick measure nothing: read as 0 cycles they passed a cycles budget
    the estimate fails. Every kernel takes time, so such a profile is refused as it is read (both paths
    read it so); one kernel call that measures 0 among others that count is a coarse timer's figure."""
    pte, _, kinds = plain_profile
    config = tmp_path / ".qlint.yaml"
    config.write_text("budgets: {cycles: 1}\n")
    profile = tmp_path / "zero.etdump"
    profile.write_bytes(etdump(runs_of(kinds, lambda run, index: 0, 2)))
    code, _, err = run_cli(["check", "--config", str(config), str(pte), "--profile", str(profile)], capsys)
    assert (code, err.splitlines()) == (2, [f"qlint: error: {pte}: profile {profile}: every kernel call measures 0 "
                                            "cycles: the runner's timer did not count (a cycle counter that is off, "
                                            "or a timer too coarse for one operator)"])
    profile.write_bytes(etdump(runs_of(kinds, lambda run, index: 0 if index else 5_000, 2)))
    code, out, _ = run_cli(["check", "--config", str(config), str(pte), "--profile", str(profile)], capsys)
    assert code == 1 and "measured cycles 5,000 over its budget 1" in out, out


def test_a_profile_whose_cycles_sum_past_what_figures_hold_exactly_is_refused(
        plain_profile: tuple[Path, Path, list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Each event is under 2**32 cycles, so only a profile of over 2**21 instructions (a raised
    `profile_entries`) sums past 2**53: the bound lowered here to reach it with a small one."""
    from qlint.device import profile as module
    from qlint.io.limits import Limits

    _, profile, kinds = plain_profile
    total = sum(100 * (i + 1) for i in range(len(kinds)))
    monkeypatch.setattr(module, "MAX_AMOUNT", total - 1)
    with pytest.raises(module.ProfileError) as refused:
        module.read_profile(profile.read_bytes(), Limits())
    assert str(refused.value) == (f"its instructions measure {total:,} cycles together, over 2**53: "
                                  "no figure compares exactly past it")


def _shared_event_bomb(count: int) -> bytes:
    """A valid ETDump flatbuffer whose one run lists the same event table `count` times: a few bytes an
    event in the file, a few hundred each once decoded."""

    def event(builder: Any) -> int:
        name = builder.CreateString("OPERATOR_CALL")
        builder.StartObject(8)  # ProfileEvent
        builder.PrependUOffsetTRelativeSlot(0, name, 0)
        builder.PrependUint64Slot(7, 10, 0)
        profile = builder.EndObject()
        builder.StartObject(3)  # Event
        builder.PrependUOffsetTRelativeSlot(0, profile, 0)
        return int(builder.EndObject())

    return _one_event_listed(count, event)


def _one_event_listed(count: int, event: Callable[[Any], int]) -> bytes:
    """An ETDump of one run that lists the event table `event` builds `count` times, as the runtime
    writes one (size-prefixed, `ED00`)."""
    import flatbuffers

    builder = flatbuffers.Builder(1024)
    built = event(builder)
    block = builder.CreateString("Execute")
    builder.StartVector(4, count, 4)
    for _ in range(count):
        builder.PrependUOffsetTRelative(built)
    events = builder.EndVector()
    builder.StartObject(4)  # RunData
    builder.PrependUOffsetTRelativeSlot(0, block, 0)
    builder.PrependUOffsetTRelativeSlot(3, events, 0)
    run = builder.EndObject()
    builder.StartVector(4, 1, 4)
    builder.PrependUOffsetTRelative(run)
    runs = builder.EndVector()
    builder.StartObject(2)  # ETDump
    builder.PrependUOffsetTRelativeSlot(1, runs, 0)
    root = builder.EndObject()
    builder.FinishSizePrefixed(root, file_identifier=b"ED00")
    return bytes(builder.Output())


def test_hostile_profiles_are_refused_before_they_are_decoded(
        plain_profile: tuple[Path, Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pte, honest, _ = plain_profile
    data = honest.read_bytes()
    cases = {
        "bomb": (_shared_event_bomb(200_001), "holds over 200000 runs and events "
                                              "(limits.profile_entries in .qlint.yaml)"),
        "truncated": (data[:-9], "its size prefix is not its length"),
        "not an etdump": (b"\x10\x00\x00\x00" + b"\x08\x00\x00\x00ET12" + bytes(8), "not an ETDump: no size-prefixed"),
        "offset outside": (data[:4] + struct.pack("<I", 1 << 30) + data[8:], "outside the file"),
        "garbage": (data[:12] + bytes(len(data) - 12), "not a valid ETDump"),
    }
    for case, (body, said) in cases.items():
        profile = tmp_path / f"{case.replace(' ', '_')}.etdump"
        profile.write_bytes(body)
        line = _refused(["check", str(pte), "--profile", str(profile)], capsys)
        assert said in line, (case, line)
    small = _shared_event_bomb(50)
    profile = tmp_path / "small_bomb.etdump"
    profile.write_bytes(small)
    config = tmp_path / ".qlint.yaml"
    config.write_text("limits: {profile_entries: 40}\n")
    assert "holds over 40 runs and events" in _refused(
        ["check", "--config", str(config), str(pte), "--profile", str(profile)], capsys)


def _fat_event_bomb(count: int, fat: int = 330) -> bytes:
    """A valid ETDump whose one run lists `count` times one event whose strings are `fat` control
    characters each: every character six bytes of JSON (`\\u0001`), every reference decoded anew."""

    def event(builder: Any) -> int:
        text = "\x01" * fat
        name = builder.CreateString("Method::execute")
        strings = [builder.CreateString(text) for _ in range(3)]
        builder.StartObject(8)  # ProfileEvent, not an instruction's: chain -1
        builder.PrependUOffsetTRelativeSlot(0, name, 0)
        builder.PrependInt32Slot(1, -1, 0)
        builder.PrependUOffsetTRelativeSlot(4, strings[0], 0)
        profile = builder.EndObject()
        builder.StartObject(6)  # DebugEvent
        builder.PrependUOffsetTRelativeSlot(4, strings[1], 0)
        builder.PrependUOffsetTRelativeSlot(5, strings[2], 0)
        debug = builder.EndObject()
        builder.StartObject(3)  # Event
        builder.PrependUOffsetTRelativeSlot(0, profile, 0)
        builder.PrependUOffsetTRelativeSlot(2, debug, 0)
        return int(builder.EndObject())

    return _one_event_listed(count, event)


def test_a_profile_costs_its_events_not_what_its_strings_decode_to(
        plain_profile: tuple[Path, Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An 800 KB ETDump listing one event with strings of control characters 199,900 times decoded, as
    JSON, to gigabytes (208 s, 2.2 GiB): it is read in about a second, each event's name only."""
    from qlint.device.profile import ProfileError, read_profile
    from qlint.io.limits import Limits

    pte = plain_profile[0]
    data = _fat_event_bomb(199_900)
    assert 790_000 < len(data) < 810_000
    started = time.perf_counter()
    with pytest.raises(ProfileError, match=r"^no instruction events \(OPERATOR_CALL\)"):
        read_profile(data, Limits())
    assert time.perf_counter() - started < 10
    profile = tmp_path / "fat.etdump"
    profile.write_bytes(data)
    assert _refused(["check", str(pte), "--profile", str(profile)], capsys) == (
        f"qlint: error: {pte}: profile {profile}: no instruction events (OPERATOR_CALL): "
        "record it with the runner's event tracer on")


def test_profile_needs_one_pte(plain_profile: tuple[Path, Path, list[str]], pt2_dir: Callable[[str], Path],
                               capsys: pytest.CaptureFixture[str]) -> None:
    pte, profile, _ = plain_profile
    for args in ([str(pte), str(pte)], ["--static", str(pte)], ["--fix", str(pte)]):
        code, _, err = run_cli(["check", *args, "--profile", str(profile)], capsys)
        assert code == 2 and "--profile reads an ETDump of one program" in err
    code, _, err = run_cli(["check", str(pte), "--write", "profile-comparison:x.csv"], capsys)
    assert code == 2 and "needs --profile" in err


def test_the_overlay_and_the_time_plot_show_the_measured_cycles(
        plain_profile: tuple[Path, Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Model Explorer's node data carries each instruction's measured cycles on the `.pte` adapter's ids
    (`forward_0_<instruction>`), and the time plot draws the measured bars."""
    from qlint.full.lint import lint_pte
    from qlint.report.model_explorer import TIME_SUFFIX, file_stem
    from qlint.report.time_plot import figure
    from qlint.settings.config import Config

    pte, profile, kinds = plain_profile
    run_cli(["check", str(pte), "--profile", str(profile), "--write", f"model-explorer:{tmp_path / 'me'}"], capsys)
    overlay = json.loads((tmp_path / "me" / f"{file_stem(str(pte))}{TIME_SUFFIX}").read_text())
    assert overlay["forward"]["name"].startswith("qlint: measured cycles")
    assert {node: result["value"] for node, result in overlay["forward"]["results"].items()} == {
        f"forward_0_{i}": 100 * (i + 1) for i, kind in enumerate(kinds) if kind == "KernelCall"}
    report = lint_pte(pte.read_bytes(), str(pte), Config(), profile=profile.read_bytes())
    [ax] = figure(report).axes
    assert "measured (median of 1 run)" in ax.get_title() and ax.get_xlabel() == "measured cycles"
    assert sorted(bar.get_width() for bar in ax.patches) == sorted(
        100 * (i + 1) for i, kind in enumerate(kinds) if kind == "KernelCall")[-len(ax.patches):]
