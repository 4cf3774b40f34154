"""Decide how an island or requantize pair can be folded, and prove the fold exact.

Three folds, each proven on every value of the input dtype before it is offered:

- identity: quantize(f(dequantize(q))) == q, so the island is deleted;
- table (int8): the island is an int8 -> int8 function of one input, so its
  256-entry table, computed with the graph's own ops, replaces it as one
  `cortex_m.quantized_activation`;
- rescale (int16): a constant scale c folds into the output quantize scale
  (S*c for div, S/c for mul) when that gives the same integers for all 65536
  inputs; a resulting identity is then deleted.

Planning only reads the graph; `qlint.fix` applies the plans.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch.fx import Node

from qlint.config import Config
from qlint.evaluate import evaluate, input_domain, not_per_integer, runtime_input
from qlint.graph_view import GraphView, Kind, input_node, op_name, output_dtype, run_node
from qlint.islands import Island

if TYPE_CHECKING:
    from qlint.analysis import Analysis, ScaleIsland

FLOAT32_TINY = 1.1754943508222875e-38  # smallest normal float32


@dataclass
class Fold:
    kind: str                 # identity | table | rescale
    code: str                 # the rule whose finding this fold resolves
    anchor: Node              # the node findings point at
    dq: Node                  # the island's dequantized input
    outputs: list[Node]       # the quantize nodes whose integers the fold reproduces
    removed: list[Node]       # island nodes (and the pair) that go away
    luts: dict[Node, torch.Tensor] = field(default_factory=dict)   # table: per output
    reshapes: list[Node] = field(default_factory=list)              # shape ops to replay on the integers
    scale: float | None = None                                      # rescale: new output scale

    def describe(self) -> str:
        ops = ", ".join(op_name(n) for n in [self.dq, *self.removed, *self.outputs])
        replay = "".join(f"{op_name(n)} on integers, " for n in self.reshapes)
        if self.kind == "identity":
            return f"identity: replace {ops} with {replay.removesuffix(', ')}" if replay else f"identity: remove {ops}"
        if self.kind == "table":
            return f"table: replace {ops} with {replay}cortex_m.quantized_activation (256-entry int8 table)"
        return (
            f"rescale: remove {', '.join(op_name(n) for n in self.removed)}; output quantize scale -> {self.scale:.9g}"
        )


@dataclass
class Left:
    code: str
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


def plan_int_fold(
    view: GraphView, code: str, anchor: Node, dq: Node, island: Island, outputs: list[Node]
) -> Fold | str:
    """Identity or table for an elementwise region from `dq` to its quantize `outputs`."""
    qp_in = view.qparams(dq)
    qps = [qp for qp in (view.qparams(o) for o in outputs) if qp is not None]
    if qp_in is None or len(qps) != len(outputs):
        return "qparams are not per-tensor literals"
    reshapes = _reshapes(dq, island, outputs)
    if isinstance(reshapes, str):
        return reshapes
    values, mask = input_domain(qp_in)
    reference = evaluate(view, island, dq, values)
    nodes = island.nodes
    if all(
        torch.equal(reference[o][mask], values[mask]) and qp.dtype == qp_in.dtype
        for o, qp in zip(outputs, qps, strict=True)
    ):
        return Fold("identity", code, anchor, dq, outputs, nodes, reshapes=reshapes)
    if qp_in.dtype == torch.int8 and all(qp.dtype == torch.int8 for qp in qps):
        luts = {o: reference[o].to(torch.int8) for o in outputs}
        return Fold("table", code, anchor, dq, outputs, nodes, luts=luts, reshapes=reshapes)
    return f"{qp_in.dtype_name} islands can only fold a constant scale into the output quantize"


def _scale_candidates(scale: float, steps: int = 16) -> list[float]:
    """`scale`, then its float32 neighbours nearest first: rounding in the quantize
    can make a neighbour exact where the plain product is not."""
    import numpy as np

    candidates = [scale]
    up = down = np.float32(scale)
    for _ in range(steps):
        up, down = np.nextafter(up, np.float32(np.inf)), np.nextafter(down, np.float32(0))
        candidates.extend([float(up), float(down)])
    return candidates


def plan_rescale(view: GraphView, scale_island: ScaleIsland, outputs: list[Node]) -> Fold | str:
    """int16: fold the island's constant factor into the output quantize scale, if exact."""
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
    qp_in, qp_out = scale_island.qp_in, scale_island.qp_out  # what view.qparams gave classify()
    values, mask = input_domain(qp_in)
    reference = evaluate(view, island, dq, values)[out][mask]
    if torch.equal(reference, values[mask]) and qp_out.dtype == qp_in.dtype:
        return Fold("identity", "QL001", island.anchor, dq, outputs, island.nodes, reshapes=reshapes)
    if reshapes:
        return "the island reshapes its input; a rescaled quantize would see the other shape"
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
            f"{qp_in.dtype_name} values for every candidate scale"
        )
    return Fold("rescale", "QL001", island.anchor, dq, outputs, island.nodes, scale=found)


