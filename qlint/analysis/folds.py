"""Decide how an island, constant subgraph or requantize pair can be folded, and prove the fold exact.

Three folds of quantized regions, each proven on every value of the input dtype before it is offered:

- identity: quantize(f(dequantize(q))) == q, so the island is deleted;
- table (int8): the island is an int8 -> int8 function of one input, so its
  256-entry table, computed with the graph's own ops, replaces it as one
  `cortex_m.quantized_activation`;
- rescale (int16): a constant scale c folds into the output quantize scale
  (S*c for div, S/c for mul) when that gives the same integers for all 65536
  inputs; a resulting identity is then deleted.

- rescale (NPU targets, int8 too): the NPU has no table for the Cortex-M kernel, so a constant scale
  folds into the output quantize scale as for int16, and is proven a second time on every input
  integer against the TOSA RESCALE the NPU computes for the dequantize -> quantize pair left behind
  (it rounds half up where the quantize rounds half to even: at a scale ratio of exactly 0.5 a
  quarter of the int8 values differ by one step);
- gather (NPU targets): a gather the CPU runs on a table it dequantizes whole every inference
  (`nn.Embedding` on a U55) reads the int8 table instead, when the quantize after it gives back
  every integer the table can hold; selecting rows commutes with the per-tensor dequantize.

A constant subgraph (QL008) has no input to range over: its results, computed once with the graph's
own ops on its own constants, are stored as constants (int8 where it ends in a quantize) and the
subgraph is deleted; exact by construction, and verified end to end like every fold.

Planning reads a `Region` and its one exhaustive evaluation; `qlint.fix.apply`
applies the plans.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import torch
from torch.fx import Node

from qlint._compat import StrEnum
from qlint.analysis.islands import Island
from qlint.analysis.regions import Exhaustive, Region
from qlint.io.reads import first_line
from qlint.loading.view import GraphView, Kind, input_node, numel, op_name, output_dtype, run_node
from qlint.rules.qparams import QParams
from qlint.rules.table import Code

FLOAT32_TINY = 1.1754943508222875e-38  # smallest normal float32

# How an NPU target computes a dequantize -> quantize pair: (integers, scale ratio, input zero point,
# output zero point, output dtype) -> integers (`analysis.tosa.rescaled`, on the TOSA reference model).
Rescaler = Callable[[torch.Tensor, float, int, int, torch.dtype], torch.Tensor]


class FoldKind(StrEnum):
    IDENTITY = "identity"   # the region is deleted
    TABLE = "table"         # the region becomes one int8 lookup table
    RESCALE = "rescale"     # the region's constant goes into the output quantize scale
    CONSTANT = "constant"   # the subgraph's results are stored as constants
    GATHER = "gather"       # a gather reads its int8 table: the table's dequantize and the quantize after go


@dataclass
class Fold:
    kind: FoldKind
    code: Code                # the rule whose finding this fold resolves
    anchor: Node              # the node findings point at
    dq: Node | None           # the island's dequantized input (None for a constant subgraph)
    outputs: list[Node]       # the quantize nodes whose integers the fold reproduces; a subgraph's results
    removed: list[Node]       # island nodes (and the pair) that go away
    luts: dict[Node, torch.Tensor] = field(default_factory=dict)   # table: per output
    values: dict[Node, torch.Tensor] = field(default_factory=dict)  # constant: per result, what is stored
    reshapes: list[Node] = field(default_factory=list)              # shape ops to replay on the integers
    scale: float | None = None                                      # rescale: new output scale
    npu_proven: bool = False  # rescale: the NPU's RESCALE of the pair left behind gives the same integers

    @property
    def before_lowering(self) -> bool:
        """A fold the quantized program can say too, so an NPU target makes it before the partitioner
        runs, and the partitions the island split merge (`qlint.fix.npu`): an identity with no shape
        op to replay (the island's output quantize reads its producer's int8 instead), a gather, and a
        rescale proven on the NPU's RESCALE (the output quantize reads the island's dequantize)."""
        return (self.kind == FoldKind.IDENTITY and not self.reshapes and self.dq is not None) \
            or self.kind == FoldKind.GATHER or (self.kind == FoldKind.RESCALE and self.npu_proven)

    def moved(self, nodes: Mapping[str, Node]) -> Fold:
        """This fold on a copy of its graph (nodes matched by name): folding the copy leaves this graph as it was."""
        def at(node: Node) -> Node:
            return nodes[node.name]

        return replace(
            self,
            anchor=at(self.anchor),
            dq=at(self.dq) if self.dq is not None else None,
            outputs=[at(n) for n in self.outputs],
            removed=[at(n) for n in self.removed],
            luts={at(n): t for n, t in self.luts.items()},
            values={at(n): t for n, t in self.values.items()},
            reshapes=[at(n) for n in self.reshapes],
        )

    def describe(self) -> str:
        if self.kind == FoldKind.CONSTANT:
            stored = ", ".join(f"{str(v.dtype).removeprefix('torch.')} {list(v.shape)}" for v in self.values.values())
            return f"constant: replace {', '.join(op_name(n) for n in self.removed)} with stored {stored}"
        assert self.dq is not None
        ops = ", ".join(op_name(n) for n in [self.dq, *self.removed, *self.outputs])
        replay = "".join(f"{op_name(n)} on integers, " for n in self.reshapes)
        if self.kind == FoldKind.IDENTITY:
            return f"identity: replace {ops} with {replay.removesuffix(', ')}" if replay else f"identity: remove {ops}"
        if self.kind == FoldKind.GATHER:
            return (f"gather: {op_name(self.anchor)} reads the int8 table; remove {op_name(self.dq)} "
                    f"({numel(self.dq):,} elements a call), {', '.join(op_name(n) for n in self.outputs)}")
        if self.kind == FoldKind.TABLE:
            return f"table: replace {ops} with {replay}cortex_m.quantized_activation (256-entry int8 table)"
        on_npu = " (a TOSA RESCALE on the NPU, proven on every input integer)" if self.npu_proven else ""
        return (f"rescale: remove {', '.join(op_name(n) for n in self.removed)}; output quantize scale -> "
                f"{self.scale:.9g}{on_npu}")


@dataclass
class Left:
    code: Code
    anchor: Node
    reason: str


def _q_outputs(view: GraphView, nodes: list[Node]) -> list[Node] | None:
    if nodes and all(view.kind(n) == Kind.QUANTIZE and view.qparams(n) is not None for n in nodes):
        return nodes
    return None


def _shape_chain(dq: Node, island: Island, out: Node) -> list[Node] | None:
    """The island's shape ops in order, when the island is one chain from `dq` to `out`.

    An elementwise table commutes with them, so they can be replayed on the
    int8 values before the table; a branching island has no single order.
    """
    nodes = island.nodes
    path: list[Node] = []
    node = input_node(out)
    while node is not dq:
        if node not in nodes:
            return None
        path.append(node)
        runtime = [a for a in node.all_input_nodes if a in nodes or a is dq]
        if len(runtime) != 1:
            return None
        node = runtime[0]
    if len(path) != len(nodes):
        return None
    return [n for n in reversed(path) if n not in island.compute]


def _reshapes(dq: Node, island: Island, outputs: list[Node]) -> list[Node] | str:
    """The island's shape ops, to replay on the integers ([] when it has none), or why they cannot be.

    The ops decide, not the shapes: a square transpose keeps the shape.
    """
    if all(n in island.compute for n in island.nodes):
        return []
    chain = _shape_chain(dq, island, outputs[0]) if len(outputs) == 1 else None
    if chain is None:
        return "the island reshapes its input along more than one path"
    # A dtype conversion is part of the function (evaluated, so in the table), not data movement.
    return [n for n in chain if output_dtype(n) == output_dtype(input_node(n))]


def _int_fold(region: Region, dq: Node, qp_in: QParams, exhaustive: Exhaustive, outputs: list[Node]) -> Fold | str:
    """Identity or table for an elementwise region from `dq` to its quantize `outputs`."""
    reshapes = _reshapes(dq, region.island, outputs)
    if isinstance(reshapes, str):
        return reshapes
    removed = region.island.nodes
    if all(exhaustive.reproduces_input(o) for o in outputs):
        return Fold(FoldKind.IDENTITY, region.code, region.anchor, dq, outputs, removed, reshapes=reshapes)
    if qp_in.dtype == "int8" and all(exhaustive.outputs[o].dtype == torch.int8 for o in outputs):
        luts = {o: exhaustive.outputs[o].to(torch.int8) for o in outputs}
        return Fold(FoldKind.TABLE, region.code, region.anchor, dq, outputs, removed, luts=luts, reshapes=reshapes)
    return f"{qp_in.dtype} islands can only fold a constant scale into the output quantize"


# How many float32 neighbours of the folded scale each way `_rescale` tries: the product of two
# float32 scales is rounded once and the quantize rounds again, so an exact scale, when there is
# one, lies a few ulps away; 16 is a margin past that, at 33 candidates checked at most.
RESCALE_NEIGHBOURS = 16


def _scale_candidates(scale: float, steps: int = RESCALE_NEIGHBOURS) -> list[float]:
    """`scale`, then its float32 neighbours nearest first: rounding in the quantize
    can make a neighbour exact where the plain product is not."""
    import numpy as np

    candidates = [scale]
    up = down = np.float32(scale)
    for _ in range(steps):
        up, down = np.nextafter(up, np.float32(np.inf)), np.nextafter(down, np.float32(0))
        candidates.extend([float(up), float(down)])
    return candidates


def _rescale(region: Region, qp_in: QParams, exhaustive: Exhaustive, outputs: list[Node]) -> Fold | str:
    """int16: fold the island's constant factor into the output quantize scale, if exact."""
    scale_island = region.scale
    if scale_island is None:
        return f"{qp_in.dtype} islands fold only as a constant scale"
    if scale_island.offset:
        return "the island adds a constant; an output scale cannot absorb an offset"
    factor = scale_island.factor
    if not (math.isfinite(factor) and factor > 0):
        return f"the constant factor {factor:g} is not positive and finite; a scale cannot absorb it"
    if len(outputs) != 1:
        return "the island feeds more than one quantize"
    [out] = outputs
    dq, island = scale_island.dq, scale_island.island
    reshapes = _reshapes(dq, island, outputs)
    if isinstance(reshapes, str):
        return reshapes
    if exhaustive.reproduces_input(out):
        return Fold(FoldKind.IDENTITY, region.code, region.anchor, dq, outputs, island.nodes, reshapes=reshapes)
    if reshapes:
        return "the island reshapes its input; a rescaled quantize would see the other shape"
    qp_out = scale_island.qp_out  # what view.qparams gave classify()
    values, mask = exhaustive.values, exhaustive.mask
    reference = exhaustive.outputs[out][mask]
    dequantized = run_node(dq, values, *dq.args[1:])
    found, best = None, None
    for new_scale in _scale_candidates(qp_out.scale / factor):
        if not (math.isfinite(new_scale) and FLOAT32_TINY <= new_scale < sys.float_info.max):
            return f"the folded scale {new_scale:g} is not a normal positive float"
        attempt = run_node(out, dequantized, new_scale, *out.args[2:])
        differing = int((attempt[mask] != reference).sum())
        if differing == 0:
            found = new_scale
            break
        best = differing if best is None else min(best, differing)
    if found is None:
        return (
            f"folding into the output scale changes at least {best} of {int(mask.sum())} "
            f"{qp_in.dtype} values for every candidate scale"
        )
    return Fold(FoldKind.RESCALE, region.code, region.anchor, dq, outputs, island.nodes, scale=found)


