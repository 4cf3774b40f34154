"""Crafted `.pte` programs far larger than their files: answered, or refused with one line.

Each program is built here as an `executorch.exir.schema.Program` written by ExecuTorch's own
serializer (tables shared many times over are packed with the flatbuffer object API; the bytes
are kept for the next run under a key of this file and ExecuTorch's version): tens of thousands
of instructions over thousands of planned tensors whose lifetimes all overlap, one list read by
every instruction, a constant reduced over and over, sizes near int64's range, and instructions
or values declared a million times. qlint checks them all in one run, in a fresh interpreter
whose processes may each use 30 s of CPU (RLIMIT_CPU); its `.pte` child reports the memory it
added (VmHWM, read in that child). The assertions are outcomes: the report, or one
`qlint: error:` line naming the limit; never a traceback, a CPU kill or a memory budget error.
"""

from __future__ import annotations

import json
import os
import random
import resource
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, cache_home, run_cli
from test_hostile_inputs import Shared

CPU_SECONDS = 30
EXTRA_MIB = 256  # what one crafted .pte may add to the child's resident memory

# Runs in qlint's `.pte` child in place of `lint_bytes`: appends the child's resident memory
# before and its peak after (VmHWM: getrusage would report the forkserver's or pytest's peak).
MEASURED = textwrap.dedent("""\
    import json
    import os

    from qlint.run.engine import lint_bytes


    def _status(key):
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) << 10 for line in status if line.startswith(key + ":"))


    def measured(path, data, artifact, config, options):
        start = _status("VmRSS")
        report = lint_bytes(path, data, artifact, config, options)
        with open(os.environ["QLINT_TEST_MEMORY"], "a") as out:
            out.write(json.dumps([artifact, _status("VmHWM") - start]) + "\\n")
        return report
""")
PROBE = (
    "import sys, measured\n"
    "from qlint.run import engine\n"
    "engine.lint_bytes = measured.measured\n"
    "from qlint.cli.main import main\n"
    "raise SystemExit(main(sys.argv[1:]))\n"
)

# -- programs, through ExecuTorch's schema and serializer ----------------------------------------

LUT = "cortex_m::quantized_activation"  # (input, 256-entry int8 table, out): shape-preserving
INT8, INT64 = 1, 4
ARENA = 1


def tensor(dtype: int, sizes: list[int], offset: int | None = None, buffer: int = 0) -> Any:
    """A tensor value: planned in the arena at `offset`, or a constant in `buffer`."""
    from executorch.exir import schema as s

    where = None if offset is None else s.AllocationDetails(
        memory_id=ARENA, memory_offset_low=offset & 0xFFFFFFFF, memory_offset_high=offset >> 32)
    return s.EValue(s.Tensor(
        scalar_type=s.ScalarType(dtype), storage_offset=0, sizes=sizes, dim_order=list(range(len(sizes))),
        requires_grad=False, layout=0, data_buffer_idx=buffer, allocation_info=where,
        shape_dynamism=s.TensorShapeDynamism.STATIC,
    ))


def program(values: list[Any], calls: list[tuple[int, list[int]]], operators: list[tuple[str, str]],
            inputs: list[int], outputs: list[int], constants: list[bytes], arena: int) -> bytes:
    """One method of kernel calls `(operator index, argument value indexes)`, serialized."""
    from executorch.exir import schema as s
    from executorch.exir._serialize._program import PTEFile, serialize_pte_binary

    plan = s.ExecutionPlan(
        name="forward", container_meta_type=s.ContainerMetadata("", ""), values=values, inputs=inputs,
        outputs=outputs, operators=[s.Operator(name=n, overload=o) for n, o in operators], delegates=[],
        chains=[s.Chain(inputs=[], outputs=[], stacktrace=None,
                        instructions=[s.Instruction(s.KernelCall(op_index=o, args=a)) for o, a in calls])],
        non_const_buffer_sizes=[0, arena],
    )
    return bytes(serialize_pte_binary(PTEFile(program=s.Program(
        version=0, execution_plan=[plan], constant_buffer=[s.Buffer(b"")] + [s.Buffer(c) for c in constants],
        backend_delegate_data=[], segments=[], constant_segment=s.SubsegmentOffsets(segment_index=0, offsets=[]),
    ))))


