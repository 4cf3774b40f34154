"""QL009 over-budget: each artifact's measured figures against the config's budgets, and with a base
run's metrics (`--compare`), against its growth limits.

The figures are measured where programs are (`fix.measure`); this rule reads them with the config's
budgets (`settings.budgets`) and lowers or serializes nothing. It runs with the other rules of a
check (`run.engine`, `api.lint`), never in a reporter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from qlint.records.results import NPU_PART, Contributor, Figures, Finding, Report
from qlint.rules.table import Code
from qlint.settings.budgets import Growth, Resolved, show
from qlint.settings.config import Config

CODE = Code.OVER_BUDGET
# What each budgeted figure is called, and the Figures field that holds it.
FIGURE = {"sram": "sram_bytes", "flash": "flash_bytes", "fp32_elements": "fp32_elements",
          "fp32_islands": "fp32_islands", "coverage": "coverage", "cycles": "cycles", "fp32_cycles": "fp32_cycles",
          "latency": "latency_ms"}
LABEL = {"sram": "SRAM", "flash": "flash", "fp32_elements": "fp32 elements per inference",
         "fp32_islands": "fp32 islands", "coverage": "int8 coverage", "cycles": "estimated cycles",
         "fp32_cycles": "estimated fp32 cycles", "latency": "estimated latency"}
TIMED = ("cycles", "latency")   # named by the costliest ops; fp32_cycles by its islands


def _label(key: str, figures: Figures) -> str:
    """What the figure is called, saying whether its cycles were measured (`--profile`) or estimated."""
    return LABEL[key].replace("estimated", "measured") if figures.measured_runs else LABEL[key]


def _contributors(key: str, figures: Figures) -> tuple[Contributor, ...]:
    if key in TIMED:
        return figures.time[:5]
    return {"sram": figures.sram, "flash": figures.flash}.get(key, figures.fp32)


def _contributor_text(key: str, figures: Figures) -> str:
    items = _contributors(key, figures)
    if not items:
        return ""
    npu = any(c.name.startswith(NPU_PART) for c in items)
    heading = {"sram": "live at the peak", "flash": "largest parts: NPU partitions and constants" if npu
               else "largest constants"}.get(key, "costliest ops (cycles)" if key in TIMED else "largest fp32 islands")
    if key == "sram" and figures.method_allocator_bytes is not None:
        heading = _sram_heading(figures)
    return f"; {heading}: " + "; ".join(str(c) for c in items)


def _sram_heading(figures: Figures) -> str:
    """What SRAM adds up, and what its contributors are: with NPU partitions, the largest one's scratch."""
    total = f"arena {figures.arena_bytes:,} B + method allocator {figures.method_allocator_bytes:,} B"
    if figures.npu_scratch_bytes is None:
        return f"{total}; the method allocator and the tensors live at the peak"
    return (f"{total} + NPU scratch {figures.npu_scratch_bytes:,} B (the largest partition's: partitions run one "
            "at a time and reuse the temp allocator); the method allocator, each NPU partition's scratch (the "
            "largest counted), and the tensors live at the arena's peak")


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
            budget = f"{_label(key, figures)} budget {show(key, limit.value)} ({limit.origin})"
            unclocked = key == "latency" and figures.cycles is not None
            why = "no board with a clock is set (`board:` or --board)" if unclocked else figures.measured
            message = f"{budget} cannot be checked: {why}"
            found.append(_finding(config, figures, key, message,
                                  {"limit": limit.value, "measured": None, "origin": limit.origin}))
            continue
        broken = value < limit.value if key == "coverage" else value > limit.value
        if not broken:
            continue
        side = "under its minimum" if key == "coverage" else "over its budget"
        by = limit.value - value if key == "coverage" else value - limit.value
        message = (f"{_label(key, figures)} {show(key, value)} {side} {show(key, limit.value)} by {show(key, by)} "
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
        message = (f"{_label(key, figures)} {verb} {show(key, before)} -> {show(key, value)} "
                   f"({_signed(key, value - before)}{relative}), past its growth budget "
                   f"{_growth_text(key, growth)} ({origin}); measured "
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


def figure_findings(report: Report, config: Config, base: dict[str, dict[str, Any]] | None) -> list[Finding]:
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
