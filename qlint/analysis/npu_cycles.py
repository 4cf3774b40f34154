"""Where an NPU partition's time goes in the user's source: Vela's per-layer cycles by source line.

Each row of Vela's per-layer estimate names the TOSA tensor its operation writes (`NpuLayer.name`).
The lowering keeps, per partition, the node each TOSA tensor was written while visiting
(`Compiled.writers`) and the nodes a writer's provenance may name (`Compiled.origins`: the partition
before Arm's passes and every node they erased). A row reaches a source line in three derived steps:

1. its TOSA tensor: the name itself, or the longest written tensor name it extends with `_` or `/`
   (Vela names the operations it adds after the tensor they serve: `x_int32`, `x/Transpose`,
   `x_propagated_reshape`);
2. that tensor's writer node, and when the writer's stack trace has no frame in the user's code, the
   nodes its provenance names, nearest first: `meta["from_node"]` (what a pass made it from), and for
   a TOSA TABLE the node it replaced, named in its table constant (`b_<name>_table_constant`);
3. the innermost user frame of the first of those that has one (`records.source.locate`).

Nothing is guessed from a node's neighbours: a row none of these steps place stays unattributed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qlint.io.vela import NpuLayer
from qlint.loading.ethos_u import Compiled, Delegation
from qlint.records.results import Location
from qlint.records.source import locate

_TABLE_CONSTANT = ("b_", "_table_constant")


@dataclass(frozen=True)
class NpuCycles:
    """One delegate call's Vela cycles by the source line they come from.

    `cycles` is Vela's `cycles_total` for the partition, which its per-layer rows add up to;
    `by_line` holds the cycles of the rows placed on each line, and `unplaced` the rows no line was
    derived for (their cycles are `cycles - attributed`)."""

    call: str
    cycles: int
    by_line: dict[Location, int]
    unplaced: tuple[NpuLayer, ...]

    @property
    def attributed(self) -> int:
        return sum(self.by_line.values())

    @property
    def share(self) -> float:
        """The part of the partition's cycles placed on a line (1.0 for a partition of no cycles)."""
        return self.attributed / self.cycles if self.cycles else 1.0


def npu_cycles(delegation: Delegation, root: Path) -> dict[str, NpuCycles]:
    """Each delegate call's cycles by source line (by the call's node name), for the calls whose
    compilation the lowering kept (none for a `.pte`). `root` is what paths are shown relative to."""
    return {call: partition_cycles(call, compiled, root) for call, compiled in delegation.compiled.items()}


def partition_cycles(call: str, compiled: Compiled, root: Path) -> NpuCycles:
    by_line: dict[Location, int] = {}
    unplaced: list[NpuLayer] = []
    for layer in compiled.estimate.layers:
        writer = compiled.writers.get(tosa_tensor(layer.name, compiled.writers) or "")
        location = source_of(writer, compiled.origins, root) if writer is not None else None
        if location is None:
            unplaced.append(layer)
        else:
            by_line[location] = by_line.get(location, 0) + layer.cycles
    return NpuCycles(call, compiled.estimate.cycles, by_line, tuple(unplaced))


def tosa_tensor(name: str, tensors: dict[str, Any]) -> str | None:
    """The TOSA tensor a Vela row's name is, or the longest one it extends with `_` or `/`."""
    if name in tensors:
        return name
    for end in range(len(name) - 1, 0, -1):
        if name[end] in "_/" and name[:end] in tensors:
            return name[:end]
    return None


def source_of(node: Any, origins: dict[str, Any], root: Path) -> Location | None:
    """The user's line of `node`, or of the nearest node its provenance names that has one."""
    seen: set[str] = set()
    queue = [node]
    while queue:
        current = queue.pop(0)
        location = locate(current.meta.get("stack_trace"), root)
        if location is not None:
            return location
        for name in provenance(current):
            if name not in seen and name in origins:
                seen.add(name)
                queue.append(origins[name])
    return None


def provenance(node: Any) -> Iterator[str]:
    """The names of the nodes `node` was made from, nearest first: its `from_node` chain (a
    `NodeSource` per pass, each with its own), and the node a TABLE replaced, which Arm's
    InsertTableOpsPass names only in the table's constant."""
    sources = list(node.meta.get("from_node") or [])
    while sources:
        source = sources.pop()
        yield source.name
        sources[:0] = list(source.from_node or [])
    for arg in node.args:
        name = getattr(arg, "name", "")
        if isinstance(name, str) and name.startswith(_TABLE_CONSTANT[0]) and name.endswith(_TABLE_CONSTANT[1]):
            yield name[len(_TABLE_CONSTANT[0]):-len(_TABLE_CONSTANT[1])]
