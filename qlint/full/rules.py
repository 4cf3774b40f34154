"""The full check's rules, QL001-QL005, QL007, QL008 and QL010: one program's regions, fold plans,
coverage and validity into findings.

`FULL_RULES` is this tier's registry, keyed by the rule table's `Code`; `run_rules` asks the table
which rules are enabled first, so a deselected rule's analysis (island classification, exhaustive
evaluation, fold planning) never runs.
"""

from __future__ import annotations

import functools
import math
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, TypeAlias

from torch.fx import Node

from qlint.analysis.causes import cause_of
from qlint.analysis.folds import Fold, Left, Rescaler, plan_gather, plan_region
from qlint.analysis.islands import (
    Coverage,
    constant_fp32,
    coverage,
    fp32_by_node,
    fp32_compute,
    fp32_elements,
    fp32_total,
)
from qlint.analysis.npu_cycles import npu_cycles
from qlint.analysis.partitions import Partitions, cpu_ops, partitions
from qlint.analysis.regions import ISLAND_CODES, Analysis, Evaluations, Region, ScaleIsland, analyse
from qlint.analysis.tosa import DelegateValues, rescaled
from qlint.analysis.validity import Invalid, find_invalid, restorable
from qlint.analysis.values import DIVERGED_STEPS, NotRun, Unchecked, uncompared_calls
from qlint.device.cost import ProgramCost, compare, core_of, estimate
from qlint.full.npu import fallback_findings, miswired_calls, why_on_cpu
from qlint.io.limits import MIB
from qlint.io.reads import first_line
from qlint.io.vela import NpuPartition
from qlint.loading.ethos_u import Delegation, lowered_module
from qlint.loading.inputs import check_inputs, npu_check_inputs
from qlint.loading.lowering import LoweringError
from qlint.loading.view import DELEGATE_CALL, GraphView, base_name, is_float, numel, op_name
from qlint.records.results import NPU_PART, ArtifactStats, Contributor, Finding, Location, Severity, shapes_elided
from qlint.records.source import locate, module_path
from qlint.rules import builders
from qlint.rules.builders import Term
from qlint.rules.catalog import enabled_rules
from qlint.rules.table import Code, Scope
from qlint.settings.config import Config
from qlint.settings.sizes import show_size


class FindingFactory:
    """Fills in what every finding of one artifact shares."""

    def __init__(self, artifact: str, config: Config) -> None:
        self.artifact, self.config = artifact, config

    def location(self, *nodes: Node) -> Location | None:
        for node in nodes:
            found = locate(node.meta.get("stack_trace"), self.config.root)
            if found:
                return found
        return None

    def finding(
        self, code: Code, message: str, nodes: tuple[Node, ...] = (), fixable: bool = False, **details: Any
    ) -> Finding:
        location = self.location(*nodes)
        if location is None:  # code inside torch: the module that ran it
            module = next((m for n in nodes if (m := module_path(n.meta.get("nn_module_stack")))), None)
            if module:
                details["module"] = module
        return Finding(
            code=code,
            severity=self.config.severity(code),
            message=message,
            artifact=self.artifact,
            node=nodes[0].name if nodes else "",
            location=location,
            fixable=fixable,
            details=details,
        )