def _constant(region: Region) -> Fold | str:
    """Store a constant subgraph's results as they are computed now: what the device would compute."""
    subgraph, view = region.constant, region.view
    assert subgraph is not None
    if subgraph.misread:
        return subgraph.misread
    if any(u.op == "output" for n in subgraph.results for u in n.users):
        return "it is a program output: a fold stores values that ops read, not the program's outputs"
    values = {n: view.computed(n) for n in subgraph.results}
    if not values or any(v is None for v in values.values()):
        return "a result has no computed value"
    return Fold(FoldKind.CONSTANT, region.code, region.anchor, None, subgraph.results, region.island.nodes,
                values={n: v.clone().contiguous() for n, v in values.items() if v is not None})


# The gathers whose first argument is the table they select from, by op name.
GATHERS = ("aten.index_select.default", "aten.embedding.default")


def plan_gather(view: GraphView, node: Node) -> Fold | Left | None:
    """How a gather on the CPU that reads a whole dequantized int8 table folds, or why it cannot (QL010);
    None when `node` is no gather of a dequantized constant.

    `nn.Embedding` quantized for a U55 (whose TOSA profile has no gather for it) runs on the CPU as
    dequantize(table) -> index_select -> quantize: every inference dequantizes every row to select a
    few. A per-tensor dequantize maps each integer alone, so selecting rows first and dequantizing
    them gives the same floats; when the quantize after the gather gives back every integer the
    table's dtype range holds (proven on each of them, with the graph's own ops), the gather reads the
    int8 table and both conversions go."""
    if op_name(node) not in GATHERS or not isinstance(node.args[0], Node):
        return None
    dq = node.args[0]
    if view.kind(dq) != Kind.DEQUANTIZE or len(dq.users) != 1 or view.constant(input_node(dq)) is None:
        return None
    qp_in, users = view.qparams(dq), list(node.users)
    if qp_in is None:
        return Left(Code.NPU_FALLBACK, node, "its table is not quantized per tensor")
    if len(users) != 1 or view.kind(users[0]) != Kind.QUANTIZE or view.qparams(users[0]) is None:
        return Left(Code.NPU_FALLBACK, node, "what it gathers is not quantized again by one per-tensor quantize")
    [q] = users
    dtype = getattr(torch, qp_in.dtype)
    values = torch.arange(qp_in.qmin, qp_in.qmax + 1).to(dtype)
    back = run_node(q, run_node(dq, values, *dq.args[1:]), *q.args[1:])
    if back.dtype != dtype or not torch.equal(back, values):
        differing = int((back.to(torch.int32) != values.to(torch.int32)).sum())
        return Left(Code.NPU_FALLBACK, node, (f"the quantize after it, {view.qparams(q)}, changes {differing} of "
                                              f"{values.numel()} table values ({qp_in})"))
    return Fold(FoldKind.GATHER, Code.NPU_FALLBACK, node, dq, [q], [dq, q])


