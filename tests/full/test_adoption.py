"""Adopting qlint on an existing code base: baselines, inline suppressions, markdown."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, run_cli

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
    config = project(tmp_path, first="  # qlint: ignore[QL001]", extra_config="rules:\n  QL006: warning\n  QL005: off\n")
    (tmp_path / "scales.py").write_text((tmp_path / "scales.py").read_text().replace(
        "return a, b", "return a, b  # qlint: ignore[QL002]"))
    _, found = findings(["check", "--config", str(config), "--targets-only"], capsys)
    unused = [f for f in found if f["code"] == "QL006"]
    assert [(f["location"]["path"], f["location"]["line"]) for f in unused] == [("scales.py", 8)]
    assert [f["code"] for f in found if f["code"] != "QL006"] == ["QL001"]  # line 7 only


@pytest.fixture(scope="module")
def sam_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("sam_baseline")
    (folder / "examples").symlink_to(ROOT / "examples")
    (folder / "sam_plus.py").write_text(textwrap.dedent('''\
        import torch
        from examples.sam import make_two_way_transformer


        class SamPlus(torch.nn.Module):
            """SAM with one more constant scale, on its point embeddings."""

            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, image, pe, points):
                points = points / 3.0
                return self.inner(image, pe, points)


        def make():
            model, example, calibration = make_two_way_transformer()
            return SamPlus(model), example, calibration
        '''))
    return folder


def sam_config(folder: Path, factory: str) -> Path:
    config = folder / ".qlint.yaml"
    config.write_text(f"targets:\n  - name: sam\n    factory: {factory}\n")
    return config


def test_baseline_accepts_existing_findings_and_fails_on_a_new_one(sam_project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    baseline = sam_project / "qlint-baseline.json"
    config = sam_config(sam_project, "examples.sam:make_two_way_transformer")
    code, _, err = run_cli(["check", "--config", str(config), "--targets-only", "--write-baseline", str(baseline)], capsys)
    assert code == 0 and "wrote 24 findings" in err
    code, found = findings(["check", "--config", str(config), "--targets-only", "--baseline", str(baseline)], capsys)
    assert code == 0 and found == []

    config = sam_config(sam_project, "sam_plus:make")
    code, found = findings(["check", "--config", str(config), "--targets-only", "--baseline", str(baseline)], capsys)
    assert code == 1
    new = [f for f in found if f["code"] != "QL005"]  # coverage drops too: its key has no numbers
    assert [(f["code"], f["location"]["path"], f["location"]["code"]) for f in new] == [
        ("QL001", "sam_plus.py", "points = points / 3.0")
    ]


def test_markdown_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = project(tmp_path)
    code, out, _ = run_cli(["check", "--config", str(config), "--targets-only", "--output-format", "markdown"], capsys)
    lines = out.splitlines()
    assert lines[0] == "## qlint"
    assert lines[2].startswith("| artifact") and "| fp32 islands |" in lines[2].replace("  ", " ").replace("  ", " ")
    assert any(line.startswith("| `QL001` | error") for line in lines)
    assert "Found" in lines[-2] or "Found" in lines[-1]