@dataclass
class Context:
    """What the rules of one program share; fold plans are made once, on first use."""

    view: GraphView
    analysis: Analysis
    factory: FindingFactory
    failure: LoweringError | None = None
    verbose: bool = False
    values_verified: bool = False   # QL007 need not run the program against the quantized one
    cost: ProgramCost | None = None  # the estimate of the lowered program on the run's core
    plans: dict[Region, Fold | Left] = field(default_factory=dict)
    delegation: Delegation | None = None  # lowered for an Ethos-U: what its partitioner and Vela said
    npu_inputs: Sequence[tuple[Any, ...]] | None = None  # what the NPU value check runs on (None: its own)

    @cached_property
    def partitions(self) -> Partitions:
        """The delegate calls and the CPU's ops around them: QL010, QL007 and the placement overlay's."""
        return partitions(self.view)

    @cached_property
    def coverage(self) -> Coverage:
        """For QL005 and the summary row alike: with an NPU, the share of the compute it runs."""
        return coverage(self.view, None if self.delegation is None else self.delegation.npu_ops)

    @cached_property
    def gathers(self) -> dict[Node, Fold | Left]:
        """On an NPU target, each gather on the CPU that dequantizes its whole int8 table, and how it
        folds (`plan_gather`): QL010 says it is fixable, `--fix` makes the fold before partitioning."""
        if self.delegation is None:
            return {}
        found = ((f.node, plan_gather(self.view, f.node)) for f in self.partitions.fallbacks)
        return {node: plan for node, plan in found if plan is not None}

    @cached_property
    def rescaler(self) -> Rescaler | None:
        """On an NPU target whose TOSA specification is known, how it computes a dequantize -> quantize
        pair (a RESCALE on the TOSA reference model): what a fold it makes before partitioning is
        proven on (`plan_region`)."""
        if self.delegation is None or not self.delegation.tosa_spec:
            return None
        return functools.partial(rescaled, tosa_spec=self.delegation.tosa_spec)

    def plan(self, region: Region) -> Fold | Left:
        if region not in self.plans:
            self.plans[region] = plan_region(region, self.rescaler)
        return self.plans[region]

    def fixable(self, region: Region) -> bool:
        """A finding is fixable exactly when `--fix` has a proven fold for it: on an NPU target, one it
        makes before partitioning (`Fold.before_lowering`), so that the partitions merge."""
        plan = self.plan(region)
        if self.delegation is not None or self.factory.config.npu is not None:
            return isinstance(plan, Fold) and plan.before_lowering
        return isinstance(plan, Fold)

    def priced(self, finding: Finding, region: Region) -> Finding:
        """`finding` with its island's estimated cycles (its float ops, the conversions into and out of
        it) and their share of the program's: in its details, what the report ranks and shows, and at
        the end of its message, so an annotation or a SARIF result says what the island costs."""
        if self.cost is not None and self.cost.cycles:
            cycles = self.cost.of(n.name for n in fp32_by_node(self.view, region.island))
            finding.details["cycles"] = cycles
            finding.details["time_share"] = round(cycles / self.cost.cycles, 4)
            finding.details["cycles_measured"] = bool(self.cost.runs)
            latency = self.cost.latency_ms(cycles)
            if latency is not None:
                finding.details["latency_ms"] = round(latency, 6)
            finding.message += "; " + builders.time_clause_of(finding.details)
        return finding


@dataclass
class Linted:
    """One program after its rules ran: what they found, and what `--fix` would do."""

    findings: list[Finding]
    stats: ArtifactStats
    analysis: Analysis
    plans: list[Fold | Left]     # one per region, in graph order
    failure: LoweringError | None = None  # why the program did not lower
    lowered: Any | None = None   # the lowered ExportedProgram, when lowering worked
    delegation: Delegation | None = None  # what its NPU runs, when it was lowered for one

    @property
    def folds(self) -> list[Fold]:
        return [p for p in self.plans if isinstance(p, Fold)]

    @property
    def left(self) -> list[Left]:
        return [p for p in self.plans if isinstance(p, Left)]


def lowering_message(exc: LoweringError, verbose: bool = False) -> str:
    """One line naming the pass and node; with `verbose`, the traceback after it."""
    where = f" at node {exc.node.name}" if exc.node is not None else ""
    message = f"Cortex-M lowering failed in {exc.pass_name}{where}: {first_line(exc.cause)}"
    if verbose:
        message += "\n" + "".join(traceback.format_exception(exc.cause))
    return message


def lowering_failed(context: Context) -> list[Finding]:
    exc = context.failure
    assert exc is not None
    nodes: tuple[Node, ...] = (exc.node,) if exc.node is not None else ()
    message = lowering_message(exc, context.verbose)
    if exc.pass_name == NPU_PARTITIONER and not nodes:
        unscalable = unscalable_products(context.view)
        if unscalable:  # the lowering names no node: the finding goes to the first product no RESCALE holds
            mul, ratio, (left, right, out) = unscalable[0]
            nodes = (mul,)
            message += (f"; {mul.name}'s int8 product needs a RESCALE by {ratio:.3g} (its operands' scales "
                        f"{left:.3g} x {right:.3g} over its output's {out:.3g}), which Arm's "
                        "`_compute_multiplier_and_shift` refuses (a constant of torch.finfo(float32).min times "
                        "a tensor of zeros is one)")
    return [context.factory.finding(Code.LOWERING_FAILED, message, nodes, pass_name=exc.pass_name,
                                    graph_nodes=graph_nodes(context.view, dict.fromkeys(nodes, 0)))]


