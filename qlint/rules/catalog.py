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

from qlint.rules.table import TABLE, Rule, Scope

REQUIRED_KEYS = (
    "code", "name", "default_severity", "guards", "summary", "what_it_does", "why_it_matters", "example",
    "fix_safety",
)


@lru_cache(maxsize=1)
def load_catalog() -> dict[str, Rule]:
    documented: dict[str, dict[str, object]] = {}
    for entry in sorted(resources.files("qlint._rules").iterdir(), key=lambda p: p.name):
        if not entry.name.endswith(".yaml"):
            continue
        data = yaml.safe_load(entry.read_text(encoding="utf-8"))
        missing = [k for k in REQUIRED_KEYS if k not in data]
        if missing:
            raise ValueError(f"rule catalog {entry.name}: missing {', '.join(missing)}")
        documented[data["code"]] = {k: data[k] for k in REQUIRED_KEYS if k != "code"}
        documented[data["code"]]["guards"] = tuple(data["guards"])
    rows = {row.code: row for row in TABLE}
    if set(rows) != set(documented):
        raise ValueError(f"rule table and catalog differ: {sorted(set(rows) ^ set(documented))}")
    return {code: Rule(**asdict(rows[code]), **documented[code]) for code in sorted(rows)}  # type: ignore[arg-type]


class Selection(Protocol):
    """What a run selected: a config, seen from below the settings layer."""

    def enabled(self, code: str) -> bool: ...


def enabled_rules(scope: Scope, config: Selection) -> list[Rule]:
    """The rules of one scope that the config selects, by code."""
    return [r for code, r in sorted(load_catalog().items()) if r.scope == scope and config.enabled(code)]


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
