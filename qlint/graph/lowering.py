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

import contextlib
import inspect
import re
from collections.abc import Callable, Iterator
from typing import Any

from qlint.graph import stack
from qlint.io.reads import first_line
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
    share_provenance_snapshots()
    from executorch.backends.cortex_m.edge_compile_config import cortex_m_edge_compile_config
    from executorch.exir import to_edge as exir_to_edge

    with registering_py_kernels_directly():
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
    from qlint.graph.view import base_name, op_name
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


class _Snapshot(list[Any]):
    """A node's provenance list that `copy.deepcopy` copies one level deep (see below)."""

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        return list(self)


def share_provenance_snapshots() -> None:
    """Make torch's `NodeSource` snapshot a node's provenance (`node.meta["from_node"]`) as a new list of
    the same `NodeSource` records instead of a deep copy of the whole tree.

    Every node an ExecuTorch pass retraces gets a `NodeSource` of the node it came from, and torch
    deep-copies that node's provenance tree into it; the trees deepen with every pass, so the copies
    are about a fifth of `to_edge` (SAM here: a process that loads and lowers it, 15 % shorter).
    Nothing changes a `NodeSource` once made (torch builds new ones and new lists), so sharing the
    records answers every question the copies did: ExecuTorch's debug handles (each node's oldest
    ancestor) and the ETRecord are the same. Where `NodeSource` does not deep-copy `from_node`, this
    changes nothing. Set on the first lowering, not with the stack: what a quantizer builds is the
    same with or without it.
    """
    import torch.fx.traceback as fx_traceback

    original = fx_traceback.NodeSource.__init__
    if getattr(original, "shares_provenance", False):
        return

    def init(self: Any, node: Any, *args: Any, **kwargs: Any) -> None:
        meta = getattr(node, "meta", None)
        given = meta.get("from_node") if isinstance(meta, dict) else None
        if not isinstance(meta, dict) or type(given) is not list:
            original(self, node, *args, **kwargs)
            return
        meta["from_node"] = _Snapshot(given)
        try:
            original(self, node, *args, **kwargs)
        finally:
            meta["from_node"] = given

    init.shares_provenance = True  # type: ignore[attr-defined]
    init.__wrapped__ = original  # type: ignore[attr-defined]
    fx_traceback.NodeSource.__init__ = init


@contextlib.contextmanager
def registering_py_kernels_directly() -> Iterator[None]:
    """Within the block, `OpOverload.py_impl(key)` for a dispatch key writes the kernel table as torch's
    does, without building the decorator torch builds per call.

    Every `run_decompositions` (two a `to_edge`) overrides the CompositeImplicitAutograd kernels of
    ~560 ops, about 12,000 `py_impl` registrations. torch's `py_impl` defines a decorator per call
    whose `Callable[_P, _T]` annotations are evaluated each time; that is most of the ~80 ms an
    override takes here (~28 ms without it), a fifth of lowering a small program. The table writes
    are the same: the same error for a key already registered, the same cache cleared. Any other
    kind of key (a mode, a tensor subclass, a functorch transform, `DispatchKey.Python`) goes to
    torch's own `py_impl`. Scoped to the lowering; where `OpOverload` has no such method, nothing
    changes.
    """
    from torch._C import DispatchKey
    from torch._ops import OpOverload

    torch_py_impl = getattr(OpOverload, "py_impl", None)
    if torch_py_impl is None or "py_impl" in vars(OpOverload):
        yield  # not torch's inherited method (or already replaced by an enclosing block): leave it
        return

    def py_impl(self: Any, key: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        if type(key) is not DispatchKey or key == DispatchKey.Python:
            return torch_py_impl(self, key)

        def register(kernel: Callable[..., Any]) -> Callable[..., Any]:
            if key in self.py_kernels:
                raise RuntimeError(f"Trying to override a python impl for {key} on operator {self.name()}")
            self.py_kernels[key] = kernel
            self._dispatch_cache.clear()
            return kernel

        return register

    OpOverload.py_impl = py_impl
    try:
        yield
    finally:
        del OpOverload.py_impl
