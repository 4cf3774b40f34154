"""Cortex-M lowering with a pass order that survives attention with linear projections.

The stock `CortexMPassManager` order crashes on `linear -> reshape/transpose ->
matmul` ("expected scalar type torch.int8 but found torch.int32" while a later
pass retraces `aten.bmm`): after `FoldAndAnnotateQParamsPass` the graph still
holds `aten.linear`, whose fake output is int32. Running `AtenToCortexMPass`
once right after annotation and activation fusion replaces those linears before
any pass retraces the graph; the second run lowers what the scalar and quant
replacement passes exposed. Each pass runs alone so a failure names its pass.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from qlint.io.reads import first_line
from qlint.loading import speedups, stack
from qlint.settings.options import LoweringOrder

CPU_NAMES = {
    "cortex-m0": "M0", "cortex-m0plus": "M0PLUS", "cortex-m3": "M3", "cortex-m4": "M4",
    "cortex-m7": "M7", "cortex-m23": "M23", "cortex-m33": "M33", "cortex-m35p": "M35P",
    "cortex-m55": "M55", "cortex-m85": "M85",
}
_NODE_IN_ERROR = re.compile(r"While executing %(\w+)")


class LoweringError(Exception):
    """A pass raised: carries the pass name and, when known, the node it was on."""

    def __init__(self, pass_name: str, node: Any, cause: BaseException) -> None:
        self.pass_name, self.node, self.cause = pass_name, node, cause
        super().__init__(f"{pass_name}: {first_line(cause)}")


def _node_in(exc: BaseException) -> str | None:
    seen: BaseException | None = exc
    while seen is not None:
        match = _NODE_IN_ERROR.search(str(seen))
        if match:
            return match[1]
        seen = seen.__cause__ or seen.__context__
    return None


def pass_list(order: LoweringOrder = LoweringOrder.REPAIRED) -> list[type]:
    from executorch.backends.arm._passes import FoldAndAnnotateQParamsPass
    from executorch.backends.cortex_m.passes import (
        ActivationFusionPass,
        AtenToCortexMPass,
        DecomposeHardswishPass,
        QuantizedClampActivationPass,
        ReplaceQuantNodesPass,
    )
    from executorch.backends.cortex_m.passes.cortex_m_pass_manager import CortexMPassManager
    from executorch.backends.transforms.remove_getitem_op import RemoveGetItemPass
    from executorch.backends.transforms.replace_scalar_with_tensor import (
        ReplaceScalarWithTensorArgPass,
    )

    if order == LoweringOrder.STOCK:
        return list(CortexMPassManager.legacy_pass_list)
    return [
        RemoveGetItemPass,
        FoldAndAnnotateQParamsPass,
        ActivationFusionPass,
        QuantizedClampActivationPass,
        DecomposeHardswishPass,
        AtenToCortexMPass,
        ReplaceScalarWithTensorArgPass,
        ReplaceQuantNodesPass,
        AtenToCortexMPass,
    ]


def target_config(cpu: str) -> Any:
    from executorch.backends.cortex_m.target_config import CortexM, CortexMTargetConfig

    return CortexMTargetConfig(cpu=CortexM[CPU_NAMES[cpu]])


def to_edge(ep: Any) -> Any:
    """`to_edge` with the compile config the Cortex-M backend requires."""
    stack.load()
    speedups.share_provenance_snapshots()
    from executorch.backends.cortex_m.edge_compile_config import cortex_m_edge_compile_config
    from executorch.exir import to_edge as exir_to_edge

    with speedups.registering_py_kernels_directly():
        return exir_to_edge(ep, compile_config=cortex_m_edge_compile_config())


def run_passes(edge_program: Any, cpu: str = "cortex-m55", order: LoweringOrder = LoweringOrder.REPAIRED) -> Any:
    """Apply the pass list to an edge-dialect ExportedProgram, one pass at a time."""
    from executorch.exir.program._program import _transform, lift_constant_tensor_pass

    config = target_config(cpu)
    program = edge_program
    for pass_cls in pass_list(order):
        params = inspect.signature(pass_cls).parameters
        kwargs: dict[str, Any] = {}
        if "exported_program" in params:
            kwargs["exported_program"] = program
        if "target_config" in params:
            kwargs["target_config"] = config
        try:
            program = _transform(program, pass_cls(**kwargs))
        except Exception as exc:  # a pass raising is a finding, not a crash
            name = _node_in(exc)
            node = next((n for n in program.graph.nodes if n.name == name), None)
            raise LoweringError(pass_cls.__name__, node, exc) from exc
    return lift_constant_tensor_pass(program)


def needs_repair(program: Any) -> bool:
    """Whether the stock pass order would hit the linear -> ... -> bmm crash.

    The crash needs an `aten.linear` whose output reaches a batch matmul
    through shape ops and quantize/dequantize nodes only.
    """
    from qlint.loading.view import base_name, op_name
    from qlint.rules.ops import SHAPE_OPS

    passthrough = SHAPE_OPS | {"quantize_per_tensor", "dequantize_per_tensor"}
    for node in program.graph.nodes:
        if node.op != "call_function" or base_name(op_name(node)) != "linear":
            continue
        frontier, seen = list(node.users), set()
        while frontier:
            user = frontier.pop()
            if user in seen:
                continue
            seen.add(user)
            base = base_name(op_name(user)) if user.op == "call_function" else ""
            if base in ("bmm", "matmul"):
                return True
            if base in passthrough:
                frontier.extend(user.users)
    return False
