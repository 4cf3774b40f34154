"""One program: lower it for Cortex-M and run the rules. Used by the engine, `--fix` and the API."""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any

from qlint.config import Config
from qlint.findings import ArtifactStats, Finding


@dataclass
class Checked:
    """One program after checking: what the rules found and what was lowered."""

    findings: list[Finding]
    stats: ArtifactStats
    analysis: Any
    lowered: Any | None       # the lowered ExportedProgram, when lowering worked


def check_program(
    program: Any, artifact: str, config: Config, *, order: str = "repaired", verbose: bool = False
) -> Checked:
    """Lower one quantized ExportedProgram and run every rule on the result.

    When lowering raises, the failure becomes a QL003 finding and the rules run
    on the quantized program instead, so the islands are still reported.
    """
    from qlint.checks import FindingFactory, check
    from qlint.graph_view import GraphView
    from qlint.lowering import LoweringError, first_line, run_passes, to_edge

    make = FindingFactory(artifact, config)
    failure: Finding | None = None
    lowered = None
    try:
        edge = to_edge(program)
        lowered = run_passes(edge.exported_program(), config.target_cpu, order)
        view = GraphView(lowered)
    except LoweringError as exc:
        node = exc.node
        where = f" at node {node.name}" if node is not None else ""
        message = f"Cortex-M lowering failed in {exc.pass_name}{where}: {first_line(exc.cause)}"
        if verbose:
            message += "\n" + "".join(traceback.format_exception(exc.cause))
        failure = make.make("QL003", message, (node,) if node is not None else (), pass_name=exc.pass_name)
        lowered = None
        view = GraphView(program)
    findings, stats, analysis = check(view, artifact, config)
    if failure is not None:
        findings.insert(0, failure)
    return Checked(findings, stats, analysis, lowered)
