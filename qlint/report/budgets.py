"""Budgets and deltas over the figures of a run: QL009 findings, the metrics file, and what a change did.

The engine measures each artifact's figures (`Figures`, when budgets or metrics ask); here they
meet the config's budgets (`qlint.settings.budgets`) and, with `--compare`, a base run's metrics
file. Nothing here lowers or serializes: the budget check costs no lowering.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qlint import __version__
from qlint.io.limits import RECORD_MAX_BYTES
from qlint.io.reads import ReadError, printable, read_json
from qlint.report.escape import markdown_code, markdown_text
from qlint.rules.records import Contributor, Delta, Figures, Finding, Report
from qlint.rules.table import Code
from qlint.settings.budgets import Growth, Resolved
from qlint.settings.config import Config
from qlint.settings.sizes import MAX_AMOUNT, show_size

CODE = Code.OVER_BUDGET
METRICS_SCHEMA = 1
# What each budgeted figure is called, and the Figures field that holds it.
FIGURE = {"sram": "sram_bytes", "flash": "flash_bytes", "fp32_elements": "fp32_elements",
          "fp32_islands": "fp32_islands", "coverage": "coverage"}
LABEL = {"sram": "SRAM", "flash": "flash", "fp32_elements": "fp32 elements per inference",
         "fp32_islands": "fp32 islands", "coverage": "int8 coverage"}


class MetricsError(Exception):
    """A metrics file that cannot be read: one line, exit code 2."""


def show(key: str, value: float) -> str:
    if key in ("sram", "flash"):
        return show_size(int(value))
    if key == "coverage":
        return f"{100 * value:.1f}%"
    return f"{int(value):,}"


def _contributors(key: str, figures: Figures) -> tuple[Contributor, ...]:
    return {"sram": figures.sram, "flash": figures.flash}.get(key, figures.fp32)


def _contributor_text(key: str, figures: Figures) -> str:
    items = _contributors(key, figures)
    if not items:
        return ""
    heading = {"sram": "live at the peak", "flash": "largest constants"}.get(key, "largest fp32 islands")
    if key == "sram" and figures.method_allocator_bytes is not None:
        heading = (f"arena {figures.arena_bytes:,} B + method allocator {figures.method_allocator_bytes:,} B; "
                   "the method allocator and the tensors live at the peak")
    return f"; {heading}: " + "; ".join(str(c) for c in items)


def _finding(config: Config, figures: Figures, key: str, message: str, details: dict[str, Any]) -> Finding:
    contributors = _contributors(key, figures)
    location = next((c.location for c in contributors if c.location is not None), None)
    return Finding(CODE, config.severity(CODE), message, figures.artifact, location=location, details={
        "budget": key, "measured_from": figures.measured,
        "contributors": [{"name": c.name, "amount": c.amount, "what": c.what,
                          "location": str(c.location) if c.location else None} for c in contributors],
        **details})


def over_limits(figures: Figures, resolved: Resolved, config: Config) -> list[Finding]:
    """A QL009 for each limit the figures break, and for each limit that could not be measured."""
    found = []
    for key, limit in resolved.limits.items():
        value = getattr(figures, FIGURE[key])
        if value is None:
            budget = f"{LABEL[key]} budget {show(key, limit.value)} ({limit.origin})"
            message = f"{budget} cannot be checked: {figures.measured}"
            found.append(_finding(config, figures, key, message,
                                  {"limit": limit.value, "measured": None, "origin": limit.origin}))
            continue
        broken = value < limit.value if key == "coverage" else value > limit.value
        if not broken:
            continue
        side = "under its minimum" if key == "coverage" else "over its budget"
        by = limit.value - value if key == "coverage" else value - limit.value
        message = (f"{LABEL[key]} {show(key, value)} {side} {show(key, limit.value)} by {show(key, by)} "
                   f"({limit.origin}); measured {figures.measured}{_contributor_text(key, figures)}")
        found.append(_finding(config, figures, key, message,
                              {"limit": limit.value, "measured": value, "origin": limit.origin}))
    return found


def over_growth(figures: Figures, base: dict[str, Any], resolved: Resolved, config: Config) -> list[Finding]:
    """A QL009 for each figure that grew (coverage: fell) past its growth limit against the base run."""
    found = []
    for key, (growth, origin) in resolved.growth.items():
        value, before = getattr(figures, FIGURE[key]), base.get(FIGURE[key])
        if value is None or before is None:
            continue
        change = (before - value) if key == "coverage" else (value - before)
        allowed = growth.allowed(before)
        if change <= allowed + 1e-12:
            continue
        verb = "fell" if key == "coverage" else "grew"
        relative = f", {100 * change / before:+.1f}%" if before and key != "coverage" else ""
        message = (f"{LABEL[key]} {verb} {show(key, before)} -> {show(key, value)} ({_signed(key, value - before)}"
                   f"{relative}), past its growth budget {_growth_text(key, growth)} ({origin}); measured "
                   f"{figures.measured}{_contributor_text(key, figures)}")
        found.append(_finding(config, figures, key, message, {
            "growth": str(growth), "before": before, "measured": value, "origin": origin}))
    return found


def _growth_text(key: str, growth: Growth) -> str:
    if key == "coverage":
        return f"{100 * growth.amount:g} points"
    return str(growth) if growth.percent else show(key, growth.amount)


def _signed(key: str, change: float) -> str:
    if key == "coverage":
        return f"{100 * change:+.1f} points"
    return ("+" if change >= 0 else "-") + show(key, abs(change))


def budget_findings(report: Report, config: Config, base: dict[str, dict[str, Any]] | None) -> list[Finding]:
    """The findings of the rules over the run's figures (QL009), through the rule table."""
    from qlint.rules.catalog import enabled_rules
    from qlint.rules.table import Scope

    return [f for rule in enabled_rules(Scope.FIGURES, config) for f in FIGURE_RULES[rule.code](report, config, base)]


