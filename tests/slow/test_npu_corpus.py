"""ExecuTorch's own Arm Ethos-U tests as a differential corpus for qlint's NPU lowering: for each
model and op case of `backends/arm/test`, quantized with qlint's NPU quantizer and lowered as Arm's
flow does, qlint's partitions and the CPU ops around them (`lint_program` on the quantized program)
must be what the `.pte` of that lowering runs, read by ExecuTorch's deserializer: as many delegate
calls, and the same CPU kernels in the same places between them. Every op qlint reports as falling
back (QL010) must carry a cause derived from ExecuTorch's checks, never the partitioner's generic
sentence.

Programs and `.pte` files are built once per stack and source version and cached
(`npu_corpus.corpus`). Linting lowers again (ExecuTorch's Arm passes and Vela: the LSTM's alone
takes 20-27 s), so every case is linted for the Ethos-U55 and, for the Ethos-U85, the two op cases
the U55 leaves on the CPU (`U85_LINTED`); qlint's `.pte` reader reads the `.pte` of every case for
both NPUs, which costs only the reading."""

from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

import npu_corpus as npu_lib
import pytest
from conftest import ROOT

U55, U85 = npu_lib.NPUS

# Arm's model tests the corpus cannot take on this stack: DeiT-tiny (timm, torchvision and pretrained
# weights, a download), Conformer and wav2letter (torchaudio). A module lost any other way (one that
# stops importing, a recipe that no longer finds its case) fails here, not silently.
MAX_SKIPPED = 3


@dataclass(frozen=True)
class Checked:
    """One case on one NPU: what qlint says of its quantized program, and what its `.pte` runs."""

    partitions: int | None
    qlint: list[str]          # delegate calls (NPU) and CPU compute ops, in graph order
    pte: list[str]            # DelegateCall and compute KernelCalls of the `.pte`'s plan, in order
    fallbacks: list[dict[str, Any]]   # the QL010 findings' details
    placed: list[tuple[str, int | None, bool]]   # QL010's op, the partition it follows, whether it splits
    miswired: list[str]       # QL007 errors: a delegate call whose tensors are not its command stream's


@dataclass
class Run:
    corpus: npu_lib.Corpus
    checked: dict[tuple[str, str], Checked]   # (npu, stem) -> what was checked
    seconds: float


# The op cases the U55 does not delegate whole (a stride it has no kernel for, a `where` of a bool
# mask): on the U85 each is one partition.
U85_LINTED = ("test_conv2d__reject_suite.large_stride", "test_where__two_dim_tensor_cond")
# Read from its `.pte` only: linting lowers again, and the LSTM's lowering alone takes 20-27 s (it is one
# partition with nothing on the CPU, as its `.pte` shows).
NOT_LINTED = ("test_lstm_arm",)


def linted_on(accelerator: str, stems: dict[str, Any]) -> list[str]:
    """The cases linted for `accelerator`: all but `NOT_LINTED` on the U55, `U85_LINTED` on the U85."""
    return sorted(s for s in stems if (accelerator == U55 and s not in NOT_LINTED) or s in U85_LINTED)


def qlint_sequence(lowered: Any, program: Any) -> list[str]:
    """The delegate calls and the ops qlint's partitions put on the CPU, in the lowered graph's order."""
    from qlint.analysis.partitions import partitions
    from qlint.loading.view import GraphView, op_name

    found = partitions(GraphView(lowered, quantized=program))
    cpu = {f.node for f in found.fallbacks}
    return [npu_lib.NPU if node in found.delegates else ".".join(op_name(node).split(".")[:2])
            for node in lowered.graph.nodes if node in found.delegates or node in cpu]


def check(accelerator: str, stem: str, built: npu_lib.Corpus) -> Checked:
    import torch

    from qlint.full.lint import lint_program
    from qlint.settings.config import Config
    from qlint.settings.npus import npu

    program = torch.export.load(str(built.built[accelerator][stem]))
    linted = lint_program(program, stem, replace(Config(root=ROOT), npu=npu(accelerator)))
    reference = npu_lib.cpu_compute(npu_lib.plan_steps(built.ptes[accelerator][stem].read_bytes()))
    fallbacks = [f.details for f in linted.findings if f.code == "QL010"]
    miswired = [f.message for f in linted.findings if f.code == "QL007" and "stream_inputs" in f.details]
    return Checked(linted.stats.partitions, qlint_sequence(linted.lowered, program), reference, fallbacks,
                   placed(fallbacks), miswired)


def placed(fallbacks: list[dict[str, Any]]) -> list[tuple[str, int | None, bool]]:
    return [(d["op"], d["after_partition"], d["splits"]) for d in fallbacks]


@pytest.fixture(scope="module")
def run() -> Run:
    built = npu_lib.corpus()
    assert built.built[U55], "no case of ExecuTorch's Arm tests could be built"
    start = time.monotonic()
    checked = {(a, s): check(a, s, built) for a in npu_lib.NPUS for s in linted_on(a, built.ptes[a])}
    seconds = time.monotonic() - start
    print(f"\nnpu corpus: {len(built.built[U55])} cases ({'built' if built.cold else 'cached'}), "
          f"{len(built.skipped)} skipped; {len(checked)} linted in {seconds:.0f} s", file=sys.stderr)
    for (accelerator, stem), seen in sorted(checked.items()):
        print(f"  {accelerator} {stem}: {seen.partitions} partitions, CPU {[o for o in seen.pte if o != npu_lib.NPU]}",
              file=sys.stderr)
    return Run(built, checked, seconds)