def plan_region(region: Region, rescaler: Rescaler | None = None) -> Fold | Left:
    """How to fold one island or requantize pair, or why it is left; `rescaler`: the target is an NPU
    that computes a dequantize -> quantize pair so."""
    result = _plan(region, rescaler)
    return Left(region.code, region.anchor, result) if isinstance(result, str) else result


def _plan(region: Region, rescaler: Rescaler | None) -> Fold | str:
    if region.blocked:
        return f"blocked by {'; '.join(region.blocked)}"
    if region.constant is not None:
        return _constant(region)
    if region.dq is None:
        return region.reason or "more than one runtime input"
    if region.not_elementwise:
        return region.reason or region.not_elementwise
    outputs = _q_outputs(region.view, region.island.outputs)
    qp_in = region.qp_in
    if outputs is None or qp_in is None:
        return "an output does not go to a per-tensor quantize"
    exhaustive = region.exhaustive()
    assert exhaustive is not None  # one dequantized input, elementwise, quantize outputs
    if rescaler is not None and not exhaustive.identity:
        return _npu_fold(region, qp_in, exhaustive, outputs, rescaler)
    if qp_in.dtype == "int8":
        return _int_fold(region, region.dq, qp_in, exhaustive, outputs)
    return _rescale(region, qp_in, exhaustive, outputs)


