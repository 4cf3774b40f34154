"""The time as a picture: for each checked program, its costliest ops as bars, int8 and fp32 apart.

One panel per artifact, the ops that take the most of the estimated time (`ArtifactStats.costliest`,
the ones a latency budget names), each labelled with its op and model source line, in milliseconds at
the board's clock or in cycles without one. The figures are the report's own: measured when a
profile was given (`--profile`), and the title says which.
"""

from __future__ import annotations

from typing import Any

from qlint.records.results import ArtifactStats, Report
from qlint.report.memory_plot import PlotError, plain

INT8, FP32 = "#1b6ca8", "#d7263d"


def figure(report: Report) -> Any:
    """A matplotlib Figure of each estimated artifact's costliest ops (no display needed)."""
    shown = [s for s in report.stats if s.costliest and s.cycles]
    if not shown:
        raise PlotError("no estimate to draw: --write time-plot: needs a program that lowers")
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotError("matplotlib is not installed: pip install 'qlint[plot]'") from None
    heights = [0.9 + 0.32 * len(s.costliest) for s in shown]
    fig = Figure(figsize=(12, sum(heights)), layout="constrained")
    grid = fig.add_gridspec(len(shown), 1, height_ratios=heights)
    for index, stats in enumerate(shown):
        _draw(fig.add_subplot(grid[index, 0]), stats)
    return fig


def _draw(ax: Any, stats: ArtifactStats) -> None:
    ops = list(reversed(stats.costliest))  # the costliest at the top
    assert stats.cycles
    per_ms = stats.cycles / stats.latency_ms if stats.latency_ms else None
    values = [op.amount / per_ms if per_ms else op.amount for op in ops]
    colors = [FP32 if "fp32" in op.what else INT8 for op in ops]
    labels = [plain(f"{op.what.split(',')[0]} {op.location or op.name}") for op in ops]
    ax.barh(range(len(ops)), values, color=colors)
    ax.set_yticks(range(len(ops)), labels, fontsize=8)
    for row, (op, value) in enumerate(zip(ops, values, strict=True)):
        ax.annotate(f"{100 * op.amount / stats.cycles:.1f}%", (value, row), textcoords="offset points",
                    xytext=(4, 0), va="center", fontsize=8)
    total = f"{stats.latency_ms:.3g} ms" if stats.latency_ms else f"{stats.cycles:,} cycles"
    share = f"{100 * (stats.fp32_cycles or 0) / stats.cycles:.0f}%"
    runs = f"{stats.measured_runs} run{'s' if stats.measured_runs != 1 else ''}"
    how = f"measured (median of {runs})" if stats.measured_runs else "estimated"
    ax.set_title(f"{plain(stats.artifact)}: {how} {total}\non {stats.core}, {share} on float values (red)",
                 fontsize=9)
    ax.set_xlabel(f"{how.split()[0]} {'milliseconds' if per_ms else 'cycles'}")
    ax.set_xlim(0, max(values) * 1.15)  # room for the share labels
