"""The memory plan as a picture: live arena bytes at every step, fp32 and integer, before and after the folds.

One row per fixed program, the unfolded plan on the left and the folded one on
the right, and one row per checked `.pte` (its plan as shipped, step by
instruction), each with its live peak marked and labelled by the operator that
runs there and its source line. The series are the report's own
(`FixSummary.memory`, `Report.memory`), the ones its live-peak lines are read from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qlint.records.results import LivePeak, MemoryTimeline, Report

SUFFIXES = (".svg", ".png")


def plain(text: str) -> str:
    """Text from the artifact (a file name, a source path) as matplotlib draws it literally: between
    two `$` it would parse math, and an unbalanced brace there raises while drawing."""
    return text.replace("$", r"\$")


class PlotError(Exception):
    """Nothing to draw (no `--fix`, nothing lowered), no matplotlib, or not an .svg/.png path."""


@dataclass(frozen=True)
class Panel:
    artifact: str
    title: str                 # "before folds" | "after folds"
    timeline: MemoryTimeline
    peak: LivePeak | None
    budget: int | None = None  # the artifact's SRAM budget, drawn as a line


def panels(report: Report) -> list[list[Panel]]:
    """Rows of panels: (before, after) for every fix that carries a memory plan, and the plan
    as shipped for every checked `.pte`."""
    budgets = {f.artifact: f.sram_budget for f in report.figures}
    rows = []
    for fix in report.fixes:
        before, after = fix.memory
        if before is None or after is None:
            continue
        budget = budgets.get(fix.artifact)
        rows.append([Panel(fix.artifact, "before folds", before, fix.live_peak_before, budget),
                     Panel(fix.artifact, "after folds", after, fix.live_peak, budget)])
    rows += [[Panel(plan.artifact, f"as shipped, arena {plan.arena_bytes} B", plan.timeline, plan.peak,
                    budgets.get(plan.artifact))] for plan in report.memory]
    return rows


def figure(report: Report) -> Any:
    """A matplotlib Figure of the report's memory plans (no display needed)."""
    rows = panels(report)
    if not rows:
        raise PlotError("no memory plan to draw: --write memory-plot: needs --fix on a program that lowers, "
                        "or a .pte")
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotError("matplotlib is not installed: pip install 'qlint[plot]'") from None
    fig = Figure(figsize=(12, 3.4 * len(rows)), layout="constrained")
    grid = fig.add_gridspec(len(rows), 2)
    for index, row in enumerate(rows):
        first = fig.add_subplot(grid[index, 0] if len(row) == 2 else grid[index, :])
        _draw(first, row[0])
        if len(row) == 2:
            _draw(fig.add_subplot(grid[index, 1], sharey=first), row[1])
    return fig


def _draw(ax: Any, panel: Panel) -> None:
    steps = list(range(len(panel.timeline.total)))
    ax.fill_between(steps, 0, panel.timeline.fp32, step="mid", color="#d7263d", alpha=0.55, linewidth=0)
    ax.fill_between(steps, panel.timeline.fp32, panel.timeline.total, step="mid", color="#1b6ca8", alpha=0.45,
                    linewidth=0)
    ax.plot(steps, panel.timeline.total, drawstyle="steps-mid", color="#1b6ca8", linewidth=1, label="live bytes")
    ax.plot(steps, panel.timeline.fp32, drawstyle="steps-mid", color="#d7263d", linewidth=1, label="of which fp32")
    if panel.budget is not None:
        ax.axhline(panel.budget, color="black", linestyle="--", linewidth=1, label=f"SRAM budget {panel.budget} B")
    if panel.peak is not None:
        where = f"\n{panel.peak.location}" if panel.peak.location else ""
        ax.plot([panel.peak.step], [panel.peak.bytes], marker="v", color="black", linestyle="none",
                label="live peak")
        label = plain(f"peak {panel.peak.bytes} B at {panel.peak.node}{where}")
        ax.annotate(label, (panel.peak.step, panel.peak.bytes), textcoords="offset points", xytext=(6, 4),
                    va="bottom", fontsize=8)
    ax.set_title(plain(f"{panel.artifact}: {panel.title}"), fontsize=10)
    ax.set_xlabel("step of the planned program")
    ax.set_ylabel("planned arena bytes live")
    ax.set_ylim(0, max(panel.timeline.total) * 1.3)  # room above the peak for its label
    ax.legend(loc="upper right", fontsize=8)


def write_plot(report: Report, path: Path, draw: Callable[[Report], Any] | None = None, what: str = "memory plot"
               ) -> None:
    """Draw `draw(report)` (this module's `figure`, or the time plot's) into `path`, SVG or PNG by its
    suffix, atomically; no date in an SVG, so the same report draws the same bytes."""
    import io

    from qlint.io.writes import write_atomic

    if path.suffix.lower() not in SUFFIXES:
        raise PlotError(f"{path}: a {what} is written as .svg or .png")
    buffer = io.BytesIO()
    kind = path.suffix.lower().lstrip(".")
    (draw or figure)(report).savefig(buffer, format=kind, metadata={"Date": None} if kind == "svg" else None)
    write_atomic(path, buffer.getvalue())
