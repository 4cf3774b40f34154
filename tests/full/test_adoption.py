"""Adopting qlint on an existing code base: baselines, inline suppressions, markdown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli

MODEL = '''\
import torch


class Model(torch.nn.Module):
    def forward(self, x, y):
        a = torch.relu(x) / 3.0{first}
        b = torch.relu(y) * 0.25{second}
        return a, b


def make():
    g = torch.Generator().manual_seed(0)
    batch = (torch.randn(1, 8, 16, generator=g), torch.randn(1, 8, 16, generator=g))
    return Model(), batch
'''


def project(tmp_path: Path, first: str = "", second: str = "", extra_config: str = "") -> Path:
    (tmp_path / "scales.py").write_text(MODEL.format(first=first, second=second))
    config = tmp_path / ".qlint.yaml"
    config.write_text(f"targets:\n  - name: scales\n    factory: scales:make\n{extra_config}")
    return config


def findings(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[dict[str, Any]]]:
    code, out, _ = run_cli([*args, "--output-format", "json"], capsys)
    return code, json.loads(out)["findings"]


def test_inline_suppression_silences_only_its_line_and_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = project(tmp_path)
    code, found = findings(["check", "--config", str(config), "--targets-only", "--select", "QL001"], capsys)
    assert code == 1 and [f["location"]["line"] for f in found] == [6, 7]

    config = project(tmp_path, first="  # qlint: ignore[QL001]")
    code, found = findings(["check", "--config", str(config), "--targets-only", "--select", "QL001"], capsys)
    assert [f["location"]["line"] for f in found] == [7]

    config = project(tmp_path, first="  # qlint: ignore[QL002]")  # another code: no effect
    _, found = findings(["check", "--config", str(config), "--targets-only", "--select", "QL001"], capsys)
    assert [f["location"]["line"] for f in found] == [6, 7]

    config = project(tmp_path, first="  # qlint: ignore", second="  # qlint: ignore[QL004, QL001]")
    code, found = findings(["check", "--config", str(config), "--targets-only", "--select", "QL001"], capsys)
    assert code == 0 and found == []


def test_unused_suppressions_are_reportable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = project(tmp_path, first="  # qlint: ignore[QL001]",
                     extra_config="rules:\n  QL006: warning\n  QL005: off\n")
    (tmp_path / "scales.py").write_text((tmp_path / "scales.py").read_text().replace(
        "return a, b", "return a, b  # qlint: ignore[QL002]"))
    _, found = findings(["check", "--config", str(config), "--targets-only"], capsys)
    unused = [f for f in found if f["code"] == "QL006"]
    assert [(f["location"]["path"], f["location"]["line"]) for f in unused] == [("scales.py", 8)]
    assert [f["code"] for f in found if f["code"] != "QL006"] == ["QL001"]  # line 7 only


def test_baseline_accepts_existing_findings_and_fails_on_a_new_one(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A baseline written before an edit accepts the findings that were there, wherever the edit moved
    their lines, and the one island the edit adds fails the check, named by its line."""
    baseline = tmp_path / "qlint-baseline.json"
    config = project(tmp_path)
    targets = ["check", "--config", str(config), "--targets-only"]
    code, _, err = run_cli([*targets, "--write-baseline", str(baseline)], capsys)
    assert code == 0 and "wrote 3 findings" in err  # the two scales and the coverage
    code, found = findings([*targets, "--baseline", str(baseline)], capsys)
    assert code == 0 and found == []

    source = tmp_path / "scales.py"
    edited = source.read_text().replace("y):\n", "y):\n        c = torch.relu(y) / 5.0\n")
    source.write_text(edited.replace("a, b\n", "a, b, c\n"))  # the findings that were there move a line down
    code, found = findings([*targets, "--baseline", str(baseline)], capsys)
    assert code == 1
    new = [f for f in found if f["code"] != "QL005"]  # coverage drops too: its key has no numbers
    assert [(f["code"], f["location"]["path"], f["location"]["line"], f["location"]["code"]) for f in new] == [
        ("QL001", "scales.py", 6, "c = torch.relu(y) / 5.0")
    ]


def test_markdown_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = project(tmp_path)
    code, out, _ = run_cli(["check", "--config", str(config), "--targets-only", "--output-format", "markdown"], capsys)
    lines = out.splitlines()
    assert lines[0] == "## qlint"
    assert lines[2].startswith("| artifact") and "| fp32 islands |" in lines[2].replace("  ", " ").replace("  ", " ")
    assert sum(line.startswith("| `QL001` | error") for line in lines) == 2  # the two scales, one row each
    # the totals close the summary, each line a markdown line break
    assert lines[-3:] == ["", "Found 3 findings (2 error, 1 warning).  ", "[*] 2 fixable with `qlint check --fix`."]
