"""Apply proven folds to a lowered program, verify it end to end, and emit a .pte.

Graph rewriting stays in small functions over nodes; nothing here decides
whether a fold is exact (that is `qlint.analysis.folds`), and nothing is written unless
the folded program reproduces the unfolded one's outputs bit for bit.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch.fx import Node

from qlint.analysis.folds import Fold, FoldKind
from qlint.analysis.regions import Evaluations, moved_evaluations
from qlint.analysis.validity import Invalid, find_invalid, float_reads, integer_clamps, restorable
from qlint.analysis.values import Unchecked
from qlint.fix.errors import FixError
from qlint.fix.program import (
    NO_INPUTS,
    FixResult,
    Serialized,
    float_op_count,
    memory_plan,
    record_after,
    require_same_outputs,
    run_program,
    to_pte,
)
from qlint.fix.repair import rebound_clamps, restore_quantizes
from qlint.io.reads import first_line
from qlint.loading.view import GraphView, constant_inputs, input_node, output_dtype
from qlint.records.results import (
    AppliedFold,
    FixSummary,
    LeftIsland,
)
from qlint.rules.table import Code
from qlint.settings.config import Config
from qlint.settings.options import RunOptions

if TYPE_CHECKING:
    from qlint.full.rules import Linted


def _erase_if_dead(program: Any, nodes: Sequence[Node]) -> None:
    from executorch.backends.transforms.utils import delete_constant_placeholder

    graph = program.graph_module.graph
    pending = list(nodes)
    while pending:
        node = pending.pop()
        if node.graph is not graph or node.users or node.op == "output":
            continue
        inputs = node.all_input_nodes
        if node.op == "placeholder":
            if node.name in constant_inputs(program.graph_signature):
                delete_constant_placeholder(program, node)
            continue
        graph.erase_node(node)
        pending.extend(inputs)


def _constant_node(program: Any, name: str, value: torch.Tensor,
                   kind: Literal["PARAMETER", "CONSTANT_TENSOR"] = "PARAMETER") -> Node:
    """A new lifted constant of the program (`kind` names its `InputKind`), before every input."""
    from executorch.backends.transforms.utils import create_constant_placeholder
    from torch.export.graph_signature import InputKind

    graph = program.graph_module.graph
    first = next(n for n in graph.nodes if n.op == "placeholder")
    with graph.inserting_before(first):
        return create_constant_placeholder(program, graph, name, InputKind[kind], value)


def _replay_reshapes(graph: Any, value: Node, reshapes: list[Node]) -> Node:
    """Re-issue an island's shape ops on its integer input (an elementwise identity or table commutes with them)."""
    for node in reshapes:
        copy_ = graph.call_function(node.target, (value, *node.args[1:]), dict(node.kwargs))
        dtype, val = output_dtype(value), node.meta["val"]
        copy_.meta["val"] = type(val)(v.to(dtype) for v in val) if isinstance(val, (list, tuple)) else val.to(dtype)
        copy_.meta["stack_trace"] = node.meta.get("stack_trace")
        value = copy_
    return value


def _store_constants(program: Any, fold: Fold) -> None:
    """Replace a constant subgraph's results with their stored values and delete what no op reads any more."""
    for result, value in fold.values.items():
        stored = _constant_node(program, f"{result.name}_qlint_const", value, "CONSTANT_TENSOR")
        stored.meta["stack_trace"] = result.meta.get("stack_trace")
        result.replace_all_uses_with(stored)
    _erase_if_dead(program, fold.removed)


def apply(program: Any, fold: Fold) -> None:
    """Rewrite one fold into the program's graph."""
    from executorch.exir.dialects._ops import ops as exir_ops

    if fold.kind == FoldKind.CONSTANT:
        _store_constants(program, fold)
        return
    assert fold.dq is not None
    graph = program.graph_module.graph
    producer = input_node(fold.dq)
    for out in fold.outputs:
        if fold.kind == FoldKind.IDENTITY:
            with graph.inserting_before(out):
                replacement = _replay_reshapes(graph, producer, fold.reshapes)
        elif fold.kind == FoldKind.TABLE:
            lut = _constant_node(program, f"{out.name}_qlint_lut", fold.luts[out])
            with graph.inserting_before(out):
                source = _replay_reshapes(graph, producer, fold.reshapes)
                replacement = graph.call_function(
                    exir_ops.edge.cortex_m.quantized_activation.default, (source, lut)
                )
        else:
            with graph.inserting_before(out):
                replacement = graph.call_function(out.target, (fold.dq, fold.scale, *out.args[2:]))
        if replacement is not producer:
            replacement.meta = {k: v for k, v in out.meta.items() if k in ("val", "tensor_meta")}
            replacement.meta["stack_trace"] = fold.anchor.meta.get("stack_trace")
        out.replace_all_uses_with(replacement)
    _erase_if_dead(program, [*fold.outputs, *reversed(fold.removed), fold.dq])


