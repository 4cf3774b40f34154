"""Golden output: every format and exit code on the bundled examples, byte for byte.

The report is qlint's interface: a change in wording, order or numbers must be
deliberate. Each format is compared with `tests/full/golden/` (SAM and the zoo in
`tests/full/golden/models/`, recorded before the package was split into subpackages), the checkout's path
written as `<root>`; `QLINT_UPDATE_GOLDEN=1 python -m pytest tests/full/test_golden.py`
rewrites the files after an intended change (review the diff).
"""

from __future__ import annotations

import math
import os
import re
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
# A decimal fraction or a number with an exponent: the figures a CPU's float kernels decide.
FLOAT = re.compile(r"-?(?:\d+\.\d*|\.\d+)(?:[eE][-+]?\d+)?|-?\d+[eE][-+]?\d+")


def same_report(got: str, want: str) -> bool:
    """`got` is `want` in every word, integer and order; each decimal within a relative 1e-5. The
    models are quantized on the machine that runs the suite, and calibration sums in the order its
    CPU's vector kernels choose: a scale may differ in its last bits, never a cause or a count."""
    if got == want:
        return True
    got_numbers, want_numbers = FLOAT.findall(got), FLOAT.findall(want)
    if FLOAT.split(got) != FLOAT.split(want) or len(got_numbers) != len(want_numbers):
        return False
    return all(math.isclose(float(a), float(b), rel_tol=1e-5, abs_tol=1e-12)
               for a, b in zip(got_numbers, want_numbers, strict=True))


def assert_same_report(got: str, want: str, name: str) -> None:
    assert same_report(got, want), f"{name}\n" + "\n".join(
        f"- {w}\n+ {g}" for g, w in zip(got.splitlines(), want.splitlines(), strict=False) if g != w)[:4000]


@pytest.mark.parametrize("name", MODELS)
def test_model_findings_are_unchanged(name: str, linted: Callable[..., Any]) -> None:
    """SAM and every zoo model in text, JSON and SARIF: the findings of real architectures (causes,
    source lines, constants, qparams) change only on purpose; their calibrated floats only in the
    last bits the machine's CPU decides (`assert_same_report`). Rendered from the session's linted
    programs, so no model is lowered again for this."""
    from qlint.records.results import Report
    from qlint.report.formats import as_json, sarif, text

    checked = linted(name)
    report = Report(findings=checked.findings, stats=[checked.stats])
    for suffix, render in (("txt", text), ("json", as_json), ("sarif", sarif)):
        got = render(report).replace(str(ROOT), "<root>")
        path = GOLDEN / "models" / f"{name.removeprefix('make_')}.{suffix}"
        if updating() and not same_report(got, path.read_text()):  # a rewrite for float noise is churn
            path.write_text(got)
        assert_same_report(got, path.read_text(), path.name)


def test_the_model_comparison_allows_float_noise_and_nothing_else() -> None:
    want = "scale=0.00734433, zp=12; est. 3,232 cycles, 20.1% of the time"
    assert same_report("scale=0.00734434, zp=12; est. 3,232 cycles, 20.1% of the time", want)
    for changed in ("scale=0.00734433, zp=13; est. 3,232 cycles, 20.1% of the time",   # an integer
                    "scale=0.00734433, zp=12; est. 3,233 cycles, 20.1% of the time",   # a count
                    "scale=0.00735433, zp=12; est. 3,232 cycles, 20.1% of the time",   # past 1e-5
                    "scale=0.00734433, zp=12; est. 3,232 cycles, 20.2% of the time",
                    "scale=0.00734433, zp=12; est. 3,232 cycles, 20.1% of the memory"):
        assert not same_report(changed, want), changed
