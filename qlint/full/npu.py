"""QL010 npu-fallback: the ops an Ethos-U target leaves to the CPU (compute, and data movement
between two partitions), where they sit among the NPU's partitions, and why ExecuTorch's TOSA
support checks did not delegate them."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from torch.fx import Node

from qlint.analysis.npu_causes import causes
from qlint.analysis.partitions import Fallback, Partitions
from qlint.device.cost import ProgramCost
from qlint.loading.ethos_u import Delegation
from qlint.loading.view import GraphView, Kind, numel, op_name, output_dtype, output_value
from qlint.records.results import Finding
from qlint.rules.builders import time_clause_of
from qlint.rules.table import Code

MakeFinding = Callable[..., Finding]  # `FindingFactory.finding`: (code, message, nodes, **details)

# An op on the CPU no support check refused: the partitioner left it out of every partition (a
# partition-level rule, recorded when it gives one).
UNREFUSED = "no support check refused it: the partitioner left it out of every partition"
NO_REASONS = "a .pte does not record why the partitioner left it; check the .pt2 or the config target for the cause"


def fallback_findings(view: GraphView, split: Partitions, delegation: Delegation,
                      make: MakeFinding, cost: ProgramCost | None = None,
                      fixable: Collection[Node] = ()) -> list[Finding]:
    """One finding per op the NPU does not run that computes on the CPU in float, and per op on the CPU
    that splits a partition, integer compute or data movement (`split`: the partitions of `view`),
    priced with `cost`; those in `fixable` have a fold `--fix` makes."""
    return [_priced(_finding(make, delegation, fallback, split.count, _graph_nodes(view, fallback),
                             fallback.node in fixable), view, fallback, delegation, cost)
            for fallback in split.fallbacks if fallback.float or fallback.splits]


def _conversions(view: GraphView, node: Node) -> list[Node]:
    """The op and the dequantize and quantize the CPU runs only for it: what it costs the CPU."""
    before = [n for n in node.all_input_nodes if view.kind(n) == Kind.DEQUANTIZE and len(n.users) == 1]
    after = [n for n in node.users if view.kind(n) == Kind.QUANTIZE]
    return [*before, node, *after]


def _priced(finding: Finding, view: GraphView, fallback: Fallback, delegation: Delegation,
            cost: ProgramCost | None) -> Finding:
    """`finding` with what its op costs: the CPU's cycles for it (with its conversions), and, for an op
    compiled the other way too (`Delegation.on_npu`), the NPU cycles the split costs: Vela's cycles for
    the program as it is, less those for the program with the op quantized onto the NPU (which count
    the op's own NPU work), so what moving it saves. Both on the core's clock, as the inference's time is."""
    if cost is None or not cost.cycles or cost.unpriced:
        return finding
    cpu = cost.of(n.name for n in _conversions(view, fallback.node))
    split, other = 0, delegation.on_npu.get(fallback.node.name)
    clause = ""
    if other is not None and delegation.npu_cycles is not None:
        split = delegation.npu_cycles - other.npu_cycles
        on_core = round(split * cost.core.clock_hz / other.clock_hz) if cost.core.clock_hz else split
        clause = (f"; the split costs the NPU {split:,} cycles ({delegation.npu_cycles:,} as it is, "
                  f"{other.npu_cycles:,} with it quantized onto the NPU: {other.partitions} partition"
                  f"{'s' if other.partitions != 1 else ''})")
        finding.details.update(npu_split_cycles=split, npu_cycles_on_npu=other.npu_cycles,
                               partitions_on_npu=other.partitions)
        split = on_core
    finding.details.update(cpu_cycles=cpu, cycles=cpu + max(split, 0),
                           time_share=round((cpu + max(split, 0)) / cost.cycles, 4), cycles_measured=bool(cost.runs))
    latency = cost.latency_ms(cpu + max(split, 0))
    if latency is not None:
        finding.details["latency_ms"] = round(latency, 6)
    finding.message += clause + "; " + time_clause_of(finding.details)
    return finding


def _graph_nodes(view: GraphView, fallback: Fallback) -> dict[str, int]:
    """The op by its id in the checked program (what `--write model-explorer:` marks), with the fp32
    elements it materializes when it computes in float."""
    name = view.source_name(fallback.node)
    return {} if name is None else {name: numel(fallback.node) if fallback.float else 0}


def where_it_runs(fallback: Fallback, count: int) -> str:
    """Where the op sits among the partitions, as the device runs them (partitions counted from 1)."""
    if count == 0:
        return "runs on the CPU, and no partition runs on the NPU"
    if fallback.after is None:
        return "runs on the CPU before the first NPU partition"
    if fallback.splits:
        return f"runs on the CPU between NPU partitions {fallback.after + 1} and {fallback.after + 2}"
    return f"runs on the CPU after NPU partition {fallback.after + 1}"


def why_on_cpu(node: Node, delegation: Delegation) -> tuple[list[str], str]:
    """The derived causes of `node` (none from a `.pte`, which does not record them), and the sentence a
    finding states: those causes, or why there are none. QL010 and QL005's main cause both say it."""
    said = causes(node, delegation) if delegation.recorded else []
    return said, "; ".join(said) if said else UNREFUSED if delegation.recorded else NO_REASONS


def _finding(make: MakeFinding, delegation: Delegation, fallback: Fallback, count: int,
             graph_nodes: dict[str, int], fixable: bool) -> Finding:
    node = fallback.node
    dtype = str(output_dtype(node)).removeprefix("torch.")
    said, why = why_on_cpu(node, delegation)
    split = ", splitting the NPU's work" if fallback.splits else ""
    message = (f"{op_name(node)} ({dtype}) {where_it_runs(fallback, count)}{split}; "
               f"{count} NPU partition{'s' if count != 1 else ''} on {delegation.npu}: {why}")
    details: dict[str, Any] = dict(op=op_name(node), dtype=dtype, npu=delegation.npu,
        partitions=count, after_partition=None if fallback.after is None else fallback.after + 1,
        splits=fallback.splits, causes=said,
        reasons=[{"check": r.check, "reason": r.reason} for r in delegation.rejections.get(node.name, ())],
        graph_nodes=graph_nodes)
    return make(Code.NPU_FALLBACK, message, (node,), fixable, **details)


def miswired_calls(split: Partitions, delegation: Delegation, make: MakeFinding) -> list[Finding]:
    """QL007 for each delegate call whose tensors are not the ones its command stream reads and writes.
    ExecuTorch's Ethos-U backend copies a call's first arguments into the stream's inputs and takes
    output i from argument `inputs + i` (the blob's counts): a call with another number of inputs (a
    partition Vela compiled to read none, called with one) has its outputs written over other tensors."""
    found = []
    for number, node in enumerate(split.delegates, start=1):
        blob = delegation.blobs.get(node.name)
        inputs = [a for a in node.args if isinstance(a, Node) and a.op != "get_attr"]  # not the lowered module
        value = output_value(node)
        outputs = len(value) if isinstance(value, (tuple, list)) else 1
        if blob is None or (len(inputs), outputs) == (len(blob.inputs), len(blob.outputs)):
            continue
        message = (f"lowered program cannot run as lowered: NPU partition {number} is called with {len(inputs)} "
                   f"input{'s' if len(inputs) != 1 else ''} and {outputs} output{'s' if outputs != 1 else ''}, and "
                   f"Vela's command stream for it reads {len(blob.inputs)} and writes {len(blob.outputs)}: the "
                   "Ethos-U backend would write its outputs over other tensors")
        found.append(make(Code.LOWERED_PROGRAM_INVALID, message, (node,), op=op_name(node), partition=number,
                          call_inputs=len(inputs), call_outputs=outputs, stream_inputs=len(blob.inputs),
                          stream_outputs=len(blob.outputs)))
    return found
