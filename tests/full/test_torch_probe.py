"""The probe that tests/unit/test_cli.py runs finds torch when a command does import it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import TORCH_PROBE


@pytest.mark.model("make_scale")
def test_probe_detects_torch(pt2_dir: Callable[[str], Path]) -> None:
    """The probe can fail: a command that reads a program does import torch."""
    result = subprocess.run(
        [sys.executable, "-c", TORCH_PROBE, "check", "-q", "--no-cache", str(pt2_dir("make_scale"))],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 1, result.stderr
    assert "torch" in result.stdout.strip().splitlines()[-1]
