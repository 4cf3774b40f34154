"""Render a Report: text, json, github, sarif, plus the summary table and statistics."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from tabulate import tabulate

from qlint import __version__
from qlint.io.reads import not_a_command, printable
from qlint.records.results import (
    ArtifactStats,
    Finding,
    FixSummary,
    Measurement,
    PlanMemory,
    ProgramIO,
    RemedyReport,
    RemedyStatus,
    Report,
    Severity,
    SiteMeasurement,
    shapes_elided,
)
from qlint.report import OUTPUT_FORMATS
from qlint.report.escape import github_value, markdown_code, markdown_fence, markdown_link, markdown_text
from qlint.rules.builders import time_clause, time_clause_of
from qlint.rules.catalog import load_catalog
from qlint.rules.table import Code

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
SARIF_LEVEL = {"error": "error", "warning": "warning", "info": "note"}
GITHUB_LEVEL = {"error": "error", "warning": "warning", "info": "notice"}


def by_cost(findings: list[Finding]) -> list[Finding]:
    """Each artifact's findings (artifacts in the order they come) costliest first by their estimated
    cycles; findings without an estimate (coverage, budgets, a static check) after them, as they come."""
    artifacts = list(dict.fromkeys(f.artifact for f in findings))
    return sorted(findings, key=lambda f: (artifacts.index(f.artifact), "cycles" not in f.details,
                                           -int(f.details.get("cycles", 0))))


def by_cause(findings: list[Finding]) -> list[list[Finding]]:
    """Findings in report order, with the QL002 islands of one artifact that share a cause gathered
    where the first of them stands: a network of 50 NCHW convolutions is one root cause, not 50."""
    groups: list[list[Finding]] = []
    index: dict[tuple[Any, ...], list[Finding]] = {}
    for f in findings:
        reason = f.details.get("reason") if f.code == Code.FP32_ISLAND else None
        if not reason:
            groups.append([f])
            continue
        key = (f.artifact, f.code, f.severity, f.fixable, shapes_elided(reason))
        if key in index:
            index[key].append(f)
        else:
            index[key] = [f]
            groups.append(index[key])
    return groups


def _group_reason(group: list[Finding]) -> str:
    """The group's cause: as each finding says it when they agree, else with the differing shapes elided."""
    reasons = {str(g.details["reason"]) for g in group}
    return reasons.pop() if len(reasons) == 1 else shapes_elided(str(group[0].details["reason"]))


def _listed(items: list[str], shown: int = 3) -> str:
    more = f" (+{len(items) - shown} more)" if len(items) > shown else ""
    return ", ".join(items[:shown]) + more


def _finding_lines(group: list[Finding], quiet: bool) -> list[str]:
    f = group[0]
    fix = " [*]" if f.fixable else ""
    if len(group) == 1:
        lines = [f"{f.artifact}: {f.code}{fix} [{f.severity}] {f.message}"]
    else:
        elements = sum(int(g.details.get("fp32_elements", 0)) for g in group)
        lines = [f"{f.artifact}: {f.code}{fix} [{f.severity}] {len(group)} fp32 islands, {elements} fp32 elements "
                 f"per inference: {_group_reason(group)}"]
    if quiet:
        return lines
    places = list(dict.fromkeys(g.location for g in group if g.location))
    if places:
        code = f"  {places[0].code}" if places[0].code else ""
        lines.append(f"  --> {places[0]}{code}")
        if len(places) > 1:
            lines.append(f"  and at {_listed([str(p) for p in places[1:]])}")
    elif f.details.get("module"):
        modules = list(dict.fromkeys(str(g.details.get("module")) for g in group if g.details.get("module")))
        lines.append(f"  --> in module {_listed(modules)}")
    nodes = [g.node for g in group if g.node]
    if nodes:
        lines.append(f"  {'node' if len(nodes) == 1 else 'nodes'}: {_listed(nodes)}")
    cost = time_line(group)
    if cost:
        lines.append(f"  {cost}")
    return lines


