"""ExecuTorch's own Cortex-M test cases, quantized as its tester does, as a differential corpus:
qlint, lowering with the stock pass order, must count exactly the floating-point compute ops that
the stock Cortex-M flow leaves in each program, and report QL003 wherever that flow raises; and
the `.pte` that flow writes from each program it lowers must read as that program.

The reference is counted here, independently of qlint's graph view, from the dtypes recorded on
the stock-lowered graph (`executorch_corpus.fp32_compute_ops`). Programs are built once per stack
and test-source version and cached (`executorch_corpus.corpus`)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import executorch_corpus as corpus_lib
import pytest
from conftest import ROOT

from qlint.analysis import conditions


@dataclass
class Run:
    corpus: corpus_lib.Corpus
    references: dict[str, corpus_lib.Reference]
    report: dict[str, Any]
    seconds: float   # the qlint check process alone

    def findings(self, stem: str, *codes: str) -> list[dict[str, Any]]:
        return [f for f in self.report["findings"] if Path(f["artifact"]).stem == stem and f["code"] in codes]

    def fp32_ops(self, stem: str) -> Counter[str]:
        """qlint's fp32 compute ops of one artifact: the ops of its islands, which QL001 and QL002
        report one finding each (every float compute op belongs to exactly one island), and of the
        work it computes from constants alone (QL008, one finding per connected group)."""
        ops: Counter[str] = Counter()
        for finding in self.findings(stem, "QL001", "QL002", "QL008"):
            ops.update(finding["details"]["ops"])
        return ops


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """One `qlint check` process over every built program; the stock references are computed (or
    read from their cache) while it runs."""
    built = corpus_lib.corpus()
    assert built.built, "no case of ExecuTorch's Cortex-M tests could be built"
    config = tmp_path_factory.mktemp("corpus-config") / "qlint.yaml"
    config.write_text("target_cpu: cortex-m55\n")  # the tester's default target
    command = [sys.executable, "-m", "qlint", "check", "--config", str(config), "--no-cache", "--lowering", "stock",
               "--output-format", "json", "--exit-zero", "."]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    start = time.monotonic()
    child = subprocess.Popen(command, cwd=built.folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        references = corpus_lib.references(built)
        out, err = child.communicate(timeout=1800)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    seconds = time.monotonic() - start
    print(f"\ncorpus: {len(built.built)} programs ({'built' if built.cold else 'cached'}), "
          f"{len(built.failed)} failed to build, {len(built.skipped)} skipped; qlint check {seconds:.0f} s",
          file=sys.stderr)
    assert child.returncode == 0, f"qlint check exited {child.returncode}:\n{err[-4000:]}"
    return Run(built, references, json.loads(out), seconds)


def test_every_built_program_is_checked(run: Run) -> None:
    """No program of the corpus is refused or lost by qlint, and the build itself mostly worked
    (a cache of nothing would make every comparison below pass)."""
    assert not run.report["errors"], run.report["errors"]
    checked = {Path(a["artifact"]).stem for a in run.report["artifacts"]}
    assert checked == set(run.corpus.built)
    assert set(run.references) == set(run.corpus.built)
    assert len(run.corpus.failed) <= len(run.corpus.built) // 20, run.corpus.failed


# The test modules the corpus cannot take on this stack, each for a dependency outside it: MobileNet
# v2 and v3 (torchvision, pretrained weights), wav2letter (torchaudio), YOLO11 (ultralytics). A case
# lost any other way (a module that stops importing, a case without a model) fails here, not silently.
MAX_SKIPPED = 4


def test_no_more_cases_are_skipped_than_the_stack_explains() -> None:
    skipped = corpus_lib.corpus().skipped
    assert len(skipped) <= MAX_SKIPPED, skipped


def test_fp32_ops_match_the_stock_flow(run: Run) -> None:
    mismatches = []
    for stem, reference in sorted(run.references.items()):
        if reference.error is not None or run.findings(stem, "QL003"):
            continue  # the next test holds these
        stock, qlint = Counter(reference.fp32_ops), run.fp32_ops(stem)
        if stock != qlint:
            mismatches.append(f"{stem}: stock {dict(sorted(stock.items()))} != qlint {dict(sorted(qlint.items()))}")
    assert not mismatches, f"{len(mismatches)} of {len(run.references)} programs:\n" + "\n".join(mismatches)


def test_stock_lowering_failures_are_ql003(run: Run) -> None:
    """QL003 exactly where the stock flow raises, naming the pass that raised."""
    wrong = []
    for stem, reference in sorted(run.references.items()):
        reported = run.findings(stem, "QL003")
        if reference.error is None:
            if reported:
                wrong.append(f"{stem}: QL003 ({reported[0]['message']}) but the stock flow lowers it")
            continue
        if not reported:
            wrong.append(f"{stem}: the stock flow raised ({reference.error}), no QL003")
            continue
        expected = corpus_lib.failed_pass(reference.error)
        if expected is not None and reported[0]["details"]["pass_name"] != expected:
            wrong.append(f"{stem}: QL003 names {reported[0]['details']['pass_name']}, the stock flow {expected}")
    assert not wrong, "\n".join(wrong)


def test_no_lowering_of_the_corpus_changes_the_values(run: Run) -> None:
    """QL007's value check runs every lowered program of ExecuTorch's Cortex-M tests against its quantized
    program on its sample inputs: none diverges (docs/checks.md, "Values"), and every QL007 the corpus
    has is a program that cannot run, each naming its node."""
    diverged = [f"{f['artifact']}: {f['message']}" for stem in run.corpus.built
                for f in run.findings(stem, "QL007") if "steps" in f["details"]]
    assert not diverged, "\n".join(diverged)


def test_every_fp32_island_has_a_cause(run: Run) -> None:
    islands = [f for stem in run.corpus.built for f in run.findings(stem, "QL002")]
    assert islands, "the corpus has fp32 islands (NCHW convolutions, broadcasts): none reported"
    empty = [f"{f['artifact']}: {f['message']}" for f in islands if not f["details"]["reason"].strip()]
    assert not empty, "\n".join(empty)


# A cause names a failed condition, a missing pattern, what the lowering required, or a fact of the
# island itself; never a refusal it cannot explain.
EXPLAINED = ("refused it (", "no CortexMQuantizer pattern", "matches CortexMQuantizer",
             "runtime (non-constant) operand", "data-dependent normalization", "constant",
             "part of F.scaled_dot_product_attention", "fast path")


def test_every_cause_names_a_condition_pattern_or_kernel(run: Run) -> None:
    islands = [f for stem in run.corpus.built for f in run.findings(stem, "QL002")]
    unexplained = [f"{f['artifact']}: {f['details']['reason']}" for f in islands
                   if "the condition is not one qlint knows" in f["details"]["reason"]
                   or not any(part in f["details"]["reason"] for part in EXPLAINED)]
    assert not unexplained, "\n".join(unexplained)
    refusals = [f["details"]["reason"] for f in islands if "refused it (" in f["details"]["reason"]]
    assert refusals and all("refused it (" in r and "): " in r for r in refusals)


def test_no_cause_contradicts_the_case(run: Run) -> None:
    """Held against facts of the case the cause was not derived from: a case whose 4-D inputs are all
    channels_last is never told to export channels_last, and the operand shapes a cause names differ."""
    import re

    import torch

    inputs = {case.stem: case.example_inputs() if callable(case.example_inputs) else case.example_inputs
              for case in corpus_lib.collect().cases}
    wrong = []
    for stem in run.corpus.built:
        four_d = [t for t in inputs[stem] if isinstance(t, torch.Tensor) and t.dim() == 4]
        all_channels_last = bool(four_d) and all(t.is_contiguous(memory_format=torch.channels_last)
                                                 and not t.is_contiguous() for t in four_d)
        for finding in run.findings(stem, "QL002"):
            reason = finding["details"]["reason"]
            if all_channels_last and "memory_format=torch.channels_last" in reason:
                wrong.append(f"{stem}: channels_last inputs told to export channels_last: {reason}")
            for first, second in re.findall(r"operand shapes (\[[^\]]*\]) and (\[[^\]]*\])", reason):
                if first == second:
                    wrong.append(f"{stem}: equal operand shapes told to broadcast: {reason}")
    assert not wrong, "\n".join(wrong)


def _annotated_graph(case: corpus_lib.Case) -> Any:
    """The float graph as CortexMQuantizer annotates it: exported the tester's way (kept beside the
    corpus), then its own `transform_for_annotation`; None when the case does not export."""
    from executorch.backends.cortex_m.quantizer.quantizer import CortexMQuantizer

    exported = corpus_lib.float_export(case)
    return None if exported is None else CortexMQuantizer().transform_for_annotation(
        exported.module(check_guards=False))


def _matches(node: Any, pattern: tuple[Any, ...]) -> list[Any] | None:
    """The chain of nodes starting at `node` whose targets are `pattern`, each feeding only the next."""
    chain = [node]
    for target in pattern[1:]:
        users = list(chain[-1].users)
        if len(users) != 1 or users[0].target != target:
            return None
        chain.append(users[0])
    return chain if chain[0].target == pattern[0] else None


def _verdicts(graph: Any) -> list[tuple[str, str, bool, list[str]]]:
    """(node, checker, ExecuTorch's verdict, qlint's failed conditions) for every pattern match."""
    from executorch.backends.cortex_m.passes.passes_utils import skips_quantized_max_pool2d
    from executorch.backends.cortex_m.quantizer.quantizer_support import CORTEX_M_QUANTIZER_SUPPORT_DICT

    found = []
    for node in list(graph.graph.nodes):
        if node.op != "call_function":
            continue
        for pattern, checker in CORTEX_M_QUANTIZER_SUPPORT_DICT.items():
            match = _matches(node, pattern)
            if match is None:
                continue
            accepted = bool(checker.check_pattern(match))
            failed = [str(f) for f in conditions.PATTERN_CONDITIONS[checker.__name__](match)]
            found.append((node.name, checker.__name__, accepted, failed))
            if checker.__name__ == "CortexMMaxPool2DCheck":  # its refusal is a tag the lowering reads
                lowering = [str(f) for f in conditions.max_pool2d_lowering(node)]
                found.append((node.name, "lowering of max_pool2d", not skips_quantized_max_pool2d(node), lowering))
    return found


def test_conditions_agree_with_executorchs_checks_on_every_node() -> None:
    """qlint's written conditions (qlint.analysis.conditions) against ExecuTorch's own checks on every pattern
    match of every case's float graph as the quantizer annotates it: a check that refuses what the
    conditions accept, or the reverse, fails here (a new executorch release is noticed this way)."""
    collected = corpus_lib.collect()
    disagree, checked, refused = [], 0, 0
    for case in collected.cases:
        graph = _annotated_graph(case)
        if graph is None:  # the corpus test reports cases that do not export
            continue
        for node, checker, accepted, failed in _verdicts(graph):
            checked += 1
            refused += not accepted
            if accepted != (not failed):
                disagree.append(f"{case.stem} {node} {checker}: executorch {'accepts' if accepted else 'refuses'}, "
                                f"qlint's conditions {failed or 'accept'}")
    assert not disagree, "\n".join(disagree)
    # The corpus exercises both verdicts of the checks: a differential that saw no refusal proves nothing.
    assert checked > 300 and refused > 20, (checked, refused)


def test_every_stock_pte_is_read_as_the_program_it_was_written_from(run: Run) -> None:
    """The `.pte` that the stock flow's `to_executorch` writes from every program it lowers is read
    by qlint's `.pte` reader, none refused, with the fp32 compute ops of the stock reference. All are
    read in this process, about 2 s (a `qlint check` decodes each `.pte` in a child of its own: over a
    minute for these on two cores)."""
    from qlint.full.lint import lint_pte
    from qlint.io.reads import ReadError
    from qlint.settings.config import Config

    lowered = {stem for stem, ref in run.references.items() if ref.error is None}
    unserialized = {stem: ref.pte_error for stem, ref in run.references.items() if ref.pte_error is not None}
    assert not unserialized, f"to_executorch raised on {len(unserialized)} lowered programs: {unserialized}"
    written = corpus_lib.ptes(run.corpus, run.references)
    assert set(written) == lowered and len(written) >= len(run.corpus.built) - 5, (len(written), len(lowered))
    refused, mismatches = {}, []
    for stem, path in written.items():
        try:
            findings = lint_pte(path.read_bytes(), path.name, Config()).findings
        except ReadError as exc:
            refused[stem] = str(exc)
            continue
        ops = Counter(op for f in findings if f.code in ("QL001", "QL002", "QL008") for op in f.details["ops"])
        if ops != Counter(run.references[stem].fp32_ops):
            mismatches.append(f"{stem}: stock {run.references[stem].fp32_ops} != .pte {dict(sorted(ops.items()))}")
    print(f"\ncorpus .pte: {len(written)} written by the stock flow, {len(refused)} refused", file=sys.stderr)
    lines = [f"{stem}: {error}" for stem, error in refused.items()]
    assert not refused, f"{len(refused)} of {len(written)} refused:\n" + "\n".join(lines)
    assert not mismatches, "\n".join(mismatches)


# Published whole-model latencies of ExecuTorch's MLPerf Tiny test models' architectures with CMSIS-NN
# kernels (docs/cost-model.md, "Whole models"): validation rows, never fitted to. Each is estimated
# on its board where the table has it (its flash read cost), else on the bare core.
PUBLISHED = [  # (model, cpu, MHz, board, ms)
    ("deep_autoencoder", "cortex-m4", 120, "nucleo-l4r5zi", 8.605),
    ("deep_autoencoder", "cortex-m33", 128, "nrf5340-dk", 6.266),
    ("deep_autoencoder", "cortex-m4", 200, None, 4.887),
    ("deep_autoencoder", "cortex-m85", 480, "ek-ra8d1", 0.531),
    ("ds_cnn", "cortex-m4", 120, "nucleo-l4r5zi", 99.810), ("ds_cnn", "cortex-m33", 128, "nrf5340-dk", 76.086),
    ("ds_cnn", "cortex-m4", 200, None, 46.185), ("ds_cnn", "cortex-m33", 200, "ek-ra6m4", 50.571),
    ("ds_cnn", "cortex-m85", 480, "ek-ra8d1", 3.465),
    ("mobilenet_v1_025", "cortex-m4", 120, "nucleo-l4r5zi", 301.205),
    ("mobilenet_v1_025", "cortex-m33", 128, "nrf5340-dk", 232.019),
    ("mobilenet_v1_025", "cortex-m4", 200, None, 98.726),
    ("mobilenet_v1_025", "cortex-m33", 200, "ek-ra6m4", 162.364),
    ("mobilenet_v1_025", "cortex-m85", 480, "ek-ra8d1", 13.393),
    ("resnet8", "cortex-m4", 120, "nucleo-l4r5zi", 389.560), ("resnet8", "cortex-m33", 128, "nrf5340-dk", 316.156),
    ("resnet8", "cortex-m4", 200, None, 171.438), ("resnet8", "cortex-m33", 200, "ek-ra6m4", 246.184),
    ("resnet8", "cortex-m85", 480, "ek-ra8d1", 8.478),
]


def test_estimates_of_the_mlperf_tiny_models_are_within_1_5x_of_published_latencies() -> None:
    import torch

    from qlint.device.cost import core_for, estimate
    from qlint.loading.lowering import run_passes, to_edge
    from qlint.loading.view import GraphView
    from qlint.settings.boards import builtin_boards

    built = corpus_lib.corpus()
    boards = builtin_boards()
    ratios, views, edges = {}, {}, {}
    for model, cpu, mhz, name, ms in PUBLISHED:
        if (model, cpu) not in views:
            if model not in edges:  # to_edge is the same for every CPU: only the passes take one
                program = torch.export.load(str(built.folder / f"test_{model}__{model}.pt2"))
                edges[model] = program, to_edge(program).exported_program()
            program, edge = edges[model]
            views[(model, cpu)] = GraphView(run_passes(copy.deepcopy(edge), cpu), quantized=program)
        board = boards[name] if name else None
        assert board is None or (board.cpu, board.clock_hz) == (cpu, mhz * 1_000_000), name
        core = core_for(cpu, flash_read=(board.flash_read or 0.0) if board else 0.0)
        ratios[(model, cpu, mhz)] = estimate(views[(model, cpu)], core).cycles / (mhz * 1e3) / ms
    outside = {key: round(r, 2) for key, r in ratios.items() if not 1 / 1.5 <= r <= 1.5}
    assert not outside, outside


def test_a_depthwise_convolution_of_one_input_channel_is_priced_as_cmsis_nn_runs_it() -> None:
    """DS-CNN's first layer (1 -> 64 channels, 10x4): on MVE CMSIS-NN's depthwise wrapper runs it as a
    regular convolution (im2col and the matrix product), on DSP as a depthwise one."""
    import torch

    from qlint.device.cost import core_for, estimate
    from qlint.loading.lowering import run_passes, to_edge
    from qlint.loading.view import GraphView
    from qlint.settings.cycles import cost_table

    program = torch.export.load(str(corpus_lib.corpus().folder / "test_ds_cnn__ds_cnn.pt2"))
    edge = to_edge(program).exported_program()
    table, first = cost_table(), {}
    for cpu in ("cortex-m55", "cortex-m4"):
        core = core_for(cpu)
        cost = estimate(GraphView(run_passes(copy.deepcopy(edge), cpu), quantized=program), core)
        first[core.backend] = next(o for o in cost.ops if "conv" in o.op)
    mve, dsp = first["mve"], first["dsp"]
    assert mve.op == dsp.op == "cortex_m.quantized_depthwise_conv2d.default"
    assert mve.work == dsp.work == 25 * 5 * 64 * 10 * 4  # MACs: output elements x kernel window
    windows = 25 * 5 * 10 * 4  # output pixels x kernel positions
    assert mve.cycles == pytest.approx(table.kernel(core_for("cortex-m55"), "conv").cycles(
        mve.work, 25 * 5 * 64, windows) + table.dispatch)
    assert dsp.cycles == pytest.approx(table.kernel(core_for("cortex-m4"), "depthwise").per_mac * dsp.work
                                       + table.dispatch)

