"""Patches of torch that make qlint's lowering faster without changing what it computes.

Each replaces one torch function with one that returns the same answer with less work, says what it
saves and why the answer is the same, and leaves torch alone where the function it replaces is not
there. The stack applies the first when it loads (`stack.load`); the lowering applies the other two
(`lowering.to_edge`): sharing provenance records for good, registering kernels directly only
inside `to_edge`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any


def ask_the_dispatcher_once_per_collection() -> None:
    """Make torch's `_collect_all_valid_cia_ops` ask the C++ dispatcher for its CompositeImplicitAutograd
    ops once per call instead of once per op namespace.

    `run_decompositions` (twice in every `to_edge`) calls it, and it walks the dispatcher's whole CIA
    list for each of the ~44 namespaces, though nothing can register an op in between: 53 ms a call
    here, 8 ms with one walk, the same set of ops. It is not cached across calls (an op registered
    by a model factory is still seen). Where torch does not have these functions, nothing changes.
    """
    import torch._export.utils as export_utils
    import torch.export.decomp_utils as decomp_utils
    import torch.export.exported_program as exported_program

    collect = getattr(export_utils, "_collect_all_valid_cia_ops", None)
    materialize = getattr(export_utils, "_materialize_cpp_cia_ops", None)
    if collect is None or materialize is None:
        return

    def collect_once() -> Any:
        asked: list[bool] = []

        def materialize_once() -> None:
            if not asked:
                materialize()
                asked.append(True)

        export_utils._materialize_cpp_cia_ops = materialize_once
        try:
            return collect()
        finally:
            export_utils._materialize_cpp_cia_ops = materialize

    for module in (exported_program, decomp_utils):
        if getattr(module, "_collect_all_valid_cia_ops", None) is collect:
            module._collect_all_valid_cia_ops = collect_once


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