def plan_island(
    view: GraphView, island: Island, scale_island: ScaleIsland | None, reason: str | None, config: Config,
    blocked: list[str],
) -> Fold | str:
    """How to fold one island, or why it is left."""
    code = "QL001" if scale_island is not None else "QL002"
    if blocked:
        return f"blocked by {'; '.join(blocked)}"
    dq = runtime_input(view, island)
    if dq is None:
        return reason or "more than one runtime input"
    why = not_per_integer(view, island)
    if why:
        return reason or why
    outputs = _q_outputs(view, island.outputs)
    if outputs is None:
        return "an output does not go to a per-tensor quantize"
    qp_in = view.qparams(dq)
    if qp_in is None or qp_in.dtype_name not in config.fold.dtypes:
        return f"fold.dtypes: {qp_in.dtype_name if qp_in else 'unknown'} not in [{', '.join(config.fold.dtypes)}]"
    if code == "QL002":
        kinds = {c.kind for n in island.compute for a in n.args if (c := view.constant(a)) is not None}
        disallowed = sorted(kinds - set(config.fold.constant_kinds))
        if disallowed:
            return f"fold.constant_kinds: {', '.join(disallowed)} not in [{', '.join(config.fold.constant_kinds)}]"
    if qp_in.dtype == torch.int8:
        return plan_int_fold(view, code, island.anchor, dq, island, outputs)
    if scale_island is None:
        return f"{qp_in.dtype_name} islands fold only as a constant scale"
    return plan_rescale(view, scale_island, outputs)


def plan_pair(view: GraphView, dq: Node, q: Node, config: Config) -> Fold | str:
    qp_in = view.qparams(dq)
    if qp_in is None or view.qparams(q) is None:
        return "qparams are not per-tensor literals"
    if qp_in.dtype_name not in config.fold.dtypes:
        return f"fold.dtypes: {qp_in.dtype_name} not in [{', '.join(config.fold.dtypes)}]"
    return plan_int_fold(view, "QL004", q, dq, Island([], [], [dq], [q]), [q])


def plan(analysis: Analysis, config: Config) -> tuple[list[Fold], list[Left]]:
    """A fold for every island and requantize pair that has one; the reason for the rest."""
    from qlint.analysis import blocked_guards
    from qlint.islands import requantize_pairs

    view = analysis.view
    folds: list[Fold] = []
    left: list[Left] = []
    for index, island in enumerate(analysis.islands):
        scale = analysis.scale_islands.get(index)
        blocked = blocked_guards(scale, config) if scale is not None else []
        result = plan_island(view, island, scale, analysis.reasons.get(index), config, blocked)
        code = "QL001" if scale is not None else "QL002"
        if isinstance(result, Fold):
            folds.append(result)
        else:
            left.append(Left(code, island.anchor, result))
    for dq, q in requantize_pairs(view):
        result = plan_pair(view, dq, q, config)
        if isinstance(result, Fold):
            folds.append(result)
        else:
            left.append(Left("QL004", q, result))
    return folds, left