def _priced(finding: Finding) -> bool:
    """Whether the finding carries its island's time (`full.rules.Context.priced` sets both)."""
    return "time_share" in finding.details and "cycles" in finding.details


def time_line(group: list[Finding]) -> str:
    """The time clause of a group of islands, summed (one island's ends its message), if priced."""
    priced = [g for g in group if _priced(g)]
    if len(group) < 2 or not priced:
        return ""
    cycles = sum(int(g.details["cycles"]) for g in priced)
    share = sum(float(g.details["time_share"]) for g in priced)
    ms = [float(g.details["latency_ms"]) for g in priced if "latency_ms" in g.details]
    return time_clause(cycles, share, sum(ms) if len(ms) == len(priced) else None,
                       all(g.details.get("cycles_measured") for g in priced))


def text(report: Report, *, quiet: bool = False) -> str:
    lines = []
    for group in by_cause(by_cost(report.findings)):
        lines.extend(_finding_lines(group, quiet))
    for remedied in report.remedies:
        lines.extend(remedy_lines(remedied))
    for summary in report.fixes:
        lines.extend(fix_lines(summary))
    lines.extend(memory_line(plan) for plan in report.memory)
    for stats in report.stats:
        lines.extend(profile_lines(stats))
    if report.compared is not None:
        from qlint.report.metrics import delta_lines

        lines.extend(delta_lines(report.deltas, report.compared))
    lines = [printable(line) for line in lines]  # names and messages come from artifacts
    if not quiet and report.stats:
        lines.append("")
        lines.append(summary_table(report, "simple"))
    if not quiet:
        lines.append("")
        lines.append(totals(report))
    # One line each now; none may read as a workflow command in a CI log (an artifact named `::error`).
    return "\n".join(not_a_command(line) for line in "\n".join(lines).split("\n"))


def memory_line(plan: PlanMemory) -> str:
    """A shipped program's memory plan: what `--write memory-plot:` draws for a `.pte`."""
    peak = plan.peak
    return (f"{plan.artifact}: memory plan: arena {plan.arena_bytes} bytes, live peak {peak.bytes} bytes at "
            f"step {peak.step} ({peak.node}): {peak.fp32_bytes} fp32, {peak.input_bytes} of them graph inputs")


def _tally(fix: FixSummary, codes: tuple[str, ...]) -> tuple[int, int]:
    """How many regions of these rules were folded, and how many left."""
    return sum(1 for f in fix.folds if f.code in codes), sum(1 for f in fix.left if f.code in codes)


