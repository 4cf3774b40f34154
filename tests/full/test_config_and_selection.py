"""Config errors point at file, line and key; select/ignore/severity change results and exit codes."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import run_json


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / ".qlint.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def where(finding: dict[str, Any]) -> tuple[str, str, str, Any]:
    """A finding's rule, severity, artifact and location: what selecting rules must leave as it was (a
    coverage message names the main cause, which may be a rule the selection turned off)."""
    return finding["code"], finding["severity"], finding["artifact"], finding["location"]


@pytest.fixture(scope="module")
def attention(pt2_dir: Callable[[str], Path]) -> Path:
    return pt2_dir("make_attention")


def test_select_ignore_and_off_change_results_and_exit_codes(
    attention: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, data = run_json(["check", str(attention)], capsys)
    assert code == 1 and {f["code"] for f in data["findings"]} == {"QL001", "QL004", "QL005"}
    every = [where(f) for f in data["findings"]]

    code, data = run_json(["check", str(attention), "--select", "QL004,QL005"], capsys)
    assert code == 0 and {f["code"] for f in data["findings"]} == {"QL004", "QL005"}

    # --ignore drops its rule's findings and only those: the others are reported where they were
    code, data = run_json(["check", str(attention), "--ignore", "QL001"], capsys)
    assert code == 0 and [where(f) for f in data["findings"]] == [f for f in every if f[0] != "QL001"]
    assert {f["code"] for f in data["findings"]} == {"QL004", "QL005"}

    code, data = run_json(["check", str(attention), "--select", "QL00", "--ignore", "QL004"], capsys)
    assert code == 1 and [where(f) for f in data["findings"]] == [f for f in every if f[0] != "QL004"]

    config = write(tmp_path, "rules:\n  QL001: off\n  QL004: error\n")
    code, data = run_json(["check", "--config", str(config), str(attention)], capsys)
    assert code == 1 and {f["code"]: f["severity"] for f in data["findings"]} == {"QL004": "error", "QL005": "warning"}

    config = write(tmp_path, "rules:\n  QL001: warning\n")
    code, data = run_json(["check", "--config", str(config), str(attention)], capsys)
    assert code == 0 and data["findings"][0]["severity"] == "warning"

    code, _ = run_json(["check", str(attention), "--exit-zero"], capsys)
    assert code == 0


def test_target_cpu_option(attention: Path, capsys: pytest.CaptureFixture[str],
                           monkeypatch: pytest.MonkeyPatch) -> None:
    """--target-cpu reaches the lowering (the real target config, recorded on its way)."""
    from qlint.loading import lowering

    used: list[str] = []
    real = lowering.target_config

    def recording(cpu: str) -> object:
        used.append(cpu)
        return real(cpu)

    monkeypatch.setattr(lowering, "target_config", recording)
    code, data = run_json(["check", "--no-cache", str(attention), "--target-cpu", "cortex-m0"], capsys)
    assert {f["code"] for f in data["findings"]} == {"QL001", "QL004", "QL005"}
    assert used == ["cortex-m0", "cortex-m0"]  # the lowering's, and the estimate's kernel backend
    run_json(["check", "--no-cache", str(attention)], capsys)
    assert used[2:] == ["cortex-m55", "cortex-m55"]  # the default


@pytest.mark.model("make_attention")
def test_directories_are_walked_with_include_and_exclude(
    pt2_dir: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "zoo" / "keep").mkdir(parents=True)
    (tmp_path / "zoo" / "skip").mkdir()
    (tmp_path / "zoo" / "keep" / "a.pt2").write_bytes(pt2_dir("make_attention").read_bytes())
    (tmp_path / "zoo" / "skip" / "b.pt2").write_bytes(pt2_dir("make_attention").read_bytes())
    (tmp_path / "zoo" / "notes.txt").write_text("not an artifact")
    config = write(tmp_path, 'exclude: ["skip/**"]\n')
    # `qlint PATH` is `qlint check PATH`.
    code, data = run_json(["--config", str(config), str(tmp_path / "zoo")], capsys)
    assert code == 1
    assert [Path(s["artifact"]).name for s in data["artifacts"]] == ["a.pt2"]
    config = write(tmp_path, 'include: ["**/*.pt2"]\n')
    code, data = run_json(["--config", str(config), str(tmp_path / "zoo")], capsys)
    assert sorted(Path(s["artifact"]).name for s in data["artifacts"]) == ["a.pt2", "b.pt2"]