NPU_PARTITIONER = "EthosUPartitioner"  # the pass name an Ethos-U lowering's failure carries


def unscalable_products(view: GraphView) -> list[tuple[Node, float, tuple[float, float, float]]]:
    """Each `mul` of two int8 operands whose product no TOSA RESCALE can bring to its output's scale:
    the scale `s_a * s_b / s_out` Arm's TOSA MUL rescales its int32 product by, refused by Arm's own
    multiplier and shift. The ratio, then the three scales."""
    from executorch.backends.arm.operators.op_tosa_rescale import _compute_multiplier_and_shift

    found: list[tuple[Node, float, tuple[float, float, float]]] = []
    for node in view.graph.nodes:
        if node.op != "call_function" or base_name(op_name(node)) != "mul" or len(node.users) != 1:
            continue
        reads = [view.qparams(a) if isinstance(a, Node) else None for a in node.args[:2]]
        writes = view.qparams(next(iter(node.users)))
        if None in reads or writes is None or len(reads) != 2:
            continue
        left, right = (qp.scale for qp in reads if qp is not None)
        if not all(math.isfinite(s) and s > 0 for s in (left, right, writes.scale)):
            continue  # qparams no quantizer writes (a crafted program's): no RESCALE to speak of
        ratio = left * right / writes.scale
        try:
            _compute_multiplier_and_shift([ratio], 32)
        except (AssertionError, ValueError, OverflowError):
            found.append((node, ratio, (left, right, writes.scale)))
    return found


def _terms(scale: ScaleIsland) -> list[Term]:
    return [Term(s.op, s.constant.name, s.constant.kind, s.constant.numel, s.value) for s in scale.steps]


def constant_scale(context: Context, region: Region) -> Finding:
    scale = region.scale
    assert scale is not None
    exhaustive = region.exhaustive()
    island = region.island
    message, details = builders.constant_scale(
        island.ops, _terms(scale), scale.qp_in, scale.qp_out, exhaustive is not None and exhaustive.identity,
        region.blocked, fp32_elements(context.view, island),
        graph_nodes(context.view, fp32_by_node(context.view, island)))
    nodes = (region.anchor, *island.nodes)
    return context.factory.finding(Code.CONSTANT_SCALE_ISLAND, message, nodes, context.fixable(region), **details)


def fp32_island(context: Context, region: Region) -> Finding:
    island = region.island
    elements = fp32_elements(context.view, island)
    return context.factory.finding(
        Code.FP32_ISLAND,
        builders.fp32_island(island.ops, elements, region.reason),
        (region.anchor, *island.nodes),
        context.fixable(region),
        ops=island.ops,
        fp32_elements=elements,
        reason=region.reason,
        graph_nodes=graph_nodes(context.view, fp32_by_node(context.view, island)),
    )


def constant_subgraph(context: Context, region: Region) -> Finding:
    island, constant = region.island, region.constant
    assert constant is not None
    elements = fp32_elements(context.view, island)
    message = f"constant subgraph ({', '.join(island.ops)}), {elements} fp32 elements per inference: {region.reason}"
    if constant.misread:
        message += f"; {constant.misread}"
    return context.factory.finding(
        Code.CONSTANT_SUBGRAPH,
        message,
        (region.anchor, *reversed(island.nodes)),
        context.fixable(region),
        ops=island.ops,
        fp32_elements=elements,
        reason=region.reason,
        misread=constant.misread,
        blocked_by=region.blocked,
        graph_nodes=graph_nodes(context.view, fp32_by_node(context.view, island)),
    )


def requantize(context: Context, region: Region) -> Finding:
    view, dq, q = context.view, region.island.inputs[0], region.anchor
    qp_in, qp_out = view.qparams(dq), view.qparams(q)
    assert qp_in is not None and qp_out is not None
    exhaustive = region.exhaustive()
    message, details = builders.requantize(qp_in, qp_out, exhaustive is not None and exhaustive.identity,
                                           graph_nodes(view, {dq: numel(dq), q: 0}))
    return context.factory.finding(Code.REQUANTIZE_PAIR, message, (q, dq, *dq.all_input_nodes), context.fixable(region),
                             **details)


