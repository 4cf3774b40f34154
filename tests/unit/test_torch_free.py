"""The unit tier runs without torch: its tests, and the conftest every tier shares, never import it.

In a session that runs other tiers too, torch is theirs and this is skipped;
`tests/integration/test_code_quality.py` runs the unit tier in a session of its own, where it is not."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace
from typing import Any, cast

import pytest
from conftest import in_unit_tier


def test_the_unit_tier_never_imports_the_stack(request: pytest.FixtureRequest) -> None:
    if not all(in_unit_tier(item) for item in request.session.items):
        pytest.skip("the session runs other tiers too: torch is theirs")
    assert not {"torch", "executorch", "torchao"} & set(sys.modules)


API_PROBE = (
    "import sys\n"
    "import qlint.api\n"
    "from qlint.api import ArtifactStats, Finding, FixError, Location, Remedied, Report, Severity, VerificationError\n"
    "print('HEAVY=' + ','.join(sorted(m for m in ('torch', 'executorch', 'torchao') if m in sys.modules)))\n"
)


def test_importing_the_api_does_not_import_the_stack() -> None:
    """A program imports `qlint.api` (and catches its errors) without paying for torch until it reads a program."""
    result = subprocess.run([sys.executable, "-c", API_PROBE], capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout.strip()) == (0, "HEAVY="), result.stderr


def test_the_api_exports_what_it_returns() -> None:
    import qlint.api
    from qlint.records.results import Finding, Report

    assert qlint.api.Finding is Finding and qlint.api.Report is Report
    assert {"check", "lint", "fix", "remedy", "Finding", "Report", "FixError", "FixResult"} <= set(qlint.api.__all__)
    assert all(name == "FixResult" or hasattr(qlint.api, name) for name in qlint.api.__all__)


def test_a_remedied_program_without_a_pte_says_so() -> None:
    from qlint.api import FixError, Remedied

    remedied = Remedied(None, (), cast(Any, None), cast(Any, SimpleNamespace(pte=None)))
    with pytest.raises(FixError, match=r"^cannot fix: the remedied program was not serialized, so it has no \.pte$"):
        _ = remedied.pte
    assert Remedied(None, (), cast(Any, None), cast(Any, SimpleNamespace(pte=b"pte"))).pte == b"pte"