def fix_lines(fix: FixSummary) -> list[str]:
    if fix.not_written:
        return [not_written_line(fix)]
    verb = "would fold" if fix.dry_run else "folded"
    head = f"{fix.artifact}: {'--diff' if fix.dry_run else 'fixed'}"
    if fix.output and None not in fix.partitions:  # an NPU program: its partitions ran on the TOSA reference model
        head += (f" -> {fix.output} ({fix.pte_bytes} bytes, verified bit-exact on {fix.verified_inputs} inputs, "
                 "its NPU partitions on the TOSA reference model)")
    elif fix.output:
        head += f" -> {fix.output} ({fix.pte_bytes} bytes, verified bit-exact on {fix.verified_inputs} inputs)"
    lines = [head]
    islands = _tally(fix, (Code.CONSTANT_SCALE_ISLAND, Code.FP32_ISLAND, Code.NPU_FALLBACK))  # QL010: an NPU's
    lines.append(f"  islands: {fix.islands_found} found, {islands[0]} {verb}, {islands[1]} left")
    constants = _tally(fix, (Code.CONSTANT_SUBGRAPH,))
    if any(constants):
        lines.append(f"  constant subgraphs: {sum(constants)} found, {constants[0]} {verb}, {constants[1]} left")
    for fold in fix.folds:
        lines.append(f"  {verb} {fold.code} at {fold.node}: {fold.change}")
    for item in fix.left:
        lines.append(f"  left {item.code} at {item.node}: {item.reason}")
    if not fix.dry_run:
        (ops0, ops1), (el0, el1), (mem0, mem1) = fix.fp32_ops, fix.fp32_elements, fix.activation_bytes
        lines.append(f"  fp32 ops {ops0} -> {ops1}; fp32 elements per inference {el0} -> {el1}; "
                     f"planned activation memory {mem0} -> {mem1} bytes")
        (cy0, cy1), (fc0, fc1) = fix.cycles, fix.fp32_cycles
        if None not in (cy0, cy1, fc0, fc1):
            lines.append(f"  estimated cycles {cy0:,} -> {cy1:,}, of which fp32 {fc0:,} -> {fc1:,}")
        if None not in fix.partitions:
            lines.append(f"  NPU partitions {fix.partitions[0]} -> {fix.partitions[1]}")
        if fix.live_peak:
            peak = fix.live_peak
            where = f" ({peak.location})" if peak.location else ""
            lines.append(f"  live peak {fix.live_peak_bytes[0]} -> {fix.live_peak_bytes[1]} bytes, "
                         f"at {peak.node}{where}: {peak.fp32_bytes} fp32, "
                         f"{peak.input_bytes} of them graph inputs")
    lines.append(
        f"  lowering repair: {'needed (linear feeding a batch matmul)' if fix.lowering_repair else 'not needed'}"
    )
    return lines


def not_written_line(fix: FixSummary) -> str:
    """A fix the check's own findings refused: nothing was written for the artifact, and why."""
    return f"{fix.artifact}: fix not written: {fix.not_written}"


def _measured(m: Measurement) -> str:
    return (f"int8 coverage {m.coverage:.0%}, {m.fp32_ops} fp32 ops, {m.fp32_elements} fp32 elements per inference, "
            f"arena {m.arena_bytes} bytes (live peak {m.live_peak_bytes}), SQNR {m.sqnr_db:.1f} dB"
            + (f", est. {m.cycles:,} cycles" if m.cycles is not None else "") + _split(m))


def _split(m: Measurement) -> str:
    """An NPU target's time split: ` (a NPU + b CPU; n partitions)`."""
    if m.partitions is None or m.npu_cycles is None or m.cpu_cycles is None:
        return ""
    return f" ({m.npu_cycles:,} NPU + {m.cpu_cycles:,} CPU; {m.partitions} partition{'s' if m.partitions != 1 else ''})"


def _site_cycles(remedied: RemedyReport, site: SiteMeasurement) -> str:
    """A placed site's inference time against the plain build's: `; est. cycles 66,861 -> 71,204`."""
    if site.cycles is None or remedied.baseline.cycles is None:
        return ""
    return f"; est. cycles {remedied.baseline.cycles:,} -> {site.cycles:,}"


def _compared(before: Measurement, after: Measurement) -> str:
    """A remedy's build against the plain one: SQNR, and on an NPU target the inference's cycles both ways."""
    said = f"SQNR {before.sqnr_db:.1f} -> {after.sqnr_db:.1f} dB"
    if after.partitions is not None and before.cycles is not None and after.cycles is not None:
        said += f"; est. cycles {before.cycles:,}{_split(before)} -> {after.cycles:,}{_split(after)}"
    return said


def kernels_gained(before: Measurement, after: Measurement) -> dict[str, int]:
    """Cortex-M kernels the remedies added, by name (the Counter difference)."""
    return dict(Counter(after.kernels) - Counter(before.kernels))


def io_lines(io: ProgramIO | None) -> list[str]:
    """What the application converts for an int8-io program."""
    if io is None:
        return []
    lines = [f"    input {p.index} ({p.name}) is {q.dtype}: q = clamp(round(x / {q.scale:.8g}) {q.zero_point:+d}, "
             f"{q.qmin}, {q.qmax})" for p in io.inputs for q in [p.qparams]]
    lines += [f"    output {p.index} is {q.dtype}: x = (q {-q.zero_point:+d}) * {q.scale:.8g}"
              for p in io.outputs for q in [p.qparams]]
    return lines


