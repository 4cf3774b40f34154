"""One record per fp32 island, constant subgraph and requantize pair: what it is, why, what blocks a fold.

The rules (`full.rules`) and the fold planner (`analysis.folds`) both read these records: the
rules ask the planner whether a region has a fold (`plan_region`), and the planner never reads a
finding. The exhaustive evaluation of a region (every
integer of its input dtype through the graph's own ops) is the expensive part:
a record computes it at most once, on first use, and a run shares it between the
finding, the fold plan and the check of the fixed program.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import torch
from torch.fx import Node

from qlint.analysis.causes import cause_of, causes, normalization
from qlint.analysis.evaluate import evaluate, input_domain, not_per_integer, runtime_input
from qlint.analysis.islands import Island, find_constant_subgraphs, find_islands, requantize_pairs, results
from qlint.analysis.validity import float_reads_of
from qlint.io.limits import MAX_WALK_NODES
from qlint.loading.view import Constant, GraphView, Kind, base_name, op_name
from qlint.records.source import locate
from qlint.rules.builders import factor, unfit_constant
from qlint.rules.ops import OFFSET_OPS, SCALE_OPS
from qlint.rules.qparams import QParams
from qlint.rules.steps import NotAStep, Operand, Step, scale_step
from qlint.rules.table import Code
from qlint.settings.config import Config, ConstantKind
from qlint.settings.guards import blocked_guards

NORMALIZATION_OPS = {
    "native_layer_norm", "layer_norm", "group_norm", "native_group_norm", "batch_norm",
    "native_batch_norm", "_native_batch_norm_legit_no_training", "rms_norm", "var", "var_mean",
    "std", "rsqrt", "norm", "linalg_vector_norm",
}
# The rules whose findings come from regions; the others need no island analysis.
ISLAND_CODES = (Code.CONSTANT_SCALE_ISLAND, Code.FP32_ISLAND)
PAIR_CODE = Code.REQUANTIZE_PAIR
CONSTANT_CODE = Code.CONSTANT_SUBGRAPH


@dataclass
class ScaleStep:
    node: Node
    op: str            # "div" | "mul" | "add" | "sub"
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
        """What the island multiplies its input by (its offsets aside)."""
        found = factor(self.steps)
        assert found is not None  # every step of a ScaleIsland has its value
        return found

    @property
    def offset(self) -> bool:
        """Whether the island adds or subtracts a constant other than zero."""
        return any(step.op in OFFSET_OPS and step.value != 0.0 for step in self.steps)


@dataclass(frozen=True)
class Exhaustive:
    """A region run on every integer of its input dtype: the whole function, not a sample."""

    values: torch.Tensor                 # every integer of the input dtype
    mask: torch.Tensor                   # those the producer can emit (inside its [qmin, qmax])
    outputs: dict[Node, torch.Tensor]    # integers each quantize output gets for `values`

    def reproduces_input(self, out: Node) -> bool:
        """quantize(f(dequantize(q))) == q at `out`, for every q the input can hold."""
        result = self.outputs[out]
        return result.dtype == self.values.dtype and torch.equal(result[self.mask], self.values[self.mask])

    @property
    def identity(self) -> bool:
        return all(self.reproduces_input(out) for out in self.outputs)


@dataclass(frozen=True)
class ConstantSubgraph:
    """A QL008 region: fp32 work no runtime input reaches, whose results a fold can store."""

    results: list[Node]       # the members whose values leave it, in graph order
    misread: str | None       # why the reference kernels' value is not the device's, when it is not


# Shared by the records of one run: the fixed program keeps the nodes of the
# regions it did not fold, so their evaluations carry over.
Evaluations = dict[tuple[Node, ...], "Exhaustive | None"]


def moved_evaluations(evaluations: Evaluations, nodes: Mapping[str, Node]) -> Evaluations:
    """`evaluations` keyed by the nodes of a copy of their graph (matched by name), so a fix of the copy reuses them."""
    def at(node: Node) -> Node:
        return nodes[node.name]

    def moved(found: Exhaustive | None) -> Exhaustive | None:
        return None if found is None else replace(found, outputs={at(n): t for n, t in found.outputs.items()})

    return {tuple(at(n) for n in key): moved(found) for key, found in evaluations.items()}


@dataclass(eq=False)
class Region:
    """An fp32 island (QL001 or QL002), a constant subgraph (QL008) or a requantize pair (QL004): what a rule
    reports and a fold rewrites."""

    code: Code
    island: Island              # a pair is an island with no nodes: input dq, output q
    anchor: Node                # the node findings point at
    dq: Node | None             # the one dequantized runtime input, if there is exactly one
    scale: ScaleIsland | None   # QL001 only
    reason: str                 # QL002: why it is not a constant scale; QL008: what it is computed from
    blocked: list[str]          # fold guards from the config that forbid folding it
    not_elementwise: str | None  # why a flat vector of integers does not describe it
    view: GraphView = field(repr=False)
    evaluations: Evaluations = field(repr=False)
    constant: ConstantSubgraph | None = None   # QL008 only

    @property
    def qp_in(self) -> QParams | None:
        return self.view.qparams(self.dq) if self.dq is not None else None

    def exhaustive(self) -> Exhaustive | None:
        """The region on every input integer (computed once per run), or None when that
        does not describe it: not one dequantized input, not elementwise, an output that
        is not a quantize."""
        key = (*self.island.nodes, *self.island.inputs, *self.island.outputs)
        if key not in self.evaluations:
            self.evaluations[key] = self._evaluate()
        return self.evaluations[key]

    def _evaluate(self) -> Exhaustive | None:
        qp_in = self.qp_in
        if self.dq is None or qp_in is None or self.not_elementwise:
            return None
        if any(self.view.kind(o) != Kind.QUANTIZE for o in self.island.outputs):
            return None
        values, mask = input_domain(qp_in)
        return Exhaustive(values, mask, evaluate(self.view, self.island, self.dq, values))


@dataclass(frozen=True)
class Analysis:
    """The regions of one program, in graph order (constant subgraphs, islands, then requantize pairs): a
    constant subgraph is folded before the islands that read it."""

    view: GraphView
    islands: list[Island]     # every fp32 island, whether or not its rule is enabled
    constants: list[Island]   # every constant subgraph, whether or not QL008 is enabled
    regions: list[Region]     # only those of enabled rules
    evaluations: Evaluations


def _is_runtime(view: GraphView, arg: Any, inside: set[Node]) -> bool:
    """An operand computed at run time: inside the island or a non-constant input."""
    return isinstance(arg, Node) and (arg in inside or not view.is_constant(arg))


def classify(view: GraphView, island: Island, max_elements: int, root: Path = Path(".")) -> ScaleIsland | str:
    """A ScaleIsland (constant scales, and offsets by a uniform constant), or the reason the
    island is not one: the causes of the ops that are no scale first (an LSTM's gates are why it
    is fp32, not the constant its add reads), then the first scale or offset that is not constant."""
    bases = [base_name(op_name(n)) for n in island.compute]
    norm = sorted({op_name(n) for n, b in zip(island.compute, bases, strict=True) if b in NORMALIZATION_OPS})
    affine = SCALE_OPS | OFFSET_OPS
    other = [n for n, b in zip(island.compute, bases, strict=True) if b not in affine | NORMALIZATION_OPS]
    if norm:
        # Other ops in the same island (a stem convolution before a LayerNorm) keep their own cause.
        named = [str(c) for c in causes(other, view.as_quantized)]
        return "; ".join([normalization(norm), *named])
    dq = runtime_input(view, island)
    inside = set(island.nodes)
    steps = []
    for node, base in zip(island.compute, bases, strict=True):
        if base not in affine:
            continue
        step = _step(view, node, base, inside, max_elements, root)
        if isinstance(step, str):
            return "; ".join([*(str(c) for c in causes(other, view.as_quantized)), step])
        steps.append(step)
    if other:
        return "; ".join(str(c) for c in causes(other, view.as_quantized))
    if dq is None:
        return "more than one runtime input, or an input that is not dequantized"
    outs = [o for o in island.outputs if view.kind(o) == Kind.QUANTIZE]
    qp_in = view.qparams(dq)
    qps_out = {view.qparams(o) for o in outs}
    if len(outs) != len(island.outputs) or qp_in is None or len(qps_out) != 1 or None in qps_out:
        return "outputs are not one per-tensor quantize"
    return ScaleIsland(island, dq, steps, qp_in, cast(QParams, qps_out.pop()))


def _origin(view: GraphView, node: Node) -> Node:
    """What a value is before quantize, dequantize and data movement: the input, constant or op the user wrote."""
    seen = 0
    while view.op_kind(node) in (Kind.QUANTIZE, Kind.DEQUANTIZE, Kind.SHAPE) and node.args and seen < MAX_WALK_NODES:
        source = node.args[0]
        if not isinstance(source, Node):
            break
        node, seen = source, seen + 1
    return node


def _program_inputs(view: GraphView, node: Node, limit: int = MAX_WALK_NODES) -> list[str]:
    """The runtime inputs a computed value depends on, in graph order (walked once, at most `limit` nodes)."""
    found, stack, seen = set(), [node], {node}
    while stack and len(seen) < limit:
        current = stack.pop()
        if current.op == "placeholder" and view.kind(current) == Kind.INPUT:
            found.add(current)
        for arg in current.all_input_nodes:
            if arg not in seen:
                seen.add(arg)
                stack.append(arg)
    return [n.name for n in view.nodes if n in found]


def operand_name(view: GraphView, node: Node, root: Path) -> str:
    """A runtime operand as the user knows it: a program input by its name and shape, a parameter or
    buffer by its module path, a computed value by its op, its source line and the inputs it comes from."""
    origin = _origin(view, node)
    value = origin.meta.get("val")
    shape = f" {list(value.shape)}" if isinstance(value, torch.Tensor) else ""
    if origin.op == "placeholder":
        constant = view.constant(origin)
        if view.kind(origin) == Kind.INPUT or constant is None:
            return f"input `{origin.name}`{shape}"
        return f"{constant.kind} `{constant.name}`{shape}"
    where = locate(origin.meta.get("stack_trace"), root)
    inputs = _program_inputs(view, origin)
    written = view.as_quantized(origin)  # the op as written, not the kernel lowering made of it
    text = f"{op_name(written)}{shape}" + (f" at {where}" if where else "")
    return text + (f", computed from input {', '.join(f'`{n}`' for n in inputs)}" if inputs else "")


def _runtime_operand(view: GraphView, node: Node, outside: list[Node], root: Path) -> str:
    """Why a second runtime operand keeps `node` in fp32: the operand (a float graph input named
    as such), and what CortexMQuantizer's own check said about the op."""
    inputs = [a for a in outside if view.kind(a) == Kind.INPUT]
    operand = inputs[0] if inputs else cast(Node, node.args[1])
    unquantized = ", an fp32 graph input that was never quantized" if inputs else ""
    name, cause = operand_name(view, operand, root), cause_of(node, view.as_quantized)
    return f"runtime (non-constant) operand {name} of {op_name(node)}{unquantized}; {cause}"


