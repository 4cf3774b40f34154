"""`qlint.api.check` gives the report `qlint check` prints: the same JSON on the bundled examples,
with budgets (QL009) and a baseline applied as the command line applies them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT, run_cli

from qlint.api import Report, check
from qlint.report import formats

EXAMPLES = ["examples/attention.pt2", "examples/layernorm.pt2"]
# Budgets the examples break (QL009 for each), the CLI's and the API's config alike.
BUDGETS = "budgets: {sram: 1KiB, fp32_islands: 0}\n"


def cli_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code, out, _ = run_cli(["check", *args, "--no-cache", "--output-format", "json"], capsys)
    return code, out


def test_check_on_the_examples_is_the_clis_json(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(ROOT)
    code, out = cli_json(EXAMPLES, capsys)
    report = check(EXAMPLES)
    assert isinstance(report, Report)
    assert (code, formats.as_json(report) + "\n") == (1, out)
    assert [f.code for f in report.findings] == ["QL001", "QL004", "QL005", "QL002", "QL005"]


def test_check_applies_budgets_and_a_baseline_as_the_cli_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(ROOT)
    config = tmp_path / "qlint.yaml"
    config.write_text(BUDGETS)
    baseline = tmp_path / "baseline.json"
    assert run_cli(["check", EXAMPLES[0], "--no-cache", "--config", str(config), "--write-baseline", str(baseline)],
                   capsys)[0] == 0
    code, out = cli_json([*EXAMPLES, "--config", str(config), "--baseline", str(baseline)], capsys)
    report = check(EXAMPLES, config, baseline=baseline)
    assert formats.as_json(report) + "\n" == out
    # The baseline accepts every finding of the first example; the second's remain, QL009 among them.
    assert {f.artifact for f in report.findings} == {EXAMPLES[1]}
    assert "QL009" in {f.code for f in report.findings} and code == 1
    assert json.loads(out)["findings"] == [f.to_dict() for f in report.findings]