def resolve_all(report: Report, config: Config) -> dict[str, Resolved]:
    """Each measured artifact's budgets (a target's own over the config's), and its SRAM budget
    recorded on its figures for the memory plot."""
    own = {f"target:{t.name}": t.budgets for t in config.targets}
    resolved = {}
    for figures in report.figures:
        resolved[figures.artifact] = config.budgets.resolve(figures.artifact, own.get(figures.artifact))
        sram = resolved[figures.artifact].limits.get("sram")
        figures.sram_budget = int(sram.value) if sram is not None else None
    return resolved


def over_budget(report: Report, config: Config, base: dict[str, dict[str, Any]] | None) -> list[Finding]:
    """QL009: the budgets each artifact's figures break, and with a base run's metrics, the growth past
    its limits."""
    budgets = resolve_all(report, config)
    found = []
    for figures in report.figures:
        resolved = budgets[figures.artifact]
        found += over_limits(figures, resolved, config)
        if base is not None and figures.artifact in base:
            found += over_growth(figures, base[figures.artifact], resolved, config)
    return found


# The rules that run on the measured figures (the rule table's `Scope.FIGURES`), by code.
FIGURE_RULES: dict[Code, Callable[[Report, Config, dict[str, dict[str, Any]] | None], list[Finding]]] = {
    Code.OVER_BUDGET: over_budget,
}


def metrics_json(report: Report) -> str:
    """`--write metrics:FILE`: each artifact's figures, keyed by artifact, with a schema version."""
    return json.dumps({"schema": METRICS_SCHEMA, "qlint": __version__,
                       "artifacts": {f.artifact: f.to_dict() for f in report.figures}}, indent=2, sort_keys=True)