def remedy_lines(remedied: RemedyReport) -> list[str]:
    lines = [f"{remedied.artifact}: remedies (unsafe fixes; SQNR of the int8 program against the float model "
             f"on {remedied.sqnr_inputs} inputs, guard {remedied.max_sqnr_drop_db:g} dB)",
             f"  before: {_measured(remedied.baseline)}"]
    for outcome in remedied.outcomes:
        lines.append(f"  {outcome.status} {outcome.remedy}: {outcome.reason}")
        if outcome.measured is not None and (outcome.status != RemedyStatus.SKIPPED
                                             or outcome.measured.partitions is not None):
            lines.append(f"    {_compared(remedied.baseline, outcome.measured)}")
        if outcome.sites:
            placed = any(site.cycles is not None for site in outcome.sites)
            lines.append("    each LayerNorm alone on the CPU:" if placed else "    each site alone, worst first:")
            lines.extend(f"      {site.site}: {site.failed}" if site.failed else
                         f"      {site.site}: SQNR {remedied.baseline.sqnr_db:.1f} -> {site.sqnr_db:.1f} dB "
                         f"({site.sqnr_db - remedied.baseline.sqnr_db:+.2f} dB)" + _site_cycles(remedied, site)
                         for site in outcome.sites)
        if outcome.status == RemedyStatus.KEPT:
            lines.append("    in your export script:")
            lines.extend(f"      {line}" for line in outcome.user_change)
            lines.extend(io_lines(outcome.io))
    if remedied.kept and remedied.final is not None:
        lines.append(f"  after: {_measured(remedied.final)}")
        gained = kernels_gained(remedied.baseline, remedied.final)
        if gained:
            lines.append(f"  Cortex-M kernels gained: {', '.join(f'{k} x{n}' for k, n in gained.items())}")
    return lines


def estimated_time(stats: ArtifactStats) -> str:
    """`2.31 ms (38%)` at the board's clock, else `445k cycles (38%)`: the estimate and its fp32 share
    (`, measured` after it when a profile measured it)."""
    if stats.cycles is None:
        return "-"
    share = f" ({stats.fp32_cycles / stats.cycles:.0%})" if stats.cycles and stats.fp32_cycles is not None else ""
    how = ", measured" if stats.measured_runs else ""
    if stats.latency_ms is not None:
        return f"{stats.latency_ms:.3g} ms{share}{how}"
    amount = f"{stats.cycles / 1000:,.0f}k cycles" if stats.cycles >= 1000 else f"{stats.cycles} cycles"
    return f"{amount}{share}{how}"


def profile_lines(stats: ArtifactStats) -> list[str]:
    """A profiled program's operators: the estimate beside the measurement, costliest measured first."""
    if not stats.profile:
        return []
    runs = f"{stats.measured_runs} run{'s' if stats.measured_runs != 1 else ''}"
    rows = [[row.op, row.calls, f"{row.estimated:,}", f"{row.measured:,}",
             f"{row.ratio:.2f}x" if row.ratio is not None else "-"] for row in stats.profile]
    total = sum(r.estimated for r in stats.profile)
    comparable = total and all(r.estimated for r in stats.profile)  # else some of the time has no estimate
    rows.append(["(all)", sum(r.calls for r in stats.profile), f"{total:,}", f"{stats.cycles or 0:,}",
                 f"{(stats.cycles or 0) / total:.2f}x" if comparable else "-"])
    table = tabulate(rows, headers=["operator", "calls", "estimated cycles", "measured cycles", "measured/estimated"],
                     tablefmt="simple", disable_numparse=True, colalign=("left", "right", "right", "right", "right"))
    npu = [f"  {row.op}: the NPU's runs took {row.npu:,} of its {row.measured:,} cycles (the Ethos-U backend's "
           "NPU event); the rest copied the inputs and ran the backend" for row in stats.profile if row.npu is not None]
    return [f"{stats.artifact}: measured on the device (median of {runs}) beside the estimate for {stats.core}:",
            *("  " + line for line in table.splitlines()), *npu]


