"""The metrics file (`--write metrics:`, read back by `--compare`) and what changed against it.

A run's figures by artifact, schema-versioned; read field by field, since a pull request's base run
wrote it; and the comparison of two runs as text lines, a markdown table and notices. QL009's growth
limits read the same metrics (`full.over_budget`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from qlint import __version__
from qlint.io.limits import RECORD_MAX_BYTES
from qlint.io.reads import ReadError, printable, read_json
from qlint.records.results import Delta, Figures, Report
from qlint.report.escape import markdown_code, markdown_text, spreadsheet_cell
from qlint.settings.budgets import show
from qlint.settings.sizes import MAX_AMOUNT

METRICS_SCHEMA = 1


class MetricsError(Exception):
    """A metrics file that cannot be read: one line, exit code 2."""


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
    """What a figure of a metrics file should be, when it is not: bytes, counts and cycles are whole
    numbers up to `MAX_AMOUNT` (compared exactly as floats), coverage a share from 0 to 1, latency
    milliseconds from 0 to `MAX_AMOUNT` (NaN and infinities fail the comparison)."""
    if value is None:
        return None
    if key == "coverage":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            return "a share from 0 to 1"
        return None
    if key == "latency_ms":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_AMOUNT:
            return "milliseconds from 0 to 2**53"
        return None
    if type(value) is not int or not 0 <= value <= MAX_AMOUNT:
        return "a whole number from 0 to 2**53"
    return None


def deltas(report: Report, base: dict[str, dict[str, Any]]) -> list[Delta]:
    """What changed against the base run, artifact by artifact; new and removed ones included."""
    now = {f.artifact: f.to_dict() for f in report.figures}
    names = sorted({*now, *base})
    return [Delta(name, base.get(name), now.get(name)) for name in names]


TIMED = ("cycles", "fp32_cycles", "latency")  # figures a profile measures (else estimated)
_SHOWN = {"fp32_islands": "fp32_islands", "fp32_elements": "fp32_elements", "coverage": "coverage",
          "arena_bytes": "sram", "live_peak_bytes": "sram", "method_allocator_bytes": "sram",
          "npu_scratch_bytes": "sram", "sram_bytes": "sram",
          "flash_bytes": "flash", "cycles": "cycles", "fp32_cycles": "fp32_cycles", "latency_ms": "latency"}


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
        measured = any((side or {}).get("cycles_measured_runs") for side in (delta.before, delta.after))
        rows += [[delta.artifact, f"{key} (measured)" if measured and _SHOWN[key] in TIMED else key,
                  _cell(key, b), _cell(key, a), _difference(key, b, a)]
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


def profile_comparison(report: Report, suffix: str) -> str:
    """`--write profile-comparison:FILE` (.csv or .json): each profiled program's operators with the
    estimate beside the measured cycles, for an issue report on the cost model."""
    rows = [{"artifact": s.artifact, "core": s.core, "runs": s.measured_runs, "operator": r.op, "calls": r.calls,
             "estimated_cycles": r.estimated, "measured_cycles": r.measured,
             "measured_over_estimated": None if r.ratio is None else round(r.ratio, 4),
             "npu_run_cycles": r.npu}  # delegate calls: the NPU's run within them (the Ethos-U backend's event)
            for s in report.stats for r in s.profile]
    if suffix == ".json":
        return json.dumps({"schema": 1, "rows": rows}, indent=2) + "\n"
    import csv
    import io

    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]) if rows else ["artifact"], lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: spreadsheet_cell(v) if isinstance(v, str) else v for k, v in row.items()})
    return out.getvalue()
