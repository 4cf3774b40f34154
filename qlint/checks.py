"""The rules: turn the analysis, fold plans, requantize pairs and coverage of a GraphView into findings."""

from __future__ import annotations

import math
from typing import Any

from torch.fx import Node

from qlint.analysis import Analysis, ScaleIsland, analyse, blocked_guards
from qlint.config import Config
from qlint.evaluate import identity_on_ints, requantize_identity
from qlint.findings import ArtifactStats, Finding, Location
from qlint.folds import plan
from qlint.graph_view import GraphView, QParams
from qlint.islands import Island, coverage, fp32_elements, requantize_pairs
from qlint.source import locate


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
