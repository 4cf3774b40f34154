"""Golden output: every format and exit code on the bundled examples, byte for byte.

The report is qlint's interface: a change in wording, order or numbers must be
deliberate. Each format is compared with `tests/golden/`, the checkout's path
written as `<root>`; `QLINT_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py`
rewrites the files after an intended change (review the diff).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import ROOT, run_cli

GOLDEN = Path(__file__).parent / "golden"
EXAMPLES = ["examples/attention.pt2", "examples/layernorm.pt2"]
RUNS = {
    "check.txt": ["check", *EXAMPLES],
    "check.json": ["check", *EXAMPLES, "--output-format", "json"],
    "check.sarif": ["check", *EXAMPLES, "--output-format", "sarif"],
    "check.md": ["check", *EXAMPLES, "--output-format", "markdown"],
    "check.github": ["check", *EXAMPLES, "--output-format", "github"],
    "static.json": ["check", "--static", *EXAMPLES, "--output-format", "json"],
}


@pytest.mark.parametrize("name", list(RUNS))
def test_output_is_unchanged(name: str, tmp_path_factory: pytest.TempPathFactory,
                             monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """stdout and the exit code; the full check's programs are lowered once and served from the
    cache afterwards, so the cached report is held to the same bytes."""
    monkeypatch.chdir(ROOT)
    cache = tmp_path_factory.getbasetemp() / "golden-cache"
    code, out, _ = run_cli([*RUNS[name], "--cache-dir", str(cache)], capsys)
    got = f"exit {code}\n" + out.replace(str(ROOT), "<root>")
    path = GOLDEN / name
    if os.environ.get("QLINT_UPDATE_GOLDEN"):
        path.write_text(got)
    assert got == path.read_text()