def overlapping(instructions: int, tensors: int) -> bytes:
    """A chain of table lookups through `tensors` int8 tensors at two planned offsets, each
    written again every `tensors` steps: every lifetime spans the program."""
    values = [tensor(INT8, [256], buffer=1)] + [tensor(INT8, [64], offset=64 * (k % 2)) for k in range(tensors)]
    after = [1 + (k + 1) % tensors for k in range(instructions)]
    calls = [(0, [1 + k % tensors, 0, after[k], after[k]]) for k in range(instructions)]
    return program(values, calls, [(LUT, "out")], [1], [after[-1]], [bytes(256)], arena=128)


def shared_list(instructions: int, width: int) -> bytes:
    """Every instruction concatenates the same list of `width` tensors."""
    from executorch.exir import schema as s

    values = [tensor(INT8, [1], offset=0), s.EValue(s.Int(0)), s.EValue(s.TensorList(items=[0] * width)),
              tensor(INT8, [width], offset=64)]
    calls = [(0, [2, 1, 3, 3])] * instructions
    return program(values, calls, [("aten::cat", "out")], [0], [3], [], arena=64 + width)


def reductions(instructions: int, constant_bytes: int) -> bytes:
    """Every instruction sums the same int8 constant of `constant_bytes` to an int64 scalar."""
    from executorch.exir import schema as s

    values = [tensor(INT8, [constant_bytes], buffer=1), s.EValue(s.IntList(items=[4])), s.EValue(s.Bool(False)),
              s.EValue(s.Null()), s.EValue(s.Int(0)), tensor(INT64, [], offset=0)]
    calls = [(0, [0, 1, 2, 3, 5, 5])] * instructions
    return program(values, calls, [("aten::sum", "IntList_out")], [], [5], [bytes(constant_bytes)], arena=8)


def huge_sizes(instructions: int, tensors: int, dims: int) -> bytes:
    """Table lookups over tensors of `dims` dimensions of 2**31 - 1 elements, all at offset 2**63."""
    values = [tensor(INT8, [256], buffer=1)] + [
        tensor(INT8, [(1 << 31) - 1] * dims, offset=1 << 63) for k in range(tensors)]
    calls = [(0, [1 + k % tensors, 0, 1 + (k + 1) % tensors, 1 + (k + 1) % tensors]) for k in range(instructions)]
    return program(values, calls, [(LUT, "out")], [1], [1 + instructions % tensors], [bytes(256)], arena=128)


def declared_many_times(table: str, count: int) -> bytes:
    """A small program whose first instruction or value is listed `count` times: each entry is
    a 4-byte offset to the one packed table, and a decoder unpacks every one of them."""
    import flatbuffers
    from executorch.exir._serialize._flatbuffer_program import _patch_generated_flatbuffer_aliases
    from executorch.exir._serialize.generated.executorch_flatbuffer.Program import ProgramT

    _patch_generated_flatbuffer_aliases()
    data = overlapping(4, 2)
    packed = ProgramT.InitFromPackedBuf(data)
    plan = packed.executionPlan[0]
    if table == "instructions":
        plan.chains[0].instructions = [Shared(plan.chains[0].instructions[0])] * count
    else:
        plan.values = [Shared(plan.values[1])] * count
    builder = flatbuffers.Builder()
    builder.Finish(packed.Pack(builder), file_identifier=data[4:8])
    return bytes(builder.Output())


# -- one run over all of them ------------------------------------------------------------------

CRAFTED = {
    "overlapping.pte": lambda: overlapping(50_000, 5_000),
    "shared-list.pte": lambda: shared_list(50_000, 10_000),
    "reductions.pte": lambda: reductions(30_000, 1 << 20),
    "huge-sizes.pte": lambda: huge_sizes(1_000, 100, dims=2),
    "overflowing-sizes.pte": lambda: huge_sizes(1_000, 100, dims=3),
    "many-instructions.pte": lambda: declared_many_times("instructions", 1_000_000),
    "many-values.pte": lambda: declared_many_times("values", 1_000_000),
}


