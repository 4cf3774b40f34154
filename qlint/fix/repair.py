"""QL007's fixes, for the faults of the Cortex-M lowering that have one right answer.

A relu, clamp or hardtanh the lowering leaves on the integers (a relu whose input has other users is
not fused into the kernel before it) keeps the float model's bounds: a relu clamps the integers at 0,
not at the zero point. Its bounds quantized as its input and output are read (one way, or a clamp could
not compute it) make it compute what the quantized program computes: `aten.clamp` at those integers.

The other: put back the quantizes the Cortex-M lowering folded away before an integer kernel.

`FoldAndAnnotateQParamsPass` removes the quantize after an op it annotates and records its qparams
on the op (`output_qparams`); the Arm flow then computes constant ops ahead of time
(`ComputeConstantOpsAOTPass`) and the quantize goes with them. The Cortex-M passes never run that
pass, so an `aten.full` whose quantize was folded away feeds a Cortex-M integer kernel its float
bytes. A `cortex_m.quantize_per_tensor` with the recorded qparams between the two makes the kernel
read what the quantized program gives it; the constant subgraph that then ends in that quantize is
QL008's, whose fold computes it once and stores the integers, as the Arm flow does.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

from qlint.analysis.validity import FloatRead, IntegerClamp
from qlint.loading.view import base_name, folded_qparams, op_name, torch_dtype
from qlint.records.results import AppliedFold
from qlint.rules.ops import SHAPE_OPS
from qlint.rules.table import Code

RESTORED = "quantize"  # AppliedFold.kind of a quantize put back
REBOUND = "clamp"     # ... and of an activation clamped at its quantized bounds


def _retype(kernel: Node) -> None:
    """Record the integer outputs of a kernel that read floats, and of the kernels after it that
    recorded floats for the same reason, as the qparams the lowering folded into them say."""
    pending = [kernel]
    while pending:
        node = pending.pop()
        folded = folded_qparams(node)
        val = node.meta.get("val")
        if folded is None or not isinstance(val, torch.Tensor) or not val.is_floating_point():
            continue
        if not op_name(node).startswith("cortex_m.") and base_name(op_name(node)) not in SHAPE_OPS:
            continue  # data movement passes the integers on; anything else computes its own dtype
        node.meta["val"] = val.to(torch_dtype(folded))
        pending.extend(node.users)


def restore_quantizes(program: Any, reads: list[FloatRead]) -> list[AppliedFold]:
    """One quantize after each float producer, read by the integer kernel (or the data movement
    before it, which then moves integers, as the lowering meant); what was done."""
    from executorch.exir.dialects._ops import ops as exir_ops

    graph = program.graph_module.graph
    restored: dict[Node, Node] = {}
    done = []
    for read in reads:
        qp = read.qparams
        assert qp is not None, "only restorable reads are restored"
        if read.producer not in restored:
            with graph.inserting_after(read.producer):
                quantize = graph.call_function(
                    exir_ops.edge.cortex_m.quantize_per_tensor.default,
                    (read.producer, qp.scale, qp.zero_point, qp.qmin, qp.qmax, torch_dtype(qp)),
                )
            quantize.meta["val"] = read.producer.meta["val"].to(torch_dtype(qp))
            quantize.meta["stack_trace"] = read.producer.meta.get("stack_trace")
            restored[read.producer] = quantize
        first = read.through[0] if read.through else read.kernel
        first.replace_input_with(read.producer, restored[read.producer])
        for moved in read.through:  # now on the integers, as the lowering meant
            moved.meta["val"] = moved.meta["val"].to(torch_dtype(qp))
        _retype(read.kernel)
        done.append(AppliedFold(
            Code.LOWERED_PROGRAM_INVALID, read.kernel.name, RESTORED,
            f"put back the quantize of {op_name(read.producer)}'s output ({qp}) that {op_name(read.kernel)} reads",
        ))
    graph.lint()
    program.graph_module.recompile()
    return done


def _shown(bounds: tuple[float | int | None, float | int | None]) -> str:
    low, high = bounds
    if low is not None and high is not None:
        return f"[{low}, {high}]"
    return f"min {low}" if high is None else f"max {high}"


def _change(clamp: IntegerClamp, was: str) -> str:
    qp = clamp.qparams
    if base_name(was) in ("relu", "relu_"):
        return (f"{was} clamped the {qp.dtype} integers at 0, not at the zero point: now aten.clamp at "
                f"{qp.zero_point} ({qp})")
    return (f"{was} clamped the {qp.dtype} integers at {_shown(clamp.bounds)}, the model's float bounds: now "
            f"aten.clamp at {_shown(clamp.integers)}, those bounds quantized ({qp})")


def rebound_clamps(program: Any, clamps: list[IntegerClamp]) -> list[AppliedFold]:
    """Each activation an `aten.clamp` of the integers at its quantized bounds; what was done."""
    from executorch.exir.dialects._ops import ops as exir_ops

    done = []
    for clamp in clamps:
        node, was, source = clamp.node, op_name(clamp.node), clamp.node.args[0]
        node.target = exir_ops.edge.aten.clamp.default
        node.args, node.kwargs = (source, *clamp.integers), {}
        node.meta["val"] = node.meta["val"].to(torch_dtype(clamp.qparams))  # a float bound made it float
        done.append(AppliedFold(Code.LOWERED_PROGRAM_INVALID, node.name, REBOUND, _change(clamp, was)))
    program.graph_module.graph.lint()
    program.graph_module.recompile()
    return done
