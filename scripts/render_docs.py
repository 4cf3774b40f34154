"""Render docs/rules.md and the README's rule table from the rule catalog, docs/budgets.md's board
table from the board table and docs/cost-model.md's coefficient tables from cycles.yaml:
`python scripts/render_docs.py`.

tests/unit/test_docs.py fails when any of them disagrees with its source.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from qlint.rules.catalog import load_catalog, render_rule  # noqa: E402
from qlint.settings.boards import board_rows, builtin_boards  # noqa: E402
from qlint.settings.cycles import INT8_CLASSES, Coefficient, CostTable, cost_table  # noqa: E402

README_TABLE = re.compile(r"(<!-- rules:start[^>]*-->\n).*?(<!-- rules:end -->)", re.S)
BOARD_TABLE = re.compile(r"(<!-- boards:start[^>]*-->\n).*?(<!-- boards:end -->)", re.S)
CYCLES_TABLE = re.compile(r"(<!-- cycles:start[^>]*-->\n).*?(<!-- cycles:end -->)", re.S)


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
    rows = "\n".join(f"| `{name}` | {cpu} | {npu} | {sram} | {flash} | {clock} | {fpu} | {source} |"
                     for name, cpu, npu, sram, flash, clock, fpu, source in board_rows(builtin_boards().values()))
    header = "| board | CPU | NPU | SRAM | flash | clock | FPU | source |\n|---|---|---|---|---|---|---|---|"
    return BOARD_TABLE.sub(lambda m: f"{m[1]}{header}\n{rows}\n{m[2]}", page)



def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _int8_cell(coefficient: Coefficient) -> str:
    units = (("per_mac", "MAC"), ("per_output", "output"), ("per_element", "element"), ("per_window", "window"))
    return " + ".join(f"{getattr(coefficient, name):g} /{unit}" for name, unit in units if getattr(coefficient, name))


def _counts(counts: Mapping[str, float]) -> str:
    return ", ".join(f"{op} {n:g}" for op, n in counts.items())


def _figures(table: CostTable, key: str) -> str:
    """The figures of the row `key` of cycles.yaml, as the page shows them."""
    section, _, rest = key.partition(".")
    if section == "int8":
        backend, kind = rest.split(".")
        return _int8_cell(table.int8[backend][kind])
    if section == "cores":
        return "its backend's per-MAC figures x " + ", ".join(f"{kind} {factor:g}"
                                                              for kind, factor in table.mac_factor[rest].items())
    fp32 = {"fp32.loop": f"{table.fp32_loop:g} /element", "fp32.soft": _counts(table.soft),
            "fp32.exp": f"{table.exp_in_fpu_ops:g} FPU muls", "fp32.mac": _counts(table.mac),
            "fp32.conversion": _counts(table.conversion), "fp32.arithmetic.other": _counts(table.other)}
    if key == "dispatch":
        return f"{table.dispatch:g} /op"
    if key in fp32:
        return fp32[key]
    if key.startswith("fp32.fpu."):
        cpu = key.removeprefix("fp32.fpu.")
        return _counts(table.fpu[cpu]) if cpu in table.fpu else "no FPU: soft float"
    return _counts(table.ops[key.removeprefix("fp32.arithmetic.")])


def cycles_tables(table: CostTable) -> str:
    """The int8 coefficients by backend and kernel class, then every row of cycles.yaml with its source."""
    head = "| backend | " + " | ".join(INT8_CLASSES) + " |\n|---|" + "---:|" * len(INT8_CLASSES)
    rows = "\n".join(f"| {backend} | " + " | ".join(
        _int8_cell(c) + (" *" if table.sources[f"int8.{backend}.{kind}"].kind == "assumed" else "")
        for kind, c in kinds.items()) + " |" for backend, kinds in table.int8.items())
    every = "\n".join(f"| `{key}` | {_figures(table, key)} | {source.kind}: {_cell(source.text)} |"
                      for key, source in table.sources.items())
    return (f"{head}\n{rows}\n\n\\* assumed, not fitted to a measurement: the table below says why.\n\n"
            f"| row | cycles | where the figures come from |\n|---|---|---|\n{every}\n")


def render_cost_model(page: str) -> str:
    """`page` (docs/cost-model.md) with the tables between its cycles markers rendered from cycles.yaml."""
    return CYCLES_TABLE.sub(lambda m: m[1] + cycles_tables(cost_table()) + m[2], page)


if __name__ == "__main__":
    (ROOT / "docs" / "rules.md").write_text(render(), encoding="utf-8")
    readme = ROOT / "README.md"
    readme.write_text(render_readme(readme.read_text(encoding="utf-8")), encoding="utf-8")
    budgets = ROOT / "docs" / "budgets.md"
    budgets.write_text(render_budgets(budgets.read_text(encoding="utf-8")), encoding="utf-8")
    cost_model = ROOT / "docs" / "cost-model.md"
    cost_model.write_text(render_cost_model(cost_model.read_text(encoding="utf-8")), encoding="utf-8")
