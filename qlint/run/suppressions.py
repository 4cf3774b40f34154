"""Inline suppressions (`# qlint: ignore[QL001]`) and baselines (accepted existing findings).

Both are applied to a finished Report, after the rules ran, so the rules never
need to know about them.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from qlint.io.limits import RECORD_MAX_BYTES, SOURCE_MAX_BYTES
from qlint.io.reads import ReadError, printable, read_input, read_json
from qlint.records.results import Finding, Location, Report
from qlint.rules.catalog import enabled_rules
from qlint.rules.table import Code, Scope
from qlint.settings.config import Config

IGNORE = re.compile(r"#\s*qlint:\s*ignore(?:\[(?P<codes>[^\]]*)\])?")




class _Sources:
    """Source lines for suppression comments, read only from regular files inside the
    repository and below a size cap: an artifact's stack trace may name `/dev/zero`."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.lines: dict[str, list[str]] = {}

    def get(self, file: str) -> list[str]:
        if file not in self.lines:
            self.lines[file] = self._read(file)
        return self.lines[file]

    def _read(self, file: str) -> list[str]:
        try:
            path = Path(file).resolve()
            if not file or not path.is_relative_to(self.root):
                return []
            return read_input(path, SOURCE_MAX_BYTES, "source file").decode("utf-8", "replace").splitlines()
        except (ReadError, OSError, RuntimeError, ValueError):
            return []

    def comment(self, file: str, line: int) -> set[str] | None:
        """Codes a line suppresses (empty set: all), or None without a suppression."""
        lines = self.get(file)
        match = IGNORE.search(lines[line - 1]) if 0 < line <= len(lines) else None
        if match is None:
            return None
        return {c.strip() for c in (match["codes"] or "").split(",") if c.strip()}


def apply_suppressions(report: Report, config: Config) -> None:
    """Drop findings silenced on their source line; report unused comments as QL006."""
    sources = _Sources(config.root)
    kept: list[Finding] = []
    used: set[tuple[str, int]] = set()
    files: dict[str, str] = {}
    for finding in report.findings:
        location = finding.location
        if location is not None:
            files[location.file] = location.path
            codes = sources.comment(location.file, location.line)
            if codes is not None and (not codes or finding.code in codes):
                used.add((location.file, location.line))
                continue
        kept.append(finding)
    for rule in enabled_rules(Scope.REPORT, config):
        kept.extend(REPORT_RULES[rule.code](config, sources, files, used))
    report.findings = kept


def unused_suppressions(
    config: Config, sources: _Sources, files: dict[str, str], used: set[tuple[str, int]]
) -> list[Finding]:
    """Suppression comments in the files findings pointed at that silenced nothing."""
    return [
        Finding(
            Code.UNUSED_SUPPRESSION, config.severity(Code.UNUSED_SUPPRESSION),
            "unused suppression: no finding on this line matched it",
            artifact=shown, location=Location(shown, number, printable(text.strip()), file),
        )
        for file, shown in sorted(files.items())
        for number, text in enumerate(sources.get(file), 1)
        if IGNORE.search(text) and (file, number) not in used
    ]


# The rules that run on a finished report (the rule table's `Scope.REPORT`), by code.
REPORT_RULES: dict[Code, Callable[[Config, _Sources, dict[str, str], set[tuple[str, int]]], list[Finding]]] = {
    Code.UNUSED_SUPPRESSION: unused_suppressions,
}


def baseline_key(finding: Finding) -> str:
    """Stable across unrelated graph changes: no node names, line numbers or measured values."""
    where = f"{finding.location.path}|{finding.location.code}" if finding.location else ""
    ops = ",".join(finding.details.get("ops", []))
    return f"{finding.code}|{finding.artifact}|{where}|{ops}"


def write_baseline(report: Report, path: Path) -> None:
    """Record the findings in `path`; a BaselineError when it cannot be written."""
    from qlint.io.writes import write_atomic

    counts = Counter(baseline_key(f) for f in report.findings)
    data = {"qlint-baseline": 1, "findings": [{"key": k, "count": n} for k, n in sorted(counts.items())]}
    try:
        write_atomic(path, (json.dumps(data, indent=2) + "\n").encode())
    except OSError as exc:
        raise BaselineError(f"cannot write baseline {printable(str(path))}: {exc.strerror or exc}") from None


class BaselineError(Exception):
    """A baseline that cannot be read or written: one line, exit 2."""


def read_baseline(path: Path) -> Counter[str]:
    """How many findings of each key the baseline at `path` accepts; a BaselineError when it cannot be read.
    Read before a run starts, so that a bad baseline is said before anything is checked."""
    where = printable(str(path))
    try:
        data = read_json(path, RECORD_MAX_BYTES, "baseline", "a qlint baseline")
    except ReadError as exc:
        raise BaselineError(str(exc)) from None
    allowed: Counter[str] = Counter()
    items = data.get("findings") if isinstance(data, dict) and data.get("qlint-baseline") == 1 else None
    if not isinstance(items, list):
        raise BaselineError(f"{where}: not a qlint baseline (no qlint-baseline: 1 and findings list)")
    for number, item in enumerate(items, 1):
        key, count = (item.get("key"), item.get("count")) if isinstance(item, dict) else (None, None)
        if not isinstance(key, str) or not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise BaselineError(f"{where}: entry {number} is not {{key: text, count: whole number >= 0}}")
        allowed[key] += count
    return allowed


def apply_baseline(report: Report, accepted: Counter[str]) -> int:
    """Drop findings the baseline accepts (up to its count per key); return how many."""
    allowed = Counter(accepted)
    kept, dropped = [], 0
    for finding in report.findings:
        key = baseline_key(finding)
        if allowed[key] > 0:
            allowed[key] -= 1
            dropped += 1
        else:
            kept.append(finding)
    report.findings = kept
    return dropped
