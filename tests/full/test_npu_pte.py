"""The `.pte` Arm's Ethos-U flow writes, read as it ships: each delegate call a node of the rebuilt
graph, each delegate's Vela blob read for its SRAM and flash, the CPU ops between the partitions
reported (QL010), and a crafted delegate refused with one line.

Three programs of the NPU table are lowered once for the module (each lowering runs Vela): the
attention whose division stays float (2 partitions), the conv block whose hardswish stays float
(3) and the embedding whose lookup stays float (1)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, run_cli

from qlint.full.npu import NO_REASONS
from qlint.io.vela import NpuBlob

U55 = "ethos-u55-128"
ATTENTION, CONV, EMBEDDING, MIXING = FACTORIES = ("make_attention", "make_conv_hardswish", "make_embedding",
                                                  "make_token_mixing")


@dataclass(frozen=True)
class Shipped:
    """One lowering's `.pte` and what the lowered program itself says."""

    path: Path
    data: bytes
    calls: int                                  # DelegateCall instructions in its plan
    blobs: tuple[NpuBlob, ...]                  # `ethos_u.delegates` of the lowered program
    fallbacks: list[tuple[str, str, int | None, bool]]  # QL010 on the lowered program: op, dtype, after, splits


@pytest.fixture(scope="module")
def shipped(quantized: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Shipped]:
    from executorch.exir._serialize._program import deserialize_pte_binary

    from qlint.full.rules import run_rules
    from qlint.loading import ethos_u
    from qlint.loading.view import GraphView
    from qlint.settings.config import Config
    from qlint.settings.npus import npu

    folder = tmp_path_factory.mktemp("npu-pte")
    config = replace(Config(root=ROOT), npu=npu(U55))
    built = {}
    for factory in FACTORIES:
        program = quantized(factory, npu=U55)
        lowering = ethos_u.lower(program, npu(U55))
        blobs, _ = ethos_u.delegates(lowering.program)
        linted = run_rules(GraphView(lowering.program, quantized=program), factory, config,
                           delegation=lowering.delegation)
        data = bytes(lowering.edge.to_executorch().buffer)
        plan = deserialize_pte_binary(data).program.execution_plan[0]
        calls = sum(type(i.instr_args).__name__ == "DelegateCall" for i in plan.chains[0].instructions)
        path = folder / f"{factory}.pte"
        path.write_bytes(data)
        built[factory] = Shipped(path, data, calls, tuple(blobs.values()), [
            (f.details["op"], f.details["dtype"], f.details["after_partition"], f.details["splits"])
            for f in linted.findings if f.code == "QL010"])
    return built


def test_a_delegated_pte_reports_its_partitions_delegates_and_cpu_fallbacks(shipped: dict[str, Shipped]) -> None:
    run = subprocess.run([sys.executable, "-m", "qlint", "check", "--output-format", "json",
                          *(str(s.path) for s in shipped.values())], capture_output=True, text=True, cwd=ROOT)
    report = json.loads(run.stdout)
    assert (run.returncode, report["errors"]) == (1, [])  # QL010 warnings
    stats = {Path(a["artifact"]).stem: a for a in report["artifacts"]}
    assert {name: s.calls for name, s in shipped.items()} == {ATTENTION: 2, CONV: 3, EMBEDDING: 1, MIXING: 2}
    for name, expected in shipped.items():
        got = stats[name]
        assert (got["target"], got["partitions"]) == (U55, expected.calls)
        assert [(d["sram"], d["flash"], d["command_stream"]) for d in got["delegates"]] == [
            (b.sram, b.flash, b.command_stream) for b in expected.blobs]
        findings = [f for f in report["findings"] if f["code"] == "QL010" and Path(f["artifact"]).stem == name]
        assert [(f["details"]["op"], f["details"]["dtype"], f["details"]["after_partition"], f["details"]["splits"])
                for f in findings] == expected.fallbacks
        assert all(f["message"].endswith(NO_REASONS) and f["details"]["npu"] == U55 for f in findings)
        # each call's tensors are its command stream's: QL007 only says the NPU's values are not run here
        assert [(f["severity"], f["details"].get("unchecked")) for f in report["findings"]
                if f["code"] == "QL007" and Path(f["artifact"]).stem == name] == [("info", "npu")]
    assert shipped[ATTENTION].fallbacks == [("aten.div.Tensor", "float32", 1, True)]
    assert shipped[EMBEDDING].fallbacks == [("aten.index_select.default", "float32", None, False)]
    assert shipped[MIXING].fallbacks == [("aten.permute_copy.default", "float32", 1, True)]  # a data move that splits


def test_a_delegated_pte_plans_its_memory_with_the_delegates_outputs(shipped: dict[str, Shipped]) -> None:
    from qlint.io.limits import Limits
    from qlint.loading.pte import read_pte

    read = read_pte(shipped[ATTENTION].data, Limits())
    assert read.steps.count("DelegateCall") == 2
    produced = [(b.what, b.size) for b in read.buffers if b.what.endswith("output of DelegateCall")]
    assert produced == [("int8 [1, 16, 16], output of DelegateCall", 256),
                        ("int8 [1, 16, 32], output of DelegateCall", 512)]
    assert read.delegation is not None
    assert (read.delegation.npu, read.delegation.tosa_spec, read.delegation.rejections) == (
        U55, "TOSA-1.0+INT+int16+int4+u55", {})
    assert read.delegation.ops == {"executorch_call_delegate": 1, "executorch_call_delegate_1": 1}


