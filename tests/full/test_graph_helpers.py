"""Fast tests of the graph layer's pure helpers (the layer imports torch)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any

import pytest

from qlint.analysis.folds import _scale_candidates
from qlint.device.memory import _covered
from qlint.records.results import Buffer


def buffer(offset: int, size: int) -> Buffer:
    return Buffer(start=0, end=1, offset=offset, size=size, fp32=True, input=False)


def test_covered_counts_overlapping_buffers_once() -> None:
    assert _covered([]) == 0
    assert _covered([buffer(0, 100), buffer(200, 50)]) == 150          # apart
    assert _covered([buffer(0, 100), buffer(50, 100)]) == 150          # overlapping (aliases)
    assert _covered([buffer(10, 20), buffer(0, 100)]) == 100           # nested, in any order
    assert _covered([buffer(0, 100), buffer(100, 1)]) == 101           # touching


def test_scale_candidates_are_the_scale_then_float32_neighbours() -> None:
    import numpy as np

    found = _scale_candidates(0.1, steps=2)
    assert found[0] == 0.1 and len(found) == 5
    one_up = float(np.nextafter(np.float32(0.1), np.float32(1)))
    one_down = float(np.nextafter(np.float32(0.1), np.float32(0)))
    assert found[1:3] == [one_up, one_down]
    assert sorted(found[1:]) == sorted(set(found[1:]))  # distinct


def test_constant_propagation_never_runs_a_huge_or_untrusted_constant() -> None:
    """`aten.full` of any size is one node in an untrusted program: only small ones are computed."""
    import torch

    from qlint.io.limits import MAX_CONSTANT_BYTES
    from qlint.loading.view import computed_constants

    class Masks(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            small = torch.full((8, 8), 0.5)
            big = torch.full((4096, 4096), 1.0)  # 64 MiB of float32
            return x * small + big[:8, :8]

    program = torch.export.export(Masks(), (torch.randn(8, 8),))
    computed = computed_constants(program, trusted_shapes=True)
    assert 4096 * 4096 * 4 > MAX_CONSTANT_BYTES
    assert [tuple(v.shape) for v in computed.values()] == []  # both are aten.full: the big one skips the op
    assert computed_constants(program, trusted_shapes=False) == {}

    class Mask(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.full((8, 8), 0.5) * 2

    computed = computed_constants(torch.export.export(Mask(), (torch.randn(8, 8),)), trusted_shapes=True)
    assert sorted(float(v.flatten()[0]) for v in computed.values()) == [0.5, 1.0]


def test_the_stack_collects_cia_ops_with_one_dispatcher_walk_and_the_same_answer(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`run_decompositions` asks for the CompositeImplicitAutograd ops twice per `to_edge`; torch walks
    the dispatcher's list once per op namespace, the stack's version once per call, same set."""
    import torch
    import torch._export.utils as export_utils
    import torch.export.decomp_utils as decomp_utils
    import torch.export.exported_program as exported_program

    from qlint.loading import stack

    stack.load()
    patched, original = exported_program._collect_all_valid_cia_ops, export_utils._collect_all_valid_cia_ops
    assert patched is not original and decomp_utils._collect_all_valid_cia_ops is patched
    ask = torch._C._dispatch_get_registrations_for_dispatch_key
    walks: list[str] = []
    monkeypatch.setattr(torch._C, "_dispatch_get_registrations_for_dispatch_key",
                        lambda key: (walks.append(key), ask(key))[1])
    once = patched()
    assert walks == ["CompositeImplicitAutograd"]
    walks.clear()
    assert original() == once and len(walks) > 10 and len(once) > 100
    assert export_utils._materialize_cpp_cia_ops.__name__ == "_materialize_cpp_cia_ops"  # restored after the call