def low_coverage(context: Context) -> list[Finding]:
    """Coverage by op count, or by the estimate's time (`coverage_by: time`): the share of the
    program's cycles that is not spent on float values."""
    config, cov, cost = context.factory.config, context.coverage, context.cost
    by_time = 1 - cost.fp32_cycles / cost.cycles if cost is not None and cost.cycles else None
    timed = config.coverage_by == "time" and by_time is not None
    if (by_time if timed and by_time is not None else cov.ratio) >= config.coverage_threshold:
        return []
    listed = ", ".join(f"{name} x{count}" for name, count in cov.fp32_op_counts.most_common())
    by_cause = fp32_causes(context)
    main = f"; main cause ({by_cause[0][1]} ops): {by_cause[0][0]}" if by_cause else ""
    npu = context.delegation is not None
    ops = (f"{cov.total - cov.int_ops} of {cov.total} compute ops run on the CPU ({listed or 'integer ops'})" if npu
           else f"{cov.total - cov.int_ops} of {cov.total} compute ops run in fp32 ({listed})")
    how = "measured" if cost is not None and cost.runs else "estimated"
    time = f"{_percent_down(by_time)} of the {how} time is int8" if by_time is not None else ""
    threshold = f"{config.coverage_threshold * 100:g}%"
    counts = context.delegation.counts if context.delegation is not None else "ops"
    calls = "" if counts == "ops" else f", {per_call(len(context.partitions.delegates))}"
    message = (f"int8 share of the {how} time {_percent_down(by_time or 0.0)} < {threshold}{calls}: {ops}{main}"
               if timed else f"{'NPU' if npu else 'int8'} coverage {_percent_down(cov.ratio)} < {threshold}{calls}: "
               f"{ops}{'; ' + time if time else ''}{main}")
    details: dict[str, Any] = dict(
        coverage=cov.ratio,
        time_coverage=round(by_time, 4) if by_time is not None else None,
        fp32_ops=dict(cov.fp32_op_counts),
        int_ops=cov.int_ops,
        causes=[{"cause": cause, "ops": count} for cause, count in by_cause],
    )
    if npu:  # what the NPU's share counts: its ops, or its calls (a `.pte`)
        details["counts"] = counts
    return [context.factory.finding(Code.INT8_COVERAGE, message, **details)]


def per_call(calls: int) -> str:
    """How a `.pte`'s NPU share is counted, said where the share is."""
    each = "the" if calls == 1 else f"each of the {calls}"
    return (f"{each} NPU partition{'s' if calls != 1 else ''} counted as one op (a .pte does not record how many "
            "ops a partition runs)")


def fp32_causes(context: Context) -> list[tuple[str, int]]:
    """Why the fp32 compute ops are fp32, most ops first: the reason of the island each one is in
    (a constant scale is QL001's, work on constants QL008's), or the quantizer's verdict on the op
    itself. Reasons that differ only in shapes count as one, said as the first of them says it."""
    counts: Counter[str] = Counter()
    said: dict[str, str] = {}
    view = context.view
    seen: set[Node] = set()

    def count(reason: str, ops: int) -> None:
        key = shapes_elided(reason)
        said.setdefault(key, reason)
        counts[key] += ops

    if context.delegation is not None:  # on the CPU instead of the NPU: QL010's first cause for each op
        for node in cpu_ops(view):
            given, why = why_on_cpu(node, context.delegation)
            count(given[0] if given else why, 1)
        return [(said[key], ops) for key, ops in counts.most_common()]

    for region in context.analysis.regions:
        if region.code in ISLAND_CODES:
            count("a constant scale between quantized ops (QL001)" if region.scale else region.reason,
                  len(region.island.compute))
            seen.update(region.island.compute)
    constant = [n for island in context.analysis.constants for n in island.compute if constant_fp32(view, n)]
    if constant:
        count("work computed only from constants, the same value on every inference (QL008)", len(constant))
        seen.update(constant)
    for node in fp32_compute(view):
        if node not in seen:
            count(str(cause_of(node, view.as_quantized)), 1)
    return [(said[key], ops) for key, ops in counts.most_common()]


