"""ExecuTorch's own Cortex-M test cases, quantized as its tester does, as a differential corpus:
qlint, lowering with the stock pass order, must count exactly the floating-point compute ops that
the stock Cortex-M flow leaves in each program, and report QL003 wherever that flow raises.

The reference is counted here, independently of qlint's graph view, from the dtypes recorded on
the stock-lowered graph (`executorch_corpus.fp32_compute_ops`). Programs are built once per stack
and test-source version and cached (`executorch_corpus.corpus`)."""

from __future__ import annotations

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

pytestmark = pytest.mark.slow


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
        report one finding each (every float compute op belongs to exactly one island)."""
        ops: Counter[str] = Counter()
        for finding in self.findings(stem, "QL001", "QL002"):
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


def test_every_fp32_island_has_a_cause(run: Run) -> None:
    islands = [f for stem in run.corpus.built for f in run.findings(stem, "QL002")]
    assert islands, "the corpus has fp32 islands (NCHW convolutions, broadcasts): none reported"
    empty = [f"{f['artifact']}: {f['message']}" for f in islands if not f["details"]["reason"].strip()]
    assert not empty, "\n".join(empty)