# The dtypes whose dequantize -> quantize pair `_npu_fold` proves on the NPU's RESCALE: Arm lowers an
# unsigned one with flags the one-op graph of `analysis.tosa.rescaled` does not set.
SIGNED_RESCALES = ("int8", "int16")

# Why an island on an NPU target that is no identity has no fold, before what `_rescale` said.
NPU_RESCALE_ONLY = "on an NPU target an island folds only as an identity or into its output quantize's scale"


def _npu_fold(region: Region, qp_in: QParams, exhaustive: Exhaustive, outputs: list[Node],
              rescaler: Rescaler) -> Fold | str:
    """An island on an NPU target that is no identity: the NPU has no int8 table for it, so it folds
    only into the output quantize scale, and only when the NPU's RESCALE of the dequantize -> quantize
    pair the fold leaves gives the integers the island gives, on every input integer (`Rescaler`)."""
    fold = _rescale(region, qp_in, exhaustive, outputs)
    if isinstance(fold, str):
        return f"{NPU_RESCALE_ONLY}: {fold}"
    assert region.scale is not None and fold.scale is not None
    [out] = fold.outputs
    read, write = region.scale.qp_in, region.scale.qp_out  # the qparams `_rescale` proved the float scale on
    if {read.dtype, write.dtype} - set(SIGNED_RESCALES):
        return (f"the NPU's RESCALE of a {read.dtype} -> {write.dtype} pair is not proven here "
                "(signed int8 and int16 are)")
    reference = exhaustive.outputs[out]
    ratio = read.scale / fold.scale  # as Arm's InsertRescalePass computes the pair's RESCALE scale
    try:
        on_npu = rescaler(exhaustive.values, ratio, read.zero_point, write.zero_point, reference.dtype)
    except ImportError as exc:
        return f"the NPU's RESCALE cannot be run on the host: {first_line(exc)}"
    except Exception as exc:  # noqa: BLE001 - Arm's serialization refuses the scale (a shift out of range)
        return f"the NPU's RESCALE by {ratio:.9g} cannot be built: {first_line(exc)}"
    mask = exhaustive.mask
    differing = on_npu[mask].to(torch.int32) - reference[mask].to(torch.int32)
    steps = int(differing.abs().max())
    if steps:
        return (f"the NPU's RESCALE by {ratio:.9g} (fixed point, rounding half up, clamped to the dtype's range) "
                f"differs from the quantize on {int((differing != 0).sum())} of {int(mask.sum())} {qp_in.dtype} "
                f"inputs, by up to {steps} step{'s' if steps != 1 else ''}")
    return replace(fold, npu_proven=True)