def invalid_message(invalid: Invalid | Unchecked) -> str:
    if isinstance(invalid, Unchecked):
        return unchecked_message(invalid)
    node = invalid.node
    what = "computes other values" if invalid.divergence is not None else "cannot run"
    return (
        f"lowered program {what}: {op_name(node)} at {node.name} receives "
        f"{', '.join(invalid.dtypes)}: {invalid.reason}"
    )


def unchecked_message(unchecked: Unchecked) -> str:
    """QL007 when a run it needs would hold more than it may, said as QL009 says a budget it cannot measure."""
    subject, run = UNCHECKED[unchecked.check]
    node, where = unchecked.node, "" if unchecked.program == "lowered" else ", in the quantized program"
    held = f"{unchecked.held / MIB:,.0f} MiB" if math.isfinite(unchecked.held) else "a size no shape bounds"
    return (f"{subject} cannot be checked: {run} would hold {held} at once at {node.name} ({op_name(node)}{where}), "
            f"over the {show_size(unchecked.budget)} the check may hold")


UNCHECKED = {  # Unchecked.check: what could not be checked, and the run that would have checked it
    "values": ("lowered program's values", "running it beside the quantized program"),
    "run": ("whether the lowered program runs", "running it"),
}


def lowered_program_invalid(context: Context) -> list[Finding]:
    if context.failure is not None or not context.view.lowered:
        return []  # the quantized program QL003 falls back on is not meant to run on the device
    if context.delegation is not None:
        miswired = miswired_calls(context.partitions, context.delegation, context.factory.finding)
        return miswired or npu_values(context, context.delegation)
    invalid = find_invalid(context.view, [] if context.values_verified else check_inputs(context.view.quantized))
    return [invalid_finding(context.view, context.factory, invalid)] if isinstance(invalid, (Invalid, Unchecked)) \
        else []


def npu_values(context: Context, delegation: Delegation) -> list[Finding]:
    """QL007 on a program lowered for an Ethos-U: run with each NPU partition's TOSA on the TOSA reference
    model and its CPU ops on the reference kernels, against the quantized program, on the sample inputs
    and seeded batches. A `.pte` keeps only Vela's command streams, which run on the NPU alone."""
    if not delegation.compiled:
        return [npu_unchecked(context, delegation)]
    view = context.view
    batches = context.npu_inputs if context.npu_inputs is not None else npu_check_inputs(view.quantized)
    unpaired = uncompared_calls(view) if view.quantized is not None and batches else []
    if unpaired:
        return [npu_not_run(context, NotRun(unpaired[0], NOT_PAIRED))]
    found = find_invalid(view, batches, DelegateValues(delegation))
    if isinstance(found, NotRun):
        return [npu_not_run(context, found)]
    if isinstance(found, Invalid) and found.divergence is not None and _partition_output(found.node) is not None:
        return [npu_diverged(context, found)]
    return [invalid_finding(view, context.factory, found)] if found is not None else []


def _partition_output(node: Node) -> tuple[Node, int] | None:
    """The delegate call a `getitem` reads, and which of its outputs."""
    call, index = (node.args + (None, None))[:2]
    if base_name(op_name(node)) != "getitem" or not isinstance(call, Node) or not isinstance(index, int):
        return None
    return (call, index) if base_name(op_name(call)) == DELEGATE_CALL else None


def _partition_number(context: Context, call: Node) -> int:
    """The call's partition, counted from 1 in execution order as QL010 counts them."""
    return next((i for i, n in enumerate(context.partitions.delegates, 1) if n.name == call.name), 0)


def npu_diverged(context: Context, invalid: Invalid) -> Finding:
    """QL007 for a partition whose TOSA, run on the reference model on the quantized program's inputs to
    it, writes other integers than the quantized program: the first such output."""
    diverged, where = invalid.divergence, _partition_output(invalid.node)
    assert diverged is not None and where is not None
    call, output = where
    number = _partition_number(context, call)
    message = (f"lowered program computes other values: NPU partition {number} ({call.name}), its TOSA run on the "
               f"TOSA reference model, writes output {output} ({invalid.node.name}) other than the quantized "
               f"program's {diverged.reference.name}: {diverged.differing} of {diverged.values} values more than "
               f"{DIVERGED_STEPS} quantization steps apart, up to {diverged.steps:.0f}: {diverged.lowered:.6g} where "
               f"that gives {diverged.expected:.6g} (on input {diverged.batch}, the partition's inputs taken from the "
               "quantized program)")
    return context.factory.finding(
        Code.LOWERED_PROGRAM_INVALID, message, (invalid.node, call), op=op_name(call), partition=number,
        output=output, reference=diverged.reference.name, steps=diverged.steps, differing=diverged.differing,
        values=diverged.values, lowered_value=diverged.lowered, expected_value=diverged.expected,
        batch=diverged.batch, graph_nodes=graph_nodes(context.view, {call: 0}))