def read_metrics(path: Path) -> dict[str, dict[str, Any]]:
    """A metrics file another run wrote (a pull request's base), checked field by field: the
    figures by artifact. Raises MetricsError naming what is wrong."""
    try:
        data = read_json(path, RECORD_MAX_BYTES, "metrics file", "a qlint metrics file")
    except ReadError as exc:
        raise MetricsError(str(exc)) from None
    if not isinstance(data, dict) or data.get("schema") != METRICS_SCHEMA:
        raise MetricsError(f"{path}: not a qlint metrics file of schema {METRICS_SCHEMA}")
    artifacts = data.get("artifacts")
    if not isinstance(artifacts, dict):
        raise MetricsError(f"{path}: `artifacts` is not a mapping")
    for name, figures in artifacts.items():
        if not isinstance(figures, dict):
            raise MetricsError(f"{path}: {printable(name)[:80]}: not a mapping of figures")
        for key in Figures.METRICS:
            problem = _metric_problem(key, figures.get(key))
            if problem is not None:
                shown = printable(repr(figures.get(key)))[:40]
                raise MetricsError(f"{path}: {printable(name)[:80]}: {key} is not {problem}: {shown}")
    return artifacts


def _metric_problem(key: str, value: Any) -> str | None:
    """What a figure of a metrics file should be, when it is not: bytes and counts are whole numbers
    up to `MAX_AMOUNT` (compared exactly as floats), coverage a share from 0 to 1."""
    if value is None:
        return None
    if key == "coverage":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            return "a share from 0 to 1"
        return None
    if type(value) is not int or not 0 <= value <= MAX_AMOUNT:
        return "a whole number from 0 to 2**53"
    return None


def deltas(report: Report, base: dict[str, dict[str, Any]]) -> list[Delta]:
    """What changed against the base run, artifact by artifact; new and removed ones included."""
    now = {f.artifact: f.to_dict() for f in report.figures}
    names = sorted({*now, *base})
    return [Delta(name, base.get(name), now.get(name)) for name in names]


_SHOWN = {"fp32_islands": "fp32_islands", "fp32_elements": "fp32_elements", "coverage": "coverage",
          "arena_bytes": "sram", "live_peak_bytes": "sram", "method_allocator_bytes": "sram", "sram_bytes": "sram",
          "flash_bytes": "flash"}


def _exact(key: str, value: float) -> str:
    """A figure for the delta table: bytes as bytes (one unit down a column), counts, coverage in %."""
    kind = _SHOWN[key]
    if kind in ("sram", "flash"):
        return f"{int(value):,} B"
    return show(kind, value)


def _cell(key: str, value: Any) -> str:
    return "-" if value is None else _exact(key, value)


def _difference(key: str, before: Any, after: Any) -> str:
    if before is None or after is None:
        return ""
    change = after - before
    if _SHOWN[key] == "coverage":
        return f"{100 * change:+.1f} points"
    return ("+" if change >= 0 else "-") + _exact(key, abs(change))


def delta_rows(found: list[Delta]) -> list[list[str]]:
    """[artifact, figure, before, after, difference] for every change, new and removed artifacts."""
    rows = []
    for delta in found:
        if delta.before is None:
            rows.append([delta.artifact, "(new)", "", "", ""])
        elif delta.after is None:
            rows.append([delta.artifact, "(removed)", "", "", ""])
        rows += [[delta.artifact, key, _cell(key, b), _cell(key, a), _difference(key, b, a)]
                 for key, b, a in delta.changed()]
    return rows


def delta_lines(found: list[Delta], base: str) -> list[str]:
    """The comparison as text, a line each (names are escaped by the caller, line by line)."""
    rows = delta_rows(found)
    if not rows:
        return [f"compared with {base}: no figure changed"]
    lines = [f"compared with {base}:"]
    lines += [f"  {r[0]}: {r[1]}" + (f" {r[2]} -> {r[3]} ({r[4]})" if r[2] or r[3] else "") for r in rows]
    return lines


def delta_markdown(found: list[Delta], base: str) -> str:
    rows = delta_rows(found)
    if not rows:
        return f"No figure changed against {markdown_code(base)}."
    lines = [f"Compared with {markdown_code(base)}:", "", "| artifact | figure | before | after | change |",
             "|---|---|---|---|---|"]
    lines += [f"| {markdown_text(row[0])} | " + " | ".join(row[1:]) + " |" for row in rows]  # the name is an input's
    return "\n".join(lines)
