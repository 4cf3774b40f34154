"""The static tier's rules (`qlint check --static`): QL001 and QL004 on a `.pt2`'s program, no torch.

A constant scale island is visible before lowering: a dequantize, `div`/`mul` (and `add`/`sub`) by
a constant the quantizer left unquantized, then quantize nodes of one qparams; a requantize pair is
a dequantize feeding a quantize. The identity verdict is computed in emulated float32
(`qlint.static.float32`). An island whose constant the tier cannot compute (an op it does not
evaluate, such as `aten.index` of a trained bias) is still reported, its verdict undecided
(`identity: None`), never guessed: as QL001 when the constant has one element; with several, only
whether they are equal decides between QL001 and QL002, so as the fp32 island it is (QL002). An
island whose constant is zero (a scale), NaN or an infinity is QL002 by that value alone, said as
the full check says it (`rules.steps.BY_VALUE`). Everything else that needs lowering (QL002's other
reasons, which carry CortexMQuantizer's verdict; QL003, QL005, QL007, folds) is left to the full check.
What a finding says comes from `qlint.rules.builders`, as the full check's does;
`tests/full/test_static.py` holds the two tiers to the same findings on every `.pt2` of the test suite.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeAlias

from qlint.io.archive import parse_pt2
from qlint.io.limits import MAX_EVALUATED_INTEGERS
from qlint.io.reads import ReadError
from qlint.io.wellformed import MODEL, QUANT_RANGES
from qlint.records.results import ArtifactStats, Finding, Location, Report
from qlint.records.source import locate
from qlint.rules import builders
from qlint.rules.builders import RUN_FULL, Term
from qlint.rules.catalog import enabled_rules
from qlint.rules.ops import OFFSET_OPS, SCALE_OPS
from qlint.rules.qparams import QParams
from qlint.rules.steps import BY_VALUE, NotAStep, Operand, scale_step
from qlint.rules.table import Code, Scope
from qlint.settings.config import Config
from qlint.settings.guards import blocked_guards
from qlint.static.float32 import is_identity
from qlint.static.program import (
    CASTS,
    CHAIN_SHAPE_OPS,
    DQ,
    Q,
    Ref,
    StaticConstant,
    StaticGraph,
    StaticNode,
    Uniform,
    Unknown,
    qparams,
)

ChainStep = tuple[StaticNode, str, StaticConstant, float | None]   # node, op, constant, its value (None: unknown)


@dataclass
class ScaleChain:
    dq: StaticNode
    nodes: list[StaticNode]                   # the island: affine ops and the shape ops between
    steps: list[ChainStep]                    # its steps, up to the first one `reason` refuses
    outputs: list[StaticNode]                 # the quantize nodes it ends in
    reason: str = ""                          # why a constant's value makes it QL002 (`steps.BY_VALUE`)

    @property
    def unknown(self) -> list[StaticConstant]:
        """The constants the tier cannot compute: while there are any, the identity is undecided."""
        return [c for _, _, c, value in self.steps if value is None]

    @property
    def code(self) -> Code:
        """QL001; QL002 when a constant's value refuses a step (zero, not finite), or when an unknown
        constant has several elements: whether they are equal decides between the two
        (`regions._step`), and the tier claims no constant scale it cannot show."""
        if self.reason or any(c.numel != 1 for c in self.unknown):
            return Code.FP32_ISLAND
        return Code.CONSTANT_SCALE_ISLAND


def _chain(graph: StaticGraph, start: StaticNode, max_elements: int) -> ScaleChain | None:
    """The constant scale island through `start`, an affine op with one constant operand; None
    where the full check calls the island QL002 whatever the value of a constant the tier cannot
    compute (`analysis.regions.classify`)."""
    dq_side = _runtime_operand(graph, start)
    if dq_side is None or _quantized_constant(graph, start, dq_side):
        return None
    before: list[StaticNode] = []
    source = graph.nodes.get(dq_side.name)
    while source is not None and source.op != DQ:
        if source.base not in CHAIN_SHAPE_OPS or len(source.users) != 1:
            return None
        before.append(source)
        source = graph.nodes.get(source.refs[0]) if source.refs else None
    end = _island_end(graph, start)
    if source is None or end is None:
        return None
    nodes = [*reversed(before), start]
    current = start
    while current is not end:
        current = current.users[0]
        nodes.append(current)
    steps: list[ChainStep] = []
    for node in nodes:
        if node.base in CHAIN_SHAPE_OPS:
            continue
        step = _step(graph, node, max_elements)
        if step is None:
            return None
        if isinstance(step, str):  # the full check stops at the first op that is no step, as here
            return ScaleChain(source, nodes, steps, list(current.users), step)
        steps.append(step)
    return ScaleChain(source, nodes, steps, list(current.users))


def _island_end(graph: StaticGraph, start: StaticNode) -> StaticNode | None:
    """The last op of the island through `start`, the one whose users are all quantize nodes;
    None when the path forks or reaches another op first. Each node's answer is kept, so a long
    chain is walked once whatever the number of ops on it that start an island."""
    path: list[StaticNode] = []
    current, end = start, None
    while True:
        if current in graph.island_ends:
            end = graph.island_ends[current]
            break
        path.append(current)
        if all(user.op == Q for user in current.users):
            end = current if current.users else None
            break
        following = current.users[0] if len(current.users) == 1 else None
        if following is None or following.base not in CHAIN_SHAPE_OPS and (
                following.base not in SCALE_OPS | OFFSET_OPS or _runtime_operand(graph, following) is None):
            break
        current = following
    for node in path:
        graph.island_ends[node] = end
    return end


class _Operands:
    """The exported graph as `rules.steps.scale_step` asks it."""

    def __init__(self, graph: StaticGraph) -> None:
        self.graph = graph

    def is_runtime(self, arg: Any) -> bool:
        return self.graph.is_runtime(arg)

    def operand(self, arg: Any) -> Operand | None:
        constant = self.graph.constant(arg)
        if constant is None:
            return None
        if isinstance(constant.value, Unknown):
            return Operand(constant.numel, None, computed=False)
        value = constant.value.value if isinstance(constant.value, Uniform) else None
        if value is not None and math.isnan(value) and constant.numel > 1:
            value = None  # NaN != NaN: several NaNs differ by position, as the full check reads them
        return Operand(constant.numel, value)


def _step(graph: StaticGraph, node: StaticNode, max_elements: int) -> ChainStep | str | None:
    """One `x op c` of a scale island, decided by `rules.steps` as the full check decides it. Where
    the op is not one and the island is QL002: the full check's reason when the constant's value
    alone decides it (zero, not finite: `steps.BY_VALUE`), else None (the full check says why, with
    CortexMQuantizer's verdict)."""
    lhs, rhs = node.args[0], node.args[1]
    found = scale_step(_Operands(graph), node.base, lhs, rhs, node.kwargs.get("alpha", 1), max_elements)
    if isinstance(found, NotAStep):
        if found not in BY_VALUE:
            return None
        refused = graph.constant(rhs if graph.is_runtime(lhs) else lhs)
        assert refused is not None  # a value refused it
        return builders.unfit_constant(node.base, refused.name)
    constant = graph.constant(found.constant)
    assert constant is not None
    return node, node.base, constant, found.value


def _runtime_operand(graph: StaticGraph, node: StaticNode) -> Ref | None:
    """The one runtime operand of a binary op whose other operand is constant."""
    operands = node.args[:2]
    runtime: list[Ref] = [a for a in operands if isinstance(a, Ref) and graph.is_runtime(a)]
    if len(operands) != 2 or len(runtime) != 1:
        return None
    return runtime[0]


def _quantized_constant(graph: StaticGraph, node: StaticNode, runtime: Ref) -> bool:
    """The quantizer annotated the op: its constant operand is dequantized like its activation,
    so lowering makes it an integer kernel."""
    other = node.args[1] if node.args[0] is runtime else node.args[0]
    return isinstance(other, Ref) and other.name in graph.nodes and graph.nodes[other.name].op == DQ


def scale_chains(graph: StaticGraph, max_elements: int = 1) -> list[ScaleChain]:
    seen: set[str] = set()
    chains = []
    for node in graph.order:
        if node.name in seen or node.base not in SCALE_OPS | OFFSET_OPS or node.op.startswith("quantized"):
            continue
        chain = _chain(graph, node, max_elements)
        if chain is None:  # an island of offsets alone is one too: the full check calls it QL001
            continue
        seen.update(n.name for n in chain.nodes)
        chains.append(chain)
    return chains




class FindingFactory:
    def __init__(self, artifact: str, config: Config) -> None:
        self.artifact, self.config = artifact, config
        self.decided: set[tuple[QParams, tuple[tuple[str, float], ...], QParams]] = set()
        self.evaluated = 0  # input integers the distinct verdicts so far cost

    def identity(self, qp_in: QParams, steps: tuple[tuple[str, float], ...], qp_out: QParams) -> bool:
        """`float32.is_identity`, within the program's evaluation budget (a ReadError past it)."""
        if (qp_in, steps, qp_out) not in self.decided:
            self.decided.add((qp_in, steps, qp_out))
            low, high = QUANT_RANGES[qp_in.dtype]
            self.evaluated += high - low + 1
            if self.evaluated > MAX_EVALUATED_INTEGERS:
                raise ReadError(f"more distinct islands than the static tier evaluates ({MAX_EVALUATED_INTEGERS} "
                                "input integers in all); use the full check")
        return is_identity(qp_in, steps, qp_out)

    def location(self, *nodes: StaticNode) -> Location | None:
        for node in nodes:
            found = locate(node.stack_trace, self.config.root)
            if found:
                return found
        return None

    def finding(self, code: Code, message: str, nodes: tuple[StaticNode, ...], **details: Any) -> Finding:
        return Finding(code=code, severity=self.config.severity(code), message=message, artifact=self.artifact,
                       node=nodes[0].name, location=self.location(*nodes), fixable=False, details=details)


def scale_finding(factory: FindingFactory, graph: StaticGraph, chain: ScaleChain, config: Config) -> Finding | None:
    """The island's QL001 finding, or its QL002 one when a constant the tier cannot compute decides
    between the two; None when its outputs are not one per-tensor quantize or its rule is off."""
    if not config.enabled(chain.code):
        return None
    nodes = _fp32_nodes(graph, chain)
    anchor = next(n for n in chain.nodes if n.base not in CHAIN_SHAPE_OPS)
    ops = [n.op for n in chain.nodes if n.base not in CHAIN_SHAPE_OPS]
    shared = {"ops": ops, "fp32_elements": sum(nodes.values()), "graph_nodes": nodes}
    if chain.reason:  # QL002 whatever its outputs, as the full check decides it
        return _unfit_finding(factory, chain, anchor, shared)
    qp_in = qparams(chain.dq)
    outs = {qparams(o) for o in chain.outputs}
    if qp_in is None or len(outs) != 1 or None in outs:
        return None
    qp_out: QParams = outs.pop()  # type: ignore[assignment]
    if chain.unknown:
        shared["undecided"] = _undecided(chain)
    if chain.code == Code.FP32_ISLAND:
        reason = (f"undecided: {_undecided(chain)}; QL001 if it holds one value (its identity verdict undecided), "
                  f"QL002 if it differs by position: {RUN_FULL}")
        message = builders.fp32_island(ops, sum(nodes.values()), reason)
        return factory.finding(Code.FP32_ISLAND, message, (anchor, *chain.nodes), reason=reason, identity=None,
                               **shared)
    steps = tuple((op, value) for _, op, _, value in chain.steps if value is not None)
    identity = None if chain.unknown else factory.identity(qp_in, steps, qp_out)
    blocked = blocked_guards(config.fold, qp_in, [c.kind for _, _, c, _ in chain.steps], qp_out)
    message, details = builders.constant_scale(
        ops, _terms(chain), qp_in, qp_out, identity, blocked, sum(nodes.values()), nodes,
        _undecided(chain) if chain.unknown else None)
    return factory.finding(Code.CONSTANT_SCALE_ISLAND, message, (anchor, *chain.nodes), **details)


def _unfit_finding(factory: FindingFactory, chain: ScaleChain, anchor: StaticNode, shared: dict[str, Any]) -> Finding:
    """QL002 of an island a constant's value keeps in fp32 (zero, NaN, an infinity), said as the full
    check says it; with a constant before it the tier cannot compute (which the full check may name
    first), the finding says which, its reason undecided."""
    reason, extra = chain.reason, {}
    if chain.unknown:
        reason = f"{reason}; undecided: {_undecided(chain)} before it: {RUN_FULL}"
        extra = {"identity": None, "undecided": _undecided(chain)}
    message = builders.fp32_island(shared["ops"], shared["fp32_elements"], reason)
    return factory.finding(Code.FP32_ISLAND, message, (anchor, *chain.nodes), reason=reason, **shared, **extra)


def _terms(chain: ScaleChain) -> list[Term]:
    return [Term(op, c.name, c.kind, c.numel, value) for _, op, c, value in chain.steps]


def _fp32_nodes(graph: StaticGraph, chain: ScaleChain) -> dict[str, int]:
    """As the full check counts them: every dequantized input (a dequantized constant too), the
    island's own outputs, and the quantize nodes it ends in with none."""
    dequantized = [graph.nodes[r] for n in chain.nodes for r in n.refs
                   if r in graph.nodes and graph.nodes[r].op == DQ]
    return {**{d.name: d.numel for d in dequantized}, **{n.name: n.numel for n in chain.nodes},
            **{o.name: 0 for o in chain.outputs}}


def _undecided(chain: ScaleChain) -> str:
    """The constants the tier cannot compute, and what computes them: what the full check evaluates."""
    return "; ".join(f"{Term('', c.name, c.kind, c.numel, None)} {c.value.why}" for c in chain.unknown
                     if isinstance(c.value, Unknown))


def _past_casts(node: StaticNode) -> StaticNode:
    """`node`, or the op after a chain of float32 -> float32 casts from it: `to_edge` drops those."""
    while node.base in CASTS - {"clone"} and node.dtype == "float32" and len(node.users) == 1:
        node = node.users[0]
    return node


def scale_findings(factory: FindingFactory, graph: StaticGraph, config: Config) -> Iterator[Finding]:
    """QL001 of each constant scale island, and QL002 of each one whose undecided constant has several
    elements (`ScaleChain.code`), as far as the config selects them."""
    for chain in scale_chains(graph, config.fold.max_elements):
        found = scale_finding(factory, graph, chain, config)
        if found is not None:
            yield found


def requantize_findings(factory: FindingFactory, graph: StaticGraph, config: Config) -> Iterator[Finding]:
    for dq in graph.order:
        if dq.op != DQ or not dq.refs or not graph.is_runtime(Ref(dq.refs[0])):
            continue
        for q in [_past_casts(user) for user in dq.users]:
            qp_in, qp_out = qparams(dq), qparams(q)
            if q.op != Q or qp_in is None or qp_out is None:
                continue
            producer = [graph.nodes[r] for r in dq.refs if r in graph.nodes]
            message, details = builders.requantize(qp_in, qp_out, factory.identity(qp_in, (), qp_out),
                                                   {dq.name: dq.numel, q.name: 0})
            yield factory.finding(Code.REQUANTIZE_PAIR, message, (q, dq, *producer), **details)


def lint_static(data: bytes, artifact: str, config: Config) -> Report:
    """QL001 and QL004 of a `.pt2`, and the QL002 islands it cannot decide, read from its graph JSON
    (the hardened archive reader)."""

    archive = parse_pt2(data, config.limits)
    # The archive reader checked the program's shape, not every field's type: a crafted field
    # that breaks the reading is a corrupt file, reported in one line.
    try:
        graph = StaticGraph(archive)
        factory = FindingFactory(artifact, config)
        findings: list[Finding] = []
        for rule in enabled_rules(Scope.REGION, config, tier="static"):
            findings.extend(STATIC_RULES[rule.code](factory, graph, config))
    except (TypeError, KeyError, AttributeError, ValueError, IndexError, OverflowError) as exc:
        raise ReadError(f"corrupt {MODEL}: {type(exc).__name__} while reading its graph") from None
    islands_found = [f for f in findings if f.code != Code.REQUANTIZE_PAIR]
    stats = ArtifactStats(artifact=artifact, nodes=len(graph.order), fp32_islands=len(islands_found),
                          fp32_elements=sum(int(f.details["fp32_elements"]) for f in islands_found),
                          coverage=1.0, lowered=False, static=True)
    return Report(findings=findings, stats=[stats])


# This tier's registry: the region rules it decides, each over the whole program.
StaticRule: TypeAlias = Callable[[FindingFactory, StaticGraph, Config], Iterator[Finding]]
STATIC_RULES: dict[Code, StaticRule] = {
    Code.CONSTANT_SCALE_ISLAND: scale_findings, Code.REQUANTIZE_PAIR: requantize_findings,
}