def summary_table(report: Report, fmt: str = "simple", name: Callable[[str], str] = printable) -> str:
    """The artifacts in a table (`name`: how an artifact's name is escaped for the format)."""
    rows = [
        [
            name(s.artifact),
            s.nodes,
            "-" if s.static else s.int_kernels,
            s.fp32_islands,
            s.fp32_elements,
            "-" if s.static else f"{s.coverage:.0%}{' by calls' if s.coverage_counts == 'calls' else ''}",
            "static tier" if s.static else "yes" if s.lowered else "no (QL003)",
            estimated_time(s),
        ]
        for s in report.stats
    ]
    headers = ["artifact", "nodes", "int8 kernels", "fp32 islands", "fp32 elements", "coverage", "lowered",
               "time (fp32)" if any(s.measured_runs for s in report.stats) else "est. time (fp32)"]
    if any(s.partitions is not None for s in report.stats):  # a column only where a run lowered for an NPU
        headers.append("NPU partitions")
        for row, s in zip(rows, report.stats, strict=True):
            row.append(npu_partitions(s))
    return tabulate(rows, headers=headers, tablefmt=fmt)


def npu_partitions(stats: ArtifactStats) -> str:
    """`2 on ethos-u55-128: 12,800/19,469 NPU cycles, SRAM 3,392/2,816 B, flash 2,720/3,344 B`: the
    delegate calls and each one's Vela cycles (when compiled here), scratch and weights, in execution
    order (each call's own: how calls share SRAM is the runtime's)."""
    if stats.partitions is None:
        return "-"
    if not stats.delegates:
        return f"{stats.partitions} on {stats.target}"
    sram, flash = ("/".join(f"{getattr(d, field):,}" for d in stats.delegates) for field in ("sram", "flash"))
    cycles = [d.npu_cycles for d in stats.delegates]
    timed = "/".join(f"{c:,}" for c in cycles if c is not None) + " NPU cycles, " if None not in cycles else ""
    return f"{stats.partitions} on {stats.target}: {timed}SRAM {sram} B, flash {flash} B"


def totals(report: Report) -> str:
    by_severity = Counter(f.severity for f in report.findings)
    fixable = sum(1 for f in report.findings if f.fixable)
    if not report.findings:
        if report.errors:
            text = "No findings in the inputs that could be checked."
        else:
            text = "All checks passed." if report.checked or report.stats else "No artifacts checked."
    else:
        parts = ", ".join(f"{by_severity[s]} {s}" for s in list(Severity)[:-1] if by_severity[s])
        text = f"Found {len(report.findings)} finding{'s' if len(report.findings) != 1 else ''} ({parts})."
        if fixable:
            text += f"\n[*] {fixable} fixable with `qlint check --fix`."
    refused = sum(1 for fix in report.fixes if fix.not_written)
    if refused:
        text += f"\n{refused} fix{'es' if refused != 1 else ''} not written: the findings above say why."
    if report.errors:
        text += f"\n{len(report.errors)} input{'s' if len(report.errors) != 1 else ''} could not be checked."
    return text