# Why a partition whose outputs are no value of the quantized program is not checked.
NOT_PAIRED = ("none of its outputs is traced to a quantize of the quantized program, so its values have "
              "nothing to be compared with")


def npu_not_run(context: Context, not_run: NotRun) -> Finding:
    """QL007 when a partition's TOSA cannot run on the reference model: said as a run the check could not
    make (`unchecked_message`): a check that could not run never passes."""
    number = _partition_number(context, not_run.node)
    return context.factory.finding(
        Code.LOWERED_PROGRAM_INVALID,
        f"lowered program's values cannot be checked: NPU partition {number} ({not_run.node.name}) cannot run on "
        f"the TOSA reference model: {not_run.reason}",
        (not_run.node,), unchecked="tosa", op=op_name(not_run.node), partition=number, reason=not_run.reason)


def npu_fallback(context: Context) -> list[Finding]:
    """QL010 on a program lowered for an Ethos-U (`qlint.full.npu`)."""
    if context.delegation is None or context.failure is not None:
        return []
    fixable = {node for node, plan in context.gathers.items() if isinstance(plan, Fold)}
    return fallback_findings(context.view, context.partitions, context.delegation, context.factory.finding,
                             context.cost, fixable)


def npu_unchecked(context: Context, delegation: Delegation) -> Finding:
    """QL007 on a `.pte` with NPU partitions: it keeps their command streams, which run on the Ethos-U
    only, and no TOSA, so the check cannot run the program beside the quantized one. Said at info
    severity: it is a limit of the check, on every such program, not a fault of this one."""
    count = len(delegation.blobs)
    finding = context.factory.finding(
        Code.LOWERED_PROGRAM_INVALID,
        f"lowered program's values cannot be checked: its {count} NPU partition{'s' if count != 1 else ''} "
        f"run on the {delegation.npu} only, not on this machine", unchecked="npu", partitions=count)
    return replace(finding, severity=Severity.INFO)


def invalid_finding(view: GraphView, factory: FindingFactory, invalid: Invalid | Unchecked) -> Finding:
    """QL007 for what `find_invalid` found: a node that cannot run or changed the values, or a run it
    could not make."""
    if isinstance(invalid, Unchecked):
        return factory.finding(
            Code.LOWERED_PROGRAM_INVALID, invalid_message(invalid), (invalid.node,), unchecked=invalid.check,
            op=op_name(invalid.node), held_bytes=invalid.held if math.isfinite(invalid.held) else None,
            budget_bytes=invalid.budget)
    details: dict[str, Any] = {}
    if invalid.float_read is not None:
        read = invalid.float_read
        details.update(producer=read.producer.name, producer_op=op_name(read.producer),
                       restored_qparams=read.qparams.to_dict() if read.qparams is not None else None)
    if invalid.divergence is not None:
        diverged = invalid.divergence
        details.update(reference=diverged.reference.name, steps=diverged.steps, lowered_value=diverged.lowered,
                       expected_value=diverged.expected)
    nodes = (invalid.node, invalid.float_read.producer) if invalid.float_read is not None else (invalid.node,)
    return factory.finding(
        Code.LOWERED_PROGRAM_INVALID, invalid_message(invalid), nodes, fixable=restorable(view, invalid),
        op=op_name(invalid.node), input_dtypes=invalid.dtypes, reason=invalid.reason, **details,
        graph_nodes=graph_nodes(view, {invalid.node: numel(invalid.node) if is_float(invalid.node) else 0}),
    )


def graph_nodes(view: GraphView, counts: dict[Node, int]) -> dict[str, int]:
    """A finding's nodes by their names in the checked program, with the fp32 elements each
    materializes: what `--write model-explorer:` colours. Nodes lowering made are left out."""
    named: dict[str, int] = {}
    for node, count in counts.items():
        name = view.source_name(node)
        if name is not None:
            named[name] = named.get(name, 0) + count
    return named


