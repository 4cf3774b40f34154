"""Golden output: every format and exit code on the bundled examples, byte for byte.

The report is qlint's interface: a change in wording, order or numbers must be
deliberate. Each format is compared with `tests/full/golden/` (SAM and the zoo in
`tests/full/golden/models/`, recorded before the package was split into subpackages), the checkout's path
written as `<root>`; `QLINT_UPDATE_GOLDEN=1 python -m pytest tests/full/test_golden.py`
rewrites the files after an intended change (review the diff).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, run_cli

from examples.zoo import ZOO

GOLDEN = Path(__file__).parent / "golden"
EXAMPLES = ["examples/attention.pt2", "examples/layernorm.pt2"]
RUNS = {
    "check.txt": ["check", *EXAMPLES],
    "check.json": ["check", *EXAMPLES, "--output-format", "json"],
    "check.sarif": ["check", *EXAMPLES, "--output-format", "sarif"],
    "check.md": ["check", *EXAMPLES, "--output-format", "markdown"],
    "check.github": ["check", *EXAMPLES, "--output-format", "github"],
    "static.json": ["check", "--static", *EXAMPLES, "--output-format", "json"],
    "readme.txt": ["check", EXAMPLES[0]],  # README's example (tests/unit/test_docs.py compares them)
}


def updating() -> bool:
    """`QLINT_UPDATE_GOLDEN=1` rewrites the golden files, on a developer's machine only: in CI a test
    that compares a file with what it just wrote could not fail."""
    if not os.environ.get("QLINT_UPDATE_GOLDEN"):
        return False
    if os.environ.get("CI"):
        pytest.fail("QLINT_UPDATE_GOLDEN is set in CI: golden files are compared there, never rewritten")
    return True


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
    if updating():
        path.write_text(got)
    assert got == path.read_text()


MODELS = [f"make_{name}" for name in ZOO] + ["make_two_way_transformer"]


@pytest.mark.parametrize("name", MODELS)
def test_model_findings_are_unchanged(name: str, linted: Callable[..., Any]) -> None:
    """SAM and every zoo model in text, JSON and SARIF, byte for byte: the findings of real
    architectures (causes, source lines, constants, qparams) change only on purpose. Rendered from
    the session's linted programs, so no model is lowered again for this."""
    from qlint.records.results import Report
    from qlint.report.formats import as_json, sarif, text

    checked = linted(name)
    report = Report(findings=checked.findings, stats=[checked.stats])
    for suffix, render in (("txt", text), ("json", as_json), ("sarif", sarif)):
        got = render(report).replace(str(ROOT), "<root>")
        path = GOLDEN / "models" / f"{name.removeprefix('make_')}.{suffix}"
        if updating():
            path.write_text(got)
        assert got == path.read_text(), path.name
