"""The rule catalog, read from the YAML files in `rules/` (package `qlint._rules`).

The catalog is the single source of truth for codes, names, default severities
and documentation; the rule implementations look their metadata up here.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import yaml

REQUIRED_KEYS = (
    "code", "name", "default_severity", "fixable", "guards", "summary",
    "what_it_does", "why_it_matters", "example", "fix_safety",
)


@dataclass(frozen=True)
class Rule:
    code: str
    name: str
    default_severity: str
    fixable: bool
    guards: tuple[str, ...]
    summary: str
    what_it_does: str
    why_it_matters: str
    example: str
    fix_safety: str


@lru_cache(maxsize=1)
def load_catalog() -> dict[str, Rule]:
    rules: dict[str, Rule] = {}
    for entry in sorted(resources.files("qlint._rules").iterdir(), key=lambda p: p.name):
        if not entry.name.endswith(".yaml"):
            continue
        data = yaml.safe_load(entry.read_text(encoding="utf-8"))
        missing = [k for k in REQUIRED_KEYS if k not in data]
        if missing:
            raise ValueError(f"rule catalog {entry.name}: missing {', '.join(missing)}")
        data["guards"] = tuple(data["guards"])
        rules[data["code"]] = Rule(**{k: data[k] for k in REQUIRED_KEYS})
    return rules


def render_rule(r: Rule) -> str:
    """The `qlint rule CODE` page: ruff's what / why / example / fix safety."""
    fix = "fixable" if r.fixable else "not fixable"
    guards = ", ".join(r.guards) if r.guards else "none"
    return (
        f"# {r.name} ({r.code})\n\n"
        f"Default severity: {r.default_severity}. {fix.capitalize()}. Guards: {guards}.\n\n"
        f"## What it does\n{r.what_it_does.strip()}\n\n"
        f"## Why it matters\n{r.why_it_matters.strip()}\n\n"
        f"## Example\n```python\n{r.example.rstrip()}\n```\n\n"
        f"## Fix safety\n{r.fix_safety.strip()}\n"
    )