def test_no_more_cases_are_skipped_than_the_stack_explains(run: Run) -> None:
    assert len(run.corpus.skipped) <= MAX_SKIPPED, run.corpus.skipped


def test_every_case_is_quantized_lowered_and_serialized_for_both_npus(run: Run) -> None:
    assert run.corpus.failed == {U55: {}, U85: {}}
    cases = len(npu_lib.MODELS) + len(npu_lib.OPS) - len(run.corpus.skipped)
    assert [len(run.corpus.ptes[a]) for a in npu_lib.NPUS] == [cases, cases]


def test_partitions_and_cpu_ops_are_what_the_pte_runs(run: Run) -> None:
    wrong = [f"{a} {stem}: qlint {seen.partitions} partitions {seen.qlint} != .pte {seen.pte}"
             for (a, stem), seen in sorted(run.checked.items())
             if seen.partitions != seen.pte.count(npu_lib.NPU) or seen.qlint != seen.pte]
    assert not wrong, "\n".join(wrong)


# The causes QL010 states on the corpus (docs/benchmarks.md): the U55's conv2d check on the stride, a
# bool operand the U55's integer-only profile refuses, and the U55's operator list.
CAUSES = {
    ("test_conv2d__reject_suite.large_stride", "aten.convolution.default"):
        ["Failed condition on stride, pad and dilation combination"],
    ("test_where__two_dim_tensor_cond", "aten.where.self"):
        ["a bool input (aten_gt_tensor) that U55's integer-only TOSA profile does not take",
         "`where`: no U55 operator"],
}


def test_every_npu_fallback_has_a_derived_cause(run: Run) -> None:
    findings = [(a, stem, d) for (a, stem), seen in sorted(run.checked.items()) for d in seen.fallbacks]
    assert findings, "the corpus has ops the U55 leaves to the CPU (a large-stride conv, where): none reported"
    generic = [f"{a} {stem} {d['op']}: {d['causes']}" for a, stem, d in findings
               if not d["causes"] or any(not c.strip() or "BaseTOSASupportList" in c for c in d["causes"])]
    assert not generic, "\n".join(generic)
    seen = Counter(c for _, _, d in findings for c in d["causes"])
    print("\nQL010 causes in the npu corpus:\n" + "\n".join(f"  {n} x {c}" for c, n in seen.most_common()),
          file=sys.stderr)
    assert {(stem, d["op"]): d["causes"] for _, stem, d in findings} == CAUSES
    assert {a for a, _, _ in findings} == {U55}


# The `.pte` qlint's reader refuses, and why. On the U55, `where`'s partition is a `full_like` of its
# input's shape: Vela compiles it with no input, yet the DelegateCall passes the input and the output,
# and EthosUBackend takes the outputs after the blob's input count, so the NPU would write its output
# into the input tensor and the `where` would read an output never written.
REFUSED = {(U55, "test_where__two_dim_tensor_cond"):
           "not a valid .pte program: a call of delegate 0 passes 2 values; its blob reads 0 and writes 1"}


def test_every_pte_reads_as_the_program_it_was_lowered_from(run: Run) -> None:
    """qlint's `.pte` reader on the `.pte` of every case for both NPUs: each is read (but `REFUSED`),
    its partitions are the plan's DelegateCalls, its QL010 findings ops the plan runs on the CPU,
    and, for the cases linted, the same findings in the same places as the lint of the `.pt2` (a
    `.pte` of no partition is read as a CPU program: it does not say which NPU it was lowered for)."""
    from qlint.full.lint import lint_pte
    from qlint.io.reads import ReadError
    from qlint.settings.config import Config

    wrong, refused = [], {}
    for accelerator, ptes in sorted(run.corpus.ptes.items()):
        for stem, path in sorted(ptes.items()):
            data = path.read_bytes()
            try:
                report = lint_pte(data, path.name, Config())
            except ReadError as exc:
                refused[(accelerator, stem)] = str(exc)
                continue
            [stats] = report.stats
            sequence = npu_lib.cpu_compute(npu_lib.plan_steps(data))
            found = [f.details for f in report.findings if f.code == "QL010"]
            ops = [".".join(d["op"].split(".")[:2]) for d in found]
            calls = sequence.count(npu_lib.NPU)
            # a `.pte` with no delegate call does not record the NPU it was lowered for: a CPU program
            expected = (accelerator, calls) if calls else (stats.target, None)
            if (stats.target, stats.partitions) != expected or not set(ops) <= set(sequence) or (not calls and ops):
                wrong.append(f"{accelerator} {stem}: {stats.target} {stats.partitions} partitions, QL010 {ops}, "
                             f"plan {sequence}")
            linted = run.checked.get((accelerator, stem))
            if linted is not None and calls and placed(found) != linted.placed:
                wrong.append(f"{accelerator} {stem}: .pte QL010 {placed(found)} != .pt2 QL010 {linted.placed}")
    assert not wrong, "\n".join(wrong)
    assert refused == REFUSED


def test_the_lint_of_the_pt2_reports_the_call_the_pte_reader_refuses(run: Run) -> None:
    """The miswired call `REFUSED` names is a QL007 error on the lint of the program it was lowered from."""
    miswired = {key: seen.miswired for key, seen in run.checked.items() if seen.miswired}
    assert miswired == {(U55, "test_where__two_dim_tensor_cond"): [
        "lowered program cannot run as lowered: NPU partition 1 is called with 1 input and 1 output, and Vela's "
        "command stream for it reads 0 and writes 1: the Ethos-U backend would write its outputs over other "
        "tensors"]}