def _counts(report: Report) -> list[dict[str, Any]]:
    """Findings per rule, most first (ruff's `--statistics`): code, name, count, and whether any is fixable."""
    catalog = load_catalog()
    counts = Counter(f.code for f in report.findings)
    fixable = {f.code for f in report.findings if f.fixable}
    return [{"code": code, "name": catalog[code].name, "count": count, "fixable": code in fixable}
            for code, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def statistics(report: Report) -> str:
    """`--statistics`: a line a rule, its count first."""
    rows = [[c["count"], c["code"], "[*]" if c["fixable"] else "", c["name"]] for c in _counts(report)]
    return tabulate(rows, tablefmt="plain")


def statistics_json(report: Report) -> str:
    """`--statistics --output-format json`: the same counts as a list of records, as ruff writes them."""
    return json.dumps(_counts(report), indent=2)


def as_json(report: Report) -> str:
    return json.dumps(
        {
            "version": __version__,
            "findings": [f.to_dict() for f in report.findings],
            "artifacts": [s.to_dict() for s in report.stats],
            "errors": [{"artifact": e.artifact, "message": e.message} for e in report.errors],
            "fixes": [f.to_dict() for f in report.fixes],
            "remedies": [r.to_dict() for r in report.remedies],
            "memory": [m.to_dict() for m in report.memory],
            **_figures_and_compare(report),
        },
        indent=2,
    )


def _figures_and_compare(report: Report) -> dict[str, Any]:
    """The figures and the comparison, in JSON only when the run measured (budgets, metrics, --compare)."""
    found: dict[str, Any] = {}
    if report.figures:
        found["figures"] = [{"artifact": f.artifact, **f.to_dict()} for f in report.figures]
    if report.compared is not None:
        found["compare"] = {"base": report.compared, "artifacts": [
            {"artifact": d.artifact, "before": d.before, "after": d.after} for d in report.deltas]}
    return found


def github(report: Report) -> str:
    """GitHub workflow commands: one annotation per finding, on the model source line."""
    catalog = load_catalog()
    lines = []
    for f in report.findings:
        props = [f"file={github_value(f.location.path if f.location else f.artifact, True)}"]
        if f.location:
            props.append(f"line={f.location.line}")
        props.append(f"title={github_value(f'{f.code} {catalog[f.code].name}', True)}")
        lines.append(f"::{GITHUB_LEVEL[f.severity]} {','.join(props)}::{github_value(f'{f.artifact}: {f.message}')}")
    for e in report.errors:
        lines.append(f"::error file={github_value(e.artifact, True)},title=qlint::{github_value(e.message)}")
    for fix in report.fixes:
        if fix.not_written:
            lines.append(f"::warning file={github_value(fix.artifact, True)},title=qlint --fix::"
                         f"{github_value(not_written_line(fix))}")
    if report.compared is not None:
        lines += _delta_annotations(report)
    return "\n".join(printable(line) for line in lines)


def _delta_annotations(report: Report) -> list[str]:
    """One notice per artifact whose figures changed against the base run, on its model source line
    (the largest fp32 island's, or the tensor at the SRAM peak's) where one is known."""
    from qlint.report.metrics import delta_rows

    sources = {f.artifact: next((c.location for c in (*f.fp32, *f.sram, *f.flash) if c.location), None)
               for f in report.figures}
    changes: dict[str, list[str]] = {}
    for artifact, figure, before, after, difference in delta_rows(report.deltas):
        changes.setdefault(artifact, []).append(f"{figure} {before} -> {after} ({difference})" if before or after
                                                else figure.strip("()"))
    lines = []
    for artifact, said in changes.items():
        where = sources.get(artifact)
        props = [f"file={github_value(where.path, True)}", f"line={where.line}"] if where else []
        props.append(f"title={github_value('qlint: changed against the base', True)}")
        lines.append(f"::notice {','.join(props)}::{github_value(f'{artifact}: ' + '; '.join(said))}")
    return lines


def sarif(report: Report) -> str:
    catalog = load_catalog()
    codes = list(catalog)
    rules = [
        {
            "id": r.code,
            "name": r.name,
            "shortDescription": {"text": r.summary.strip()},
            "fullDescription": {"text": r.what_it_does.strip()},
            "help": {"text": f"{r.why_it_matters.strip()}\n\nFix safety: {r.fix_safety.strip()}"},
            "defaultConfiguration": {"level": SARIF_LEVEL.get(r.default_severity, "warning")},
        }
        for r in catalog.values()
    ]
    results = []
    for f in report.findings:
        location: dict[str, Any] = {
            "physicalLocation": {
                "artifactLocation": {"uri": f.location.path if f.location else f.artifact},
                **({"region": {"startLine": f.location.line}} if f.location else {}),
            }
        }
        if f.node:
            location["logicalLocations"] = [{"name": f.node, "kind": "function"}]
        results.append(
            {
                "ruleId": f.code,
                "ruleIndex": codes.index(f.code),
                "level": SARIF_LEVEL[f.severity],
                "message": {"text": f.message},
                "locations": [location],
                "properties": {"artifact": f.artifact, "fixable": f.fixable},
            }
        )
    notifications = [{"level": "error", "message": {"text": f"{e.artifact}: {e.message}"}} for e in report.errors]
    notifications += [{"level": "warning", "message": {"text": not_written_line(fix)}}
                      for fix in report.fixes if fix.not_written]
    run = {
        "tool": {
            "driver": {
                "name": "qlint",
                "version": __version__,
                "informationUri": "https://github.com/qlint/qlint",
                "rules": rules,
            }
        },
        "results": results,
        "invocations": [{"executionSuccessful": not report.errors, "toolExecutionNotifications": notifications}],
    }
    return json.dumps({"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}, indent=2)


def markdown(report: Report, attachments: Sequence[str] = ()) -> str:
    """A summary for `$GITHUB_STEP_SUMMARY`: the artifact table, then the findings, then links to
    the other files the run wrote (`attachments`: a memory plot, Model Explorer node data)."""
    lines = ["## qlint", ""]
    if report.stats:
        lines += [summary_table(report, "github", markdown_text), ""]
    if report.findings:
        rows = [
            [
                f"`{f.code}`",
                f.severity,
                markdown_text(f.artifact),
                markdown_code(str(f.location)) if f.location else "",
                markdown_text(f.message.removesuffix(f"; {time_clause_of(f.details)}") if _priced(f) else f.message),
                _time_cell(f) if _priced(f) else "",
            ]
            for f in by_cost(report.findings)
        ]
        measured = any(f.details.get("cycles_measured") for f in report.findings)
        headers = ["code", "severity", "artifact", "source", "message", "time" if measured else "est. time"]
        lines += [tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True), ""]
    for remedied in report.remedies:
        lines += [*markdown_fence([printable(line) for line in remedy_lines(remedied)]), ""]
    for fix in report.fixes:
        lines += [*markdown_fence([printable(line) for line in fix_lines(fix)]), ""]
    if report.memory:
        lines += [*markdown_fence([printable(memory_line(plan)) for plan in report.memory]), ""]
    for stats in report.stats:
        if stats.profile:
            lines += [*markdown_fence([printable(line) for line in profile_lines(stats)]), ""]
    if report.compared is not None:
        from qlint.report.metrics import delta_markdown

        lines += [delta_markdown(report.deltas, report.compared), ""]
    for error in report.errors:
        lines.append(f"- :x: {markdown_code(error.artifact)}: {markdown_text(error.message)}")
    for link in attachments:
        lines += [markdown_link(link, link, image=link.lower().endswith((".svg", ".png"))), ""]
    lines.append(totals(report).replace("\n", "  \n"))
    return "\n".join(lines)


def _time_cell(finding: Finding) -> str:
    """`3,232 cycles (20.1%)`: the summary's time column, so a priced finding's message there ends
    before its time clause (annotations and SARIF, which have no column, keep it)."""
    latency = finding.details.get("latency_ms")
    at_clock = f", {float(latency):.3g} ms" if latency is not None else ""
    return f"{int(finding.details['cycles']):,} cycles{at_clock} ({float(finding.details['time_share']):.1%})"


FORMATS: dict[str, Callable[[Report], str]] = dict(
    zip(OUTPUT_FORMATS[1:], (as_json, github, sarif, markdown), strict=True))  # text has options of its own