def npu_nodes(view: GraphView, split: Partitions) -> dict[str, int]:
    """Each node an NPU partition runs, by its id in the checked program, with the partition's number
    (from 1, in execution order, as QL010 counts them): what `--write model-explorer:` marks as NPU
    work. A `.pte`'s delegate call is one instruction; a `.pt2`'s partition is the nodes of the
    partition's own graph, each mapped back as a lowered node is."""
    found: dict[str, int] = {}
    for number, call in enumerate(split.delegates, 1):
        for node in (call, *_delegated(view, call)):
            name = view.source_name(node)
            if name is not None and node.op == "call_function":
                found.setdefault(name, number)
    return found


def _delegated(view: GraphView, call: Node) -> list[Node]:
    """The nodes of a delegate call's partition (`LoweredBackendModule.original_module`); none for a
    `.pte`, which keeps only the compiled blob."""
    original = getattr(lowered_module(view.program, call), "original_module", None)
    return list(original.graph.nodes) if original is not None else []


def costliest(view: GraphView, cost: ProgramCost, root: Path, shown: int = 20,
              delegation: Delegation | None = None) -> tuple[Contributor, ...]:
    """The ops that take the most of the estimate, costliest first, at their model source lines: what a
    latency or cycles budget names (its first five) and the time plot draws. An NPU partition's time is
    given by the source lines Vela's per-layer cycles come from (`analysis.npu_cycles`), and what no
    line was derived for as the partition's own."""
    nodes = {n.name: n for n in view.nodes}
    found = [Contributor(o.node, round(o.cycles),
                         f"{base_name(o.op)}, {o.work:,} {o.unit}s{', fp32' if o.fp32 else ''}",
                         locate(nodes[o.node].meta.get("stack_trace"), root) if o.node in nodes else None)
             for o in cost.ops if not o.npu]
    lines = npu_cycles(delegation, root) if delegation is not None else {}
    for number, o in enumerate((o for o in cost.ops if o.npu), start=1):
        on_core = o.cycles / o.work if o.work else 1.0  # the core's cycles for one of the NPU's
        placed = lines.get(o.node)
        for where, cycles in (placed.by_line.items() if placed else ()):
            found.append(Contributor(o.node, round(cycles * on_core), f"{NPU_PART} {number}, {cycles:,} NPU cycles",
                                     where))
        rest = o.work - (placed.attributed if placed else 0)
        if rest:
            what = f"{NPU_PART} {number}, {rest:,} NPU cycles{' at no source line' if placed else ''}"
            found.append(Contributor(o.node, round(rest * on_core), what, None))
    return tuple(sorted(found, key=lambda c: (-c.amount, c.name))[:shown])


def _percent_down(ratio: float) -> str:
    """Rounded down, so a ratio just under the threshold never prints as equal to it."""
    return f"{math.floor(ratio * 1000) / 10:.1f}%"