@dataclass(frozen=True)
class _IslandOperands:
    """The lowered graph as `rules.steps.scale_step` asks it, for the ops of one island."""

    view: GraphView
    inside: set[Node]

    def is_runtime(self, arg: Any) -> bool:
        return _is_runtime(self.view, arg, self.inside)

    def operand(self, arg: Any) -> Operand | None:
        constant = self.view.constant(arg)
        if constant is None:
            return None
        uniform = constant.uniform()
        return Operand(constant.numel, float(uniform.double().flatten()[0]) if uniform is not None else None)


def _step(view: GraphView, node: Node, base: str, inside: set[Node], max_elements: int,
          root: Path) -> ScaleStep | str:
    """One `x op c` of a scale island (decided by `rules.steps`, as the static tier decides it), or
    why the op is not one, with the operand's name and CortexMQuantizer's verdict."""
    lhs, rhs = node.args[0], node.args[1]
    found = scale_step(_IslandOperands(view, inside), base, lhs, rhs, node.kwargs.get("alpha", 1), max_elements)
    if isinstance(found, Step):
        constant = view.constant(found.constant)
        assert constant is not None and found.value is not None  # the full check computes every constant
        return ScaleStep(node, base, constant, found.value)
    if found == NotAStep.RUNTIME_OPERANDS:
        return _runtime_operand(view, node, [a for a in (lhs, rhs) if isinstance(a, Node) and a not in inside], root)
    if found == NotAStep.CONSTANT_FIRST:
        return f"constant-first operand ({op_name(node)} of a constant by the activation)"
    if found == NotAStep.ALPHA:
        return f"{op_name(node)} with alpha={node.kwargs['alpha']}"
    operand = rhs if _is_runtime(view, lhs, inside) else lhs
    constant = view.constant(operand)
    if constant is None:  # NOT_CONSTANT
        name = operand_name(view, operand, root) if isinstance(operand, Node) else repr(operand)
        return f"runtime (non-constant) operand {name} of {op_name(node)}"
    if found == NotAStep.DIFFERS_BY_POSITION:
        computed = isinstance(operand, Node) and constant.kind == ConstantKind.COMPUTED
        made = (f"; it is computed in the graph ({op_name(operand)}) from constants, one value per element, and "
                "never quantized" if isinstance(operand, Node) and computed else "")
        held = "" if computed else f", a {constant.kind}"
        return (f"constant {constant.name}{held} differs by position ({constant.numel} elements), so no table "
                f"folds it{made}; {cause_of(node, view.as_quantized)}")
    if found == NotAStep.PER_CHANNEL:
        return f"per-channel constant {constant.name} ({constant.numel} elements); {cause_of(node, view.as_quantized)}"
    return unfit_constant(base, constant.name)  # BY_VALUE: zero, or not finite


