"""Inline suppressions (`# qlint: ignore[QL001]`) and baselines (accepted existing findings).

Both are applied to a finished Report, after the rules ran, so the rules never
need to know about them.
"""

from __future__ import annotations

import json
import linecache
import re
from collections import Counter
from pathlib import Path

from qlint.config import Config
from qlint.findings import Finding, Location, Report

IGNORE = re.compile(r"#\s*qlint:\s*ignore(?:\[(?P<codes>[^\]]*)\])?")


def _comment(file: str, line: int) -> set[str] | None:
    """Codes a line suppresses (empty set: all), or None without a suppression."""
    if not file:
        return None
    match = IGNORE.search(linecache.getline(file, line))
    if match is None:
        return None
    return {c.strip() for c in (match["codes"] or "").split(",") if c.strip()}


def apply_suppressions(report: Report, config: Config) -> None:
    """Drop findings silenced on their source line; report unused comments as QL006."""
    linecache.clearcache()
    kept: list[Finding] = []
    used: set[tuple[str, int]] = set()
    files: dict[str, str] = {}
    for finding in report.findings:
        location = finding.location
        codes = _comment(location.file, location.line) if location else None
        if location:
            files[location.file] = location.path
        if codes is not None and (not codes or finding.code in codes):
            used.add((location.file, location.line))
            continue
        kept.append(finding)
    report.findings = kept
    if config.severity("QL006") == "off":
        return
    for file, shown in sorted(files.items()):
        for number, text in enumerate(linecache.getlines(file), 1):
            if IGNORE.search(text) and (file, number) not in used:
                kept.append(Finding(
                    "QL006", config.severity("QL006"), "unused suppression: no finding on this line matched it",
                    artifact=shown, location=Location(shown, number, text.strip(), file),
                ))


def baseline_key(finding: Finding) -> str:
    """Stable across unrelated graph changes: no node names, line numbers or measured values."""
    where = f"{finding.location.path}|{finding.location.code}" if finding.location else ""
    ops = ",".join(finding.details.get("ops", []))
    return f"{finding.code}|{finding.artifact}|{where}|{ops}"


def write_baseline(report: Report, path: Path) -> None:
    from qlint.output import write_atomic

    counts = Counter(baseline_key(f) for f in report.findings)
    data = {"qlint-baseline": 1, "findings": [{"key": k, "count": n} for k, n in sorted(counts.items())]}
    write_atomic(path, (json.dumps(data, indent=2) + "\n").encode())


class BaselineError(Exception):
    pass


def apply_baseline(report: Report, path: Path) -> int:
    """Drop findings the baseline accepts (up to its count per key); return how many."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        allowed = Counter({item["key"]: int(item["count"]) for item in data["findings"]})
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BaselineError(f"{path}: not a qlint baseline ({type(exc).__name__})") from None
    kept, accepted = [], 0
    for finding in report.findings:
        key = baseline_key(finding)
        if allowed[key] > 0:
            allowed[key] -= 1
            accepted += 1
        else:
            kept.append(finding)
    report.findings = kept
    return accepted
