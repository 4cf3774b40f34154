"""The rule table and catalog: fix applicability as ruff says it, and which rules a config enables."""

from __future__ import annotations

from qlint.rules.catalog import enabled_rules, load_catalog, render_rule
from qlint.rules.table import Applicability, Availability, Scope
from qlint.settings.config import Config


def test_fix_applicability_is_the_tables() -> None:
    catalog = load_catalog()
    assert {code: (r.applicability, r.availability) for code, r in catalog.items()} == {
        "QL001": (Applicability.SAFE, Availability.SOMETIMES), "QL002": (Applicability.SAFE, Availability.SOMETIMES),
        "QL003": (Applicability.NONE, Availability.NONE), "QL004": (Applicability.SAFE, Availability.SOMETIMES),
        "QL005": (Applicability.NONE, Availability.NONE), "QL006": (Applicability.NONE, Availability.NONE),
        "QL007": (Applicability.SAFE, Availability.SOMETIMES),
        "QL008": (Applicability.SAFE, Availability.SOMETIMES),
        "QL009": (Applicability.NONE, Availability.NONE), "QL010": (Applicability.SAFE, Availability.SOMETIMES),
    }
    assert catalog["QL001"].fix_text == "safe, sometimes available" and catalog["QL005"].fix_text == "none"
    assert "Fix: safe, sometimes available." in render_rule(catalog["QL001"])


def test_enabled_rules_follow_select_and_ignore() -> None:
    region = [r.code for r in enabled_rules(Scope.REGION, Config(ignore=("QL00",), select=()))]
    assert region == []
    assert [r.code for r in enabled_rules(Scope.REGION, Config(select=("QL004", "QL001")))] == ["QL001", "QL004"]
    without_islands = Config(severities={"QL002": "off"})
    assert [r.code for r in enabled_rules(Scope.REGION, without_islands)] == ["QL001", "QL004", "QL008"]
