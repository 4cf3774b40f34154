"""The unit tier runs without torch: its tests, and the conftest every tier shares, never import it.

In a session that runs other tiers too, torch is theirs and this is skipped;
`tests/integration/test_code_quality.py` runs the unit tier in a session of its own, where it is not."""

from __future__ import annotations

import sys

import pytest
from conftest import in_unit_tier


def test_the_unit_tier_never_imports_the_stack(request: pytest.FixtureRequest) -> None:
    if not all(in_unit_tier(item) for item in request.session.items):
        pytest.skip("the session runs other tiers too: torch is theirs")
    assert not {"torch", "executorch", "torchao"} & set(sys.modules)
