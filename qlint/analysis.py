"""What each fp32 island is: a constant scale, or the reason it is not; and which guards block a fold.

Both the rules (`checks`) and the fold planner (`folds`) start from this
analysis, so neither imports the other's layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from torch.fx import Node

from qlint.config import Config
from qlint.evaluate import runtime_input
from qlint.graph_view import Constant, GraphView, Kind, QParams, base_name, op_name
from qlint.islands import Island, find_islands

SCALE_OPS = {"div", "mul"}
NORMALIZATION_OPS = {
    "native_layer_norm", "layer_norm", "group_norm", "native_group_norm", "batch_norm",
    "native_batch_norm", "_native_batch_norm_legit_no_training", "rms_norm", "var", "var_mean",
    "std", "rsqrt", "norm", "linalg_vector_norm",
}


@dataclass
class ScaleStep:
    node: Node
    op: str            # "div" | "mul"
    constant: Constant
    value: float


@dataclass
class ScaleIsland:
    """A QL001 island: one dequantized input scaled by constants into quantize nodes."""

    island: Island
    dq: Node
    steps: list[ScaleStep]
    qp_in: QParams
    qp_out: QParams

    @property
    def factor(self) -> float:
        """What the island multiplies its input by."""
        factor = 1.0
        for step in self.steps:
            factor = factor / step.value if step.op == "div" else factor * step.value
        return factor


@dataclass
class Analysis:
    """Everything the rules found in one program; fixes start from here."""

    view: GraphView
    islands: list[Island] = field(default_factory=list)
    scale_islands: dict[int, ScaleIsland] = field(default_factory=dict)   # by island index
    reasons: dict[int, str] = field(default_factory=dict)                 # why not QL001
    folds: list[Any] = field(default_factory=list)    # qlint.folds.Fold: what --fix would apply
    left: list[Any] = field(default_factory=list)     # qlint.folds.Left: what it would leave, and why


def _is_runtime(view: GraphView, arg: Any, inside: set[Node]) -> bool:
    """An operand computed at run time: inside the island or a non-constant input."""
    return isinstance(arg, Node) and (arg in inside or view.kind(arg) != Kind.CONSTANT)


def classify(view: GraphView, island: Island, max_elements: int) -> ScaleIsland | str:
    """A ScaleIsland, or the reason the island is not a constant scale."""
    bases = [base_name(op_name(n)) for n in island.compute]
    norm = sorted({op_name(n) for n, b in zip(island.compute, bases, strict=True) if b in NORMALIZATION_OPS})
    if norm:
        return f"data-dependent normalization ({', '.join(norm)})"
    other = sorted({op_name(n) for n, b in zip(island.compute, bases, strict=True) if b not in SCALE_OPS})
    dq = runtime_input(view, island)
    inside = set(island.nodes)
    steps = []
    for node, base in zip(island.compute, bases, strict=True):
        if base not in SCALE_OPS:
            continue
        lhs, rhs = node.args[0], node.args[1]
        lhs_runtime, rhs_runtime = _is_runtime(view, lhs, inside), _is_runtime(view, rhs, inside)
        if lhs_runtime and rhs_runtime:
            return f"runtime (non-constant) operand {cast(Node, rhs).name} of {op_name(node)}"
        if base == "div" and rhs_runtime:
            return f"constant-first operand ({op_name(node)} of a constant by the activation)"
        operand = rhs if lhs_runtime else lhs
        constant = view.constant(operand)
        if constant is None:
            name = operand.name if isinstance(operand, Node) else repr(operand)
            return f"runtime (non-constant) operand {name} of {op_name(node)}"
        value = constant.scalar()
        if constant.numel > 1 and (value is None or constant.numel > max_elements):
            return f"per-channel constant {constant.name} ({constant.numel} elements)"
        if value is None or value == 0.0:
            return f"constant {constant.name} is zero or not finite"
        steps.append(ScaleStep(node, base, constant, value))
    if other:
        return f"ops the Cortex-M backend does not lower: {', '.join(other)}"
    if dq is None:
        return "more than one runtime input, or an input that is not dequantized"
    outs = [o for o in island.outputs if view.kind(o) == Kind.QUANTIZE]
    qp_in = view.qparams(dq)
    qps_out = {view.qparams(o) for o in outs}
    if len(outs) != len(island.outputs) or qp_in is None or len(qps_out) != 1 or None in qps_out:
        return "outputs are not one per-tensor quantize"
    return ScaleIsland(island, dq, steps, qp_in, cast(QParams, qps_out.pop()))


def blocked_guards(scale: ScaleIsland, config: Config) -> list[str]:
    """The fold guards from the config that forbid folding this island."""
    guards = config.fold
    blocked = []
    if scale.qp_in.dtype_name not in guards.dtypes:
        blocked.append(f"fold.dtypes: {scale.qp_in.dtype_name} not in [{', '.join(guards.dtypes)}]")
    kinds = sorted({s.constant.kind for s in scale.steps} - set(guards.constant_kinds))
    if kinds:
        blocked.append(f"fold.constant_kinds: {', '.join(kinds)} not in [{', '.join(guards.constant_kinds)}]")
    a, b = scale.qp_in, scale.qp_out
    if guards.require_equal_qrange and (a.dtype, a.qmin, a.qmax) != (b.dtype, b.qmin, b.qmax):
        blocked.append(
            f"fold.require_equal_qrange: {a.dtype_name}[{a.qmin}, {a.qmax}] in, {b.dtype_name}[{b.qmin}, {b.qmax}] out"
        )
    return blocked


def analyse(view: GraphView, config: Config) -> Analysis:
    analysis = Analysis(view, find_islands(view))
    for index, island in enumerate(analysis.islands):
        result = classify(view, island, config.fold.max_elements)
        if isinstance(result, ScaleIsland):
            analysis.scale_islands[index] = result
        else:
            analysis.reasons[index] = result
    return analysis
