"""`--fix` for a program lowered for an Ethos-U NPU: fold before partitioning, so the partitions merge.

On the Cortex-M flow a fold rewrites the lowered program. On an NPU target the island sits between
two delegate calls, and rewriting the lowered program would leave both calls: the NPU would still
stop and start again. So the fold is made where the partitioner will see it, in the quantized
program, which is then lowered again. Only what the quantized program can say exactly folds there:
an island that is an identity on the int8 values (proven over the whole int8 range by
`analysis.folds`) is removed, and the quantize after it reads the int8 its producer wrote, which is
the value it held before; a constant scale that is no identity goes into the scale of the quantize
after it, which then reads the island's dequantize: the dequantize -> quantize pair left becomes a
TOSA RESCALE in the partition, proven on every input integer both as a float quantize and as that
RESCALE on the TOSA reference model; a gather that dequantizes its whole table (`nn.Embedding` on a
U55) reads the int8 table instead, and its rows are what the quantize after it gave. A table, a
replayed shape op or stored constants are folds the Cortex-M flow makes in the lowered program:
they are left, and say why.

Nothing is written unless the folded quantized program gives the unfolded one's outputs bit for bit
on every verification input, and its lowering passes the value check, each NPU partition's TOSA run
on the TOSA reference model (`analysis.tosa`) against the folded quantized program on those inputs,
and the lowered programs before and after the fold, run as the device runs them, give the same
outputs bit for bit (`require_same_on_device`).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from qlint.analysis.folds import Fold, FoldKind
from qlint.analysis.tosa import DelegateValues
from qlint.analysis.values import device_outputs
from qlint.fix.errors import FixError, VerificationError
from qlint.fix.program import (
    NO_INPUTS,
    FixResult,
    MemoryPlan,
    Serialized,
    float_op_count,
    memory_plan,
    record_after,
    require_same_outputs,
    run_program,
    to_pte,
)
from qlint.io.reads import first_line
from qlint.loading.view import input_node
from qlint.records.results import AppliedFold, FixSummary, LeftIsland
from qlint.rules.table import Code
from qlint.settings.config import Config
from qlint.settings.options import RunOptions

if TYPE_CHECKING:
    from qlint.full.rules import Linted

# Why a fold the Cortex-M flow makes is not made on an NPU target.
NOT_BEFORE_LOWERING = ("on an NPU target a fold is made in the quantized program, before partitioning (an identity, "
                       "a gather from an int8 table, or a scale proven on the NPU's RESCALE); this {kind} fold is "
                       "one the Cortex-M flow makes in the lowered program")


def folded_quantized(program: Any, linted: Linted, folds: Sequence[Fold], example: tuple[Any, ...]) -> Any:
    """A copy of the quantized `program` with each fold made: the island's output quantizes replaced by
    the quantize whose int8 the island's dequantize read, and what no one reads then removed; exported
    again on `example`, as the quantizer's program is. Lowering traces the program anew and names
    each node's origin by the traced name (`from_node`), which is how the value check pairs a partition's
    outputs with the quantized program's: with nodes removed, only a program exported again has the
    names a trace gives."""
    import torch

    view = linted.analysis.view
    folded = copy.deepcopy(program)
    nodes = {n.name: n for n in folded.graph.nodes}
    for fold in folds:
        assert fold.dq is not None
        dq = nodes[view.as_quantized(fold.dq).name]
        if fold.kind == FoldKind.RESCALE:  # the output quantize reads the dequantize, at the folded scale
            [out] = [nodes[view.as_quantized(o).name] for o in fold.outputs]
            out.args = (dq, fold.scale, *out.args[2:])
            continue
        read = input_node(dq)
        if fold.kind == FoldKind.GATHER:  # the gather selects from the int8 table; its rows are what the quantize gave
            gather = nodes[view.as_quantized(fold.anchor).name]
            gather.replace_input_with(dq, read)
            read = gather
        for out in fold.outputs:
            nodes[view.as_quantized(out).name].replace_all_uses_with(read)
    folded.graph.eliminate_dead_code()
    folded.graph.lint()
    folded.graph_module.recompile()
    return torch.export.export(folded.module(check_guards=False), example, strict=False)


def fix_npu_program(program: Any, artifact: str, config: Config, inputs: Sequence[tuple[Any, ...]],
                    options: RunOptions, linted: Linted | None = None) -> FixResult:
    """Fold what folds before partitioning, lower again, verify, and serialize (`fix_program` on an
    NPU target). Raises FixError when the program does not lower or its check found values it cannot
    vouch for, VerificationError when the folded program differs on any input."""
    from qlint.full.lint import lint_program
    from qlint.full.rules import lowering_message

    linted = linted or lint_program(program, artifact, config, options)
    if linted.failure is not None:
        failed = next((f for f in linted.findings if f.code == Code.LOWERING_FAILED), None)
        raise FixError(f"cannot fix: {lowering_message(linted.failure)}", linted if failed else None, failed)
    reported = next((f for f in linted.findings if f.code == Code.LOWERED_PROGRAM_INVALID
                     and f.severity == "error"), None)
    if reported is not None:
        raise FixError(f"cannot fix: {reported.message}", linted, reported)
    folds = [f for f in linted.folds if f.before_lowering]
    summary = _summary(artifact, linted, folds, options)
    if summary.dry_run:
        return FixResult(summary, linted.findings, linted.stats, None)
    if not inputs:
        raise FixError(NO_INPUTS)
    assert linted.lowered is not None
    before = memory_plan(linted.lowered, config.root)
    if not folds:
        after = to_pte(linted.lowered, config.root, "fixed")
        return _result(summary, linted, before, after, inputs)
    folded = folded_quantized(program, linted, folds, inputs[0])
    try:
        require_same_outputs(run_program(program, inputs), run_program(folded, inputs))
    except VerificationError:
        raise
    except Exception as exc:  # the inputs do not fit the program
        raise FixError(f"cannot run the quantized program on its inputs: {first_line(exc)}") from None
    fixed = lint_program(folded, artifact, config, options, npu_inputs=inputs)  # QL007 on the fix's inputs
    if fixed.failure is not None or fixed.lowered is None:
        raise VerificationError(f"the folded program does not lower: {fixed.failure}")
    bad = next((f for f in fixed.findings if f.code == Code.LOWERED_PROGRAM_INVALID and f.severity == "error"), None)
    if bad is not None:
        raise VerificationError(bad.message)
    require_same_on_device(linted, fixed, inputs)
    after = to_pte(fixed.lowered, config.root, "fixed")
    return _result(summary, fixed, before, after, inputs)


def require_same_on_device(linted: Linted, fixed: Linted, inputs: Sequence[tuple[Any, ...]]) -> None:
    """Raise VerificationError unless the fold changes nothing the device computes: the lowered program's
    outputs before and after it, each NPU partition's TOSA run on the reference model and the CPU's ops on
    their kernels, are the same bit for bit on every input. The value check (QL007) allows a partition
    `DIVERGED_STEPS` fixed-point steps against the quantized program; a fold that claims no numerical
    change allows none, and one whose values cannot be computed is not verified."""
    assert linted.delegation is not None and fixed.delegation is not None
    try:
        before = device_outputs(linted.analysis.view, inputs, DelegateValues(linted.delegation))
        after = device_outputs(fixed.analysis.view, inputs, DelegateValues(fixed.delegation))
    except Exception as exc:  # noqa: BLE001 - a partition the reference model refuses, a run over its memory bound
        raise VerificationError(f"the lowered program's values cannot be computed on the host: {first_line(exc)}") \
            from None
    try:
        require_same_outputs(before, after)
    except VerificationError as exc:
        raise VerificationError(f"the device computes other values after the fold: {exc}") from None


def _summary(artifact: str, linted: Linted, folds: Sequence[Fold], options: RunOptions) -> FixSummary:
    made = {id(f) for f in folds}
    ops = float_op_count(linted.analysis.view)
    return FixSummary(
        artifact=artifact,
        folds=[AppliedFold(f.code, f.anchor.name, f.kind, f.describe()) for f in folds],
        left=[*(LeftIsland(f.code, f.anchor.name, NOT_BEFORE_LOWERING.format(kind=f.kind.value))
                for f in linted.folds if id(f) not in made),
              *(LeftIsland(item.code, item.anchor.name, item.reason) for item in linted.left)],
        islands_found=len(linted.analysis.islands),
        dry_run=options.fix is not None and options.fix.dry_run,
        fp32_ops=(ops, ops),
        fp32_elements=(linted.stats.fp32_elements, linted.stats.fp32_elements),
        cycles=(linted.stats.cycles, linted.stats.cycles),
        fp32_cycles=(linted.stats.fp32_cycles, linted.stats.fp32_cycles),
        partitions=(linted.stats.partitions, linted.stats.partitions),
    )


def _result(summary: FixSummary, fixed: Linted, before: MemoryPlan, after: Serialized,
            inputs: Sequence[tuple[Any, ...]]) -> FixResult:
    """What the fix wrote: `fixed`, the lint of the lowered program, and its serialized plan `after`."""
    record_after(summary, fixed.analysis.view, fixed.stats, before, after, inputs)
    return FixResult(summary, fixed.findings, fixed.stats, after.pte, fixed.lowered, after)
