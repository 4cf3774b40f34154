"""`--help`, `--version`, `rules` and `rule` answer without importing torch."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from qlint import __version__
from qlint.rules.catalog import load_catalog

PROBE = (
    "import sys\n"
    "from qlint.cli.main import main\n"
    "try:\n"
    "    code = main(sys.argv[1:])\n"
    "except SystemExit as exc:\n"
    "    code = exc.code\n"
    "heavy = sorted(m for m in ('torch', 'executorch', 'torchao') if m in sys.modules)\n"
    "print('HEAVY=' + ','.join(heavy))\n"
    "raise SystemExit(code)\n"
)


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["rules"], ["rule", "QL001"], ["check", "--help"]])
def test_fast_commands_do_not_import_torch(args: list[str]) -> None:
    result = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "HEAVY="


@pytest.mark.slow
def test_probe_detects_torch(pt2_dir: Callable[[str], Path]) -> None:
    """The probe above can fail: a command that reads a program does import torch."""
    result = subprocess.run(
        [sys.executable, "-c", PROBE, "check", "-q", "--no-cache", str(pt2_dir("make_scale"))],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 1, result.stderr
    assert "torch" in result.stdout.strip().splitlines()[-1]


def test_version() -> None:
    result = subprocess.run([sys.executable, "-m", "qlint", "--version"], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == f"qlint {__version__}"


def test_rules_lists_the_catalog() -> None:
    result = subprocess.run([sys.executable, "-m", "qlint", "rules"], capture_output=True, text=True, timeout=60)
    rows = {line.split()[0]: line for line in result.stdout.splitlines()[2:]}
    for rule in load_catalog().values():
        assert rule.name in rows[rule.code] and rule.fix_text in rows[rule.code]
    assert "unsafe, sometimes available" in rows["QL007"] and " none " in rows["QL003"]


def test_rule_page_renders_every_section() -> None:
    result = subprocess.run([sys.executable, "-m", "qlint", "rule", "ql002"], capture_output=True, text=True, timeout=60)
    out = result.stdout
    assert out.startswith("# fp32-island (QL002)")
    assert "Fix: safe, sometimes available." in out  # its applicability, as `ruff rule` says it
    for heading in ("## What it does", "## Why it matters", "## Example", "## Fix safety"):
        assert heading in out
    bad = subprocess.run([sys.executable, "-m", "qlint", "rule", "QL999"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown rule 'QL999'" in bad.stderr