def crafted(name: str) -> bytes:
    """The bytes of `CRAFTED[name]`, built once and kept under a folder keyed by this file's source and
    ExecuTorch's version (building them through the serializer takes ~20 s; they never change
    otherwise), written atomically so a killed run leaves no half program behind."""
    import hashlib
    from importlib import metadata

    from qlint.io.writes import write_atomic

    key = hashlib.sha256(Path(__file__).read_bytes() + metadata.version("executorch").encode()).hexdigest()[:16]
    target = cache_home() / "qlint-test-crafted-pte" / key / name
    if target.exists():
        return target.read_bytes()
    data = CRAFTED[name]()
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(target, data)
    return data


def _limit_cpu() -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS + 10))


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every crafted program checked in one qlint run: its JSON report, stderr lines, exit code,
    and the memory each `.pte` child added, by artifact."""
    folder = tmp_path_factory.mktemp("hostile-pte")
    for name in CRAFTED:
        (folder / name).write_bytes(crafted(name))
    (folder / "measured.py").write_text(MEASURED)
    memory = folder / "memory.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(folder)]), "QLINT_TEST_MEMORY": str(memory)}
    result = subprocess.run(
        [sys.executable, "-c", PROBE, "check", "--no-cache", *CRAFTED, "--output-format", "json"],
        capture_output=True, text=True, cwd=folder, env=env, preexec_fn=_limit_cpu, timeout=600,
    )
    sizes = {name: (folder / name).stat().st_size for name in CRAFTED}
    added = dict(json.loads(line) for line in memory.read_text().splitlines())
    return {"code": result.returncode, "report": json.loads(result.stdout), "err": result.stderr.splitlines(),
            "added": added, "sizes": sizes}


def outcome(checked: dict[str, Any], name: str) -> tuple[Any, Any, Any]:
    """(stats, memory plan, error message) of one artifact; the others None. Its child stayed
    within EXTRA_MIB; an error is exactly one stderr line."""
    report = checked["report"]
    assert name in checked["added"], f"{name}: its child ended before it reported (a CPU or memory kill)"
    assert checked["added"][name] < EXTRA_MIB << 20, (name, checked["added"][name] >> 20)
    stats = [s for s in report["artifacts"] if s["artifact"] == name]
    plans = [m for m in report["memory"] if m["artifact"] == name]
    errors = [e["message"] for e in report["errors"] if e["artifact"] == name]
    lines = [line for line in checked["err"] if line.startswith(f"qlint: error: {name}: ")]
    assert len(lines) == len(errors) <= 1 and len(stats) + len(errors) == 1, (stats, errors, lines)
    assert not errors or lines == [f"qlint: error: {name}: {errors[0]}"]
    return (stats or [None])[0], (plans or [None])[0], (errors or [None])[0]


def test_the_run_ends_with_a_report_and_one_line_per_refusal(checked: dict[str, Any]) -> None:
    assert checked["code"] == 2  # some are refused
    assert not any("Traceback" in line for line in checked["err"]), checked["err"]
    assert len(checked["err"]) == len(checked["report"]["errors"]) == 4, checked["err"]
    assert set(checked["added"]) == set(CRAFTED)  # every one was read in a child, none was killed
    assert checked["sizes"]["overlapping.pte"] < 3 << 20


def test_fifty_thousand_instructions_over_overlapping_lifetimes_are_read(checked: dict[str, Any]) -> None:
    """Every tensor is live from its first write to its last: covering the live set anew at
    every step would cost 50,000 x 5,000; the timeline is one sweep."""
    stats, plan, error = outcome(checked, "overlapping.pte")
    assert error is None and stats["nodes"] == 50_000
    assert len(plan["timeline"]["total"]) == 50_001  # the inputs, then each instruction
    assert plan["peak"]["bytes"] == plan["arena_bytes"] == 128  # both offsets, aliases counted once


def test_one_list_read_by_every_instruction_is_refused(checked: dict[str, Any]) -> None:
    """50,000 instructions reading one 10,000-tensor list: 500 million reads from 2.4 MB."""
    _, _, error = outcome(checked, "shared-list.pte")
    assert error == ("its tables and the values its instructions read, list items one by one, are over 500000 "
                     "entries (limits.pte_entries in .qlint.yaml)")


def test_a_constant_reduced_thirty_thousand_times_is_not_computed(checked: dict[str, Any]) -> None:
    stats, plan, error = outcome(checked, "reductions.pte")
    assert error is None and stats["nodes"] == 30_000 and plan["peak"]["bytes"] == 8


def test_sizes_near_the_integer_limits(checked: dict[str, Any]) -> None:
    """Two dimensions of 2**31 - 1 bytes fit in int64 and are read as declared; three overflow
    the element count and are refused."""
    _, plan, error = outcome(checked, "huge-sizes.pte")
    assert error is None and plan["peak"]["bytes"] == ((1 << 31) - 1) ** 2  # all of them alias one range
    _, _, error = outcome(checked, "overflowing-sizes.pte")
    assert error.startswith("not a valid .pte program: "), error


@pytest.mark.parametrize("name, limit", [
    ("many-instructions.pte", "declares over 100000 instructions (limits.pte_instructions in .qlint.yaml)"),
    ("many-values.pte", "declares over 500000 values, instructions and other tables "
                        "(limits.pte_entries in .qlint.yaml)"),
])
def test_tables_declared_a_million_times_are_refused_before_decoding(
    checked: dict[str, Any], name: str, limit: str
) -> None:
    """Decoding a million instructions or values would take seconds and hundreds of MB: the
    counts are read from the flatbuffer first."""
    _, _, error = outcome(checked, name)
    assert error == limit and checked["added"][name] < 32 << 20, (error, checked["added"][name] >> 20)


# -- in this process ------------------------------------------------------------------------------


def test_limits_on_pte_reading_are_configurable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    small = tmp_path / "small.pte"
    small.write_bytes(overlapping(40, 8))
    config = tmp_path / ".qlint.yaml"
    for limits, message in [
        ("{pte_instructions: 39}", "declares over 39 instructions (limits.pte_instructions in .qlint.yaml)"),
        ("{pte_entries: 50}", "declares over 50 values, instructions and other tables "
                              "(limits.pte_entries in .qlint.yaml)"),
        ("{pte_entries: 100}", "its tables and the values its instructions read, list items one by one, are over 100 "
                               "entries (limits.pte_entries in .qlint.yaml)"),
    ]:
        config.write_text(f"limits: {limits}\n")
        code, out, err = run_cli(["check", "--no-cache", "--config", str(config), str(small)], capsys)
        assert (code, err.strip()) == (2, f"qlint: error: {small}: {message}")
    config.write_text("limits: {pte_instructions: 40, pte_entries: 300}\n")
    code, out, err = run_cli(["check", "--no-cache", "--config", str(config), str(small)], capsys)
    assert code == 0 and not err, err


def test_the_timeline_sweep_equals_covering_the_live_buffers_at_every_step() -> None:
    """Aliases (overlapping offsets), empty and inverted lifetimes, zero sizes, negative starts."""
    from qlint.device.memory import _covered, timeline
    from qlint.records.results import Buffer

    rng = random.Random(7)
    for _ in range(500):
        buffers = []
        for _ in range(rng.randint(1, 24)):
            start = rng.randint(-2, 16)
            buffers.append(Buffer(start, start + rng.randint(-2, 8), rng.choice([0, 16, 32, rng.randint(0, 64)]),
                                  rng.choice([0, 16, rng.randint(0, 48)]), rng.random() < 0.5, rng.random() < 0.3))
        if max(b.end for b in buffers) < 0:
            continue
        series = timeline(buffers)
        assert series is not None
        steps = range(max(b.end for b in buffers) + 1)
        live = [[b for b in buffers if b.start <= step <= b.end] for step in steps]
        assert series.total == tuple(_covered(bs) for bs in live)
        assert series.fp32 == tuple(_covered(b for b in bs if b.fp32) for bs in live)
