"""Render docs/rules.md from the rule catalog in rules/*.yaml: `python scripts/render_docs.py`.

tests/test_docs.py fails when the rendered page and the catalog disagree.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from qlint.rules.catalog import load_catalog, render_rule  # noqa: E402


def render() -> str:
    catalog = load_catalog()
    index = "\n".join(f"| [{r.code}](#{r.name}-{r.code.lower()}) | {r.name} | {r.default_severity} | "
                      f"{r.fix_text} | {r.summary} |" for r in catalog.values())
    pages = "\n".join(render_rule(r).replace("# ", "## ", 1).replace("\n## ", "\n### ") for r in catalog.values())
    return (
        "# Rules\n\n"
        "<!-- Generated from rules/*.yaml by scripts/render_docs.py; do not edit. -->\n\n"
        "| code | name | default severity | fix | summary |\n|---|---|---|---|---|\n"
        f"{index}\n\n{pages}"
    )


if __name__ == "__main__":
    (ROOT / "docs" / "rules.md").write_text(render(), encoding="utf-8")
