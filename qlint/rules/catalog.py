"""The rule catalog: the rule table joined to each rule's YAML file in `rules/` (package `qlint._rules`).

The YAML files are the single source of each rule's documentation (name, default severity, what /
why / example / fix safety); `qlint rule`, docs/rules.md and the README's table render from here.
"""

from __future__ import annotations

from dataclasses import asdict
from functools import lru_cache
from importlib import resources
from typing import Protocol

import yaml

from qlint.rules.table import TABLE, Code, Rule, Scope

REQUIRED_KEYS = (
    "code", "name", "default_severity", "guards", "summary", "what_it_does", "why_it_matters", "example",
    "fix_safety",
)


@lru_cache(maxsize=1)
def load_catalog() -> dict[Code, Rule]:
    documented: dict[Code, dict[str, object]] = {}
    for entry in sorted(resources.files("qlint._rules").iterdir(), key=lambda p: p.name):
        if not entry.name.endswith(".yaml"):
            continue
        data = yaml.safe_load(entry.read_text(encoding="utf-8"))
        missing = [k for k in REQUIRED_KEYS if k not in data]
        if missing:
            raise ValueError(f"rule catalog {entry.name}: missing {', '.join(missing)}")
        if data["code"] not in tuple(Code):
            raise ValueError(f"rule catalog {entry.name}: {data['code']!r} is not in the rule table")
        code = Code(data["code"])
        documented[code] = {k: data[k] for k in REQUIRED_KEYS if k != "code"}
        documented[code]["guards"] = tuple(data["guards"])
    rows = {row.code: row for row in TABLE}
    if set(rows) != set(documented):
        raise ValueError(f"rule table and catalog differ: {sorted(set(rows) ^ set(documented))}")
    for code in rows:
        if code.name.lower().replace("_", "-") != documented[code]["name"]:
            raise ValueError(f"rule table names {code} {code.name}, its catalog {documented[code]['name']}")
    return {code: Rule(**asdict(rows[code]), **documented[code]) for code in sorted(rows)}  # type: ignore[arg-type]


class Selection(Protocol):
    """What a run selected: a config, seen from below the settings layer."""

    def enabled(self, code: Code) -> bool: ...


# Codes a static-tier function reports besides its own: QL001's reports the island whose undecided
# constant has several elements as the fp32 island it is (QL002), so it runs when either is selected.
STATIC_ALSO = {Code.CONSTANT_SCALE_ISLAND: (Code.FP32_ISLAND,)}


def enabled_rules(scope: Scope, config: Selection, tier: str = "full") -> list[Rule]:
    """The rules of one scope that the config selects, by code; with `tier="static"`, those the static
    tier decides (and runs for any code its function may report)."""
    catalog = load_catalog()
    if tier == "static":
        return [r for code, r in sorted(catalog.items()) if r.scope == scope and r.static and any(
            config.enabled(c) for c in (code, *STATIC_ALSO.get(code, ())))]
    return [r for code, r in sorted(catalog.items()) if r.scope == scope and config.enabled(code)]


def rule_record(r: Rule) -> dict[str, object]:
    """Every field of a rule, its page as `explanation` (ruff's `rule --output-format json`), for
    `qlint rules --output-format json` and `qlint rule --output-format json`."""
    return {"code": str(r.code), "name": r.name, "summary": r.summary, "default_severity": r.default_severity,
            "fix": r.fix_text, "applicability": str(r.applicability), "availability": str(r.availability),
            "scope": str(r.scope), "static": r.static, "guards": list(r.guards), "explanation": render_rule(r)}


def render_rule(r: Rule) -> str:
    """The `qlint rule CODE` page: ruff's what / why / example / fix safety."""
    guards = ", ".join(r.guards) if r.guards else "none"
    return (
        f"# {r.name} ({r.code})\n\n"
        f"Default severity: {r.default_severity}. Fix: {r.fix_text}. Guards: {guards}.\n\n"
        f"## What it does\n{r.what_it_does.strip()}\n\n"
        f"## Why it matters\n{r.why_it_matters.strip()}\n\n"
        f"## Example\n```python\n{r.example.rstrip()}\n```\n\n"
        f"## Fix safety\n{r.fix_safety.strip()}\n"
    )