def detached(linted: Linted) -> tuple[Any, list[Fold], Evaluations]:
    """A copy of the lowered program with the folds and evaluations moved onto it, so folding leaves `linted` whole.

    Copying costs less than lowering again, and a `Linted` that callers keep (a
    check's report, a test's shared program) must not change under them.
    """
    assert linted.lowered is not None
    lowered = copy.deepcopy(linted.lowered)
    nodes = {n.name: n for n in lowered.graph.nodes}
    return lowered, [f.moved(nodes) for f in linted.folds], moved_evaluations(linted.analysis.evaluations, nodes)


def fixable_lint(program: Any, artifact: str, config: Config, options: RunOptions, linted: Linted | None,
                 inputs: Sequence[tuple[Any, ...]] = ()) -> tuple[Linted, list[AppliedFold]]:
    """`linted` (or the program's lint) and the repairs made to it, or FixError when no fix can be made
    from it: it did not lower, or it cannot run, or on `inputs` it computes other values than the
    quantized program, or that could not be checked (QL007's check, made here even when the rule is
    off). A program whose faults have one right answer (an integer kernel reading floats, an activation
    clamping the integers at the float model's bounds) is repaired (`qlint.fix.repair`) on a copy, linted
    again, and must then pass the same check: the lint returned is the copy's."""
    from qlint.full.lint import lint_program
    from qlint.full.rules import invalid_message, lowering_message

    # `find_invalid` below runs the values on `inputs`: the lint need not run them on the sample inputs too
    linted = linted or lint_program(program, artifact, config, options, values_verified=bool(inputs))
    if linted.failure is not None:
        failed = next((f for f in linted.findings if f.code == Code.LOWERING_FAILED), None)
        raise FixError(f"cannot fix: {lowering_message(linted.failure)}", linted if failed else None, failed)
    assert linted.lowered is not None
    reported = next((f for f in linted.findings if f.code == Code.LOWERED_PROGRAM_INVALID and not f.fixable), None)
    if reported is not None:  # the check's value check, on inputs this caller may not pass
        raise FixError(f"cannot fix: {reported.message}", linted, reported)
    view = linted.analysis.view
    invalid = find_invalid(view, inputs)
    if invalid is None:
        return linted, []
    if isinstance(invalid, Unchecked) or not restorable(view, invalid):
        raise _refused(f"cannot fix: {invalid_message(invalid)}", linted, artifact, config, (view, invalid))
    repaired, repairs = _repaired(program, artifact, config, options, linted)
    still = find_invalid(repaired.analysis.view, inputs)
    if still is not None:
        count = f"{len(repairs)} repair{'s' if len(repairs) != 1 else ''}"
        raise _refused(f"cannot fix: {invalid_message(still)} (after {count} of the lowering)", linted, artifact,
                       config, (view, invalid), (repaired.analysis.view, still))
    return repaired, repairs


def _refused(message: str, linted: Linted, artifact: str, config: Config,
             *found: tuple[GraphView, Invalid | Unchecked]) -> FixError:
    """The FixError for what the fix's own check `found` (on its inputs; after a repair, the next fault):
    with `linted` and a QL007 for each, the last why; without them when QL007 is off, since then no
    finding says why and the artifact is an error."""
    from qlint.full.rules import FindingFactory, invalid_finding

    if not config.enabled(Code.LOWERED_PROGRAM_INVALID):
        return FixError(message)
    factory = FindingFactory(artifact, config)
    findings = list(linted.findings)
    said = [invalid_finding(view, factory, invalid) for view, invalid in found]
    for finding in said:
        if not any((f.code, f.node, f.message) == (finding.code, finding.node, finding.message) for f in findings):
            findings.append(finding)
    return FixError(message, replace(linted, findings=findings), said[-1])


def _repaired(program: Any, artifact: str, config: Config, options: RunOptions,
              linted: Linted) -> tuple[Linted, list[AppliedFold]]:
    """A copy of the lowered program with QL007's repairs made (the quantizes put back, the clamps at their
    quantized bounds), and its lint."""
    from qlint.full.rules import run_rules

    lowered = copy.deepcopy(linted.lowered)
    repairs = restore_quantizes(lowered, float_reads(GraphView(lowered, quantized=program)))
    repairs += rebound_clamps(lowered, integer_clamps(GraphView(lowered, quantized=program)))
    # its values are checked on every input by the caller
    repaired = run_rules(GraphView(lowered, quantized=program), artifact, config, verbose=options.verbose,
                         values_verified=True)
    repaired.lowered = lowered
    return repaired, repairs


