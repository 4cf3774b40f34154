"""Render docs/rules.md and the README's rule table from the rule catalog, and docs/budgets.md's board
table from the board table: `python scripts/render_docs.py`.

tests/unit/test_docs.py fails when any of them disagrees with its source.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from qlint.rules.catalog import load_catalog, render_rule  # noqa: E402
from qlint.settings.boards import board_rows, builtin_boards  # noqa: E402

README_TABLE = re.compile(r"(<!-- rules:start[^>]*-->\n).*?(<!-- rules:end -->)", re.S)
BOARD_TABLE = re.compile(r"(<!-- boards:start[^>]*-->\n).*?(<!-- boards:end -->)", re.S)


def rule_table(link: str = "docs/rules.md") -> str:
    """The code table both pages show: code, name, default severity, fix applicability, summary."""
    rows = "\n".join(f"| [{r.code}]({link}#{r.name}-{r.code.lower()}) | {r.name} | {r.default_severity} | "
                     f"{r.fix_text} | {r.summary} |" for r in load_catalog().values())
    return f"| code | name | default severity | fix | summary |\n|---|---|---|---|---|\n{rows}\n"


def render() -> str:
    pages = "\n".join(render_rule(r).replace("# ", "## ", 1).replace("\n## ", "\n### ")
                      for r in load_catalog().values())
    return (
        "# Rules\n\n"
        "<!-- Generated from rules/*.yaml by scripts/render_docs.py; do not edit. -->\n\n"
        f"{rule_table(link='')}\n{pages}"
    )


def render_readme(readme: str) -> str:
    """`readme` with the table between its rules markers rendered from the catalog."""
    return README_TABLE.sub(lambda m: m[1] + rule_table() + m[2], readme)


def render_budgets(page: str) -> str:
    """`page` (docs/budgets.md) with the table between its boards markers rendered from the board table."""
    rows = "\n".join(f"| `{name}` | {cpu} | {sram} | {flash} | {clock} | {fpu} | {source} |"
                     for name, cpu, sram, flash, clock, fpu, source in board_rows(builtin_boards().values()))
    header = "| board | CPU | SRAM | flash | clock | FPU | source |\n|---|---|---|---|---|---|---|"
    return BOARD_TABLE.sub(lambda m: f"{m[1]}{header}\n{rows}\n{m[2]}", page)


if __name__ == "__main__":
    (ROOT / "docs" / "rules.md").write_text(render(), encoding="utf-8")
    readme = ROOT / "README.md"
    readme.write_text(render_readme(readme.read_text(encoding="utf-8")), encoding="utf-8")
    budgets = ROOT / "docs" / "budgets.md"
    budgets.write_text(render_budgets(budgets.read_text(encoding="utf-8")), encoding="utf-8")
