"""The package stays typed and lint-clean (and its tests and scripts lint-clean): mypy and ruff run with the
tests, configured in pyproject.toml."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


# What ruff checks: the package, and the tests and scripts that hold it, which are code like it.
RUFF_PATHS = ("qlint", "tests", "scripts")


def test_ruff_is_clean() -> None:
    result = run("ruff", "check", *RUFF_PATHS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "All checks passed!"


def test_mypy_is_clean() -> None:
    result = run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found" in result.stdout


def test_the_unit_tier_runs_without_torch() -> None:
    """In a session of its own, where `test_torch_free` is not skipped (in a session that runs other
    tiers too, torch is theirs): the unit tier and the conftest all tiers share never import torch."""
    result = run("pytest", "tests/unit", "-p", "no:xdist", "-o", "addopts=", "-q", "-rA", "-p", "no:cacheprovider")
    assert result.returncode == 0, result.stdout[-3000:]
    assert "PASSED tests/unit/test_torch_free.py::test_the_unit_tier_never_imports_the_stack" in result.stdout


def test_the_test_counts_docs_state_are_the_collected_ones() -> None:
    """docs/inputs.md counts the hostile-input tests (`tests/...py` (N tests...)): N is what pytest
    collects, and of the hostile inputs, the hand-built ones are the tests hypothesis does not drive
    and the generated ones its examples (each `@given` test runs `max_examples` of them)."""
    import re

    page = (ROOT / "docs" / "inputs.md").read_text(encoding="utf-8")
    stated = {path: int(count) for path, count in re.findall(r"`(tests/[\w/]+\.py)` \((\d+) tests", page)}
    assert len(stated) >= 2, stated
    result = run("pytest", "--collect-only", "-q", "-p", "no:xdist", "-o", "addopts=", "-p", "no:cacheprovider",
                 *stated)
    assert result.returncode == 0, result.stdout[-3000:]
    collected = {path: sum(line.startswith(f"{path}::") for line in result.stdout.splitlines()) for path in stated}
    assert collected == stated

    hostile = "tests/full/test_hostile_inputs.py"
    source = (ROOT / hostile).read_text()
    driven = source.count("\n@given(")
    examples = re.search(r"max_examples=(\d+)", source)
    said = re.search(rf"`{hostile}` \(\d+ tests: (\d+) hand-built attacks, and (\d+) inputs generated", page)
    assert said is not None and examples is not None and driven > 0
    assert (int(said[1]), int(said[2])) == (collected[hostile] - driven, driven * int(examples[1]))
