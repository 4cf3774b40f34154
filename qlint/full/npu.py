"""QL010 npu-fallback: the ops an Ethos-U target leaves to the CPU, where they sit between the NPU's
partitions, and why ExecuTorch's TOSA support checks did not delegate them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from qlint.analysis.npu_causes import causes
from qlint.analysis.partitions import Fallback, partitions
from qlint.loading.ethos_u import Delegation
from qlint.loading.view import GraphView, numel, op_name, output_dtype
from qlint.records.results import Finding
from qlint.rules.table import Code

MakeFinding = Callable[..., Finding]  # `FindingFactory.finding`: (code, message, nodes, **details)

NO_REASONS = "a .pte does not record why the partitioner left it; check the .pt2 or the config target for the cause"


def fallback_findings(view: GraphView, delegation: Delegation, make: MakeFinding) -> list[Finding]:
    """One finding per op the NPU does not run that computes on the CPU in float, and per integer op on
    the CPU that splits a partition."""
    found = partitions(view)
    return [_finding(make, delegation, fallback, found.count, _graph_nodes(view, fallback))
            for fallback in found.fallbacks if fallback.float or fallback.splits]


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


def _finding(make: MakeFinding, delegation: Delegation, fallback: Fallback, count: int,
             graph_nodes: dict[str, int]) -> Finding:
    node = fallback.node
    dtype = str(output_dtype(node)).removeprefix("torch.")
    said = causes(node, delegation) if delegation.rejections else []
    why = "; ".join(said) if said else NO_REASONS
    split = ", splitting the NPU's work" if fallback.splits else ""
    message = (f"{op_name(node)} ({dtype}) {where_it_runs(fallback, count)}{split}; "
               f"{count} NPU partition{'s' if count != 1 else ''} on {delegation.npu}: {why}")
    details: dict[str, Any] = dict(op=op_name(node), dtype=dtype, npu=delegation.npu,
        partitions=count, after_partition=None if fallback.after is None else fallback.after + 1,
        splits=fallback.splits, causes=said,
        reasons=[{"check": r.check, "reason": r.reason} for r in delegation.rejections.get(node.name, ())],
        graph_nodes=graph_nodes)
    return make(Code.NPU_FALLBACK, message, (node,), **details)
