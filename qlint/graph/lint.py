"""One program: lower it for Cortex-M and run the rules. Used by the engine, `--fix` and the API."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias

from qlint.settings.config import Config
from qlint.settings.options import RunOptions

if TYPE_CHECKING:
    from qlint.graph.cost import ProgramCost
    from qlint.graph.rules import Linted
    from qlint.graph.view import GraphView

Measure: TypeAlias = "Callable[[GraphView, ProgramCost], ProgramCost]"


def lint_program(program: Any, artifact: str, config: Config, options: RunOptions | None = None, *,
                 values_verified: bool = False, measure: Measure | None = None) -> Linted:
    """Lower one quantized ExportedProgram and run the enabled rules on the result.

    When lowering raises, the failure becomes a QL003 finding and the rules run
    on the quantized program instead, so the islands are still reported.
    `values_verified`: the caller runs QL007's value check itself (`--fix`, on its inputs).
    `measure`: measured cycles of the lowered program's ops from its view and the estimate (`--profile`).
    """
    from qlint.graph.lowering import LoweringError, run_passes, to_edge
    from qlint.graph.rules import run_rules
    from qlint.graph.view import GraphView

    options = options or RunOptions()
    try:
        edge = to_edge(program)
        lowered = run_passes(edge.exported_program(), config.target_cpu, options.order)
    except LoweringError as exc:
        return run_rules(GraphView(program), artifact, config, failure=exc, verbose=options.verbose)
    view = GraphView(lowered, quantized=program)
    linted = run_rules(view, artifact, config, verbose=options.verbose, values_verified=values_verified,
                       measure=None if measure is None else functools.partial(measure, view))
    linted.lowered = lowered
    return linted