@pytest.mark.model("make_attention")
def test_a_lowering_with_shared_provenance_records_is_the_lowering_torch_copies_them_for(
        quantized: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """qlint's lowering snapshots a node's provenance without deep-copying its tree: the same records
    (names, passes, actions, ancestry) and the same debug handles as torch's deep copies, which differ
    only by the graph ids and addresses that differ between any two processes."""
    import copy
    import re

    import torch.fx.traceback as fx_traceback

    from qlint.loading import lowering, speedups

    def lowered() -> list[tuple[str, Any, str]]:
        program = lowering.run_passes(lowering.to_edge(copy.deepcopy(quantized("make_attention"))).exported_program())
        return [(n.name, n.meta.get("debug_handle"),
                 re.sub(r'"graph_id": -?\d+|0x[0-9a-f]+', "",
                        json.dumps([s.to_dict() for s in n.meta.get("from_node", [])], sort_keys=True)))
                for n in program.graph.nodes]

    shared = lowered()
    init = fx_traceback.NodeSource.__init__
    assert getattr(init, "shares_provenance", False)
    node = next(n for n in quantized("make_attention").graph.nodes if n.meta.get("from_node"))
    assert fx_traceback.NodeSource(node).from_node[0] is node.meta["from_node"][0]  # shared, not copied
    monkeypatch.setattr(fx_traceback.NodeSource, "__init__", init.__wrapped__)
    monkeypatch.setattr(speedups, "share_provenance_snapshots", lambda: None)
    copied = lowered()
    assert fx_traceback.NodeSource(node).from_node[0] is not node.meta["from_node"][0]
    assert shared == copied and sum(1 for _, handle, _ in shared if handle) > 10


@pytest.mark.model("make_attention")
def test_kernels_registered_directly_are_the_kernels_torch_registers(
        quantized: Callable[..., Any]) -> None:
    """qlint's lowering registers the ~12,000 CompositeImplicitAutograd overrides of a
    `run_decompositions` without torch's per-call decorator: the same kernel tables inside the block
    (same keys, same kernels), the same error for a key already taken, torch's method after it, and the
    same lowered program."""
    import copy

    import torch
    import torch.export.exported_program as exported_program
    from executorch.exir.tracer import _default_decomposition_table
    from torch._ops import OpOverload

    from qlint.loading import lowering, speedups

    cia, _ = exported_program._split_decomp_table_to_cia_and_python_decomp(_default_decomposition_table())

    def tables() -> dict[str, list[tuple[str, str]]]:
        with exported_program._override_composite_implicit_decomp(cia):
            return {str(op): sorted((str(key), getattr(kernel, "__qualname__", type(kernel).__name__))
                                    for key, kernel in op.py_kernels.items()) for op in cia}

    torch_tables = tables()
    with speedups.registering_py_kernels_directly():
        assert "py_impl" in vars(OpOverload)
        direct_tables = tables()
        assert torch._C.DispatchKey.Autograd not in torch.ops.aten.add.Tensor.py_kernels
        try:
            with pytest.raises(RuntimeError, match="Trying to override a python impl"):
                torch.ops.aten.add.Tensor.py_impl(torch._C.DispatchKey.Autograd)(lambda *a: None)
                torch.ops.aten.add.Tensor.py_impl(torch._C.DispatchKey.Autograd)(lambda *a: None)
        finally:  # the session's other tests must not see the kernel registered here
            torch.ops.aten.add.Tensor.py_kernels.pop(torch._C.DispatchKey.Autograd, None)
            torch.ops.aten.add.Tensor._dispatch_cache.clear()
    assert "py_impl" not in vars(OpOverload)
    assert direct_tables == torch_tables and len(cia) > 500
    assert sum(len(kernels) for kernels in direct_tables.values()) > 5000

    def lowered(direct: bool) -> list[tuple[str, str, str]]:
        block = speedups.registering_py_kernels_directly if direct else contextlib.nullcontext
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(speedups, "registering_py_kernels_directly", block)
            edge = lowering.to_edge(copy.deepcopy(quantized("make_attention")))
        program = lowering.run_passes(edge.exported_program())
        return [(n.name, str(n.target), str(n.meta.get("val"))) for n in program.graph.nodes]

    direct = lowered(direct=True)
    assert direct == lowered(direct=False) and sum(1 for _, target, _ in direct if "cortex_m" in target) > 3