def fold_all(lowered: Any, folds: Sequence[Fold]) -> None:
    """Apply every fold to the lowered program, and check and recompile its graph."""
    for fold in folds:
        apply(lowered, fold)
    lowered.graph_module.graph.lint()
    lowered.graph_module.recompile()


def checked_after(program: Any, lowered: Any, artifact: str, config: Config, options: RunOptions,
                  evaluations: Evaluations) -> tuple[Linted, Serialized]:
    """The folded program's rules (reusing the evaluations of what it kept) and its `.pte`."""
    from qlint.full.rules import run_rules

    view = GraphView(lowered, quantized=program)
    return (run_rules(view, artifact, config, verbose=options.verbose, evaluations=evaluations, values_verified=True),
            to_pte(lowered, config.root, "fixed"))


def _summary(program: Any, artifact: str, linted: Linted, options: RunOptions, dry_run: bool) -> FixSummary:
    """What the fix plans: the folds and what is left, before anything is folded."""
    from qlint.loading.lowering import needs_repair
    from qlint.settings.options import LoweringOrder

    ops = float_op_count(linted.analysis.view)
    return FixSummary(
        artifact=artifact,
        folds=[AppliedFold(f.code, f.anchor.name, f.kind, f.describe()) for f in linted.folds],
        left=[LeftIsland(item.code, item.anchor.name, item.reason) for item in linted.left],
        islands_found=len(linted.analysis.islands),
        lowering_repair=options.order == LoweringOrder.REPAIRED and needs_repair(program),
        dry_run=dry_run,
        fp32_ops=(ops, ops),
        fp32_elements=(linted.stats.fp32_elements, linted.stats.fp32_elements),
        cycles=(linted.stats.cycles, linted.stats.cycles),
        fp32_cycles=(linted.stats.fp32_cycles, linted.stats.fp32_cycles),
    )


def fix_program(
    program: Any,
    artifact: str,
    config: Config,
    inputs: Sequence[tuple[Any, ...]],
    options: RunOptions | None = None,
    *,
    linted: Linted | None = None,
) -> FixResult:
    """Lower, fold every island of an enabled rule that has a proven fold, verify, and serialize.

    `linted` is an earlier `lint_program(program, artifact, config, options)`:
    its lowered program is copied instead of lowering again, and stays unfolded.
    With `options.fix.dry_run` (`--diff`) only the plan is returned. Raises
    FixError when the program does not lower, and VerificationError when the
    folded program's outputs differ from the unfolded one's on any input.
    """
    options = options or RunOptions()
    if config.npu is not None:  # fold before partitioning, so that the partitions merge
        from qlint.fix.npu import fix_npu_program

        return fix_npu_program(program, artifact, config, inputs, options, linted)
    dry_run = options.fix is not None and options.fix.dry_run
    given = linted
    linted, repairs = fixable_lint(program, artifact, config, options, linted, inputs)
    if not inputs and not dry_run:
        raise FixError(NO_INPUTS)
    shared = linted is given  # a caller's lint: fold a copy and leave it whole
    summary = _summary(program, artifact, linted, options, dry_run)
    summary.folds[:0] = repairs
    if dry_run:
        return FixResult(summary, linted.findings, linted.stats, None)
    lowered, folds, evaluations = (
        detached(linted) if shared else (linted.lowered, linted.folds, linted.analysis.evaluations))
    assert lowered is not None
    before = memory_plan(lowered, config.root)
    try:  # the unfolded program's module, unlifted once for the value check
        reference = run_program(lowered, inputs, linted.analysis.view.module)
    except Exception as exc:  # the inputs do not fit the program
        raise FixError(f"cannot run the lowered program on its inputs: {first_line(exc)}") from None
    fold_all(lowered, folds)
    # A constant subgraph left unfolded is gone when the island that read it was folded away.
    remaining = {n.name for n in lowered.graph.nodes}
    summary.left = [item for item in summary.left if item.node in remaining]
    require_same_outputs(reference, run_program(lowered, inputs))
    after_fix, after = checked_after(program, lowered, artifact, config, options, evaluations)
    record_after(summary, after_fix.analysis.view, after_fix.stats, before, after, inputs)
    return FixResult(summary, after_fix.findings, after_fix.stats, after.pte, lowered, after)