def _island_region(
    view: GraphView, island: Island, config: Config, evaluations: Evaluations
) -> Region:
    dq = runtime_input(view, island)
    result = classify(view, island, config.fold.max_elements, config.root)
    if isinstance(result, ScaleIsland):
        kinds = [s.constant.kind for s in result.steps]
        blocked = blocked_guards(config.fold, result.qp_in, kinds, result.qp_out)
        scale, reason, code = result, "", Code.CONSTANT_SCALE_ISLAND
    else:
        kinds = [c.kind for n in island.compute for a in n.args if (c := view.constant(a)) is not None]
        blocked = blocked_guards(config.fold, view.qparams(dq) if dq is not None else None, kinds)
        scale, reason, code = None, result, Code.FP32_ISLAND
    return Region(code, island, island.anchor, dq, scale, reason, blocked, not_per_integer(view, island), view,
                  evaluations)


def _pair_region(view: GraphView, dq: Node, q: Node, config: Config, evaluations: Evaluations) -> Region:
    blocked = blocked_guards(config.fold, view.qparams(dq), ())
    return Region(PAIR_CODE, Island([], [], [dq], [q]), q, dq, None, "", blocked, None, view, evaluations)


def _sources(view: GraphView, island: Island, root: Path) -> list[str]:
    """What a constant subgraph reads: its parameters, buffers and lifted constants, and the ops that
    make a tensor from literals alone (`aten.full`, `arange`)."""
    read = [operand_name(view, n, root) for n in island.inputs]
    made = [op_name(n) for n in island.compute if not n.all_input_nodes]
    return list(dict.fromkeys([*read, *made]))


