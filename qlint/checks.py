"""The rules: turn the islands, requantize pairs and coverage of a GraphView into findings."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, cast

from torch.fx import Node

from qlint.config import Config
from qlint.evaluate import identity_on_ints, requantize_identity, runtime_input
from qlint.findings import ArtifactStats, Finding, Location
from qlint.graph_view import Constant, GraphView, Kind, QParams, base_name, op_name
from qlint.islands import Island, coverage, find_islands, fp32_elements, requantize_pairs
from qlint.source import locate

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


class FindingFactory:
    """Fills in what every finding of one artifact shares."""

    def __init__(self, artifact: str, config: Config) -> None:
        self.artifact, self.config = artifact, config

    def location(self, *nodes: Node) -> Location | None:
        for node in nodes:
            found = locate(node.meta.get("stack_trace"), self.config.root)
            if found:
                return found
        return None

    def make(
        self, code: str, message: str, nodes: tuple[Node, ...] = (), fixable: bool = False, **details: Any
    ) -> Finding | None:
        severity = self.config.severity(code)
        if severity == "off":
            return None
        return Finding(
            code=code,
            severity=severity,
            message=message,
            artifact=self.artifact,
            node=nodes[0].name if nodes else "",
            location=self.location(*nodes),
            fixable=fixable,
            details=details,
        )


def _scale_text(scale: ScaleIsland) -> str:
    return " ".join(f"{'/' if s.op == 'div' else '*'} {s.constant}" for s in scale.steps)


def scale_finding(make: FindingFactory, scale: ScaleIsland, view: GraphView, fixable: bool) -> Finding | None:
    identity = identity_on_ints(view, scale.island)
    blocked = blocked_guards(scale, make.config)
    elements = fp32_elements(view, scale.island)
    ident_text = (
        f"already an exact identity on {scale.qp_in.dtype_name} values"
        if identity
        else f"not an identity on {scale.qp_in.dtype_name} values"
    )
    message = (
        f"constant scale in fp32: x {_scale_text(scale)} between dequantize {scale.qp_in} "
        f"and quantize {scale.qp_out}; {ident_text}"
    )
    if blocked:
        message += f"; fold blocked by {'; '.join(blocked)}"
    return make.make(
        "QL001",
        message,
        (scale.island.anchor, *scale.island.nodes),
        fixable,
        ops=scale.island.ops,
        constants=[
            {"name": s.constant.name, "kind": s.constant.kind, "value": s.value, "op": s.op} for s in scale.steps
        ],
        factor=scale.factor,
        input_qparams=_qp_dict(scale.qp_in),
        output_qparams=_qp_dict(scale.qp_out),
        identity=bool(identity),
        blocked_by=blocked,
        fp32_elements=elements,
    )


def island_finding(make: FindingFactory, island: Island, reason: str, view: GraphView, fixable: bool) -> Finding | None:
    elements = fp32_elements(view, island)
    ops = ", ".join(island.ops)
    return make.make(
        "QL002",
        f"fp32 island ({ops}), {elements} fp32 elements per inference: {reason}",
        (island.anchor, *island.nodes),
        fixable,
        ops=island.ops,
        fp32_elements=elements,
        reason=reason,
    )


def requantize_finding(make: FindingFactory, view: GraphView, dq: Node, q: Node, fixable: bool) -> Finding | None:
    qp_in, qp_out = view.qparams(dq), view.qparams(q)
    identity = requantize_identity(view, dq, q)
    kind = "an identity" if identity else "a rescale"
    return make.make(
        "QL004",
        f"dequantize -> quantize with nothing between ({kind} done in fp32): {qp_in} -> {qp_out}",
        (q, dq, *dq.all_input_nodes),
        fixable,
        identity=bool(identity),
        input_qparams=_qp_dict(qp_in),
        output_qparams=_qp_dict(qp_out),
    )


def _qp_dict(qp: QParams | None) -> dict[str, Any] | None:
    if qp is None:
        return None
    return {"scale": qp.scale, "zero_point": qp.zero_point, "qmin": qp.qmin, "qmax": qp.qmax, "dtype": qp.dtype_name}


def _percent_down(ratio: float) -> str:
    """Rounded down, so a ratio just under the threshold never prints as equal to it."""
    return f"{math.floor(ratio * 1000) / 10:.1f}%"


def check(view: GraphView, artifact: str, config: Config) -> tuple[list[Finding], ArtifactStats, Analysis]:
    """Run every rule on one program."""
    from qlint.folds import plan

    make = FindingFactory(artifact, config)
    analysis = analyse(view, config)
    # A finding is fixable exactly when `--fix` has a proven fold for it; the
    # plan is kept on the analysis so --fix applies it without proving it again.
    analysis.folds, analysis.left = plan(analysis, config)
    foldable = {fold.anchor for fold in analysis.folds}
    findings: list[Finding | None] = []
    for index, island in enumerate(analysis.islands):
        fixable = island.anchor in foldable
        if index in analysis.scale_islands:
            findings.append(scale_finding(make, analysis.scale_islands[index], view, fixable))
        else:
            findings.append(island_finding(make, island, analysis.reasons[index], view, fixable))
    for dq, q in requantize_pairs(view):
        findings.append(requantize_finding(make, view, dq, q, q in foldable))
    cov = coverage(view)
    if cov.ratio < config.coverage_threshold:
        listed = ", ".join(f"{name} x{count}" for name, count in cov.fp32_ops.most_common())
        findings.append(
            make.make(
                "QL005",
                f"int8 coverage {_percent_down(cov.ratio)} < {config.coverage_threshold * 100:g}%: "
                f"{sum(cov.fp32_ops.values())} of {cov.total} compute ops run in fp32 ({listed})",
                coverage=cov.ratio,
                fp32_ops=dict(cov.fp32_ops),
                int_ops=cov.int_ops,
            )
        )
    stats = ArtifactStats(
        artifact=artifact,
        nodes=sum(1 for n in view.nodes if n.op == "call_function"),
        int_kernels=cov.int_ops,
        fp32_islands=len(analysis.islands),
        fp32_elements=sum(fp32_elements(view, i) for i in analysis.islands),
        coverage=cov.ratio,
        lowered=view.lowered,
    )
    return [f for f in findings if f is not None], stats, analysis
