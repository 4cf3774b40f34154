"""The docs are rendered from the rule catalog and must not drift from it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_rules_page_is_rendered_from_the_catalog() -> None:
    spec = importlib.util.spec_from_file_location("render_docs", ROOT / "scripts" / "render_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (ROOT / "docs" / "rules.md").read_text(encoding="utf-8") == module.render(), (
        "docs/rules.md is stale: run python scripts/render_docs.py"
    )


def test_readme_lists_every_rule() -> None:
    from qlint.rules.catalog import load_catalog

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for rule in load_catalog().values():
        assert f"`{rule.code}`" in readme and rule.name in readme


def test_the_cause_classes_page_covers_every_written_check() -> None:
    """docs/causes.md lists the conditions of every ExecuTorch check qlint evaluates, and the
    README links it: a check added to qlint.graph.conditions without its row fails here."""
    from qlint.graph import conditions

    page = (ROOT / "docs" / "causes.md").read_text()
    for check in conditions.PATTERN_CONDITIONS:
        assert f"`{check}`" in page, check
    assert conditions.EXECUTORCH in page
    assert "(docs/causes.md)" in (ROOT / "README.md").read_text()