def crafted(data: bytes, change: Callable[[Any], None]) -> bytes:
    """The program in `data` with `change` made to its schema objects, written by ExecuTorch's serializer."""
    from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary

    pte = deserialize_pte_binary(data)
    change(pte.program)
    return bytes(serialize_pte_binary(pte))


def blob_edit(offset: int, value: bytes) -> Callable[[Any], None]:
    """Overwrite bytes of delegate 0's blob at `offset` (in its header: 16-byte name, u32 length)."""
    def change(program: Any) -> None:
        blob = bytearray(program.backend_delegate_data[0].data)
        blob[offset:offset + len(value)] = value
        program.backend_delegate_data[0].data = bytes(blob)
    return change


def block_offset(blob: bytes, name: bytes) -> int:
    """Where the header of the block `name` starts in a Vela blob."""
    import struct

    pos = 0
    while blob[pos:pos + 16].rstrip(b"\0") != name:
        pos += 32 + (struct.unpack_from("<I", blob, pos + 16)[0] + 15) // 16 * 16
    return pos


def first_delegate_call(program: Any) -> Any:
    return next(i.instr_args for i in program.execution_plan[0].chains[0].instructions
                if type(i.instr_args).__name__ == "DelegateCall")


def edit(what: str, blob: bytes) -> Callable[[Any], None]:
    import struct

    if what == "length":
        return blob_edit(block_offset(blob, b"cmd_data") + 16, struct.pack("<I", 1 << 30))
    if what == "inputs":
        return blob_edit(block_offset(blob, b"inputs") + 32, struct.pack("<i", 1 << 30))
    if what == "backend":
        return lambda p: setattr(p.execution_plan[0].delegates[0], "id", "XnnpackBackend")
    if what == "data index":
        return lambda p: setattr(p.execution_plan[0].delegates[0].processed, "index", 7)
    if what == "delegate index":
        return lambda p: setattr(first_delegate_call(p), "delegate_index", 5)
    return lambda p: setattr(first_delegate_call(p), "args", first_delegate_call(p).args[:1])


@pytest.mark.parametrize(("what", "message"), [
    ("length", "Ethos-U delegate blob's 'cmd_data' block claims 1073741824 bytes; {after} follow it"),
    ("inputs", "Ethos-U delegate blob's inputs block claims 1073741824 tensors in 40 bytes"),
    ("backend", "delegate 0 is for backend 'XnnpackBackend'; only EthosUBackend delegates are read"),
    ("data index", "not a valid .pte program: delegate 0's data index 7 out of range"),
    ("delegate index", "not a valid .pte program: delegate index 5 out of range"),
    ("arguments", "not a valid .pte program: a call of delegate 0 passes 1 values; its blob reads 1 and writes 1"),
])
def test_a_crafted_delegate_is_refused_with_one_line(shipped: dict[str, Shipped], tmp_path: Path, what: str,
                                                     message: str, capsys: pytest.CaptureFixture[str]) -> None:
    from executorch.exir._serialize._program import deserialize_pte_binary

    data = shipped[EMBEDDING].data
    blob = bytes(deserialize_pte_binary(data).program.backend_delegate_data[0].data)
    after = len(blob) - block_offset(blob, b"cmd_data") - 32
    path = tmp_path / f"{what.replace(' ', '_')}.pte"
    path.write_bytes(crafted(data, edit(what, blob)))
    code, _, err = run_cli(["check", str(path)], capsys)
    assert (code, err) == (2, f"qlint: error: {path}: {message.format(after=after)}\n")


@pytest.mark.model("make_attention@npu")
def test_npu_coverage_from_a_pte_says_it_counts_calls_where_the_pt2_counts_ops(
        shipped: dict[str, Shipped], quantized: Callable[..., Any]) -> None:
    """One program read both ways: its `.pt2` counts the ops each partition runs (its 2 partitions run 12
    of its 13 compute ops), its `.pte` only the calls (2 of 3), and says so in the finding and the stats."""
    from qlint.full.lint import lint_program, lint_pte
    from qlint.settings.config import Config
    from qlint.settings.npus import npu

    linted = lint_program(quantized(ATTENTION, npu=U55), ATTENTION, replace(Config(root=ROOT), npu=npu(U55)))
    read = lint_pte(shipped[ATTENTION].data, "attention.pte", Config())
    [stats] = read.stats
    assert (round(linted.stats.coverage, 4), linted.stats.coverage_counts) == (0.9231, "ops")
    assert (round(stats.coverage, 4), stats.coverage_counts) == (0.6667, "calls")
    [coverage] = [f for f in read.findings if f.code == "QL005"]
    assert coverage.message == (
        "NPU coverage 66.6% < 90%, each of the 2 NPU partitions counted as one op (a .pte does not record how "
        "many ops a partition runs): 1 of 3 compute ops run on the CPU (div x1); main cause (1 ops): " + NO_REASONS)
    assert coverage.details["counts"] == "calls"
    assert [f.code for f in linted.findings if f.code == "QL005"] == []  # 92.3% of its ops: over the threshold