def run_rules(
    view: GraphView,
    artifact: str,
    config: Config,
    *,
    failure: LoweringError | None = None,
    verbose: bool = False,
    evaluations: Evaluations | None = None,
    values_verified: bool = False,
    measure: Callable[[ProgramCost], ProgramCost] | None = None,
    delegation: Delegation | None = None,
    npu_inputs: Sequence[tuple[Any, ...]] | None = None,
) -> Linted:
    """Run the enabled rules on one program (the quantized one when lowering failed).

    `evaluations` carries exhaustive evaluations over from an earlier analysis of
    the same graph (the fixed program keeps the nodes it did not fold).
    `values_verified`: the program's values were checked already (a fix's, verified
    bit for bit against a program that passed the value check), so QL007 checks dtypes only.
    `measure`: the cycles a profile of this program measured, given the estimate: they replace it in
    every figure, and the report sets the two side by side (`qlint.device.profile`).
    `delegation`: the program was lowered for an Ethos-U. QL010 says what its NPU does not run and why,
    in QL002's place (an fp32 island there is an NPU fallback); QL005 counts the NPU's share; each
    delegate call is priced at Vela's estimate for its partition. `npu_inputs`: what QL007 runs its NPU
    partitions on (`--fix`'s verification inputs), instead of the sample input and seeded batches.
    """
    region_codes = {r.code for r in enabled_rules(Scope.REGION, config)}
    if delegation is not None or config.npu is not None:  # lowered for an NPU, or that lowering failed
        region_codes.discard(Code.FP32_ISLAND)
    analysis = analyse(view, config, region_codes, evaluations)
    npu = {call: c.estimate for call, c in delegation.compiled.items()} if delegation else None
    estimated = estimate(view, core_of(config), npu) if view.lowered and failure is None else None
    cost = measure(estimated) if measure is not None and estimated is not None else estimated
    # a delegate call with no estimate (a `.pte`'s) leaves the inference's time unknown: no finding
    # states a share of it, though the CPU's ops are priced
    timed = cost if cost is None or not cost.unpriced else None
    context = Context(view, analysis, FindingFactory(artifact, config), failure, verbose, values_verified, timed,
                      delegation=delegation, npu_inputs=npu_inputs)
    findings: list[Finding] = []
    if failure is not None:
        for lowering_rule in enabled_rules(Scope.LOWERING, config):
            findings.extend(LOWERING_RULES[lowering_rule.code](context))
    for region in analysis.regions:
        findings.append(context.priced(REGION_RULES[region.code](context, region), region))
    for program_rule in enabled_rules(Scope.PROGRAM, config):
        findings.extend(PROGRAM_RULES[program_rule.code](context))
    cov = context.coverage
    stats = ArtifactStats(
        artifact=artifact,
        nodes=sum(1 for n in view.nodes if n.op == "call_function"),
        int_kernels=cov.int_ops,
        fp32_islands=len(analysis.islands),
        fp32_elements=fp32_total(view, analysis.islands, analysis.constants),
        coverage=cov.ratio,
        coverage_counts=delegation.counts if delegation else "ops",
        lowered=view.lowered,
        graph=view.graph_id,
        cycles=cost.cycles if cost and not cost.unpriced else None,
        fp32_cycles=cost.fp32_cycles if cost else None,
        latency_ms=cost.latency_ms() if cost and not cost.unpriced else None,
        core=cost.core.describe() if cost else "",
        costliest=costliest(view, cost, config.root, delegation=delegation) if cost else (),
        node_cycles=graph_nodes(view, cost.by_node(view)) if cost else {},
        measured_runs=cost.runs if cost else 0,
        profile=compare(estimated, cost) if cost and estimated and cost.runs else (),
        target=delegation.npu if delegation else "",
        partitions=len(delegation.blobs) if delegation else None,
        delegates=npu_partitions(delegation) if delegation else (),
        npu_cycles=cost.npu_cycles if cost and delegation and not cost.unpriced else None,
        cpu_cycles=cost.cpu_cycles if cost and delegation else None,
        npu_nodes=npu_nodes(view, context.partitions) if delegation else {},
    )
    return Linted(findings, stats, analysis, [*(context.plan(r) for r in analysis.regions), *context.gathers.values()],
                  failure, delegation=delegation)


def npu_partitions(delegation: Delegation) -> tuple[NpuPartition, ...]:
    """Each delegate call's blob figures, with Vela's cycles for it when qlint compiled it."""
    return tuple(NpuPartition(**vars(blob), npu_cycles=delegation.compiled[call].estimate.cycles
                              if call in delegation.compiled else None)
                 for call, blob in delegation.blobs.items())


# This tier's registry, by scope: what the rule table's `Scope` says each function is given.
ProgramRule: TypeAlias = Callable[[Context], list[Finding]]     # LOWERING and PROGRAM
RegionRule: TypeAlias = Callable[[Context, Region], Finding]    # REGION: once per region of its code
LOWERING_RULES: dict[Code, ProgramRule] = {Code.LOWERING_FAILED: lowering_failed}
REGION_RULES: dict[Code, RegionRule] = {
    Code.CONSTANT_SCALE_ISLAND: constant_scale, Code.FP32_ISLAND: fp32_island,
    Code.REQUANTIZE_PAIR: requantize, Code.CONSTANT_SUBGRAPH: constant_subgraph,
}
PROGRAM_RULES: dict[Code, ProgramRule] = {
    Code.INT8_COVERAGE: low_coverage, Code.LOWERED_PROGRAM_INVALID: lowered_program_invalid,
    Code.NPU_FALLBACK: npu_fallback,
}
FULL_RULES: dict[Code, ProgramRule | RegionRule] = {**LOWERING_RULES, **REGION_RULES, **PROGRAM_RULES}