def _misread(view: GraphView, island: Island) -> str | None:
    """An integer kernel of the subgraph fed a float: the lowering folded a quantize into a constant op
    (ExecuTorch's Arm flow then computes that op ahead of time; the Cortex-M passes do not)."""
    for node in island.compute:
        for read in float_reads_of(view, node):
            return (f"{op_name(node)} reads the float32 output of {op_name(_origin(view, read.producer))} where its "
                    "kernel expects integers (the lowering folded the quantize between them away): the reference "
                    "kernels convert the floats, the device does not, so they disagree on its value; "
                    "QL007's fix puts the quantize back")
    return None


def _constant_region(view: GraphView, island: Island, config: Config, evaluations: Evaluations) -> Region:
    out = results(island)
    kinds = [ConstantKind.COMPUTED, *(c.kind for n in island.inputs if (c := view.constant(n)) is not None)]
    reason = (f"computed only from constants ({', '.join(_sources(view, island, config.root))}), "
              "so it gives the same value on every inference")
    return Region(CONSTANT_CODE, island, (out or island.nodes)[-1], None, None, reason,
                  blocked_guards(config.fold, None, kinds), None, view, evaluations,
                  ConstantSubgraph(out, _misread(view, island)))


def analyse(
    view: GraphView, config: Config, codes: Collection[str], evaluations: Evaluations | None = None
) -> Analysis:
    """The regions of the rules in `codes`; islands are classified only when QL001 or QL002 runs,
    requantize pairs found only when QL004 does."""
    evaluations = {} if evaluations is None else evaluations
    islands, constants = find_islands(view), find_constant_subgraphs(view)
    regions: list[Region] = []
    if CONSTANT_CODE in codes:
        regions.extend(_constant_region(view, c, config, evaluations) for c in constants)
    if any(code in codes for code in ISLAND_CODES):
        for island in islands:
            region = _island_region(view, island, config, evaluations)
            if region.code in codes:
                regions.append(region)
    if PAIR_CODE in codes:
        regions.extend(_pair_region(view, dq, q, config, evaluations) for dq, q in requantize_pairs(view))
    return Analysis(view, islands, constants, regions, evaluations)
